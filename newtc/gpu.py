"""What newt's launch models (the row-op plans of `ops`, deuteron's default tiles) know of a GPU, read once per
device from torch. A module of its own: deuteron's first call from its config store reads it without importing
`ops`, whose torch custom-op registrations cost ~30 ms."""
import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Gpu:
    """What the model needs of a GPU. The defaults (an H100/H200) plan CPU tensors for the interpreter."""
    sms: int = 132
    l2_bytes: int = 50 * 2**20
    regs: int = 65536  # 32-bit registers per SM
    warps: int = 64  # resident warps per SM
    ctas: int = 32  # resident programs per SM
    smem: int = 232448  # shared memory a program may take


@functools.cache
def gpu(device: int) -> Gpu:
    if device < 0:
        return Gpu()
    p = torch.cuda.get_device_properties(device)
    return Gpu(p.multi_processor_count, p.L2_cache_size or Gpu.l2_bytes, getattr(p, "regs_per_multiprocessor", 65536),
               p.max_threads_per_multi_processor // 32, smem=getattr(p, "shared_memory_per_block_optin", Gpu.smem))
