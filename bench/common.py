"""Shared by the benchmarks: timing, GB/s, correctness checks, markdown tables, logs under $OUT.

Timing follows design section 10: CUDA events, median of many runs after warm-up, L2 flushed before
every timed run. Every size `bench` times is several times the H200's 60 MB L2, and the flush (a 256 MB
write) evicts what the previous run left, so no input rotation is needed on top of it. Launches of a few
microseconds (the row sweep's small points) go through `graph_bench` instead: a flushed run of those
measures the flush's aftermath more than the kernel.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `import newtc` from a checkout, wherever the script is started


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# ---- timing ----------------------------------------------------------------------------------
def bench(fn, quick: bool = False, share: float = 1.0) -> float:
    """Median milliseconds of fn() by CUDA events, L2 flushed before each run, over `share` of the usual time."""
    warmup, rep = (5, 20 * share) if quick else (25, 200 * share)  # milliseconds of runs, as do_bench counts them
    try:
        from triton.testing import do_bench
    except ImportError:
        return _event_bench(fn, warmup, rep)
    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def _event_bench(fn, warmup: float, rep: float) -> float:
    """do_bench's method without Triton: estimate one run, warm up, then time each run between events."""
    import torch
    from newtc.timing import time_ms
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    return time_ms(fn, flush, max(1, int(rep / estimate)))


def graph_bench(fn, argsets: list, replays: int = 5) -> float:
    """Median milliseconds of one fn(*args) in a CUDA graph of a call per set of `argsets`, at least 32 cycling
    through them (copies of one input: enough of them and a small input is not just re-read from L2). Between
    flushed runs, launches of 4-10 us moved by up to 2x with no change to the kernel (Triton's 1x1024 f16 softmax
    on 1 and 2 warps: 4.96 and 9.09 us; in a graph, 1.71 and 1.62), which a graph of back-to-back launches does
    not."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as capturing asks
        for args in argsets[:3]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph, launches = torch.cuda.CUDAGraph(), max(32, len(argsets))
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(*argsets[i % len(argsets)])
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)


def gbps(nbytes: int, ms) -> float | str:
    """Bytes read + written over the time; a failed measurement (a string) passes through."""
    return nbytes / ms / 1e6 if isinstance(ms, float) else ms


def ratio(a, b) -> float | str:
    return a / b if isinstance(a, float) and isinstance(b, float) else "-"


@functools.cache
def copy_gbps(quick: bool = False) -> float:
    """The bandwidth ceiling: a 1 GiB device-to-device copy, counting bytes read + written."""
    import torch
    x = torch.randn(2**28, device="cuda")
    out = torch.empty_like(x)
    return gbps(2 * x.nbytes, bench(lambda: out.copy_(x), quick))


# ---- checks and failures -------------------------------------------------------------------
class Wrong(AssertionError):
    pass


def check_close(out, ref, rtol: float, atol: float) -> None:
    """Elementwise |out - ref| <= atol + rtol |ref| against a float64 reference; NaN (poison left
    in an unwritten element) always fails."""
    if tuple(out.shape) != tuple(ref.shape):
        raise Wrong(f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    err = (out.double() - ref.double()).abs()
    bad = ~(err <= atol + rtol * ref.double().abs())
    if bad.any():
        raise Wrong(f"{int(bad.sum())} of {out.numel()} elements off, max err {err.max():.2g}")


def failure(e: BaseException) -> str:
    """A table cell for a failed row: 'wrong: ...' for a bad result, 'n/a: ...' for an error."""
    msg = " ".join(str(e).split()) or type(e).__name__
    msg = msg if len(msg) <= 70 else msg[:67] + "..."
    return f"wrong: {msg}" if isinstance(e, Wrong) else f"n/a: {type(e).__name__}: {msg}"


def measure(fn, check, quick: bool, poison=None) -> float | str:
    """Check fn's result, then time it: median ms, or a failure cell (a wrong result is never timed)."""
    try:
        if poison is not None:
            poison.fill_(float("nan"))
        check(fn())
        return bench(fn, quick)
    except Exception as e:  # one broken kernel or missing op must not hide the rest of the table
        return failure(e)


ROUNDS = 5  # interleaved rounds of measure_all


def measure_all(fns: dict, check, quick: bool) -> dict:
    """measure for each of fns (name -> fn), timed in ROUNDS interleaved rounds (the order turned by one each round):
    each one's median over the rounds. Under kernels that load the GPU for seconds (matmuls, attention) its speed
    drifts: on an H200 the same matmul measured 726 and 658 TFLOP/s a minute apart in one process, and timed one
    after another the ratios moved with the order by up to 10%. Interleaved, every one sees the same drift."""
    times: dict = {}
    for name, fn in fns.items():
        try:
            check(fn())
            times[name] = []
        except Exception as e:  # one broken kernel or missing op must not hide the rest of the table
            times[name] = failure(e)
    for name in interleaved([name for name, t in times.items() if isinstance(t, list)], ROUNDS):
        if isinstance(times[name], list):  # not failed in an earlier round
            try:
                times[name].append(bench(fns[name], quick, share=1 / ROUNDS))
            except Exception as e:
                times[name] = failure(e)
    return {name: statistics.median(t) if isinstance(t, list) else t for name, t in times.items()}


def interleaved(items: list, rounds: int):
    """items in `rounds` rounds, each round's order turned by one from the last: none is always timed first."""
    for r in range(rounds if items else 0):
        turn = r % len(items)
        yield from items[turn:] + items[:turn]


# ---- tables and logs -----------------------------------------------------------------------
@dataclass
class Table:
    """Rows are dicts with the same keys, which are the columns; a row's 'newt/Triton' is newt's
    speed over Triton's (above 1: newt faster), which run.py gathers into the summary."""
    title: str
    rows: list[dict] = field(default_factory=list)
    note: str = ""

    def markdown(self) -> str:
        cols = list(self.rows[0]) if self.rows else []
        lines = [f"### {self.title}", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in self.rows]
        return "\n".join(lines + ([f"\n{self.note}"] if self.note else []))


def cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def out_path(name: str) -> Path | None:
    """Where a log goes: under $OUT, which is what comes back from the GPU machine; None when unset."""
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else None


def write(name: str, data) -> None:
    """Save a log under $OUT if set: text as is, anything else as JSON."""
    if path := out_path(name):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1, default=str))


def main(run) -> None:
    """Entry point of a single benchmark script: `python bench/bench_X.py [--quick]`."""
    p = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    p.add_argument("--quick", action="store_true", help="fewer timed runs")
    args = p.parse_args()
    if not cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        return
    for t in run(args.quick):
        print(t.markdown() + "\n")
