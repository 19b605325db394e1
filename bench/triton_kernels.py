"""The Triton side of the benchmarks: standard kernels in the style of the Triton tutorials.

Each wrapper allocates its output, as torch and newtc.ops do, so the three are timed alike.
Imported only where Triton is installed.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = x - tl.log(tl.sum(num, axis=0)) if LOG else num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


@triton.jit
def softmax_online_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr, LOG: tl.constexpr):
    """Rows too long for one block: a pass for the running max and sum of exp (online), a pass to write."""
    row = tl.program_id(0).to(tl.int64)
    m = -float("inf")
    s = 0.0
    for off in range(0, n_cols, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    for off in range(0, n_cols, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf")).to(tl.float32) - m
        y = x - tl.log(s) if LOG else tl.exp(x) / s
        tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


def softmax(x, num_warps=None, block=None, log=False):
    """One row per program: the whole row in one block (block None), or looped over blocks of `block`."""
    rows, cols = x.shape
    out = torch.empty_like(x)
    if block is None:
        block = triton.next_power_of_2(cols)
        if num_warps is None:
            num_warps = 16 if block >= 4096 else 8 if block >= 2048 else 4  # the tutorial's rule: wider rows, more warps
        softmax_kernel[(rows,)](out, x, x.stride(0), out.stride(0), cols, BLOCK_SIZE=block, LOG=log, num_warps=num_warps)
    else:
        softmax_online_kernel[(rows,)](out, x, x.stride(0), out.stride(0), cols, BLOCK_SIZE=block, LOG=log,
                                       num_warps=num_warps or 8)
    return out


@triton.jit
def layernorm_kernel(X, Y, W, B, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.0)
        acc += x * x
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask).to(tl.float32)
        b = tl.load(B + cols, mask=mask).to(tl.float32)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, (x - mean) * rstd * w + b, mask=mask)


@triton.jit
def rmsnorm_kernel(X, Y, W, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    X += row * stride
    Y += row * stride
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask).to(tl.float32)
        x = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, x * rstd * w, mask=mask)


def _row_config(x, block):
    """The layernorm tutorial's launch rule: a whole row per block up to 64 KB, 256 elements per warp; a
    given `block` loops over the row in blocks of that size."""
    block = block or min(65536 // x.element_size(), triton.next_power_of_2(x.shape[-1]))
    return block, min(max(block // 256, 1), 8)


def layernorm(x, weight, bias, eps=1e-5, num_warps=None, block=None):
    block, warps = _row_config(x, block)
    num_warps = num_warps or warps
    y = torch.empty_like(x)
    layernorm_kernel[(x.shape[0],)](x, y, weight, bias, x.stride(0), x.shape[1], eps,
                                    BLOCK_SIZE=block, num_warps=num_warps)
    return y


def rmsnorm(x, weight, eps=1e-6, num_warps=None, block=None):
    block, warps = _row_config(x, block)
    num_warps = num_warps or warps
    y = torch.empty_like(x)
    rmsnorm_kernel[(x.shape[0],)](x, y, weight, x.stride(0), x.shape[1], eps, BLOCK_SIZE=block, num_warps=num_warps)
    return y


@triton.jit
def cross_entropy_kernel(logits_ptr, target_ptr, loss_ptr, stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    m = float("-inf")  # running max and sum of exp(x - m): logsumexp in one pass over the row
    s = 0.0
    for off in range(0, n_cols, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(base + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    target = tl.load(target_ptr + row)
    tl.store(loss_ptr + row, m + tl.log(s) - tl.load(base + target).to(tl.float32))


def cross_entropy(logits, target, num_warps=8, block=4096):
    """Per-row losses in float32."""
    loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    cross_entropy_kernel[(logits.shape[0],)](logits, target, loss, logits.stride(0), logits.shape[1],
                                             BLOCK_SIZE=block, num_warps=num_warps)
    return loss
