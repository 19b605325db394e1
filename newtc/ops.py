"""Ops on torch tensors backed by the stdlib `.nk` kernels: allocate outputs, pick the launch.

CPU tensors run through the interpreter, CUDA tensors on the GPU.
"""
from __future__ import annotations

import torch

from .errors import NkError
from .jit import load
from .paths import data_dir

MAX_ROW_BLOCK = 16384  # longest row kept whole in registers; longer rows loop over blocks
WHOLE_ROW_BYTES = 8192  # cross-entropy rows up to this stay in registers: at 64 KB, 0.61x of the looped kernel


_modules: dict = {}


def _stdlib(name: str):
    """The stdlib module, parsed once: ops sit on the launch path, so no file system calls here."""
    mod = _modules.get(name)
    if mod is None:
        mod = _modules[name] = load(data_dir("stdlib") / f"{name}.nk")
    return mod


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(block: int, itemsize: int) -> int:
    """Warps for one row of `block` elements: 4 up to 16 KB, then one per 4 KB (measured on an H200:
    f32 softmax up to 16384 columns, f16 layer norm at 4096 and 8192)."""
    return max(4, min(16, block * itemsize // 4096))


def _streamed(itemsize: int, warps: int) -> dict:
    """Meta-parameters of row_stats (stdlib/softmax.nk): blocks of 4096 viewed per lane, VEC elements
    per 16-byte vector (measured on an H200: 4096 and 8 warps within 1% of the best for f32, f16, bf16)."""
    return dict(BLOCK=4096, WARPS=warps, VEC=16 // itemsize, num_warps=warps)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, n_cols] with unit column stride; row-strided 2-D views are kept as they are."""
    if x.dim() == 0:
        x = x.reshape(1, 1)
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    return x.reshape(-1, x.shape[-1]) if x.stride(-1) == 1 and x.is_contiguous() else x.contiguous().reshape(-1, x.shape[-1])


def _float(x: torch.Tensor, what: str) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NkError(f"{what} takes f32, f16 or bf16 tensors, got {x.dtype}")


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = torch.broadcast_tensors(x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    block = 1024
    _stdlib("add").add[(max(1, -(-n // block)),)](x, y, out, n, BLOCK=block, num_warps=4)
    return out


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) with bias broadcast over the last dimension."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    block = 1024
    _stdlib("gelu").bias_gelu[(max(1, -(-n // block)),)](x, bias.contiguous(), out, n, x.shape[-1], BLOCK=block)
    return out


def _softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
    _float(x, "softmax")
    shape = x.shape
    x2 = _rows(x)
    out = torch.empty_strided(x2.shape, x2.stride(), dtype=x2.dtype, device=x2.device)
    rows, n = x2.shape
    mod = _stdlib("softmax")
    block = _pow2(n)
    if block <= MAX_ROW_BLOCK:
        mod.softmax[(rows,)](x2, out, n, x2.stride(0), BLOCK=block, LOG=log, num_warps=_warps(block, x2.element_size()))
    else:
        mod.softmax_looped[(rows,)](x2, out, n, x2.stride(0), LOG=log, **_streamed(x2.element_size(), 8))
    return out.reshape(shape)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension."""
    return _softmax(x, False)


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    return _softmax(x, True)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-row loss (reduction='none') from [rows, classes] logits and int64 targets, in f32."""
    _float(logits, "cross_entropy")
    x2 = _rows(logits)
    rows, n = x2.shape
    loss = torch.empty(rows, dtype=torch.float32, device=x2.device)
    block = _pow2(n)
    if block * x2.element_size() <= WHOLE_ROW_BYTES:  # the row fits in registers
        meta = dict(BLOCK=block, WHOLE_ROW=True, num_warps=max(4, min(32, block // 1024)))
    else:
        meta = _streamed(x2.element_size(), 8)
    _stdlib("softmax").cross_entropy[(rows,)](x2, target.contiguous(), loss, n, x2.stride(0), **meta)
    return loss


def _norm(x, weight, bias, eps: float, rms: bool) -> torch.Tensor:
    _float(x, "rmsnorm" if rms else "layernorm")
    shape = x.shape
    x2 = _rows(x)
    rows, n = x2.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    w = weight.contiguous()
    b = bias.contiguous() if bias is not None else w
    mod = _stdlib("norm")
    block = _pow2(n)
    args = (x2, w, b, out, n, x2.stride(0), out.stride(0), float(eps))
    if block <= MAX_ROW_BLOCK:
        mod.norm[(rows,)](*args, BLOCK=block, RMS=rms, num_warps=_warps(block, x2.element_size()))
    else:
        mod.norm_looped[(rows,)](*args, BLOCK=4096, RMS=rms, num_warps=8)
    return out.reshape(shape)


def layernorm(x, weight, bias, eps: float = 1e-5) -> torch.Tensor:
    return _norm(x, weight, bias, eps, False)


def rmsnorm(x, weight, eps: float = 1e-6) -> torch.Tensor:
    return _norm(x, weight, None, eps, True)


def _row_reduce(x: torch.Tensor, op: str) -> torch.Tensor:
    _float(x, op)
    x2 = _rows(x)
    rows, n = x2.shape
    out = torch.empty(rows, dtype=x.dtype, device=x.device)
    block = min(_pow2(n), 4096)
    _stdlib("reduce").row_reduce[(rows,)](x2, out, n, x2.stride(0), BLOCK=block, OP=op, num_warps=_warps(block, x2.element_size()))
    return out.reshape(x.shape[:-1])


def sum(x: torch.Tensor) -> torch.Tensor:  # noqa: A001 - mirrors torch.sum over the last dim
    """Sum over the last dimension."""
    return _row_reduce(x, "sum")


def mean(x: torch.Tensor) -> torch.Tensor:
    return _row_reduce(x, "mean")


def amax(x: torch.Tensor) -> torch.Tensor:
    return _row_reduce(x, "amax")


def transpose(x: torch.Tensor) -> torch.Tensor:
    """A contiguous transpose of a 2-D tensor (rows may be strided)."""
    if x.dim() != 2:
        raise NkError(f"transpose takes a 2-D tensor, got {x.dim()}-D")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, n = x.shape
    out = torch.empty((n, m), dtype=x.dtype, device=x.device)
    bm = bn = 32
    _stdlib("transpose").transpose[(-(-m // bm), -(-n // bn))](x, out, m, n, x.stride(0), out.stride(0),
                                                               BM=bm, BN=bn, num_warps=4)
    return out


# ---- matmul -------------------------------------------------------------------------------------------
def _matmul_config(m: int, n: int, k: int, itemsize: int) -> dict:
    """Tile sizes by shape (a small table until the autotuner picks them): the 128x256 tile with 8 warps
    (two warpgroups) and a 4-slot ring for large products (measured on an H200: 621 TFLOP/s at 4096^3 f16
    against 504 with 3 slots, which leave asynchronous wgmma only one tile of prefetch); for few rows
    (decoding), narrow tiles so that enough programs stream B, with a longer K step and a deeper ring to
    keep each program's loads in flight. f32 (tf32) halves BK."""
    if m <= 64:
        cfg = dict(BM=max(16, _pow2(m)), BN=32, BK=128, num_warps=4, num_stages=4)
    elif m * n <= 512 * 512:
        cfg = dict(BM=64, BN=64, BK=64, num_warps=4, num_stages=4)
    else:
        cfg = dict(BM=128, BN=256, BK=64, num_warps=8, num_stages=4)
    if itemsize == 4:
        cfg["BK"] //= 2
    cfg["BK"] = min(cfg["BK"], max(16, _pow2(k)))
    return cfg


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """a @ b (+ bias over the columns, then relu or gelu) for 2-D f16, bf16 or f32 tensors (f32 runs as tf32);
    any strides, so transposed views need no copy."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise NkError(f"matmul takes [M, K] @ [K, N], got {list(a.shape)} @ {list(b.shape)}")
    _float(a, "matmul")
    if b.dtype != a.dtype:
        raise NkError(f"matmul operands must share a dtype, got {a.dtype} and {b.dtype}")
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    cfg = _matmul_config(m, n, k, a.element_size())
    grid = (-(-m // cfg["BM"]) * -(-n // cfg["BN"]),)
    act = activation or "none"
    strides = (*a.stride(), *b.stride(), *c.stride())
    mod = _stdlib("matmul")
    if bias is None:
        mod.matmul[grid](a, b, c, m, n, k, *strides, GROUP_M=8, ACTIVATION=act, **cfg)
    else:
        mod.matmul_bias[grid](a, b, c, bias.contiguous(), m, n, k, *strides, GROUP_M=8, ACTIVATION=act, **cfg)
    return c
