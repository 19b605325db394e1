"""Launch the stdlib matmul once on its mma.sync path (ldmatrix from swizzled tiles) and once on its wgmma path,
for Nsight Compute:

    ncu --clock-control none -k regex:nk_matmul --metrics \\
        l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum \\
        python bench/ncu_matmul.py
"""
import torch

import common  # noqa: F401 - puts the checkout on sys.path
from newtc import ops


def main() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    mod = ops._stdlib("matmul")
    # two warps: no warpgroup, so mma.sync from ldmatrix-read tiles
    mod.matmul[(64 * 64,)](a, b, c, 4096, 4096, 4096, *a.stride(), *b.stride(), *c.stride(), BM=64, BN=64, BK=32,
                           GROUP_M=8, num_warps=2, num_stages=3)
    ops.matmul(a, b)  # the shipped configuration: wgmma on sm_90a
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
