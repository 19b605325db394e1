"""The row model replayed over measured sweeps, without a GPU: how would `newtc.ops.plan` as it is now have done?

    python bench/replay_rows.py A/sweep.json B/sweep.json ... [--unmeasured]
    python bench/replay_rows.py bench/data/sweep-*.json.gz    # the full sweeps measured so far

Each sweep.json (bench_sweep.py; gzipped in bench/data) records, per point, the plan newt ran (`plan`), its time,
the better of Triton and torch, and with --plans the times of other plans (`plans`). For every point, the plan the
model picks now is looked up among the sweeps that ran that plan (their times averaged), and set against the
better of Triton and torch averaged over all the sweeps of the point (a single run's others move 3-7% on launches
of a few microseconds). Reports the geometric mean of newt/best and the points under 0.95 over the points whose
plan some sweep measured, per op; --unmeasured lists the others (the points to measure next). The sweeps' GPU is
taken to be an H200 (the plans of meta tensors: newtc.gpu.Gpu's defaults). A point's sweeps must have timed it
the same way (`timing`: a graph of launches, or flushed runs; sweeps before graphs were all flushed).
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
        plan = bs.model_plan(op, torch.empty((rows, width), dtype=bs.torch_dtype(dtype), device="meta"))
        times = [r["newt us"] if r["plan"] == plan else r.get("plans", {}).get(plan) for r in rs]
        times = [t for t in times if isinstance(t, float)]
        if not times:
            unmeasured.append((*key, plan))
            continue
        other = statistics.fmean(r["newt us"] * r["newt/best"] for r in rs)  # the better of Triton and torch, us
        points.append({"op": key[0], "ratio": other / statistics.fmean(times)})
    return points, unmeasured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweeps", nargs="+", metavar="sweep.json[.gz]")
    p.add_argument("--unmeasured", action="store_true", help="list the points whose plan no sweep ran")
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
        print(*u)


if __name__ == "__main__":
    main()
