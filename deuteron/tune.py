"""The autotuner's machinery. Candidates are lowered here and compiled by NVRTC in threads, into newt's disk
cache. A worker process per GPU runs each on clones of the inputs with the outputs poisoned (NaN), compares
with the eager oracle, and only then times it (CUDA events, L2 flushed, median). A compile error or a wrong
result rejects the candidate; a fault, crash or hang also costs the worker, which is replaced.
"""
import multiprocessing
import os
import sys
import threading
import time
from importlib.machinery import ModuleSpec
from multiprocessing.pool import ThreadPool
from unittest import mock

import torch

from newtc import driver
from newtc.timing import time_ms
from newtc.errors import NkError

from . import search
from .lang import device_of

TIMEOUT, START, COMPILE = 30.0, 300.0, 60.0  # seconds for a candidate (then a hang), a worker's start, a compile
# f32 at tf32 precision: `dot` on f32 tiles runs on the tensor cores as tf32 by default, as in Triton
# fp8: its rounding (a half step 1/16, 1/8) may go the other way on sums taken in another order: a step either way
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 4e-2, torch.float32: 1e-2, torch.float64: 1e-6,
             torch.float8_e4m3fn: 0.13, torch.float8_e5m2: 0.26}  # others: exact


class Wrong(AssertionError):
    """A candidate's result that differs from the oracle's."""


def outputs(result, args, kwargs=None) -> list:
    """What a call produces: its returned tensors and its tensor arguments (which it may write)."""
    values = [*(result if isinstance(result, (tuple, list)) else [result]), *args, *(kwargs or {}).values()]
    return [t for t in values if isinstance(t, torch.Tensor)]


def copies(args: list, kwargs: dict, device=None) -> tuple:
    """A call's arguments, each tensor copied (to `device`): a run writes only into its own."""
    def copy(a):
        return a.detach().to(device, copy=True) if isinstance(a, torch.Tensor) else a
    return [copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}


def why(e: BaseException) -> str:
    return e.render(color=False) if isinstance(e, NkError) else repr(e)


def check(got: list, want: list) -> None:
    """Each element within its dtype's tolerance of the oracle's, relative to |value| + mean |value|."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            raise Wrong(f"output {i} is {g.dtype}{list(g.shape)}, the oracle's {w.dtype}{list(w.shape)}")
        rel, g, w = TOLERANCE.get(g.dtype, 0.0), g.double(), w.double()
        bad = ~torch.isclose(g, w, rtol=rel, atol=rel * w.abs().nan_to_num(0, 0, 0).mean().item(), equal_nan=True)
        if bad.any():
            raise Wrong(f"output {i}: {int(bad.sum())} of {g.numel()} elements differ from the oracle")


class Session:
    """A worker's state: the program, the inputs on its GPU and the oracle's outputs."""

    def __init__(self, setup, device: int):
        from .program import Program
        torch.cuda.set_device(device)
        self.fn = Program(*setup[:2]).fns[setup[2]]  # setup: the program's text, file name, tile name, args, kwargs
        self.args, self.kwargs = copies(*setup[3:], f"cuda:{device}")
        args, kwargs = copies(self.args, self.kwargs)
        self.want = outputs(self.fn.eager(*args, **kwargs), args, kwargs)
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device=f"cuda:{device}")  # 4x the H200's L2

    def run(self, config: dict, retime: bool) -> float:
        args, kwargs = copies(self.args, self.kwargs)
        result, plan = self.fn.plan(args, kwargs, config, poison=True)
        for launch in plan:
            launch()
        torch.cuda.synchronize()
        check(outputs(result, args, kwargs), self.want)
        return time_ms(lambda: [launch() for launch in plan], self.flush, 100 if retime else 20)


def worker(conn, device: int, setup) -> None:
    """A worker process: ("ready"), then per job ("ok", ms) | ("wrong" | "error", why) | ("fatal", why) and exit."""
    try:
        session = Session(setup, device)
        conn.send(("ready", None))
    except BaseException as e:
        return conn.send(("error", why(e)))
    while (job := conn.recv()) is not None:
        try:
            conn.send(("ok", session.run(*job)))
        except BaseException as e:  # a CUDA error may leave this process's context damaged: leave, to be replaced
            kind = "wrong" if isinstance(e, Wrong) else "error" if isinstance(e, NkError) and not \
                isinstance(e, driver.CudaError) else "fatal"
            conn.send((kind, str(e) if kind != "fatal" else f"{type(e).__name__}: {e}"))
            if kind == "fatal":
                return


_hide_main = threading.Lock()


class Pool:
    """A worker process per device, each driven by a thread; a faulting, dead or hung worker is replaced."""

    def __init__(self, setup, devices: list, target=worker, timeout: float = TIMEOUT):
        self.setup, self.devices, self.target, self.timeout = setup, devices, target, timeout
        self.ctx, self.procs, self.started = multiprocessing.get_context("spawn"), {}, 0  # CUDA does not fork

    def start(self, device):
        conn, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=self.target, args=(child, device, self.setup), daemon=True)
        # spawn would run the caller's script again in the child (as __mp_main__), but not a package's __main__
        with _hide_main, mock.patch.object(sys.modules["__main__"], "__spec__", ModuleSpec("__main__", None)):
            proc.start()
        child.close()
        self.started += 1
        kind, reason = conn.recv() if conn.poll(START) else ("error", "no answer")
        if kind != "ready":
            self.stop(proc, conn)
            raise NkError(f"an autotuning worker could not start (the oracle runs there): {reason}")
        self.procs[device] = proc, conn

    @staticmethod
    def stop(proc, conn):
        conn.close()
        proc.kill()
        proc.join()

    def run_on(self, device, job):
        """(ms, None) or (inf, why)."""
        if device not in self.procs:
            self.start(device)
        conn = self.procs[device][1]
        try:
            conn.send(job)
            kind, value = conn.recv() if conn.poll(self.timeout) else ("fatal", f"no answer in {self.timeout:.0f} s: a hang")
        except (EOFError, OSError) as e:  # the pipe broke: the process is gone
            kind, value = "fatal", f"the worker died ({e or type(e).__name__})"
        if kind == "fatal":
            self.stop(*self.procs.pop(device))
        return (value, None) if kind == "ok" else (float("inf"), f"{kind}: {value}")

    def map(self, jobs: list) -> list:
        """Runs (ready, job) pairs, ready() waiting for the job's compile and saying why it failed, or None."""
        free, mine = list(self.devices), threading.local()

        def one(item):
            failed = item[0]()
            return (float("inf"), failed) if failed else self.run_on(mine.device, item[1])

        with ThreadPool(len(self.devices), lambda: setattr(mine, "device", free.pop())) as threads:  # one per device
            return threads.map(one, jobs, chunksize=1)  # an NkError (no worker starts) ends it

    def close(self):
        for proc, conn in self.procs.values():  # idle workers: nothing of theirs is lost
            self.stop(proc, conn)
        self.procs.clear()


