"""Flash attention, forward and backward: newt (stdlib/attention.nk through newtc.ops) against torch's
scaled_dot_product_attention (flash and cuDNN backends) and a Triton fused-attention pair in the style of
Triton's tutorial 06 (bench/triton_kernels.py, autotuned), f16, TFLOP/s. Forward FLOPs: 4 * B * H * L^2 * D;
backward: 2.5x the forward's (FlashAttention's count); both halved when causal.

    python bench/bench_attention.py [--quick]
"""
from __future__ import annotations

import math
import sys

import common
from common import Table, Wrong, check_close, failure, measure_all, ratio

CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (8, 16, 4096, 64, False)]


def close_grads(got, want, tol: float = 2e-2) -> None:
    """Each gradient's relative (Frobenius) error under tol: elementwise bounds suit gradients poorly, whose
    entries span orders of magnitude."""
    for name, x, r in zip(("dq", "dk", "dv"), got, want):
        err = ((x.float() - r.float()).norm() / r.float().norm()).item()
        if not err < tol:
            raise Wrong(f"{name}: relative error {err:.2g}")


def run(quick: bool):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from newtc import ops
    try:
        import triton_kernels as tk
    except ImportError as e:  # no Triton: its columns say so
        tk, missing = None, failure(e)
    fwd_rows, bwd_rows = [], []
    for b, h, n, d, causal in CASES:
        q, k, v, g = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(4))
        scale = 1 / math.sqrt(d)
        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref_out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        ref = ref_out.detach().float()

        def sdpa_backward():  # the flash backend's backward kernel, recorded with ref_out
            return torch.autograd.grad(ref_out, (qr, kr, vr), g, retain_graph=True)
        ref_grads = sdpa_backward()

        def sdpa(backend):
            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return fn

        o, lse = ops._attention_forward(q, k, v, causal, scale)
        fwd = {"newt": lambda: ops._attention_forward(q, k, v, causal, scale)[0],
               "flash": sdpa(SDPBackend.FLASH_ATTENTION), "cuDNN": sdpa(SDPBackend.CUDNN_ATTENTION)}
        bwd = {"newt": lambda: ops._attention_backward(g, q, k, v, o, lse, causal, scale), "flash": sdpa_backward}
        without = missing if tk is None else "-"
        if tk is not None:
            try:
                o_t, lse_t = tk.attention_forward(q, k, v, causal, scale)
                fwd["Triton"] = lambda: tk.attention_forward(q, k, v, causal, scale)[0]
                bwd["Triton"] = lambda: tk.attention_backward(g, q, k, v, o_t, lse_t, causal, scale)
            except AssertionError as e:  # a case its kernels do not take (lengths not multiples of 128): say so
                without = failure(e)
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        label = f"B{b} H{h} L{n} D{d}" + (" causal" if causal else "")
        for rows, fns, check, work in ((fwd_rows, fwd, lambda out: check_close(out.float(), ref, 2e-2, 2e-2), flops),
                                       (bwd_rows, bwd, lambda out: close_grads(out, ref_grads), 2.5 * flops)):
            times = measure_all(fns, check, quick)
            times.setdefault("Triton", without)
            times.setdefault("cuDNN", "-")
            row = {"case": label, **{f"{name} TFLOP/s": work / t / 1e9 if isinstance(t, float) else t
                                     for name, t in times.items()}}
            row.update({"newt/flash": ratio(times["flash"], times["newt"]),
                        "newt/Triton": ratio(times["Triton"], times["newt"])})
            if rows is fwd_rows:
                row["newt/cuDNN"] = ratio(times["cuDNN"], times["newt"])
            else:
                del row["cuDNN TFLOP/s"]
            rows.append(row)
            print(row, flush=True)
    yield Table("attention forward, f16 (ratios are speed: above 1, newt is faster)", fwd_rows)
    yield Table("attention backward (dQ, dK, dV from O and the log-sum-exp), f16", bwd_rows)


if __name__ == "__main__":
    if not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        sys.exit(0)
    tables = list(run("--quick" in sys.argv))
    for t in tables:
        print(t.markdown() + "\n")
    common.write("attention.md", "\n\n".join(t.markdown() for t in tables))
