"""Row ops on chosen shapes: the launch model's plan against forced alternatives, Triton and torch, as % of copy.

    python bench/rows_check.py [--quick] [op:dtype:ROWSxCOLS ...]

With no points, the sweep's weak ones (bench/RESULTS.md) and their neighbours: shapes of at most a program
per SM (bound by latency), and many long rows (the norms' moment pass). For each point: the model's plan
(`newtc.ops.plan`), the other whole-row warps and rows per program of its block, looped plans of 4-32 warps
and 8 or 16 elements a step, split plans of 4-16 warps and a few chunk counts, one wave and more (up to 1024
rows), then Triton's best and torch. All are run and checked against torch in f32 first, then the right ones
timed in rounds of rotated order, as in the sweep (bench_sweep.timed: small points as CUDA graphs, large ones flushed).
With $OUT set: rows_check.md and rows_check.json.
"""
from __future__ import annotations

import argparse
import itertools
import json

import bench_sweep as bs
import common
from common import Table, copy_gbps

POINTS = ["layernorm:f32:1x5120", "softmax:f16:128x128", "softmax:f32:1x32768", "softmax:f16:1x128",  # latency
          "softmax:f32:128x4096", "layernorm:f16:8x8192", "cross_entropy:bf16:1x16384", "rmsnorm:bf16:128x5120",
          "layernorm:f16:4096x262144", "rmsnorm:f16:4096x262144", "layernorm:bf16:1024x65536",  # many long rows
          "layernorm:f32:4096x50257", "layernorm:f32:8x262144"]


def alternatives(ops, op: str, m: int, n: int, s: int) -> list:
    """(name, plan): the model's plan first, then forced ones (those the kernels cannot take fail when run)."""
    model = ops.plan(op, m, n, s, False, ops.gpu(0), True)
    plans = []
    if model.kind == "rows":
        grouped = sorted({1, model.rows, max(1, ops.PROGRAM_BYTES // (n * s))})
        for (block, tail), rows in itertools.product(ops._covers(n), grouped):
            plans += [q for w in (1, 2, 4, 8, 16, 32)
                      if bs.fits(q := ops.Plan("rows", block, w, rows=rows, tail=tail), m, s)]
    for warps in (4, 8, 16, 32):
        for elems in (8, 16):  # per thread in each block of the loop
            plans.append(ops.Plan("looped", elems * 32 * warps, warps))
    for warps in (4, 8, 16) if m <= 1024 else ():
        block = ops.LOOP_ELEMS * 32 * warps
        for parts in (2, 4, 8, 32):
            chunk = ops._cdiv(ops._cdiv(n, parts), block) * block
            if ops._cdiv(n, chunk) >= 2:
                plans.append(ops.Plan("split", block, warps, parts=ops._cdiv(n, chunk), chunk=chunk))
    out = [(f"model {bs.plan_name(model)}", model)] + [(bs.plan_name(p), p) for p in plans]
    return list(dict(out).items())  # one of each name


def run(points: list[str], quick: bool) -> list[Table]:
    import torch
    from newtc import ops
    copy = copy_gbps(quick)
    cases, tk = bs.cases(torch)
    tables, log = [], []
    real = ops.plan, ops._fast
    for point in points:
        op, dt, shape = point.split(":")
        m, n = map(int, shape.split("x"))
        case = cases[op]
        torch.manual_seed(m * 7919 + n)
        args = case.make(m, n, bs.torch_dtype(dt))
        ref = case.reference(*args)
        moved = case.nbytes(m, n, bs.SIZE[dt])
        impls = {name: [bs.forced(ops, p, case.newt)]
                 for name, p in alternatives(ops, {"layernorm": "norm"}.get(op, op), m, n, bs.SIZE[dt])}
        impls |= {name: fns for name, fns in case.impls(n, tk).items() if name != "newt"}
        try:
            results = bs.timed(impls, args, ref, bs.TOL[dt], quick)
        finally:
            ops.plan, ops._fast = real
        del args, ref
        torch.cuda.empty_cache()
        rows = [{"launch": k, "us": t * 1e3 if isinstance(t, float) else t,
                 "% copy": 100 * moved / t / 1e6 / copy if isinstance(t, float) else t} for k, t in results.items()]
        tables.append(Table(f"{point} (copy {copy:.0f} GB/s)", rows))
        log.append({"point": point, "results": rows})
        print(tables[-1].markdown() + "\n", flush=True)
    common.write("rows_check.md", "\n\n".join(t.markdown() for t in tables) + "\n")
    common.write("rows_check.json", json.dumps(log, indent=1, default=str))
    return tables


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer timed runs")
    p.add_argument("points", nargs="*", default=POINTS, help="op:dtype:ROWSxCOLS (op: softmax, layernorm, "
                   "rmsnorm, cross_entropy; dtype: f32, f16, bf16)")
    args = p.parse_args()
    if not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        return
    run(args.points, args.quick)


if __name__ == "__main__":
    main()
