"""The row-op sweep: softmax, layernorm, rmsnorm and cross-entropy on every width x rows x dtype, newt
(newtc.ops as shipped) against Triton's best and torch, as % of the copy bandwidth.

    python bench/bench_sweep.py [--quick] [--ops softmax,layernorm] [--dtypes f32,bf16] [--widths 1000,4096]
                                [--rows 1,4096] [--plans K] [--append bench/RESULTS.md]
    python bench/bench_sweep.py --merge A/sweep.json B/sweep.json [--append bench/RESULTS.md]
    python bench/bench_sweep.py --only FILE.json [--plans K]

Triton's best is the fastest of a few configurations per point: one row per program in a single block
(num_warps 1-32 around the tutorial's rule) where the row fits one block of at most 32768 elements, and
its looped online form (blocks of 4096 and 8192) for rows above 4096. At each point, every candidate
(newt, each Triton configuration, torch) is run once and its result checked against torch in f32; a wrong
one is not timed. Then the right ones are timed in rounds (2 with --quick, else 3), each round in an order
rotated by one, so that none is always timed first (after the compiles' CPU gap, when the GPU's clocks
may have fallen). A candidate's time is the least of its rounds' medians; an implementation's time is its
best candidate's. Points with under GRAPHED bytes of input are timed as a CUDA graph of a launch per copy of
the input (at least 32), at least ROTATE bytes of copies where that takes at most 256 of them
(common.graph_bench: GPU time back to back, inputs of a MB and more not in L2); larger ones by do_bench with
L2 flushed before each run (the flush also hides the host's launch cost, so both are GPU times). Flushed
runs of launches of a few microseconds move by up to 2x between kernels that do the same work.

With --plans K, each point also times K - 1 plans next to the model's (bench_sweep.neighbours), and records them,
so that bench/replay_rows.py can judge other models over them without a GPU. Every newt plan runs forced (`forced`),
the model's own included, so that what is recorded under a plan's name is what ran. With --only FILE.json (written by
`replay_rows.py --write`), the sweep measures exactly the points listed there, each with the plans listed for it
(by their fields: plans the model at hand may no longer pick) besides the model's own and its neighbours.

The full sweep takes more than one 10-minute call: run it in chunks (--ops, --dtypes, --widths, --rows),
each with its own $OUT, then --merge their sweep.json files (no GPU needed).
With $OUT set: sweep.md (the summary, ready for RESULTS.md), sweep_points.md (every point), sweep.json
and sweep.png (a heat map per op and dtype: width x rows colored by newt / the better of Triton and torch).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import common
from common import Table, copy_gbps, failure

WIDTHS = [64, 128, 512, 768, 1000, 1024, 3000, 4096, 5120, 8192, 11008, 16384, 32768, 50257, 65536, 128256, 262144]
ROWS = [1, 8, 128, 1024, 4096, 32768]
QUICK_WIDTHS = [128, 1000, 5120, 32768, 50257, 262144]
QUICK_ROWS = [1, 128, 4096]
DTYPES = ("f32", "f16", "bf16")
OPS = ("softmax", "layernorm", "rmsnorm", "cross_entropy")
MAX_INPUT = 2**31  # bytes of input per point
SIZE = {"f32": 4, "f16": 2, "bf16": 2}
MAX_SINGLE_BLOCK = 32768  # Triton's one-block rows: beyond, its registers spill
GRAPHED = 128 << 20  # bytes of input under which a point is timed as a graph of launches
ROTATE = 256 << 20  # bytes of input copies the graph cycles through
TOL = {"f32": 1e-4, "f16": 2e-2, "bf16": 2e-2}  # relative error (norm) against torch in f32


def single_block_warps(block: int) -> tuple:
    """num_warps for Triton's one-block rows: the tutorial's choice and its neighbours."""
    w = min(16, max(1, block // 512))
    return tuple(sorted({max(1, w // 2), w, min(32, 2 * w)}))


def pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass
class Case:
    """One op: its inputs, its f32 reference, the bytes it must move, and its three implementations.
    triton(warps, block) is Triton's kernel with `block` columns per step (the whole row, or a loop)."""
    make: Callable  # (rows, width, torch dtype) -> args
    reference: Callable
    nbytes: Callable  # (rows, width, itemsize) -> bytes read + written
    newt: Callable
    torch: Callable
    triton: Callable

    def impls(self, n: int, tk) -> dict:
        """{name: [candidates]}; Triton's are its one-block rows (where they fit) and its looped form."""
        single = [self.triton(w, pow2(n)) for w in single_block_warps(pow2(n))] if pow2(n) <= MAX_SINGLE_BLOCK else []
        looped = [self.triton(w, b) for b, w in ((4096, 8), (8192, 16))] if n > 4096 else []
        return {"newt": [self.newt], "Triton": tk if isinstance(tk, str) else single + looped, "torch": [self.torch]}


