"""Scans, sorting and data movement (cumsum, cumprod, associative_scan, sort, topk, flip, gather, histogram,
join, split, cat, zeros_like, full_like) against torch on fresh random inputs, through the interpreter (cpu)
and the GPU (marker gpu, num_warps 1, 4 and 8); every kernel also compiles with NVRTC for sm_80 and sm_90a.

Each kernel reads an [R, C] block of which only n_rows x n_cols elements are data (masked loads), so a scanned
row of 1000 sits in a block of 1024; outputs start poisoned (NaN or a sentinel)."""
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import newtc
from newtc import driver

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int32, torch.int64]
ARCHS = ["sm_80", "sm_90a"]
SENTINEL = -77


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# (R, C, n_rows, n_cols, num_warps): the scanned axis across registers, lanes and warps
SHAPES = {"cpu": [(1, 1024, 1, 1000, 4), (1024, 1, 1000, 1, 4), (16, 64, 13, 50, 4), (64, 16, 50, 13, 4)],
          "cuda": [(1, 1024, 1, 1000, 1), (1024, 1, 1000, 1, 8), (1, 1024, 1, 1000, 4), (1, 1024, 1, 1000, 8), (16, 64, 13, 50, 4),
                   (64, 16, 50, 13, 8), (128, 32, 100, 31, 8), (8, 256, 7, 255, 1), (32, 32, 31, 17, 4),
                   (2, 2048, 2, 2000, 4)]}

KERNEL = """\
def add(a, b):
    return a + b

def biggest(a, b):
    return maximum(a, b)

def running_max(v, i, w, j):
    take = w > v
    return where(take, w, v), where(take, j, i)

kernel k(x, out, aux, n_rows, n_cols, R: constexpr, C: constexpr, AXIS: constexpr, REV: constexpr):
    r = arange(0, R)[:, None]
    c = arange(0, C)[None, :]
    m = (r < n_rows) & (c < n_cols)
    v = load(x + r * n_cols + c, mask=m, other=OTHER)
    BODY
"""


def module(body: str, other="0"):
    return newtc.compile(KERNEL.replace("OTHER", other).replace("BODY", body), "scan_test.nk")


def fresh(shape, dtype, device, low=-100, high=100):
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.randint(max(low, torch.iinfo(dtype).min), min(high, torch.iinfo(dtype).max), shape, device=device,
                         dtype=dtype)


def poisoned(shape, dtype, device):
    return torch.full(shape, float("nan") if dtype.is_floating_point else SENTINEL, dtype=dtype, device=device)


def close(out, ref, dtype):
    if dtype.is_floating_point:
        tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol * 4, equal_nan=True)
    else:
        assert torch.equal(out, ref.to(out.dtype))


def call(x, out, aux, R, C, warps, axis=0, rev=False):
    """The arguments and constexprs of one launch of `k`."""
    return (x, out, aux, *x.shape), dict(R=R, C=C, AXIS=axis, REV=rev, num_warps=warps)


def launch(mod, device, *case):
    args, meta = call(*case)
    mod.k[(1,)](*args, **meta)


def launch_all(mod, device, cases):
    """launch() of each case (x, out, aux, R, C, warps, axis, rev). On the GPU every kernel compiles first, in
    threads (NVRTC runs outside the GIL): a 1024-element sort in one warp takes 5-7 s of NVRTC, a test dozens."""
    if device == "cuda":
        arch = driver.arch(cases[0][0].get_device())
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            list(pool.map(lambda case: mod.k.binary(*call(*case), arch), cases))
    for case in cases:
        launch(mod, device, *case)


# ---- scans ------------------------------------------------------------------------------------------------
SCANS = {"cumsum": "cumsum(v, axis=AXIS, reverse=REV)", "cumprod": "cumprod(v, AXIS, REV)",
         "scan_add": "associative_scan(v, AXIS, add, reverse=REV)",
         "scan_max": "associative_scan(v, AXIS, biggest, reverse=REV)"}


def scan_input(op, shape, dtype, device):
    if op == "cumprod" and dtype.is_floating_point:  # products of 1000 factors near 1 stay in range
        return (1 + 0.02 * torch.randn(shape, device=device)).to(dtype)
    if op == "cumprod":  # mostly +-1, some 2s and 3s: integer products wrap as C's do
        return torch.tensor([-1, 1, 1, 1, 2, 3], device=device)[torch.randint(0, 6, shape, device=device)].to(dtype)
    return fresh(shape, dtype, device)


def scan_reference(op, x, axis, rev):
    x = x.flip(axis) if rev else x
    if op in ("cumsum", "scan_add"):
        y = x.double().cumsum(axis) if x.is_floating_point() else x.long().cumsum(axis)
    elif op == "cumprod":
        y = x.double().cumprod(axis) if x.is_floating_point() else x.long().cumprod(axis)
    else:
        y = x.cummax(axis).values
    return y.flip(axis) if rev else y


