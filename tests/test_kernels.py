"""Kernels beyond the stdlib ops, on both targets: the interpreter on the CPU and (marker gpu) the GPU.

Each compares with torch on fresh random inputs, outputs poisoned with NaN (or -1) first.
"""
import re

import pytest
import torch

import newtc

MATMUL = """\
# C = A @ B with a K loop: the CUDA-core dot on small tiles.
kernel matmul(a, b, c, M, N, K, BM: constexpr, BN: constexpr, BK: constexpr, PREC: constexpr = "tf32"):
    rm = program_id(0) * BM + arange(0, BM)
    rn = program_id(1) * BN + arange(0, BN)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        rk = k + arange(0, BK)
        x = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        y = load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += dot(x, y, input_precision=PREC)
    store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

# Per row: the index of the largest element (first one on ties).
kernel row_argmax(x, out, n_cols, BLOCK: constexpr):
    row = program_id(0)
    cols = arange(0, BLOCK)
    v = load(x + row * n_cols + cols, mask=cols < n_cols, other=-inf)
    store(out + row, argmax(v, axis=0))

# Per row of 4 (each thread's registers): the least and the largest of the values negated, written four ways (the
# last one LLVM's: q - (v + q) is -v, q the row reversed).
kernel negated_extremes(x, lo, hi, n_rows, BM: constexpr):
    rows = program_id(0) * BM + arange(0, BM)
    cols = arange(0, 4)
    mask = rows[:, None] < n_rows
    v = load(x + rows[:, None] * 4 + cols[None, :], mask=mask, other=0)
    q = load(x + rows[:, None] * 4 + (3 - cols)[None, :], mask=mask, other=0)
    store(lo + rows[:, None] * 4 + cols[None, :], min(-v, axis=1)[:, None] + v, mask=mask)
    hi_ = max(0 - v, axis=1) + min(v * -1, axis=1) + max(q - (v + q), axis=1)
    store(hi + rows[:, None] * 4 + cols[None, :], hi_[:, None], mask=mask)

# A square tile plus its rows' least values, transposed: the transpose goes through shared memory, read back by
# ldmatrix for 16-bit values where the layouts line up (BM 32 on 4 warps).
kernel min_rows_transposed(x, out, BM: constexpr):
    r = arange(0, BM)
    v = load(x + r[:, None] * BM + r[None, :])
    store(out + r[:, None] * BM + r[None, :], trans(min(v, axis=1)[:, None] + v))

# A histogram: many lanes add to the same bins.
kernel histogram(x, bins, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    atomic_add(bins + load(x + offs, mask=offs < n, other=0), 1, mask=offs < n)
"""


@pytest.fixture(scope="module")
def mod():
    return newtc.compile(MATMUL, "kernels.nk")


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype,prec,tol", [(torch.float32, "ieee", 1e-5), (torch.float32, "tf32", 2e-3),
                                            (torch.float16, "tf32", 1e-5)])
