"""Flash attention forward: newt (stdlib/attention.nk) against torch's scaled_dot_product_attention with the
flash and cuDNN backends, f16, TFLOP/s (4 * B * H * L^2 * D, halved when causal).

    python bench/bench_attention.py [--quick]
"""
from __future__ import annotations

import math
import sys

import common
from common import Table, bench, check_close, failure, ratio

CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (8, 16, 4096, 64, False)]
CONFIG = {128: (128, 64, 8, 2), 64: (128, 64, 8, 3)}  # D -> BM, BN, warps, stages


def run(quick: bool):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from newtc import ops
    mod = ops._stdlib("attention")
    rows = []
    for b, h, n, d, causal in CASES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(b, h, n, device="cuda")
        bm, bn, warps, stages = CONFIG[d]

        def newt():
            mod.attention_fwd[(-(-n // bm), b * h)](q, k, v, o, lse, n, n, h, h, 1 / math.sqrt(d), *q.stride()[:3],
                                                    *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], BM=bm, BN=bn,
                                                    D=d, CAUSAL=causal, num_warps=warps, num_stages=stages)
            return o
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        times = {}
        for name, fn in (("newt", newt), ("flash", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            try:
                if not callable(fn):
                    backend = fn

                    def fn(backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                check_close(fn().float(), ref, rtol=2e-2, atol=2e-2)
                times[name] = bench(fn, quick)
            except Exception as e:  # one missing backend must not hide the rest
                times[name] = failure(e)
        tf = {name: flops / t / 1e9 if isinstance(t, float) else t for name, t in times.items()}
        rows.append({"case": f"B{b} H{h} L{n} D{d}" + (" causal" if causal else ""), "newt TFLOP/s": tf["newt"],
                     "flash TFLOP/s": tf["flash"], "cuDNN TFLOP/s": tf["cuDNN"],
                     "newt/flash": ratio(times["flash"], times["newt"]), "newt/cuDNN": ratio(times["cuDNN"], times["newt"])})
        print(rows[-1], flush=True)
    yield Table("attention forward, f16 (ratios are speed: above 1, newt is faster)", rows)


if __name__ == "__main__":
    if not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        sys.exit(0)
    for t in run("--quick" in sys.argv):
        print(t.markdown() + "\n")
        common.write("attention.md", t.markdown())
