"""stdlib/attention.nk, the forward pass, against torch's math attention: the interpreter on small shapes, the
GPU (marker gpu) on the shapes people run, odd lengths, causal, GQA, head dims 64 and 128. O and the
log-sum-exp start as NaN."""
import math

import pytest
import torch

import newtc
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


def reference(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:  # aligned to the end, as flash attention does when the lengths differ
        lq, lk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril(lk - lq), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


CASES = {  # (B, H, H_kv, L_q, L_k, D, causal, (BM, BN, warps, stages))
    "cpu": [(1, 2, 1, 17, 100, 64, False, (32, 32, 4, 1)), (1, 2, 2, 70, 70, 64, True, (64, 32, 4, 2)),
            (1, 4, 2, 33, 129, 128, False, (32, 64, 4, 2))],
    "cuda": [(2, 4, 4, 1000, 1000, 64, False, (128, 64, 8, 3)), (1, 8, 2, 4097, 4097, 128, True, (128, 64, 8, 2)),
             (2, 2, 1, 1, 333, 64, False, (64, 64, 4, 3)), (1, 4, 4, 17, 1024, 128, True, (128, 64, 8, 2)),
             (1, 4, 4, 1000, 1000, 64, True, (64, 64, 4, 3))],
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
        assert (lse.double() - lse_ref).abs().max().item() < 1e-3