def test_matmul_with_dot(mod, device, dtype, prec, tol):
    M, N, K = (37, 45, 70) if device == "cpu" else (300, 257, 190)
    a = torch.randn(M, K, device=device).to(dtype)
    b = torch.randn(K, N, device=device).to(dtype)
    c = torch.full((M, N), float("nan"), device=device)
    mod.matmul[(-(-M // 16), -(-N // 16))](a, b, c, M, N, K, BM=16, BN=16, BK=16, PREC=prec)
    ref = a.double() @ b.double()
    err = (c.double() - ref).norm() / ref.norm()
    assert torch.isfinite(c).all() and err < tol


@pytest.mark.parametrize("device", devices())
def test_row_argmax(mod, device):
    x = torch.randn(33, 1000, device=device)
    x[5, 10] = x[5, 900] = 100.0  # a tie: the first index wins, as in torch
    out = torch.full((33,), -1, dtype=torch.int32, device=device)
    mod.row_argmax[(33,)](x, out, 1000, BLOCK=1024)
    assert torch.equal(out.long(), torch.argmax(x, dim=1))


def test_argmax_across_warps_verifies(mod, monkeypatch):
    """Where warps meet, argmax's scratch holds 12 bytes a value (its 8, then a 4-byte index): the IR verifier
    takes a buffer of bytes that is not a power of two."""
    monkeypatch.setenv("NEWT_VERIFY", "1")
    x, out = torch.randn(33, 1000), torch.empty(33, dtype=torch.int32)
    assert "alloc" in mod.row_argmax.ir(x, out, 1000, BLOCK=1024, num_warps=4)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.int64])
def test_negated_integers_into_min_and_max(mod, device, dtype):
    """ptxas 12.6-13.3 fold a negation into sm_90's three-way integer min/max (VIMNMX3) and drop it for one operand:
    min(-a, -b, -c, -d) came out as min(-a, b, -c, -d), found by test_random_kernels on an H200 (NVRTC 13.0), twice:
    once written -x, once LLVM's own (q - (v + q)). A kernel whose PTX negates a 32-bit or narrower integer is built
    with its min and max operands through nk_opaque's identity prmt (compiler.compile_cuda)."""
    x = torch.randint(-1000, 1000, (1000, 4), dtype=dtype, device=device)
    lo, hi = (torch.full_like(x, -7) for _ in range(2))
    args, meta = (x, lo, hi, 1000), dict(BM=64, num_warps=1)
    if device == "cpu" and dtype != torch.int64:  # (64-bit min/max has no three-way form)
        for arch in ("sm_80", "sm_90a"):
            assert re.search(r"prmt\.b32 \S+, \S+, 0, 0x3210;", mod.negated_extremes.ptx(*args, arch=arch, **meta))
    mod.negated_extremes[(-(-1000 // 64),)](*args, **meta)
    assert torch.equal(lo, (-x).amin(1, keepdim=True) + x)
    assert torch.equal(hi, (2 * (-x).amax(1, keepdim=True) + (-x).amin(1, keepdim=True)).expand_as(x))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.int16, torch.float16, torch.bfloat16])
def test_16_bit_tile_transposed_through_ldmatrix(mod, device, dtype):
    """ldmatrix reads 16-bit registers of any 16-bit type: i16 ones were written as f16's struct (a compile error,
    found by test_random_kernels)."""
    x = torch.randint(-50, 50, (32, 32), device=device).to(dtype)
    out = torch.full_like(x, -7)
    args, meta = (x, out), dict(BM=32, num_warps=4)
    for arch in ("sm_80", "sm_90a"):
        assert "ldmatrix" in mod.min_rows_transposed.output(args, meta, "cuda", arch).cuda.source
        mod.min_rows_transposed.ptx(*args, arch=arch, **meta)
    mod.min_rows_transposed[(1,)](*args, **meta)
    assert torch.equal(out, (x.amin(1, keepdim=True) + x).t())


@pytest.mark.parametrize("device", devices())
def test_histogram_atomics(mod, device):
    n = 5000 if device == "cpu" else 1_000_003
    x = torch.randint(0, 16, (n,), dtype=torch.int32, device=device)
    bins = torch.zeros(16, dtype=torch.int32, device=device)
    mod.histogram[(-(-n // 1024),)](x, bins, n, BLOCK=1024)
    assert torch.equal(bins.long(), torch.bincount(x.long(), minlength=16))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_dot_compiles_without_local_memory(mod, arch):
    a = torch.randn(16, 16)
    for prec, unit in (("ieee", "FFMA"), ("tf32", "HMMA")):  # f32 operands: CUDA cores, or tensor cores as tf32
        sass = mod.matmul.sass(a, a, a, 16, 16, 16, BM=16, BN=16, BK=16, PREC=prec, arch=arch)
        assert unit in sass and "LDL" not in sass and "STL" not in sass
