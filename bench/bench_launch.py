"""Launch cost of a cached tiny kernel from Python: newt, Triton, torch, and a raw ctypes cuLaunchKernel."""
import statistics
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
    """newt's `add` through the user path, and the same cached function through driver.launch alone."""
    import newtc
    import torch
    from newtc import driver
    # a Module of its own, so that its kernel holds exactly one launcher: the one made here
    add = newtc.compile((common.ROOT / "stdlib" / "add.nk").read_text(), "stdlib/add.nk").add

    def launch():
        add[(1,)](x, y, out, 1, BLOCK=1024, num_warps=4)

    launch()
    fn = next(iter(add.launchers.values())).launcher
    _, params = fn.local.buffers  # this thread's argument slots, already packed by the launch above
    stream = torch.cuda.current_stream().cuda_stream
    return launch, lambda: driver.launch(fn.func, (1, 1, 1), (fn.threads, 1, 1), fn.smem, stream, params)


def run(quick=False):
    import torch
    n, rounds = (2000, 3) if quick else (10000, 5)
    x, y, out = torch.randn(1, device="cuda"), torch.randn(1, device="cuda"), torch.empty(1, device="cuda")
    times = {}
    try:
        newt, raw = newt_launches(x, y, out)
        out.fill_(float("nan"))
        times["newt"] = us_per_launch(newt, n, rounds)
        if not torch.equal(out, x + y):
            times["newt"] = "wrong: out != x + y"
        times["raw cuLaunchKernel"] = us_per_launch(raw, n, rounds)
    except Exception as e:
        times["newt"] = times["raw cuLaunchKernel"] = failure(e)
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
    row |= {f"{k} us": times[k] for k in ("newt", "Triton", "torch", "raw cuLaunchKernel")}
    row["newt/Triton"] = ratio(times["Triton"], times["newt"])
    return [Table("launch cost (us per launch, host clock)", [row],
                  f"{n} back-to-back launches of add with n=1 (torch: x.add_(1)), median of {rounds}; "
                  "raw = newt's cached function and prebuilt params through newtc.driver.launch.")]


if __name__ == "__main__":
    common.main(run)
