"""Run the newt benchmarks against Triton and torch in one process and print one table each.

    python bench/run.py [--only add,launch,firstcall,norms,sweep] [--quick]

The sweep (every row op on widths x rows x dtypes, bench_sweep.py) runs only when --only names it: it
takes minutes. With $OUT set, also writes $OUT/bench.md (the tables), $OUT/bench.json (the raw rows) and
$OUT/ratios.png (newt/Triton per kernel), and the sweep's own files (see bench_sweep.py)."""
import argparse
import datetime
import importlib
import math
import os
import subprocess

import common
from common import Table, failure

BENCHES = {"add": "bench_add", "norms": "bench_norms", "launch": "bench_launch", "firstcall": "bench_firstcall",
           "sweep": "bench_sweep"}
DEFAULT = ("add", "norms", "launch", "firstcall")


def header() -> str:
    import torch
    import newtc.jit
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=common.ROOT, capture_output=True, text=True)
    # the device machine's copy of the tree may carry a stale .git: NEWT_COMMIT, when set, names the commit
    commit = os.environ.get("NEWT_COMMIT") or git.stdout.strip() or "none"
    return (f"{datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"Triton {triton_version}, commit {commit}, newt compiler {newtc.jit.VERSION}")


def summary(tables: list[Table]) -> Table:
    """Every row's newt/Triton speed ratio, and their geometric mean."""
    rows = [{"kernel": r["kernel"], "shape": r["shape"], "newt/Triton": r["newt/Triton"]}
            for t in tables for r in t.rows if "newt/Triton" in r]
    ok = [r["newt/Triton"] for r in rows if isinstance(r["newt/Triton"], float)]
    if ok:
        rows.append({"kernel": "geometric mean", "shape": f"{len(ok)} rows",
                     "newt/Triton": math.exp(sum(map(math.log, ok)) / len(ok))})
    return Table("summary: newt/Triton", rows, "newt/Triton = Triton's time over newt's: above 1, newt is faster.")


def plot(rows: list[dict], path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: ratios.png skipped)")
        return
    rows = [r for r in rows if isinstance(r["newt/Triton"], float) and r["kernel"] != "geometric mean"]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ax.barh([f'{r["kernel"]} {r["shape"]}' for r in rows], [r["newt/Triton"] for r in rows])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("newt / Triton speed (above 1: newt faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(DEFAULT), help=f"comma-separated subset of {','.join(BENCHES)} "
                   f"(default {','.join(DEFAULT)})")
    p.add_argument("--quick", action="store_true", help="fewer timed runs and processes")
    args = p.parse_args()
    only = args.only.split(",")
    if unknown := set(only) - set(BENCHES):
        p.error(f"unknown benchmark {', '.join(sorted(unknown))}; choose from {','.join(BENCHES)}")
    if not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        return

    head = header()
    print(head + "\n", flush=True)
    tables = []
    for name in BENCHES:  # a fixed order: the in-process benchmarks first, the subprocesses last
        if name not in only:
            continue
        try:
            new = importlib.import_module(BENCHES[name]).run(args.quick)
        except Exception as e:  # a benchmark that breaks outright still leaves the others' tables
            new = [Table(name, [{"kernel": name, "error": failure(e)}])]
        for t in new:
            print(t.markdown() + "\n", flush=True)
        tables += new
    tables.append(summary(tables))
    print(tables[-1].markdown())
    common.write("bench.md", "\n\n".join([head] + [t.markdown() for t in tables]) + "\n")
    common.write("bench.json", {"header": head, "tables": [t.__dict__ for t in tables]})
    if png := common.out_path("ratios.png"):
        plot(tables[-1].rows, png)


if __name__ == "__main__":
    main()
