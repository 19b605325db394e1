"""First call of a kernel in a fresh process: load + first launch + synchronize, with an empty
compile cache (cold) and with the cache that run left (warm). newt and Triton run the same add kernel."""
import os
import statistics
import subprocess
import sys
import tempfile

import common
from common import Table, failure, ratio

# Runs in a fresh interpreter: torch and CUDA are up before the clock starts, so only the
# compiler's part of a first call is timed. The result is checked after the clock stops.
CHILD = """
import sys, time
sys.path[:0] = [{root!r}, {bench!r}]
import torch
{imports}
x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
out = torch.empty_like(x)
torch.cuda.synchronize()
t0 = time.perf_counter()
{first_call}
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
assert torch.equal(out, x + y), "wrong result"
print(ms)
"""
ADD_NK = str(common.ROOT / "stdlib" / "add.nk")
IMPLS = {  # name: (cache variable, imports before the clock, the timed first call)
    "newt": ("NEWT_CACHE_DIR", "import newtc",
             f"newtc.load({ADD_NK!r}).add[(4,)](x, y, out, 4096, BLOCK=1024, num_warps=4)"),
    "Triton": ("TRITON_CACHE_DIR", "import triton, triton.language",
               "from triton_kernels import add_kernel\nadd_kernel[(4,)](x, y, out, 4096, BLOCK_SIZE=1024)"),
}


def first_call_ms(name: str, cache_dir: str) -> float:
    var, imports, first_call = IMPLS[name]
    code = CHILD.format(root=str(common.ROOT), bench=str(common.ROOT / "bench"), imports=imports, first_call=first_call)
    p = subprocess.run([sys.executable, "-c", code], env=os.environ | {var: cache_dir},
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        raise RuntimeError((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])
    return float(p.stdout.split()[-1])


def cold_warm(name: str, reps: int) -> tuple:
    """Median (cold, warm) ms over reps fresh cache folders, each used cold and then warm."""
    try:
        cold, warm = [], []
        for _ in range(reps):
            with tempfile.TemporaryDirectory(prefix=f"{name}-cache-") as d:
                cold.append(first_call_ms(name, d))
                warm.append(first_call_ms(name, d))
        return statistics.median(cold), statistics.median(warm)
    except Exception as e:
        return failure(e), failure(e)


def run(quick=False):
    reps = 1 if quick else 3
    newt, trit = cold_warm("newt", reps), cold_warm("Triton", reps)
    rows = [{"kernel": f"first call, {kind}", "shape": "add, 4096", "newt ms": newt[i], "Triton ms": trit[i],
             "newt/Triton": ratio(trit[i], newt[i])} for i, kind in enumerate(("cold", "warm"))]
    return [Table("first call in a fresh process (ms)", rows,
                  f"load + first launch + synchronize after torch and CUDA are up, median of {reps} processes; "
                  "cold = empty NEWT_CACHE_DIR / TRITON_CACHE_DIR (Triton then also builds its C launcher), "
                  "warm = the same folder again.")]


if __name__ == "__main__":
    common.main(run)