def scan_dtype(op, dtype):
    """cumsum and cumprod of integers narrower than 32 bits accumulate in i32 (Triton's rule)."""
    narrow = not dtype.is_floating_point and torch.iinfo(dtype).bits < 32
    return torch.int32 if narrow and op in ("cumsum", "cumprod") else dtype


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", list(SCANS))
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.int8, torch.int16], ids=str)
def test_scans(device, op, dtype):
    if op == "scan_add" and dtype in (torch.float16, torch.bfloat16):
        pytest.skip("a 16-bit float associative_scan rounds every partial sum: no torch reference")
    other = {"cumprod": "1", "scan_max": "-inf" if dtype.is_floating_point else "-100"}.get(op, "0")
    mod = module(f"store(out + r * n_cols + c, {SCANS[op]}, mask=m)", other)
    cases = [(x, poisoned((nr, nc), scan_dtype(op, dtype), device), x, R, C, warps, axis, rev)
             for R, C, nr, nc, warps in SHAPES[device] for axis in (0, 1) for rev in (False, True)
             for x in [scan_input(op, (nr, nc), dtype, device)]]
    launch_all(mod, device, cases)
    for x, out, _, R, C, warps, axis, rev in cases:
        ref = scan_reference(op, x, axis, rev)
        if dtype.is_floating_point:  # torch rounds the exact result once, as the f32 accumulator does
            ref = ref.to(dtype)
        close(out, ref, dtype)


@pytest.mark.parametrize("device", devices())
def test_cumsum_of_a_mask_counts_in_i32(device):
    """Where each kept element goes when the kept ones are packed together (stream compaction)."""
    mod = module("store(out + r * n_cols + c, cumsum(v > 0, axis=AXIS, reverse=REV) - 1, mask=m)")
    for R, C, nr, nc, warps in SHAPES[device]:
        for axis in (0, 1):
            x = fresh((nr, nc), torch.float32, device)
            out = poisoned((nr, nc), torch.int32, device)
            launch(mod, device, x, out, x, R, C, warps, axis, axis == 1)
            ref = (x > 0).int().flip(axis).cumsum(axis).flip(axis) if axis == 1 else (x > 0).int().cumsum(axis)
            assert torch.equal(out, (ref - 1).int())


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_associative_scan_of_a_tuple(device, dtype):
    """A running max and where it was (the first of ties), as torch.cummax."""
    mod = module("""best, at = associative_scan((v, r * (1 - AXIS) + c * AXIS), AXIS, running_max, REV)
    store(out + r * n_cols + c, best, mask=m)
    store(aux + r * n_cols + c, at, mask=m)""", "-1000000")
    for R, C, nr, nc, warps in SHAPES[device]:
        for axis in (0, 1):
            for rev in (False, True):
                x = fresh((nr, nc), dtype, device, 1 - 10**6, 10**6)
                out, at = poisoned((nr, nc), dtype, device), poisoned((nr, nc), torch.int32, device)
                launch(mod, device, x, out, at, R, C, warps, axis, rev)
                xs = x.flip(axis) if rev else x
                ref, idx = xs.cummax(axis)
                if rev:
                    ref, idx = ref.flip(axis), x.shape[axis] - 1 - idx.flip(axis)
                close(out, ref, dtype)
                assert torch.equal(at.long(), idx)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
def test_scan_of_a_3d_block(device, dtype):
    mod = module("""y = reshape(v, [R // 4, 4, C])
    y = reshape(cumsum(y, axis=AXIS, reverse=REV), [R, C])
    store(out + r * n_cols + c, y, mask=m)""")
    for warps in (1, 4) if device == "cpu" else (1, 4, 8):
        for axis in (0, 1, 2):
            for rev in (False, True):
                x = fresh((32, 64), dtype, device)
                out = poisoned((32, 64), dtype, device)
                launch(mod, device, x, out, x, 32, 64, warps, axis, rev)
                ref = scan_reference("cumsum", x.reshape(8, 4, 64), axis, rev).reshape(32, 64)
                close(out, ref.to(dtype) if dtype.is_floating_point else ref, dtype)



def test_cumsum_dtype_picks_the_result():
    """dtype= as in Triton: an i16 running sum past 2**15 in i64, an f16 one kept in f32."""
    mod = newtc.compile("""\
kernel k(x, y, out, fout):
    offs = arange(0, 1024)
    store(out + offs, cumsum(load(x + offs), 0, dtype=i64))
    store(fout + offs, cumsum(load(y + offs), 0, reverse=True, dtype=f32))
""", "dtype.nk")
    x, y = torch.randint(100, 30000, (1024,), dtype=torch.int16), torch.randn(1024).half()
    out, fout = poisoned((1024,), torch.int64, "cpu"), poisoned((1024,), torch.float32, "cpu")
    mod.k[(1,)](x, y, out, fout)
    assert torch.equal(out, x.long().cumsum(0))
    torch.testing.assert_close(fout, y.float().flip(0).cumsum(0).flip(0), rtol=1e-5, atol=1e-4)

