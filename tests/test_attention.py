"""stdlib/attention.nk, the forward pass, against torch's math attention: the interpreter on small shapes, the
GPU (marker gpu) on the shapes people run, odd lengths, causal, GQA, head dims 64 and 128. O and the
log-sum-exp start as NaN."""
import math
import re

import pytest
import torch

import newtc
from newtc import ops
from newtc.paths import data_dir


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def forward(q, k, v, causal, bm, bn, warps, stages):
    mod = newtc.load(data_dir("stdlib") / "attention.nk")
    (b, h, lq, d), hk, lk = q.shape, k.shape[1], k.shape[2]
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, lq), float("nan"), device=q.device)
    mod.attention_fwd[(-(-lq // bm), b * h)](q, k, v, o, lse, lq, lk, h, hk, 1 / math.sqrt(d), *q.stride()[:3],
                                              *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], BM=bm, BN=bn, D=d,
                                              CAUSAL=causal, num_warps=warps, num_stages=stages)
    return o, lse


def scores(q, k, causal, scale=None):
    """q @ k^T * scale in f64, k repeated over each GQA group; -inf where the causal mask hides a key (aligned to the
    end, as flash attention does when the lengths differ)."""
    group = q.shape[1] // k.shape[1]
    s = (q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril(lk - lq), float("-inf"))
    return s


def reference(q, k, v, causal):
    """O and the log-sum-exp; a causal row that sees no key (L_q > L_k) has O = 0 (torch's SDPA, flash attention)
    and, by the kernel's convention, an lse of +inf."""
    s, v = scores(q, k, causal), v.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    lse = torch.logsumexp(s, -1)
    seen = lse.isfinite()
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.where(seen, lse, math.inf)


CASES = {  # (B, H, H_kv, L_q, L_k, D, causal, (BM, BN, warps, stages))
    "cpu": [(1, 2, 1, 17, 100, 64, False, (32, 32, 4, 1)), (1, 2, 2, 70, 70, 64, True, (64, 32, 4, 2)),
            (1, 4, 2, 33, 129, 128, False, (32, 64, 4, 2)), (1, 2, 1, 70, 33, 64, True, (32, 32, 4, 2))],
    "cuda": [(2, 4, 4, 1000, 1000, 64, False, (128, 64, 8, 3)), (1, 8, 2, 4097, 4097, 128, True, (128, 64, 8, 2)),
             (2, 2, 1, 1, 333, 64, False, (64, 64, 4, 3)), (1, 4, 4, 17, 1024, 128, True, (128, 64, 8, 2)),
             (1, 4, 4, 1000, 1000, 64, True, (64, 64, 4, 3)), (1, 4, 2, 1000, 333, 128, True, (128, 64, 8, 2))],
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_forward(device, dtype):
    for b, h, hk, lq, lk, d, causal, cfg in CASES[device]:
        q = torch.randn(b, h, lq, d, device=device).to(dtype)
        k, v = (torch.randn(b, hk, lk, d, device=device).to(dtype) for _ in range(2))
        o, lse = forward(q, k, v, causal, *cfg)
        ref, lse_ref = reference(q, k, v, causal)
        err = ((o.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(o).all() and err < (5e-3 if dtype == torch.float16 else 2e-2), (lq, lk, d, causal, err)
        seen = lse_ref.isfinite()
        assert torch.equal(lse.isinf(), ~seen) and (lse.double() - lse_ref)[seen].abs().max() < 1e-3


# ---- the backward pass: the three kernels with gradients poisoned, then ops.attention end to end ----------
def sdpa_grads(q, k, v, g, causal, scale=None):
    """O and (dq, dk, dv) of torch's math SDPA in f32 (autograd on f32 copies; GQA by repeating K and V)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    group, (lq, lk) = q.shape[1] // k.shape[1], (q.shape[2], k.shape[2])
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq) if causal else None
    with sdpa_kernel(SDPBackend.MATH):
        o = torch.nn.functional.scaled_dot_product_attention(qf, kf.repeat_interleave(group, 1),
                                                             vf.repeat_interleave(group, 1), attn_mask=mask,
                                                             scale=scale)
    o.backward(g.float())
    return o.detach(), (qf.grad, kf.grad, vf.grad)


def backward(q, k, v, o, lse, g, causal):
    """The two backward kernels as ops.attention launches them, on gradients poisoned with NaN."""
    mod = newtc.load(data_dir("stdlib") / "attention.nk")
    (b, h, lq, d), hk, lk = q.shape, k.shape[1], k.shape[2]
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    delta = torch.full_like(lse, float("nan"))
    qcfg, kcfg = (ops._attention_blocks(d, lq, lk, kernel, ops._arch(q)) for kernel in ("dq", "dkdv"))
    strides = [s for t in (q, k, v) for s in t.stride()[:3]]
    mod.attention_bwd_dq[(-(-lq // qcfg["BM"]), b * h)](q, k, v, o, g, lse, delta, dq, lq, lk, h, hk, 1 / math.sqrt(d),
                                                        *strides, *o.stride()[:3], *g.stride()[:3], *dq.stride()[:3],
                                                        CAUSAL=causal, **qcfg)
    assert torch.allclose(delta, (o.float() * g.float()).sum(-1), rtol=1e-4, atol=1e-4)
    mod.attention_bwd_dkdv[(-(-lk // kcfg["BN"]), b * hk)](q, k, v, g, lse, delta, dk, dv, lq, lk, h, hk,
                                                            1 / math.sqrt(d), *strides, *g.stride()[:3],
                                                            *dk.stride()[:3], *dv.stride()[:3], CAUSAL=causal, **kcfg)
    return dq, dk, dv


GRAD_TOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2}  # relative (Frobenius) error of a gradient: P and dS
# go through the input dtype on their way into the tensor cores, as in every flash attention backward

BACKWARD_CASES = {  # (B, H, H_kv, L_q, L_k, D, causal)
    "cpu": [(1, 2, 1, 1, 17, 64, True), (1, 2, 2, 17, 17, 64, False), (1, 4, 2, 33, 33, 64, True),
            (1, 2, 1, 17, 33, 64, True), (1, 2, 2, 33, 17, 64, False), (1, 2, 1, 40, 17, 64, True)],
    "cuda": [(2, 4, 4, 1000, 1000, 64, False), (1, 8, 2, 4097, 4097, 128, True), (2, 2, 1, 1, 333, 64, False),
             (1, 4, 4, 17, 1024, 128, True), (1, 4, 1, 1000, 1000, 256, True), (1, 2, 2, 4097, 4097, 64, False),
             (1, 4, 2, 1000, 1017, 256, False), (1, 2, 1, 17, 17, 128, False), (1, 4, 2, 1000, 333, 128, True)],
}


def grads_close(got, want, dtype, label):
    for name, x, r in zip(("dq", "dk", "dv"), got, want):
        err = ((x.float() - r).norm() / r.norm()).item()
        assert torch.isfinite(x).all() and err < GRAD_TOL[dtype], (label, name, err)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_backward(device, dtype):
    for b, h, hk, lq, lk, d, causal in BACKWARD_CASES[device]:
        q, g = (torch.randn(b, h, lq, d, device=device).to(dtype) for _ in range(2))
        k, v = (torch.randn(b, hk, lk, d, device=device).to(dtype) for _ in range(2))
        o, lse = ops._attention_forward(q, k, v, causal, 1 / math.sqrt(d))
        want_o, want = sdpa_grads(q, k, v, g, causal)
        assert ((o.float() - want_o).norm() / want_o.norm()).item() < GRAD_TOL[dtype]  # ops' forward blocks
        grads_close(backward(q, k, v, o, lse, g, causal), want, dtype, (lq, lk, d, causal))


@pytest.mark.parametrize("device", devices())
def test_ops_attention_trains(device):
    """ops.attention under loss.backward(): strided views (q transposed from (B, L, H, D), k sliced along L, v
    with a strided last dim, which is copied), GQA, a scale, causal and not."""
    for dtype, causal, (lq, lk) in [(torch.float16, True, (17, 33)), (torch.bfloat16, False, (33, 17))]:
        q = torch.randn(1, lq, 4, 64, device=device).to(dtype).transpose(1, 2).requires_grad_()
        k = torch.randn(1, 2, 64, 64, device=device).to(dtype)[:, :, :lk].requires_grad_()
        v = torch.randn(1, 2, 64, lk, device=device).to(dtype).transpose(2, 3).requires_grad_()
        w = torch.randn(1, 4, lq, 64, device=device)
        o = ops.attention(q, k, v, causal=causal, scale=0.3)
        (o.float() * w).sum().backward()
        want_o, want = sdpa_grads(q, k, v, w, causal, scale=0.3)
        assert ((o.float() - want_o).norm() / want_o.norm()).item() < GRAD_TOL[dtype]
        grads_close((q.grad, k.grad, v.grad), want, dtype, causal)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("scale", [-2.0, 0.0])
def test_ops_attention_takes_any_scale(device, scale):
    """The forward kernel scales the row max of raw scores: ops hands it -Q for a negative scale, and the
    smallest normal f32 for 0 (every key of a row then weighs the same); forward and gradients match SDPA."""
    q, k, v = (torch.randn(1, 2, 33, 64, device=device).half().requires_grad_() for _ in range(3))
    w = torch.randn(1, 2, 33, 64, device=device)
    o = ops.attention(q, k, v, causal=True, scale=scale)
    (o.float() * w).sum().backward()
    want_o, want = sdpa_grads(q, k, v, w, True, scale=scale)
    assert ((o.float() - want_o).norm() / want_o.norm()).item() < GRAD_TOL[torch.float16]
    if scale:
        grads_close((q.grad, k.grad, v.grad), want, torch.float16, scale)
    else:  # the scores do not depend on Q and K: their gradients are 0 (SDPA's too), dV is the mean's
        assert q.grad.abs().max() == k.grad.abs().max() == 0 and want[0].abs().max() == want[1].abs().max() == 0
        grads_close((v.grad,), want[2:], torch.float16, scale)


@pytest.mark.parametrize("device", devices())
def test_ops_attention_compiles(device):
    """torch.compile traces ops.attention and its backward as the custom ops newt::attention(_backward), without
    a graph break (fullgraph); inductor on the GPU, the AOT-autograd trace alone on the CPU (no C++ compiler)."""
    def loss(q, k, v):
        return ops.attention(q, k, v, causal=True).float().square().sum()
    compiled = torch.compile(loss, backend="inductor" if device == "cuda" else "aot_eager", fullgraph=True)
    q = torch.randn(1, 4, 17, 64, device=device).half().requires_grad_()
    k, v = (torch.randn(1, 2, 20, 64, device=device).half().requires_grad_() for _ in range(2))
    compiled(q, k, v).backward()
    got = [t.grad for t in (q, k, v)]
    _, want = sdpa_grads(q, k, v, 2 * ops.attention(q, k, v, causal=True).detach().float(), True)  # d(o^2) = 2o
    grads_close(got, want, torch.float16, "compiled")


@pytest.mark.parametrize("shapes,dtype,message", [
    (((2, 4, 8, 64), (2, 4, 8, 64), (2, 4, 9, 64)), torch.float16, "attention takes q (B, H, L_q, D)"),
    (((4, 8, 64), (4, 8, 64), (4, 8, 64)), torch.float16, "attention takes q (B, H, L_q, D)"),
    (((1, 6, 8, 64), (1, 4, 8, 64), (1, 4, 8, 64)), torch.float16, "query heads must be a multiple"),
    (((1, 4, 8, 96), (1, 4, 8, 96), (1, 4, 8, 96)), torch.float16, "head dim 64, 128 or 256"),
    (((1, 4, 8, 64), (1, 4, 8, 64), (1, 4, 8, 64)), torch.float32, "f16 or bf16"),
    (((1, 4, 0, 64), (1, 4, 8, 64), (1, 4, 8, 64)), torch.float16, "non-empty"),
])
def test_ops_attention_rejects(shapes, dtype, message):
    with pytest.raises(newtc.NkError, match=re.escape(message)):
        ops.attention(*(torch.randn(s).to(dtype) for s in shapes))
