"""The autotuner's machinery: parallel compiles, worker processes that check and time candidates, the session.

Candidates are lowered in this process and compiled by NVRTC in threads, into newt's disk cache. Each GPU has
a worker process that loads the binaries from that cache, runs a candidate on clones of the inputs with the
outputs poisoned (NaN), compares the result with the eager oracle, and only then times it (CUDA events, L2
flushed, median). A compile error or a wrong result rejects the candidate; a fault, a crash or a hang also
costs the worker, which is replaced, and the session goes on.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from newtc import driver
from newtc.errors import NkError

from . import search

TIMEOUT = 30.0  # seconds a candidate may take in a worker before it counts as a hang
START = 300.0  # seconds a worker may take to start: import torch, copy the inputs, run the oracle
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 2e-3, torch.float64: 1e-6}


class Wrong(AssertionError):
    pass


def outputs(result, args) -> list:
    """What a call produces: its returned tensors and its tensor arguments (which it may write)."""
    result = result if isinstance(result, (tuple, list)) else [result]
    return [t for t in [*result, *args] if isinstance(t, torch.Tensor)]


def check(got: list, want: list) -> None:
    """Every element within the dtype's tolerance of the oracle's, relative to |value| + the mean |value|."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            raise Wrong(f"output {i}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
        if not g.is_floating_point():
            bad = g != w
        else:
            g64, w64 = g.double(), w.double()
            scale = w64.abs().nan_to_num(posinf=0, neginf=0).mean() if w.numel() else 0
            tol = TOLERANCE[g.dtype] * (w64.abs() + scale)
            bad = ~((g64 - w64).abs() <= tol) & ~(g64 == w64) & ~(g64.isnan() & w64.isnan())
        if bad.any():
            raise Wrong(f"output {i}: {int(bad.sum())} of {g.numel()} elements differ from the oracle")


def time_ms(fn, flush: torch.Tensor, budget_ms: float) -> float:
    """Median of fn's GPU time over runs filling about budget_ms, each after an L2 flush."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    n = max(5, min(200, int(budget_ms / max(start.elapsed_time(end) / 3, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in events:
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


class Session:
    """A worker's state: the program, its inputs on this worker's GPU and the oracle's outputs."""

    def __init__(self, setup, device: int):
        from .program import Program
        text, filename, name, args, kwargs = setup
        torch.cuda.set_device(device)
        self.fn = Program(text, filename).fns[name]
        self.args = [a.to(f"cuda:{device}") if isinstance(a, torch.Tensor) else a for a in args]
        self.kwargs = kwargs
        clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.args]
        self.want = outputs(self.fn.eager(*clones, **kwargs), clones)
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device=f"cuda:{device}")

    def run(self, config: dict, retime: bool) -> float:
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.args]
        result, plan = self.fn.plan(args, self.kwargs, config, poison=True)
        for launch in plan:
            launch()
        torch.cuda.synchronize()
        check(outputs(result, args), self.want)
        return time_ms(lambda: [launch() for launch in plan], self.flush, 400.0 if retime else 100.0)


def worker(conn, device: int, setup) -> None:
    """A worker process: set up, then answer ("ok", ms) | ("wrong" | "error", why) | ("fatal", why) and exit."""
    try:
        session = Session(setup, device)
        conn.send(("ready", None))
    except BaseException as e:
        conn.send(("error", str(e)))
        return
    while (job := conn.recv()) is not None:
        try:
            conn.send(("ok", session.run(*job)))
        except Wrong as e:
            conn.send(("wrong", str(e)))
        except NkError as e:
            conn.send(("error", e.render(color=False)))
        except BaseException as e:  # a CUDA fault poisons this process's context: leave, to be replaced
            conn.send(("fatal", f"{type(e).__name__}: {e}"))
            return


