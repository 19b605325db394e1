"""What a Triton kernel needs to port line by line: `while` on a runtime condition, `break` and `continue`,
`return` inside a runtime `if` (helpers, and a bare `return` ending a kernel's program early), tuple
assignment, a local constexpr, `x.T`, and `min`/`max` of several values. Parse and check first, then each
kernel in the interpreter (CI) and on the GPU (marker gpu) against a Python/torch oracle on fresh random
inputs, outputs poisoned first, odd sizes; and NVRTC compiles each for sm_80 and sm_90a."""
import textwrap

import pytest
import torch

import newtc
from newtc import syntax
from newtc import ast as A

ARCHS = ["sm_80", "sm_90a"]


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def compile_(text: str, name: str = "control.nk"):
    return newtc.compile(textwrap.dedent(text), name)


# ---- syntax ------------------------------------------------------------------------------------------
def test_new_statements_parse():
    body = syntax.parse(textwrap.dedent("""\
        kernel k(x, n):
            a, b = b, a
            B: constexpr = 16
            while a < n:
                if a:
                    break
                continue
        """)).defs[0].body
    swap, local, loop = body
    assert isinstance(swap.value, A.TupleExpr) and [t.id for t in swap.targets] == ["a", "b"]
    assert local.annotation.id == "constexpr" and local.value.value == 16
    assert isinstance(loop, A.While) and isinstance(loop.body[0].body[0], A.Break) and isinstance(loop.body[1], A.Continue)


@pytest.mark.parametrize("word", ["while", "break", "continue"])
def test_new_keywords_are_reserved(word):
    with pytest.raises(newtc.NkError, match=rf"unexpected '{word}'"):
        syntax.parse(f"kernel k(x):\n    y = {word} + 1\n")


# ---- a row scan: while, continue, break, a helper's early return, tuples, a local constexpr, .T --------
SCAN = """
    # Per row: blocks of BLOCK columns are summed while the running sum stays at most `stop`; blocks with a
    # negative sum are skipped, and a block over `limit` is clipped by a helper that returns early.
    def clipped(v, limit):
        if max(v, axis=0) > limit:
            return minimum(v, limit), 1
        return v, 0

    kernel scan(x, out, stats, n_rows, n_cols, limit, stop, BLOCK: constexpr):
        row = program_id(0)
        if row >= n_rows:
            return
        HALF: constexpr = BLOCK // 2
        acc = zeros([BLOCK], f32)
        col, count, clips = 0, 0, 0
        while col < n_cols:
            cols = col + arange(0, BLOCK)
            v = load(x + row * n_cols + cols, mask=cols < n_cols, other=0).to(f32)
            col += BLOCK
            if sum(v, axis=0) < 0.0:
                continue
            v, hit = clipped(v, limit)
            acc, clips = acc + v, clips + hit
            count += 1
            if sum(acc, axis=0) > stop:
                break
        first, a, b = -1, 0, 1
        for i in range(0, n_cols):
            a, b = b, a
            if load(x + row * n_cols + i) > 2:
                first = i
                break
        halves = reshape(acc, [2, HALF]).T
        store(out + row * BLOCK + arange(0, HALF)[:, None] * 2 + arange(0, 2)[None, :], halves)
        store(stats + row * 4 + arange(0, 4), where(arange(0, 4) == 0, count, where(arange(0, 4) == 1, clips,
              where(arange(0, 4) == 2, first, a))))
"""


