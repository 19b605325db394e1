"""The row model replayed over measured sweeps, without a GPU: how would `newtc.ops.plan` as it is now have done?

    python bench/replay_rows.py A/sweep.json B/sweep.json ... [--unmeasured] [--write FILE.json]
                                [--below R --neighbours K]
    python bench/replay_rows.py bench/data/sweep-*-graph-*.json.gz    # the graph sweeps so far, oldest first

Each sweep.json (bench_sweep.py; gzipped in bench/data) records, per point, the plan newt ran (`plan`), its time, the
better of Triton and torch, and with --plans the times of other plans (`plans`). For every point, the plan the model
picks now is looked up among the sweeps that ran that plan (the last one given that did: kernels change between sweeps
under the same plan names, as layer norm f16 over rows of 11008 did, 1.12x faster after the twenty-second session's
f16 conversion, so list the sweeps oldest first), and set against the better of Triton and torch averaged over all the
sweeps of the point (a single run's others move 3-7% on launches of a few microseconds). Reports the geometric mean of
newt/best and the points under 0.95 over the points whose plan some sweep measured, per op; --unmeasured lists the
others (the points to measure next), and --write saves them with their plans for `bench_sweep.py --only FILE.json`
(with --below R and --neighbours K, also the measured points under R, each to be timed with K of its plan's
neighbours: where the model might do better). The sweeps' GPU is taken to be an H200 (the plans of meta tensors:
newtc.gpu.Gpu's defaults). A point's sweeps must have timed it the same way (`timing`: a graph of launches, or flushed
runs; sweeps before graphs were all flushed).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import bench_sweep as bs
from common import Table


def replay(paths: list[str]) -> tuple[list[dict], list[tuple]]:
    import torch
    runs: dict = defaultdict(list)
    for path in paths:
        text = gzip.decompress(Path(path).read_bytes()) if path.endswith(".gz") else Path(path).read_bytes()
        for r in json.loads(text):
            if "plan" in r and isinstance(r["newt/best"], float):
                runs[r["op"], r["dtype"], r["rows"], r["width"]].append(r)
    points, unmeasured = [], []
    for key, rs in runs.items():
        op, dtype, rows, width = key
        if len({r.get("timing", "flushed") for r in rs}) > 1:  # graphs and flushed runs time different things
            raise SystemExit(f"{key}: the sweeps timed this point in different ways; replay sweeps of one method")
        (plan, model), = bs.model_plans(op, torch.empty((rows, width), dtype=bs.torch_dtype(dtype), device="meta"))
        times = [r["newt us"] if r["plan"] == plan else r.get("plans", {}).get(plan) for r in rs]
        times = [t for t in times if isinstance(t, float)]
        other = statistics.fmean(r["newt us"] * r["newt/best"] for r in rs)  # the better of Triton and torch, us
        if not times:  # with the best ratio any plan reached there: the points likeliest to miss come first
            best = max(other / t for r in rs for t in [r["newt us"], *r.get("plans", {}).values()]
                       if isinstance(t, float))
            unmeasured.append((best, (*key, plan, model)))
            continue
        points.append({"op": key[0], "key": key, "ratio": other / times[-1]})
    return points, [u for _, u in sorted(unmeasured, key=lambda u: u[0])]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="+", metavar="sweep.json[.gz]")
    p.add_argument("--unmeasured", action="store_true", help="list the points whose plan no sweep ran")
    p.add_argument("--write", metavar="FILE.json", help="save the points whose plan no sweep ran, with that plan, "
                   "for bench_sweep.py --only")
    p.add_argument("--below", type=float, default=0.0, metavar="R", help="with --write and --neighbours: also the "
                   "measured points under R")
    p.add_argument("--neighbours", type=int, default=0, metavar="K", help="with --below: K neighbours of the "
                   "model's plan to time at each of those points")
    args = p.parse_args()
    points, unmeasured = replay(args.sweeps)
    rows = []
    for op in [*bs.OPS, None]:
        ratios = [x["ratio"] for x in points if op is None or x["op"] == op]
        if ratios:
            rows.append({"op": op or "all", "points measured": len(ratios),
                         "geomean newt/best": math.exp(statistics.fmean(map(math.log, ratios))),
                         "min": min(ratios), "points < 0.95": sum(x < 0.95 for x in ratios)})
    print(Table("the row model replayed over measured plans", rows,
                f"{len(unmeasured)} points ran other plans than the model's now").markdown())
    for u in unmeasured if args.unmeasured else ():
        print(*u[:-1])
    if args.write:
        low = [x["key"] for x in sorted(points, key=lambda x: x["ratio"]) if x["ratio"] < args.below] \
            if args.neighbours else []  # first, as the likeliest to miss
        Path(args.write).write_text(json.dumps([bs.listing(key, [], args.neighbours) for key in low] +
                                               [bs.listing(u[:4], [u[4:]]) for u in unmeasured], indent=1) + "\n")
        print(f"{args.write}: {len(unmeasured)} points to measure, {len(low)} to search with {args.neighbours} "
              "neighbours")


if __name__ == "__main__":
    main()