# ---- sort, topk, flip: along a whole axis of the block, masked along the other --------------------------
def full_along(axis, R, C, nr, nc):
    return (R, nc) if axis == 0 else (nr, C)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.int16], ids=str)
def test_sort_and_flip(device, dtype):
    mod = module("""store(out + r * n_cols + c, sort(v, dim=AXIS, descending=REV), mask=m)
    store(aux + r * n_cols + c, flip(v, AXIS), mask=m)""")
    cases = []
    for R, C, nr, nc, warps in SHAPES[device]:
        for axis in (0, 1):
            for descending in (False, True):
                x = fresh(full_along(axis, R, C, nr, nc), dtype, device)
                if dtype.is_floating_point:  # NaN sorts above every number, as in torch.sort
                    x.view(-1)[torch.randperm(x.numel(), device=device)[:3]] = float("nan")
                cases.append((x, poisoned(x.shape, dtype, device), poisoned(x.shape, dtype, device), R, C, warps,
                              axis, descending))
    launch_all(mod, device, cases)
    for x, out, flipped, R, C, warps, axis, descending in cases:
        close(out, torch.sort(x, dim=axis, descending=descending).values, dtype)
        close(flipped, x.flip(axis), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_topk(device, dtype):
    for K in (1, 4, 16):
        mod = module(f"store(aux + r * {K} + arange(0, {K})[None, :], topk(v, {K}), mask=r < n_rows)")
        cases = [(x, x, poisoned((nr, K), dtype, device), R, C, warps, 0, False)
                 for R, C, nr, nc, warps in SHAPES[device] if K <= C for x in [fresh((nr, C), dtype, device, -10**4, 10**4)]]
        launch_all(mod, device, cases)
        for x, _, out, *_ in cases:
            close(out, torch.topk(x, K, dim=1).values, dtype)


# ---- gather, histogram ----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_gather(device, dtype, index_dtype):
    mod = module("""i = load(aux + r * n_cols + c, mask=m, other=0)
    store(out + r * n_cols + c, gather(v, i, AXIS), mask=m)""")
    for R, C, nr, nc, warps in SHAPES[device]:
        for axis in (0, 1):
            x = fresh((nr, nc), dtype, device)
            index = torch.randint(0, x.shape[axis], x.shape, device=device, dtype=index_dtype)
            out = poisoned(x.shape, dtype, device)
            launch(mod, device, x, out, index, R, C, warps, axis)
            close(out, torch.gather(x, axis, index.long()), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8], ids=str)
@pytest.mark.parametrize("masked", [False, True])
def test_histogram(device, dtype, masked):
    """Values outside [0, num_bins) are not counted; neither are masked ones (the others load as -1)."""
    h = "histogram(v, 64, mask=v != 0)" if masked else "histogram(v, 64)"
    mod = module(f"store(out + arange(0, 64), {h})", "-1" if dtype != torch.uint8 else "255")
    for R, C, nr, nc, warps in SHAPES[device]:
        x = fresh((nr, nc), dtype, device, -5, 70)
        out = poisoned((64,), torch.int32, device)
        launch(mod, device, x, out, x, R, C, warps)
        keep = (x.long() >= 0) & (x.long() < 64) & ((x != 0) if masked else True)
        assert torch.equal(out, torch.bincount(x[keep].long(), minlength=64).int())


# ---- join, split, cat, zeros_like, full_like -------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.int8], ids=str)
def test_join_split_cat(device, dtype):
    mod = module("""w = load(aux + r * n_cols + c, mask=m, other=0)
    pair = join(v, w)
    store(out + (r * n_cols + c)[:, :, None] * 2 + arange(0, 2)[None, None, :], pair, mask=m[:, :, None])
    lo, hi = split(pair * 2)
    store(aux + r * n_cols + c, hi - lo + zeros_like(lo) + full_like(lo, 3), mask=m)
    both = cat(v, w, can_reorder=True, dim=AXIS)
    rows = arange(0, (1 + (1 - AXIS)) * R)[:, None]
    cols = arange(0, (1 + AXIS) * C)[None, :]
    store(out + 2 * n_rows * n_cols + rows * ((1 + AXIS) * C) + cols, both)""")
    for R, C, nr, nc, warps in SHAPES[device]:
        for axis in (0, 1):
            x, y = fresh((nr, nc), dtype, device, -50, 50), fresh((nr, nc), dtype, device, -50, 50)
            out = poisoned((2 * nr * nc + 4 * R * C,), dtype, device)
            aux = y.clone()
            launch(mod, device, x, out, aux, R, C, warps, axis)
            close(out[:2 * nr * nc], torch.stack([x, y], -1).flatten(), dtype)
            close(aux, (y * 2 - x * 2 + 3).to(dtype), dtype)
            xp, yp = torch.zeros(R, C, dtype=dtype, device=device), torch.zeros(R, C, dtype=dtype, device=device)
            xp[:nr, :nc], yp[:nr, :nc] = x, y
            close(out[2 * nr * nc:].reshape(-1)[:2 * R * C], torch.cat([xp, yp], axis).flatten(), dtype)