def scan_reference(x: torch.Tensor, limit: float, stop: float, block: int):
    """The same loops in Python, on the rows of x (small integers, so every sum is exact)."""
    rows, n = x.shape
    out, stats = torch.zeros(rows, block, dtype=torch.float64), []
    for r in range(rows):
        acc, col, count, clips = torch.zeros(block, dtype=torch.float64), 0, 0, 0
        while col < n:
            v = torch.zeros(block, dtype=torch.float64)
            part = x[r, col:col + block].double()
            v[:len(part)] = part
            col += block
            if v.sum() < 0:
                continue
            if v.max() > limit:
                v, clips = v.clamp(max=limit), clips + 1
            acc += v
            count += 1
            if acc.sum() > stop:
                break
        first, a, b = -1, 0, 1
        for i in range(n):
            a, b = b, a
            if x[r, i] > 2:
                first = i
                break
        out[r] = acc.reshape(2, block // 2).T.flatten()
        stats.append([count, clips, first, a])
    return out, torch.tensor(stats, dtype=torch.int32)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_scan_matches_python(device, dtype):
    mod = compile_(SCAN, "scan.nk")
    gen = torch.Generator().manual_seed(hash((device, str(dtype))) % 2**31)
    for n_cols, stop in [(1000, 40.0), (37, 5.0), (1, 0.0), (300, 1e9)]:
        rows, block = 5, 64
        x = torch.randint(-3, 4, (rows, n_cols), generator=gen).to(dtype)
        out = torch.full((rows, block), float("nan"), device=device)
        stats = torch.full((rows, 4), -7777, dtype=torch.int32, device=device)
        # one program more than rows: it must return before touching memory
        mod.scan[(rows + 1,)](x.to(device), out, stats, rows, n_cols, 2.0, stop, BLOCK=block)
        want_out, want_stats = scan_reference(x, 2.0, stop, block)
        assert torch.equal(out.cpu().double(), want_out), (n_cols, stop)
        assert torch.equal(stats.cpu(), want_stats), (n_cols, stop, stats, want_stats)


# ---- min and max of several values, on every dtype ------------------------------------------------------
EXTREMES = """
    kernel extremes(x, y, out, red, live, n, lo, BLOCK: constexpr):
        pid = program_id(0)
        offs = pid * BLOCK + arange(0, BLOCK)
        mask = offs < n
        a = load(x + offs, mask=mask, other=0)
        b = load(y + offs, mask=mask, other=0)
        store(out + offs, max(min(a, b), lo), mask=mask)
        store(out + n + offs, min(a, b, max(a, 1)), mask=mask)
        store(red + pid, max(a, axis=0))
        store(live + pid, min(n - pid * BLOCK, BLOCK))
"""
ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
              torch.int32, torch.int64]


