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


# ---- fused attention, forward and backward (the approach of Triton's tutorial 06) -----------------------
# Contiguous (B, H, L, D) f16/bf16 tensors with L a multiple of 128, H_kv = H. Scores are scaled by
# scale * log2(e) so that every exponential is an exp2; the log-sum-exp kept for the backward pass is in
# base 2. Causal programs run the blocks strictly below their diagonal without a mask and mask only the
# diagonal ones (the config's larger block is a multiple of the smaller one). Three configs per kernel (the
# tutorial's 32/128 and 128/32 backward blocks among them) keep autotuning within the bench's time.
LOG2E = 1.4426950408889634


def _configs(pairs, names):
    return [triton.Config(dict(zip(names, p[:2])), num_warps=p[2], num_stages=p[3]) for p in pairs]


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, lo, hi, rows, cols, qk_scale, D: tl.constexpr, BN: tl.constexpr,
                DIAG: tl.constexpr):
    for start in range(lo, hi, BN):
        s = tl.dot(q, tl.load(k_ptrs + start * D)) * qk_scale
        if DIAG:
            s = tl.where(rows[:, None] >= start + cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start * D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_configs([(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3)], ("BM", "BN")),
                 key=["L", "D", "CAUSAL"])
@triton.jit
def attn_fwd_kernel(Q, K, V, O, LSE, qk_scale, L, D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr):
    m0 = tl.program_id(0) * BM
    base = tl.program_id(1).to(tl.int64) * L * D
    rows, cols, dims = m0 + tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
    q = tl.load(Q + base + rows[:, None] * D + dims[None, :])
    k_ptrs = K + base + cols[None, :] * D + dims[:, None]  # K^T: [D, BN]
    v_ptrs = V + base + cols[:, None] * D + dims[None, :]
    acc = tl.zeros([BM, D], tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, 0, m0 if CAUSAL else L, rows, cols, qk_scale, D,
                                BN, False)
    if CAUSAL:
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptrs, v_ptrs, m0, m0 + BM, rows, cols, qk_scale, D, BN, True)
    tl.store(O + base + rows[:, None] * D + dims[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty))
    tl.store(LSE + tl.program_id(1).to(tl.int64) * L + rows, m_i + tl.math.log2(l_i))


@triton.jit
def attn_bwd_pre_kernel(O, DO, DELTA, L, D: tl.constexpr, BM: tl.constexpr):
    rows, dims = tl.program_id(0) * BM + tl.arange(0, BM), tl.arange(0, D)
    bh = tl.program_id(1).to(tl.int64)
    offs = bh * L * D + rows[:, None] * D + dims[None, :]
    o, do = tl.load(O + offs).to(tl.float32), tl.load(DO + offs).to(tl.float32)
    tl.store(DELTA + bh * L + rows, tl.sum(o * do, 1))


@triton.jit
def _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, keys, lo, hi, qk_scale, D: tl.constexpr, BM: tl.constexpr,
                 DIAG: tl.constexpr):
    dims = tl.arange(0, D)
    for start in range(lo, hi, BM):
        rows = start + tl.arange(0, BM)
        q_t = tl.load(Q + rows[None, :] * D + dims[:, None])  # Q^T: [D, BM]
        p_t = tl.math.exp2(tl.dot(k, q_t) * qk_scale - tl.load(LSE + rows)[None, :])  # P^T: [BN, BM]
        if DIAG:
            p_t = tl.where(rows[None, :] >= keys[:, None], p_t, 0.0)
        do = tl.load(DO + rows[:, None] * D + dims[None, :])
        dv += tl.dot(p_t.to(do.dtype), do)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - tl.load(DELTA + rows)[None, :])
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t))
    return dk, dv


@triton.autotune(configs=_configs([(32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 3)], ("BM", "BN")),
                 key=["L", "D", "CAUSAL"])
