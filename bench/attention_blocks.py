"""Times each flash-attention kernel of stdlib/attention.nk alone over block sizes, warps and stages: how
`newtc.ops._attention_blocks` was chosen (bench/RESULTS.md). f16, newt only; prints the six fastest configs per
kernel and case beside the one ops picks. Kernels compile in parallel threads first, then run one at a time,
interleaved in rounds (`common.measure_all`).

    python bench/attention_blocks.py [fwd,dq,dkdv] [causal|full]
"""
import itertools
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import common

CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (8, 16, 4096, 64, False)]
SMEM = 220000  # bytes: configs whose tiles clearly overflow shared memory are not tried


def run(kinds, only: str | None = None):
    import torch
    from newtc import driver, ops
    mod, arch, strides = ops._stdlib("attention"), driver.arch(0), ops._strides
    for b, h, n, d, causal in CASES:
        if only is not None and causal != (only == "causal"):
            continue
        q, k, v, g = (torch.randn(b, h, n, d, device="cuda", dtype=torch.half) for _ in range(4))
        scale = 1 / math.sqrt(d)
        o, lse = ops._attention_forward(q, k, v, causal, scale)
        delta, dq, dk, dv = (o.float() * g.float()).sum(-1), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        flops = 4 * b * h * n * n * d / (2 if causal else 1)  # the forward's two matmuls

        def launch(kind, c):
            """(kernel, grid, args, meta, FLOPs): dQ does 3 of the forward's matmuls per block pair, dK/dV 4."""
            meta = dict(CAUSAL=causal, **c)
            if kind == "fwd":
                out, ls = torch.empty_like(q), torch.empty_like(lse)
                return mod.attention_fwd, (-(-n // c["BM"]), b * h), (q, k, v, out, ls, n, n, h, h, scale,
                                                                       *strides(q, k, v, out)), meta, flops
            if kind == "dkdv":
                return mod.attention_bwd_dkdv, (-(-n // c["BN"]), b * h), (q, k, v, g, lse, delta, dk, dv, n, n, h, h,
                                                                           scale, *strides(q, k, v, g, dk, dv)), meta, 2 * flops
            return mod.attention_bwd_dq, (-(-n // c["BM"]), b * h), (q, k, v, o, g, lse, delta, dq, n, n, h, h, scale,
                                                                      *strides(q, k, v, o, g, dq)), meta, 1.5 * flops

        for kind in kinds:
            base = ops._attention_blocks(d, n, n, kind, arch)
            held, streamed = ("BN", "BM") if kind == "dkdv" else ("BM", "BN")
            configs = [dict(base, **{held: hb, streamed: sb}, num_warps=w, num_stages=s)
                       for hb, sb, w, s in itertools.product((64, 128), (16, 32, 64, 128), (4, 8), (2, 3, 4))
                       if sb * d * 4 * s * (1 if kind == "fwd" else 2) + hb * d * 4 <= SMEM]
            begin = time.time()

            def compile_one(c):
                kernel, _, args, meta, _ = launch(kind, c)
                try:
                    kernel.binary(args, meta, arch)
                    return True
                except Exception:  # noqa: BLE001 - a config that does not compile is left out
                    return False
            with ThreadPoolExecutor(16) as pool:
                ok = list(pool.map(compile_one, configs))
            print(f"# {kind} B{b} H{h} L{n} D{d}{' causal' if causal else ''}: {sum(ok)} of {len(configs)} configs "
                  f"compiled in {time.time() - begin:.0f} s", flush=True)
            good = [c for c, compiled in zip(configs, ok) if compiled]
            runs = [launch(kind, c) for c in good]
            fns = {i: lambda k=k, grid=grid, args=args, meta=meta: k[grid](*args, **meta)
                   for i, (k, grid, args, meta, _) in enumerate(runs)}
            times = common.measure_all(fns, lambda out: None, quick=True)
            results = [(runs[i][4] / ms / 1e9, good[i]) for i, ms in times.items() if isinstance(ms, float)]
            results.sort(key=lambda r: -r[0])
            for tf, c in results[:6] + [r for r in results if r[1] == base]:
                print(f"  {tf:6.1f} TFLOP/s  {'(ops) ' if c == base else ''}{c}", flush=True)


if __name__ == "__main__":
    run((sys.argv[1] if len(sys.argv) > 1 else "fwd,dq,dkdv").split(","), sys.argv[2] if len(sys.argv) > 2 else None)
