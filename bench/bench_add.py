"""f32 add of 2^28 elements (3 GiB moved): newt and Triton, each the best of a small sweep, torch, and the copy ceiling."""
import itertools

import common
from common import Table, check_close, copy_gbps, failure, gbps, measure, ratio

N = 2**28
SWEEP = list(itertools.product((1024, 2048, 4096), (4, 8)))  # (BLOCK, num_warps)


def newt_add(x, y, out):
    import newtc
    add = newtc.load(common.ROOT / "stdlib" / "add.nk").add
    return lambda block, warps: lambda: add[(-(-N // block),)](x, y, out, N, BLOCK=block, num_warps=warps)


def triton_add(x, y, out):
    from triton_kernels import add_kernel
    return lambda block, warps: lambda: add_kernel[(-(-N // block),)](x, y, out, N, BLOCK_SIZE=block, num_warps=warps)


def best(factory, x, y, out, check, quick):
    """(ms, config) of the fastest correct config in the sweep; (failure, '-') when none ran."""
    try:
        make = factory(x, y, out)
    except Exception as e:
        return failure(e), "-"
    times = {cfg: measure(make(*cfg), check, quick, poison=out) for cfg in SWEEP}
    ok = [cfg for cfg, t in times.items() if isinstance(t, float)]
    if not ok:
        return times[SWEEP[0]], "-"
    cfg = min(ok, key=times.get)
    return times[cfg], f"BLOCK={cfg[0]} warps={cfg[1]}"


def run(quick=False):
    import torch
    x, y = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    out = torch.empty_like(x)
    ref = x + y

    def check(_):
        check_close(out, ref, 0, 0)  # one f32 rounding, the same everywhere: results must match exactly

    newt, newt_cfg = best(newt_add, x, y, out, check, quick)
    trit, trit_cfg = best(triton_add, x, y, out, check, quick)
    torch_ms = measure(lambda: torch.add(x, y, out=out), check, quick, poison=out)
    nbytes, copy = 3 * x.nbytes, copy_gbps(quick)
    row = {"kernel": "add f32", "shape": "2^28", "newt GB/s": gbps(nbytes, newt), "Triton GB/s": gbps(nbytes, trit),
           "torch GB/s": gbps(nbytes, torch_ms), "copy GB/s": copy, "newt/Triton": ratio(trit, newt),
           "newt % copy": ratio(gbps(nbytes, newt), copy / 100), "newt best": newt_cfg, "Triton best": trit_cfg}
    return [Table("add f32, 2^28 elements", [row],
                  f"GB/s = 3 x 1 GiB read + written over the median time; best of BLOCK x warps in {SWEEP}; "
                  "copy = out.copy_(x) of 1 GiB, counting 2 GiB.")]


if __name__ == "__main__":
    common.main(run)