def test_scalar_join_split_and_full_like_dtype():
    mod = newtc.compile("""\
kernel k(x, out):
    a, b = split(join(load(x), load(x + 1)))
    store(out, b - a)
    store(out + 1 + arange(0, 4), full_like(arange(0, 4), 2.5, dtype=f32) + zeros_like(load(x)))
""", "scalars.nk")
    x, out = torch.randn(2), poisoned((5,), torch.float32, "cpu")
    mod.k[(1,)](x, out)
    torch.testing.assert_close(out, torch.tensor([x[1] - x[0], 2.5, 2.5, 2.5, 2.5]))


# ---- NVRTC: each kernel above for sm_80 and sm_90a, the axis across registers, lanes and warps; in SASS the
# stages show (warp shuffles, shared memory and barriers across warps) and nothing spills to local memory
COMPILED = [  # (body, dtype, R, C, num_warps, axis, reverse, SASS opcodes)
    (SCANS["cumsum"], torch.float16, 1, 1024, 8, 1, False, "SHFL BAR"),
    (SCANS["cumsum"], torch.int8, 64, 16, 4, 0, True, "SHFL BAR"),
    (SCANS["cumsum"], torch.float32, 2, 2048, 4, 1, True, "SHFL BAR"),  # registers hold bits above the warps
    (SCANS["cumprod"], torch.bfloat16, 16, 64, 1, 1, True, "SHFL"),
    (SCANS["scan_max"], torch.int64, 64, 16, 8, 0, True, "SHFL BAR"),
    ("sort(v, dim=AXIS, descending=REV)", torch.float32, 1, 1024, 4, 1, True, "SHFL BAR"),
    ("sort(v, dim=AXIS, descending=REV)", torch.int64, 64, 16, 8, 0, False, "SHFL BAR"),
    ("sort(v, dim=AXIS, descending=REV)", torch.float64, 16, 64, 2, 1, True, "SHFL"),
    ("flip(v, AXIS)", torch.bfloat16, 64, 16, 4, 0, False, "BAR"),
    ("gather(v, load(aux + r * n_cols + c, mask=m, other=0), AXIS)", torch.float16, 16, 64, 4, 1, False, "STS LDS"),
]
MOVES = """store(out + r * 4 + arange(0, 4)[None, :], topk(v, 4), mask=r < n_rows)
    store(aux + arange(0, 64), histogram(load(aux + r * n_cols + c, mask=m, other=0), 64, mask=m))
    lo, hi = split(join(v, v * 2))
    w = cat(lo, hi, dim=AXIS)
    store(out + r * n_cols + c, hi - lo + full_like(lo, 1) + max(w, axis=AXIS, keep_dims=True) * 0, mask=m)
    m1, at = associative_scan((v, r * (1 - AXIS) + c * AXIS), AXIS, running_max, REV)
    store(aux + r * n_cols + c, at + m1.to(i32), mask=m)"""


COMPILED += [(MOVES, torch.float32, 16, 64, 4, 0, False, "ATOMS SHFL BAR"), (MOVES, torch.int32, 1, 1024, 8, 1, True, "ATOMS")]


@pytest.mark.parametrize("body, dtype, R, C, warps, axis, rev, expect", COMPILED, ids=[
    f"{'moves' if 'store' in b else b.split('(')[0]}-{str(d)[6:]}-{r}x{c}-warps{w}-axis{a}" for b, d, r, c, w, a, *_ in COMPILED])
def test_compiles(body, dtype, R, C, warps, axis, rev, expect):
    mod = module(body if "store" in body else f"store(out + r * n_cols + c, {body}, mask=m)")
    x, index = torch.zeros(4, dtype=dtype), torch.zeros(4, dtype=torch.int32)
    for arch in ARCHS:
        sass = mod.k.sass(x, x, index, 3, 3, R=R, C=C, AXIS=axis, REV=rev, num_warps=warps, arch=arch)
        ops = set(re.findall(r"\b[A-Z][A-Z0-9]+\b", sass))
        assert set(expect.split()) <= ops and not ops & {"LDL", "STL"}, (arch, sorted(ops))
