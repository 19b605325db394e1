"""Launch cost from Python: a cached tiny kernel (newt, Triton, torch, a raw ctypes cuLaunchKernel), and the
ops of newtc.ops on tiny tensors against the same torch ops.

    python bench/bench_launch.py [--quick]      # on the GPU
    python bench/bench_launch.py --host         # anywhere: newtc.ops' Python path with the driver call stubbed
"""
import statistics
import sys
import time

import common
from common import Table, failure, ratio


def us_per_launch(launch, n: int, rounds: int) -> float | str:
    """Host time per launch over n back-to-back launches, median of rounds. A one-element kernel runs
    faster on the GPU than Python can issue it, so this times the issuing."""
    import torch
    try:
        for _ in range(100):  # compile, load and fill every cache first
            launch()
        torch.cuda.synchronize()
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                launch()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(samples)
    except Exception as e:
        return failure(e)


def newt_launches(x, y, out):
    """newt's `add` through the user path; the cached launch function alone (torch's compiled launcher where torch has
    one), and the same through ctypes (Launcher.packed); and driver.launch alone, with the arguments packed once."""
    import newtc
    import torch
    from newtc import driver
    # a Module of its own, so that its kernel holds exactly one launcher: the one made here
    add = newtc.compile((common.ROOT / "stdlib" / "add.nk").read_text(), "stdlib/add.nk").add

    def launch():
        add[(1,)](x, y, out, 1, BLOCK=1024, num_warps=4)

    launch()
    fn = next(iter(add.launchers.values())).launcher
    stream, values = torch.cuda.current_stream().cuda_stream, (x.data_ptr(), y.data_ptr(), out.data_ptr(), 1)
    packed, function = fn.packed(), fn.function()
    packed(stream, values, 1)
    _, params = fn.local.buffers  # this thread's argument slots, packed by the launch above
    return (launch, lambda: function(stream, values, 1), lambda: packed(stream, values, 1),
            lambda: driver.launch(fn.func, (1, 1, 1), (fn.threads, 1, 1), fn.smem, stream, params))


def tiny_ops(device: str):
    """(name, newt call, torch call) of each op on a tiny tensor (4 x 128 f32; matmul by a 128 x 128 one)."""
    import newtc
    import torch
    F = torch.nn.functional
    x, y = torch.randn(4, 128, device=device), torch.randn(4, 128, device=device)
    w, b = torch.randn(128, device=device), torch.randn(128, device=device)
    t = torch.randint(0, 128, (4,), device=device)
    m = torch.randn(128, 128, device=device)
    ops = newtc.ops
    return [("softmax", lambda: ops.softmax(x), lambda: torch.softmax(x, -1)),
            ("layernorm", lambda: ops.layernorm(x, w, b), lambda: F.layer_norm(x, (128,), w, b)),
            ("rmsnorm", lambda: ops.rmsnorm(x, w), lambda: F.rms_norm(x, (128,), w, 1e-6)),
            ("cross_entropy", lambda: ops.cross_entropy(x, t), lambda: F.cross_entropy(x, t, reduction="none")),
            ("add", lambda: ops.add(x, y), lambda: torch.add(x, y)),
            ("matmul", lambda: ops.matmul(x, m), lambda: x @ m)]


def op_rows(n: int, rounds: int) -> list[dict]:
    rows = []
    for name, newt, ref in tiny_ops("cuda"):
        times = {"newt": us_per_launch(newt, n, rounds), "torch": us_per_launch(ref, n, rounds)}
        rows.append({"kernel": f"newtc.ops.{name}, cached", "shape": "4x128 f32", "newt us": times["newt"],
                     "torch us": times["torch"], "newt/torch": ratio(times["torch"], times["newt"])})
    return rows


def run(quick=False):
    import torch
    n, rounds = (2000, 3) if quick else (10000, 5)
    x, y, out = torch.randn(1, device="cuda"), torch.randn(1, device="cuda"), torch.empty(1, device="cuda")
    times = {}
    try:
        newt, function, packed, raw = newt_launches(x, y, out)
        for name, fn in (("newt", newt), ("launch function", function), ("its ctypes path", packed)):
            out.fill_(float("nan"))
            times[name] = us_per_launch(fn, n, rounds)
            if not torch.equal(out, x + y):
                times[name] = "wrong: out != x + y"
        times["raw cuLaunchKernel"] = us_per_launch(raw, n, rounds)
    except Exception as e:
        times["newt"] = times["launch function"] = times["its ctypes path"] = times["raw cuLaunchKernel"] = failure(e)
    try:
        from triton_kernels import add_kernel
        out.fill_(float("nan"))
        times["Triton"] = us_per_launch(lambda: add_kernel[(1,)](x, y, out, 1, BLOCK_SIZE=1024), n, rounds)
        if not torch.equal(out, x + y):
            times["Triton"] = "wrong: out != x + y"
    except Exception as e:
        times["Triton"] = failure(e)
    times["torch"] = us_per_launch(lambda: x.add_(1), n, rounds)
    row = {"kernel": "launch, cached tiny kernel", "shape": "1 element"}
    row |= {f"{k} us": times[k] for k in ("newt", "launch function", "its ctypes path", "Triton", "torch",
                                            "raw cuLaunchKernel")}
    row["newt/Triton"] = ratio(times["Triton"], times["newt"])
    return [Table("launch cost (us per launch, host clock)", [row],
                  f"{n} back-to-back launches of add with n=1 (torch: x.add_(1)), median of {rounds}; "
                  "launch function: the cached launch alone (through torch's compiled launcher where "
                  "torch has one); its ctypes path: the same without it (Launcher.packed); raw = newt's cached "
                  "function and prebuilt params through newtc.driver.launch."),
            Table("op call cost (us per call, host clock)", op_rows(n, rounds),
                  f"{n} back-to-back calls of each op on a 4x128 f32 tensor, median of {rounds}: newtc.ops (its bound "
                  "path after the first call) against the torch op; newt/torch above 1: newt's call is cheaper.")]


def host_path(n: int = 20000) -> Table:
    """newtc.ops' Python path on CPU tensors, as a CUDA call of a known shape takes it: the first call runs
    in the interpreter and is then bound with the driver call replaced by nothing (no GPU needed)."""
    import torch
    from newtc import ops
    ops._bind = lambda kernel, args, meta, device: (lambda stream, values, *grid: None)
    ops._raw_stream = lambda device: 0
    ops._bindable = lambda tensors: True
    rows = []
    for name, newt, ref in tiny_ops("cpu"):
        newt()
        times = []
        for fn in (newt, ref):
            for _ in range(200):
                fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - t0) / n * 1e6)
        rows.append({"op": name, "newt host path us": times[0], "torch CPU op us": times[1]})
    return Table("newtc.ops host path (driver call stubbed, CPU tensors)", rows,
                 "The torch column runs the op itself on the CPU: a yardstick for the machine's speed only.")


if __name__ == "__main__":
    if "--host" in sys.argv:
        print(host_path().markdown())
    else:
        common.main(run)