def random_of(dtype, n, gen):
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype)
    lo = 0 if dtype == torch.uint8 else -100
    return torch.randint(lo, 100, (n,), generator=gen).to(dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_min_max_of_several_values(device, dtype):
    mod = compile_(EXTREMES, "extremes.nk")
    gen = torch.Generator().manual_seed(7)
    block = 128
    for n in (1000, 5):
        x, y = random_of(dtype, n, gen), random_of(dtype, n, gen)
        grid = -(-n // block)
        out = torch.full((2 * n,), 99, dtype=dtype, device=device)
        red = torch.full((grid,), 99, dtype=dtype, device=device)
        live = torch.full((grid,), -1, dtype=torch.int32, device=device)
        mod.extremes[(grid,)](x.to(device), y.to(device), out, red, live, n, 1, BLOCK=block)
        one = torch.ones((), dtype=dtype)
        assert torch.equal(out[:n].cpu(), torch.maximum(torch.minimum(x, y), one))
        assert torch.equal(out[n:].cpu(), torch.minimum(torch.minimum(x, y), torch.maximum(x, one)))
        padded = torch.zeros(grid * block, dtype=dtype)
        padded[:n] = x
        assert torch.equal(red.cpu(), padded.reshape(grid, block).amax(1))
        assert live.tolist() == [min(n - p * block, block) for p in range(grid)]


def test_min_max_keep_their_other_forms():
    """One block with axis= (or None) reduces; two compile-time numbers fold as in Python."""
    mod = compile_("""
        kernel k(x, out, B: constexpr):
            v = load(x + arange(0, B))
            store(out, max(v, axis=0) + min(v) + max(v, None) + max(B, 3, 2) + min(2.5, B))
    """)
    x = torch.randn(16)
    out = torch.full((1,), float("nan"))
    mod.k[(1,)](x, out, B=16)
    assert torch.allclose(out, 2 * x.max() + x.min() + 16 + 2.5)


# ---- x.T -------------------------------------------------------------------------------------------------
TRANSPOSE = """
    kernel transpose(x, out, sums, M, N, BM: constexpr, BN: constexpr):
        rm = program_id(0) * BM + arange(0, BM)
        rn = program_id(1) * BN + arange(0, BN)
        tile = load(x + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0)
        store(out + rn[:, None] * M + rm[None, :], tile.T, mask=(rn[:, None] < N) & (rm[None, :] < M))
        store(sums + program_id(0) * num_programs(1) + program_id(1), sum(tile.T))  # a view reduced whole
"""


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_dot_t_transposes(device, dtype):
    mod = compile_(TRANSPOSE, "transpose.nk")
    m, n = 37, 70
    x = random_of(dtype, m * n, torch.Generator().manual_seed(3)).reshape(m, n)
    out = torch.full((n, m), 99, dtype=dtype, device=device)
    grid = (-(-m // 32), -(-n // 16))
    sums = torch.full(grid, float("nan"), dtype=torch.float64, device=device)
    mod.transpose[grid](x.to(device), out, sums, m, n, BM=32, BN=16)
    assert torch.equal(out.cpu(), x.T)
    padded = torch.zeros(grid[0] * 32, grid[1] * 16, dtype=torch.float64 if dtype.is_floating_point else torch.int64)
    padded[:m, :n] = x
    want = padded.reshape(grid[0], 32, grid[1], 16).sum((1, 3))
    want = (want.to(dtype) if dtype.is_floating_point else want).double()  # an i8 sum is i32 (Triton's): no wrap
    torch.testing.assert_close(sums.cpu(), want, rtol=1e-2, atol=0.5)  # f16 sums round


# ---- generated code --------------------------------------------------------------------------------------
CODEGEN = [
    ("scan", SCAN, (torch.randn(2, 100), torch.empty(2, 64), torch.empty(2, 4, dtype=torch.int32), 2, 100, 2.0, 9.0),
     {"BLOCK": 64}),
    ("extremes", EXTREMES, (*(torch.empty(64, dtype=torch.float16) for _ in range(3)), torch.empty(1, dtype=torch.float16),
                            torch.empty(1, dtype=torch.int32), 64, 1), {"BLOCK": 64}),
    ("transpose", TRANSPOSE, (torch.empty(8, 8), torch.empty(8, 8), torch.empty(1, dtype=torch.float64), 8, 8),
     {"BM": 32, "BN": 16}),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name, text, args, meta", CODEGEN, ids=[c[0] for c in CODEGEN])
def test_nvrtc_compiles(name, text, args, meta, arch):
    kernel = getattr(compile_(text, f"{name}.nk"), name)
    assert ".entry nk_" + name in kernel.ptx(*args, arch=arch, **meta)


def test_a_loop_that_breaks_is_a_while_and_carried_swaps_are_staged():
    source = compile_(SCAN, "scan.nk").scan.source(*CODEGEN[0][2], BLOCK=64).split('extern "C" __global__')[1]
    assert source.count("while (") == 2  # the `while`, and the `for` that breaks
    # `a, b = b, a` in a loop: each next value is copied before any is written
    assert "int const a_next" in source and "int const b_next" in source


# ---- a helper that returns a pointer early ---------------------------------------------------------------
POINTERS = """
    def pick(x, y, i, c):
        if c > 0:
            return x + i
        return y + i

    kernel gather(x, y, out, c, n, BLOCK: constexpr):
        offs = program_id(0) * BLOCK + arange(0, BLOCK)
        store(out + offs, load(pick(x, y, offs, c), mask=offs < n), mask=offs < n)
"""


@pytest.mark.parametrize("device", devices())
def test_helper_returns_a_pointer_early(device):
    mod = compile_(POINTERS, "pointers.nk")
    n = 300
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    for c, want in ((1, x), (-1, y)):
        out = torch.full((n,), float("nan"), device=device)
        mod.gather[(-(-n // 128),)](x, y, out, c, n, BLOCK=128)
        assert torch.equal(out, want)
    for arch in ARCHS:
        assert ".entry nk_gather" in mod.gather.ptx(x, y, out, 1, n, BLOCK=128, arch=arch)