@triton.jit
def attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, qk_scale, L, D: tl.constexpr,
                         CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """dK, dV of one BN block of keys: the queries on the diagonal (masked), then those below it."""
    n0 = tl.program_id(0) * BN
    bh = tl.program_id(1).to(tl.int64)
    base = bh * L * D
    keys, dims = n0 + tl.arange(0, BN), tl.arange(0, D)
    offs = base + keys[:, None] * D + dims[None, :]
    k, v = tl.load(K + offs), tl.load(V + offs)
    dk, dv = tl.zeros([BN, D], tl.float32), tl.zeros([BN, D], tl.float32)
    Q, DO, LSE, DELTA = Q + base, DO + base, LSE + bh * L, DELTA + bh * L
    lo = 0
    if CAUSAL:
        dk, dv = _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, keys, n0, n0 + BN, qk_scale, D, BM, True)
        lo = n0 + BN
    dk, dv = _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, keys, lo, L, qk_scale, D, BM, False)
    tl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + offs, dv.to(DV.dtype.element_ty))


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, K, V, rows, lo, hi, qk_scale, D: tl.constexpr, BN: tl.constexpr,
               DIAG: tl.constexpr):
    dims = tl.arange(0, D)
    for start in range(lo, hi, BN):
        keys = start + tl.arange(0, BN)
        k_t = tl.load(K + keys[None, :] * D + dims[:, None])  # K^T: [D, BN]
        v_t = tl.load(V + keys[None, :] * D + dims[:, None])
        p = tl.math.exp2(tl.dot(q, k_t) * qk_scale - lse[:, None])
        if DIAG:
            p = tl.where(rows[:, None] >= keys[None, :], p, 0.0)
        ds = p * (tl.dot(do, v_t) - delta[:, None])
        dq += tl.dot(ds.to(k_t.dtype), tl.trans(k_t))
    return dq


@triton.autotune(configs=_configs([(128, 32, 4, 3), (128, 32, 4, 5), (128, 64, 8, 3)], ("BM", "BN")),
                 key=["L", "D", "CAUSAL"])
@triton.jit
def attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, qk_scale, L, D: tl.constexpr, CAUSAL: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr):
    """dQ of one BM block of queries: the keys below the diagonal, then the diagonal ones (masked)."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1).to(tl.int64)
    base = bh * L * D
    rows, dims = m0 + tl.arange(0, BM), tl.arange(0, D)
    offs = base + rows[:, None] * D + dims[None, :]
    q, do = tl.load(Q + offs), tl.load(DO + offs)
    lse, delta = tl.load(LSE + bh * L + rows), tl.load(DELTA + bh * L + rows)
    dq = tl.zeros([BM, D], tl.float32)
    dq = _dq_blocks(dq, q, do, lse, delta, K + base, V + base, rows, 0, m0 if CAUSAL else L, qk_scale, D, BN, False)
    if CAUSAL:
        dq = _dq_blocks(dq, q, do, lse, delta, K + base, V + base, rows, m0, m0 + BM, qk_scale, D, BN, True)
    tl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty))


def _checked(*ts):
    b, h, n, d = ts[0].shape
    assert n % 128 == 0 and all(t.shape == ts[0].shape and t.is_contiguous() for t in ts), "contiguous, L % 128 == 0"
    return b, h, n, d


def attention_forward(q, k, v, causal, sm_scale):
    """O and the base-2 log-sum-exp of each query row."""
    b, h, n, d = _checked(q, k, v)
    o, lse = torch.empty_like(q), torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    attn_fwd_kernel[lambda meta: (n // meta["BM"], b * h)](q, k, v, o, lse, sm_scale * LOG2E, n, d, causal)
    return o, lse


def attention_backward(do, q, k, v, o, lse, causal, sm_scale):
    """dQ, dK, dV from the forward's O and log-sum-exp: delta = rowsum(dO * O), then the dK/dV and the dQ kernels."""
    b, h, n, d = _checked(q, k, v, o, do)
    delta = torch.empty_like(lse)
    attn_bwd_pre_kernel[(n // 128, b * h)](o, do, delta, n, d, BM=128)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    attn_bwd_dkdv_kernel[lambda meta: (n // meta["BN"], b * h)](q, k, v, do, lse, delta, dk, dv, sm_scale,
                                                                 sm_scale * LOG2E, n, d, causal)
    attn_bwd_dq_kernel[lambda meta: (n // meta["BM"], b * h)](q, k, v, do, lse, delta, dq, sm_scale, sm_scale * LOG2E,
                                                               n, d, causal)
    return dq, dk, dv