def cases(torch) -> tuple[dict, object]:
    """The four ops, and the Triton kernels module (or why it cannot load)."""
    import newtc
    F = torch.nn.functional
    try:
        import triton_kernels as tk
    except Exception as e:  # no Triton: its column shows why
        tk = failure(e)

    def norm_inputs(m, n, dt):
        return (torch.randn(m, n, device="cuda", dtype=dt), torch.rand(n, device="cuda", dtype=dt) + 0.5,
                torch.randn(n, device="cuda", dtype=dt))

    def rms_inputs(m, n, dt):
        return norm_inputs(m, n, dt)[:2]

    return {
        "softmax": Case(
            lambda m, n, dt: (torch.randn(m, n, device="cuda", dtype=dt) * 3,),
            lambda x: torch.softmax(x.float(), -1), lambda m, n, s: 2 * m * n * s,
            newtc.ops.softmax, lambda x: torch.softmax(x, -1),
            lambda w, b: lambda x: tk.softmax(x, num_warps=w, block=None if b >= x.shape[1] else b)),
        "layernorm": Case(
            norm_inputs, lambda x, w, b: F.layer_norm(x.float(), x.shape[-1:], w.float(), b.float(), 1e-5),
            lambda m, n, s: 2 * m * n * s + 2 * n * s,
            lambda x, w, b: newtc.ops.layernorm(x, w, b, 1e-5), lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5),
            lambda nw, bl: lambda x, w, b: tk.layernorm(x, w, b, 1e-5, num_warps=nw, block=bl)),
        "rmsnorm": Case(
            rms_inputs, lambda x, w: F.rms_norm(x.float(), x.shape[-1:], w.float(), 1e-6),
            lambda m, n, s: 2 * m * n * s + n * s,
            lambda x, w: newtc.ops.rmsnorm(x, w, 1e-6), lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6),
            lambda nw, bl: lambda x, w: tk.rmsnorm(x, w, 1e-6, num_warps=nw, block=bl)),
        "cross_entropy": Case(
            lambda m, n, dt: (torch.randn(m, n, device="cuda", dtype=dt) * 4, torch.randint(0, n, (m,), device="cuda")),
            lambda x, t: F.cross_entropy(x.float(), t, reduction="none"), lambda m, n, s: m * n * s + 12 * m,
            newtc.ops.cross_entropy, lambda x, t: F.cross_entropy(x, t, reduction="none"),
            lambda w, b: lambda x, t: tk.cross_entropy(x, t, w, b)),
    }, tk


def check(fn, args, ref, tol: float) -> str | None:
    """Run fn(*args) once (newt compiles on its first run) against the f32 reference: None if right, else a
    failure cell."""
    import torch
    try:
        out = fn(*args)
        err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-12))
        if not err < tol or not bool(torch.isfinite(out).all()):
            return f"wrong: relative error {err:.2g}"
    except Exception as e:
        return failure(e)
    return None


def graphed(args) -> bool:
    """Whether a point with these inputs is timed as a graph of launches (else by do_bench, flushed)."""
    return input_bytes(args) < GRAPHED


def input_bytes(args) -> int:
    return sum(a.numel() * a.element_size() for a in args)