def tune(fn, args, kwargs, space: search.Space, effort: str, budget: float | None, pool=None, arch=None):
    """Search for the fastest config that matches the oracle; prints the winner and the line that pins it.
    Returns (config, {"ms", "tried", "rejected", "seconds"})."""
    begin = time.monotonic()
    if pool is None:
        first = device_of(args, kwargs).index or 0
        name = torch.cuda.get_device_name(first)
        devices = [first] + [i for i in range(torch.cuda.device_count()) if i != first and torch.cuda.get_device_name(i) == name]
        setup = (fn.program.ast.source, fn.program.filename, fn.name, *copies(args, kwargs, "cpu"))
        pool, arch = Pool(setup, devices), driver.arch(first)  # alike GPUs time alike
    compiles, rejected, best = ThreadPool(os.cpu_count() or 2), {}, [float("inf")]  # daemon threads: see prepare
    deadline = begin + (search.EFFORT[effort][2] if budget is None else budget)
    try:
        from tqdm import tqdm
        bar = tqdm(desc=f"deuteron {fn.name}", unit=" configs", file=sys.stderr, leave=False)
    except ImportError:  # the [tune] extra brings the progress bar
        bar = None

    def prepare(config):
        """Lower, parse and check here (the parser is not thread-safe), then NVRTC in a daemon thread of `compiles`
        (one still running when the session ends does not hold up the exit); ready() says why it failed, or None."""
        try:
            plan = [(launch.low.kernel, launch) for launch in fn.plan(args, kwargs, config)[1]]
        except NkError as e:
            return lambda: f"error: {why(e)}"
        job = compiles.apply_async(lambda: [kernel.binary(launch.args, launch.low.meta, arch) for kernel, launch in plan])

        def ready():
            try:  # a compile still running well past the budget is not waited for
                job.get(max(1.0, min(COMPILE, deadline + 5 - time.monotonic())))
            except multiprocessing.TimeoutError:
                return "error: the compile took too long"
            except Exception as e:  # noqa: BLE001 - any failure to compile rejects this candidate only
                return f"error: {why(e)}"
        return ready

    def measure(configs, retime=False):
        results = pool.map([(prepare(c), (c, retime)) for c in configs])
        rejected.update((search.key(c), reason) for c, (_, reason) in zip(configs, results) if reason)
        best[0] = min([best[0], *(ms for ms, _ in results)])
        if bar is not None:
            bar.update(len(configs))
            bar.set_postfix_str(f"best {best[0]:.4f} ms")
        return [ms for ms, _ in results]

    try:
        config, tried = search.search(space, measure, effort, budget)
    finally:
        if bar is not None:
            bar.close()
        pool.close()
        compiles.terminate()  # compiles not started are dropped
    info = {"ms": min(t[1] for t in tried.values()), "tried": len(tried), "rejected": len(rejected),
            "seconds": time.monotonic() - begin}
    if info["ms"] == float("inf"):
        raise NkError(f"autotuning '{fn.name}': all {len(tried)} configs were rejected", fn.defn.span,
                      f"the first reason: {next(iter(rejected.values()), '')}")
    print(f"deuteron: {fn.name} tuned in {info['seconds']:.1f} s: {len(tried)} configs tried, {len(rejected)} rejected; "
          f"best {info['ms']:.4f} ms\n  pin it: prog.{fn.name}.pin({config!r})", file=sys.stderr)
    return config, info