class Pool:
    """One worker process per device; a faulting, dead or hung worker is replaced."""

    def __init__(self, setup, devices: list, target=worker, timeout: float = TIMEOUT):
        self.setup, self.devices, self.target, self.timeout = setup, devices, target, timeout
        self.ctx = multiprocessing.get_context("spawn")  # CUDA does not survive fork
        self.procs: dict = {}  # device -> (process, connection)
        self.started = 0  # processes started, replacements included

    def start(self, device):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=self.target, args=(child, device, self.setup), daemon=True)
        proc.start()
        child.close()
        self.started += 1
        if not parent.poll(START):
            self.stop(proc, parent)
            raise NkError("an autotuning worker did not start in time")
        kind, why = parent.recv()
        if kind != "ready":
            self.stop(proc, parent)
            raise NkError(f"the eager run of the tile program failed in an autotuning worker:\n{why}")
        self.procs[device] = proc, parent

    @staticmethod
    def stop(proc, conn):
        conn.close()
        proc.kill()
        proc.join()

    def run_on(self, device, job):
        """(ms, None) or (inf, why)."""
        if device not in self.procs or not self.procs[device][0].is_alive():
            self.start(device)
        proc, conn = self.procs[device]
        try:
            conn.send(job)
            if not conn.poll(self.timeout):
                raise TimeoutError(f"no answer in {self.timeout:.0f} s (a hang)")
            kind, value = conn.recv()
        except (EOFError, OSError, TimeoutError) as e:
            kind, value = "fatal", str(e) or "the worker died"
        if kind == "fatal":
            self.stop(*self.procs.pop(device))
        return (value, None) if kind == "ok" else (float("inf"), f"{kind}: {value}")

    def map(self, jobs: list) -> list:
        """Run (ready, job) pairs, ready() waiting for what the job needs; one thread drives each worker."""
        todo, results, errors = queue.Queue(), [None] * len(jobs), []
        for item in enumerate(jobs):
            todo.put(item)

        def drive(device):
            try:
                while not errors:
                    i, (ready, job) = todo.get_nowait()
                    why = ready()
                    results[i] = (float("inf"), why) if why else self.run_on(device, job)
            except queue.Empty:
                pass
            except NkError as e:  # no worker can start: the session cannot go on
                errors.append(e)

        threads = [threading.Thread(target=drive, args=(d,)) for d in self.devices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def close(self):
        for proc, conn in self.procs.values():
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self.procs.clear()


class Progress:
    """A tqdm bar when tqdm is installed (the [tune] extra): configs tried, best time, elapsed."""

    def __init__(self, name: str):
        try:
            from tqdm import tqdm
            self.bar = tqdm(desc=f"deuteron {name}", unit=" configs", file=sys.stderr, leave=False)
        except ImportError:
            self.bar = None

    def update(self, n: int, best: float):
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(f"best {best:.4f} ms")

    def close(self):
        if self.bar is not None:
            self.bar.close()


def tune(fn, args, kwargs, space: search.Space, effort: str, budget: float | None,
         pool: Pool | None = None, arch: str | None = None):
    """Search the space for the fastest config that matches the oracle; prints the winner and how to pin it.
    Returns (config, {"ms", "tried", "rejected", "seconds"})."""
    begin = time.monotonic()
    if pool is None:
        device = next(a.device for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor))
        name, first = torch.cuda.get_device_name(device), device.index or 0
        devices = [first] + [i for i in range(torch.cuda.device_count())
                             if i != first and torch.cuda.get_device_name(i) == name]  # alike GPUs time alike
        host = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        pool, arch = Pool((fn.program.ast.source, fn.program.filename, fn.name, host, kwargs), devices), driver.arch(first)
    compiler = ThreadPoolExecutor(max(2, os.cpu_count() or 2))
    progress, state = Progress(fn.name), {"best": float("inf"), "rejected": {}}

    def prepare(config):
        """Lower here (the parser is not thread-safe), compile in a thread; ready() says why not, or None."""
        try:
            plan = fn.plan(args, kwargs, config)[1]
        except NkError as e:
            return lambda: f"error: {e.render(color=False)}"
        future = compiler.submit(lambda: [launch.kernel.binary(launch.args, launch.meta, arch) for launch in plan])

        def ready():
            try:
                future.result()
            except Exception as e:  # noqa: BLE001 - any failure to compile rejects the candidate alone
                return f"error: {e.render(color=False) if isinstance(e, NkError) else repr(e)}"
        return ready

    def measure(configs, retime=False):
        results = pool.map([(prepare(c), (c, retime)) for c in configs])
        for c, (ms, why) in zip(configs, results):
            if why:
                state["rejected"][search.key(c)] = why
            state["best"] = min(state["best"], ms)
        progress.update(len(configs), state["best"])
        return [ms for ms, _ in results]

    try:
        best, tried = search.search(space, measure, effort, budget)
    finally:
        progress.close()
        pool.close()
        compiler.shutdown(wait=False, cancel_futures=True)
    ms = min(t[1] for t in tried.values())
    if ms == float("inf"):
        why = next(iter(state["rejected"].values()), "")
        raise NkError(f"autotuning '{fn.name}': every one of {len(tried)} configs was rejected", fn.defn.span,
                      f"the first reason: {why}")
    info = {"ms": ms, "tried": len(tried), "rejected": len(state["rejected"]), "seconds": time.monotonic() - begin}
    print(f"deuteron: {fn.name} tuned in {info['seconds']:.1f} s: {len(tried)} configs tried, {info['rejected']} "
          f"rejected; best {ms:.4f} ms\n  pin it: prog.{fn.name}.pin({best!r})", file=sys.stderr)
    return best, info