def argsets(args) -> list | None:
    """Copies of a point's inputs for common.graph_bench, or None where the point is large enough for do_bench."""
    if not graphed(args):
        return None
    return [args] + [tuple(a.clone() for a in args) for _ in range(min(255, -(-ROTATE // input_bytes(args)) - 1))]


def timed(impls: dict, args, ref, tol: float, quick: bool) -> dict:
    """{name: [candidates] or a failure cell} -> {name: median ms of its best candidate, or a failure cell}:
    all candidates checked first, then the right ones timed in rounds of rotated order, each keeping its best."""
    from triton.testing import do_bench
    rounds, warmup, rep = (2, 1, 4) if quick else (3, 2, 8)  # warmup, rep: ms of runs per round, as do_bench counts
    fns = [f for fs in impls.values() if not isinstance(fs, str) for f in fs]
    ms = [check(f, args, ref, tol) or math.inf for f in fns]
    ok = [i for i, t in enumerate(ms) if t == math.inf]
    copies = argsets(args)
    for i in common.interleaved(ok, rounds):
        if isinstance(ms[i], float):  # not failed in an earlier round
            try:
                ms[i] = min(ms[i], common.graph_bench(fns[i], copies) if copies else
                            do_bench(lambda: fns[i](*args), warmup=warmup, rep=rep, return_mode="median"))
            except Exception as e:
                ms[i] = failure(e)
    times = iter(ms)
    return {name: fs if isinstance(fs, str) else best([next(times) for _ in fs]) for name, fs in impls.items()}


def torch_dtype(name: str):
    """The torch dtype of a sweep's dtype name (f32, f16, bf16)."""
    import torch
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def plan_name(p) -> str:
    """A row plan (newtc.ops.Plan) in a few characters, as rows_check names them."""
    cap = f" n{p.regs}" if p.regs else ""  # a register cap
    return {"rows": f"rows b{p.block}+{p.tail} r{p.rows} w{p.warps}{cap}", "split": f"split w{p.warps} p{p.parts}",
            "looped": f"looped w{p.warps} e{p.block // (32 * p.warps)}"}[p.kind]


def model_plans(op: str, x, k: int = 1) -> list[tuple]:
    """(name, plan): the plan newtc.ops takes for input x (`ops._configure`; a meta tensor plans for an H200), then
    up to k - 1 of its neighbours."""
    from newtc import ops
    kind = {"layernorm": "norm"}.get(op, op)
    model, meta = ops._configure(kind, x, x.stride(0))
    (rows, width), size = x.shape, x.element_size()
    args = (kind, rows, width, size, meta["SHIFT"], ops.gpu(x.get_device()))
    out = {plan_name(model): model}
    for p in neighbours(model, ops.candidates(*args), rows, width + (16 // size - 1 if meta["SHIFT"] else 0), size):
        if len(out) >= k:
            break
        out.setdefault(plan_name(p), p)
    return list(out.items())


def neighbours(p, candidates: list, rows: int, covered: int, size: int) -> list:
    """Plans one step from p, nearest first. Whole rows: one row, half and twice its rows (the warps scaled with
    them), half and twice its warps, the row's other cover. Loops: half and twice the warps, the other loop step.
    Then the model's fastest of each other kind. A split's chunks stay whole blocks that cover the row (its
    kernels take a chunk as a count of blocks, `Plan.blocks`, which would drop a part of a block)."""
    from dataclasses import replace

    from newtc import ops

    def warped(w: int):  # p on w warps: a loop keeps its elements per thread, a split's chunks stay whole blocks
        if p.kind == "rows":
            return replace(p, warps=w)
        block = p.block // p.warps * w
        if p.kind == "looped":
            return replace(p, warps=w, block=block)
        chunk = ops._cdiv(ops._cdiv(covered, p.parts), block) * block
        return replace(p, warps=w, block=block, chunk=chunk, parts=ops._cdiv(covered, chunk))
    step = p.block // (32 * p.warps)  # a loop's elements per thread
    near = [warped(w) for w in (p.warps // 2, p.warps * 2)]
    if p.kind == "rows":  # one row a program first: against rows grouped on many warps, the likeliest to win
        near[:0] = [replace(p, rows=r, warps=max(1, p.warps * r // p.rows)) for r in (1, p.rows // 2, p.rows * 2)]
        near += [replace(p, block=b, tail=t) for b, t in ops._covers(covered) if (b, t) != (p.block, p.tail)]
    elif p.kind == "looped":
        near.append(replace(p, block=(24 - step) * 32 * p.warps))  # 8 elements a thread for 16, 16 for 8
    kinds = {}
    for c in sorted(candidates, key=lambda c: c.seconds):
        kinds.setdefault(c.kind, c)
    return [q for q in near if fits(q, rows, size)] + [c for kind, c in kinds.items() if kind != p.kind]


def fits(q, rows: int, size: int) -> bool:
    """Whether the row kernels take plan q for `rows` rows of `size`-byte elements: 1-32 warps (loops: 4 up); a
    whole-row tile of at most a power of two over the rows, that gives every thread a vector and at most
    THREAD_BYTES, and a tail that gives every thread a vector too."""
    from newtc import ops
    tile = q.rows * (q.block + q.tail) * size
    return (1 if q.kind == "rows" else 4) <= q.warps <= 32 and (q.kind != "rows" or (
        1 <= q.rows <= ops._pow2(rows) and min(ops.VECTOR, tile // 32) <= tile // (32 * q.warps) <= ops.THREAD_BYTES
        and (not q.tail or q.rows * q.tail * size >= 32 * q.warps * ops.VECTOR)))


def forced(ops, plan, fn):
    """fn under `plan`, with its own bound launches (ops' fast path), so that the plans can run in any order."""
    fast = {}

    def call(*args):
        ops.plan, ops._fast = (lambda *a, **k: plan), fast
        return fn(*args)
    return call


def best(times: list) -> float | str:
    ok = [t for t in times if isinstance(t, float)]
    return min(ok) if ok else (times[0] if times else "-")


def points(ops, dtypes, widths, heights):
    for op in ops:
        for dt in dtypes:
            for n in widths:
                for m in heights:
                    if m * n * SIZE[dt] <= MAX_INPUT:
                        yield op, dt, m, n


def measure(quick: bool, todo: list, plans: int = 1, extra: dict | None = None) -> list[dict]:
    """Each point's row (todo: (op, dtype, rows, width) points); with plans > 1, plans - 1 of the model's plan's
    neighbours are timed too, and the plans `extra` lists for a point ({point: (K, [(name, Plan)])}: K plans as
    --plans counts them, and those), each recorded under `plans` by name, so that bench/replay_rows.py can replay other
    models over them. Every newt plan is forced, the model's own included: what runs is what is recorded."""
    import torch
    from newtc import ops as newt_ops
    extra = extra or {}
    print(f"sweep: {len(todo)} points", flush=True)
    copy = copy_gbps(quick)
    (all_cases, tk), rows, started = cases(torch), [], time.perf_counter()
    for op, dt, m, n in todo:
        case = all_cases[op]
        torch.manual_seed(m * 7919 + n)
        args = case.make(m, n, torch_dtype(dt))
        ref = case.reference(*args)
        impls = case.impls(n, tk)
        k, more = extra.get((op, dt, m, n), (plans, []))
        alternatives = dict(model_plans(op, args[0], k))
        alternatives |= {name: p for name, p in more if name not in alternatives}
        (plan, model), *others = alternatives.items()
        real = newt_ops.plan, newt_ops._fast
        impls["newt"] = [forced(newt_ops, model, case.newt)]  # forced too, so that none runs another's plan
        impls |= {f"plan {name}": [forced(newt_ops, p, case.newt)] for name, p in others}
        try:
            ms = timed(impls, args, ref, TOL[dt], quick)
        finally:
            newt_ops.plan, newt_ops._fast = real
        others = {name[5:]: t * 1e3 if isinstance(t, float) else t
                  for name, t in ms.items() if name.startswith("plan ")}
        timing = "graph" if graphed(args) else "flushed"
        del args, ref
        moved = case.nbytes(m, n, SIZE[dt])
        pct = {name: 100 * moved / t / 1e6 / copy if isinstance(t, float) else t for name, t in ms.items()}
        other = best([ms["Triton"], ms["torch"]])
        ratio = other / ms["newt"] if isinstance(other, float) and isinstance(ms["newt"], float) else "-"
        rows.append({"op": op, "dtype": dt, "rows": m, "width": n, "newt % copy": pct["newt"],
                     "Triton % copy": pct["Triton"], "torch % copy": pct["torch"], "newt/best": ratio,
                     "newt us": ms["newt"] * 1e3 if isinstance(ms["newt"], float) else ms["newt"], "plan": plan,
                     "timing": timing,
                     **({"plans": others} if others else {})})
        if len(rows) % 25 == 0:  # a chunk cut short by its call's time limit keeps what it measured
            print(f"  {len(rows)} points, {time.perf_counter() - started:.0f} s", flush=True)
            common.write("sweep.json", rows)
    return rows


def geomean(xs: list) -> float:
    return math.exp(statistics.fmean(map(math.log, xs))) if xs else float("nan")


def summary(rows: list[dict]) -> Table:
    out = []
    groups = sorted({(r["op"], r["dtype"]) for r in rows}, key=lambda g: (OPS.index(g[0]), DTYPES.index(g[1])))
    for key in [*groups, None]:
        sel = [r for r in rows if key is None or (r["op"], r["dtype"]) == key]
        ratios = [r["newt/best"] for r in sel if isinstance(r["newt/best"], float)]
        pct = [r["newt % copy"] for r in sel if isinstance(r["newt % copy"], float)]
        out.append({"op": key[0] if key else "all", "dtype": key[1] if key else "", "points": len(sel),
                    "timed": len(ratios), "geomean newt/best": geomean(ratios),
                    "min newt/best": min(ratios, default="-"), "points < 0.95": sum(x < 0.95 for x in ratios),
                    "median newt % copy": statistics.median(pct) if pct else "-"})
    return Table("sweep summary: newt / the better of Triton and torch", out,
                 "newt/best = the better time of Triton (best of its configurations) and torch over newt's: above 1, "
                 "newt is faster. Points: op x dtype x width x rows with at most 2 GiB of input.")


def worst(rows: list[dict], k: int = 12) -> Table:
    timed_rows = sorted((r for r in rows if isinstance(r["newt/best"], float)), key=lambda r: r["newt/best"])
    failed = [r for r in rows if not isinstance(r["newt/best"], float)]
    return Table(f"the {k} worst points (and any that failed)", [
        {"op": r["op"], "dtype": r["dtype"], "shape": f'{r["rows"]}x{r["width"]}', "newt/best": r["newt/best"],
         "newt % copy": r["newt % copy"], "Triton % copy": r["Triton % copy"], "torch % copy": r["torch % copy"]}
        for r in timed_rows[:k] + failed])


def plot(rows: list[dict], path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import LogNorm
    except ImportError:
        print("(no matplotlib: sweep.png skipped)")
        return
    ops = [o for o in OPS if any(r["op"] == o for r in rows)]
    dts = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    widths = sorted({r["width"] for r in rows})
    heights = sorted({r["rows"] for r in rows})
    fig, axes = plt.subplots(len(ops), len(dts), figsize=(5.5 * len(dts), 3.2 * len(ops) + 0.8), squeeze=False,
                             layout="constrained")
    for i, op in enumerate(ops):
        for j, dt in enumerate(dts):
            ax = axes[i][j]
            grid = [[float("nan")] * len(widths) for _ in heights]
            for r in rows:
                if r["op"] == op and r["dtype"] == dt and isinstance(r["newt/best"], float):
                    grid[heights.index(r["rows"])][widths.index(r["width"])] = r["newt/best"]
            im = ax.imshow(grid, cmap="RdYlGn", norm=LogNorm(0.5, 2.0), aspect="auto", origin="lower")
            for y, line in enumerate(grid):
                for x, v in enumerate(line):
                    if v == v:
                        ax.text(x, y, f"{v:.2f}", ha="center", va="center", fontsize=5)
            ax.set_xticks(range(len(widths)), [str(w) for w in widths], rotation=90, fontsize=6)
            ax.set_yticks(range(len(heights)), [str(h) for h in heights], fontsize=6)
            ax.set_title(f"{op} {dt}", fontsize=8)
    bar = fig.colorbar(im, ax=axes, shrink=0.6, label="newt / best of Triton and torch (above 1: newt faster)")
    bar.set_ticks([0.5, 0.7, 0.95, 1.05, 1.5, 2.0], labels=["0.5", "0.7", "0.95", "1.05", "1.5", "2"])
    bar.minorticks_off()
    fig.suptitle("row ops: newt / the better of Triton and torch, per width (x) and rows (y)")
    fig.savefig(path, dpi=130)


def run(quick=False, ops=OPS, dtypes=DTYPES, append=None, widths=None, heights=None, plans=1):
    """Measure the points (widths and heights default to the quick or the full sweep's) and report them."""
    started = time.perf_counter()
    rows = measure(quick, list(points(ops, dtypes, widths or (QUICK_WIDTHS if quick else WIDTHS),
                                      heights or (QUICK_ROWS if quick else ROWS))), plans)
    return report(rows, f"{'quick' if quick else 'full'}: {', '.join(ops)}; {', '.join(dtypes)}",
                  f"{time.perf_counter() - started:.0f} s, copy {copy_gbps(quick):.0f} GB/s", append)


def report(rows: list[dict], what: str, how: str, append=None) -> list[Table]:
    """Write the sweep's files under $OUT (and append the summary to `append`); its tables."""
    tables = [summary(rows), worst(rows)]
    head = f"### Sweep ({what}), {len(rows)} points, {how}"
    text = "\n\n".join([head] + [t.markdown().replace("### ", "#### ", 1) for t in tables]) + "\n"
    common.write("sweep.md", text)
    columns = [c for c in {c: 0 for r in rows for c in r} if c != "plans"]  # chunks may differ in what they record
    common.write("sweep_points.md", Table("every point", [{c: r.get(c, "-") for c in columns} for r in rows]).markdown()
                 + "\n")
    common.write("sweep.json", rows)
    if png := common.out_path("sweep.png"):
        plot(rows, png)
    if append:
        with open(append, "a") as f:
            f.write("\n" + text)
    return tables


def listing(point: tuple, plans: list, neighbours: int = 0) -> dict:
    """An entry of an --only file: a point (op, dtype, rows, width), plans to time there ([(name, ops.Plan)]) and how
    many of the model's neighbours besides (`neighbours`)."""
    from dataclasses import asdict
    fields = lambda p: {k: v for k, v in asdict(p).items() if k != "seconds"}  # noqa: E731
    return dict(zip(("op", "dtype", "rows", "width"), point), plans={name: fields(p) for name, p in plans},
                neighbours=neighbours)


def listed(path: str, plans: int = 1) -> tuple[list, dict]:
    """An --only file's points, and per point (K, [(name, ops.Plan)]) for `measure`: K counts the model's plan and
    its neighbours as --plans does."""
    from newtc import ops
    todo, extra = [], {}
    for e in json.loads(Path(path).read_text()):
        point = (e["op"], e["dtype"], e["rows"], e["width"])
        todo.append(point)
        extra[point] = (max(plans, 1 + e.get("neighbours", 0)),
                        [(name, ops.Plan(**fields)) for name, fields in e.get("plans", {}).items()])
    return todo, extra


def only(path: str, plans: int = 1, append=None) -> list[Table]:
    """Measure exactly the points (and plans) an --only file lists, and report them."""
    started, (todo, extra) = time.perf_counter(), listed(path, plans)
    rows = measure(False, todo, plans, extra)
    return report(rows, f"the points of {Path(path).name}", f"{time.perf_counter() - started:.0f} s, copy "
                  f"{copy_gbps(False):.0f} GB/s", append)


def merge(paths: list[str], append=None) -> list[Table]:
    """Report the points that chunks of the sweep wrote (their sweep.json files) as one sweep."""
    def key(r: dict) -> tuple:  # the order in which points() yields them
        return OPS.index(r["op"]), DTYPES.index(r["dtype"]), r["width"], r["rows"]
    rows = sorted((r for path in paths for r in json.loads(Path(path).read_text())), key=key)
    if any(key(a) == key(b) for a, b in zip(rows, rows[1:])):
        raise SystemExit("--merge: a point is in more than one chunk")
    ops = [o for o in OPS if any(r["op"] == o for r in rows)]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    return report(rows, f"{', '.join(ops)}; {', '.join(dtypes)}", f"merged from {len(paths)} chunks", append)


def subset(choices):
    """An argparse type: a comma-separated subset of choices, returned in their order."""
    def parse(text: str) -> list:
        given = text.split(",")
        if bad := [x for x in given if x not in map(str, choices)]:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from {','.join(map(str, choices))}")
        return [c for c in choices if str(c) in given]
    return parse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"widths {QUICK_WIDTHS} x rows {QUICK_ROWS}, 2 rounds")
    p.add_argument("--ops", type=subset(OPS), default=list(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--dtypes", type=subset(DTYPES), default=list(DTYPES),
                   help=f"comma-separated subset of {','.join(DTYPES)}")
    p.add_argument("--widths", type=subset(WIDTHS), help="comma-separated subset of the full sweep's widths "
                   f"{','.join(map(str, WIDTHS))} (default: all, or the quick ones)")
    p.add_argument("--rows", type=subset(ROWS), help="comma-separated subset of the full sweep's rows "
                   f"{','.join(map(str, ROWS))} (default: all, or the quick ones)")
    p.add_argument("--merge", nargs="+", metavar="FILE.json", help="no measuring: report the points in these "
                   "sweep.json files (chunks of the sweep) as one sweep")
    p.add_argument("--append", metavar="PATH", help="append the summary to this file (bench/RESULTS.md)")
    p.add_argument("--plans", type=int, default=1, metavar="K", help="also time the model's next K-1 fastest "
                   "candidates at each point (recorded for bench/replay_rows.py)")
    p.add_argument("--only", metavar="FILE.json", help="measure only the points (and their plans) this file lists "
                   "(bench/replay_rows.py --write)")
    args = p.parse_args()
    if args.merge:
        tables = merge(args.merge, args.append)
    elif not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        return
    elif args.only:
        tables = only(args.only, args.plans, args.append)
    else:
        tables = run(args.quick, args.ops, args.dtypes, args.append, args.widths, args.rows, args.plans)
    for t in tables:
        print(t.markdown() + "\n")


if __name__ == "__main__":
    main()
