"""Promises and loop options from Triton: `multiple_of(x, n)` and `max_contiguous(x, n)` (per dimension on
blocks) feed passes/axisinfo.py, so a load the analysis could not prove whole becomes one 128-bit access with
no run-time check; `range(..., num_stages=, unroll=)` sets one loop's software pipeline and `#pragma unroll`.
The interpreter ignores hints; results are compared with torch on the CPU (interpreter) and the GPU."""
import re
import textwrap

import pytest
import torch

import newtc
from newtc import compiler, syntax
from newtc.compiler import Spec
from newtc.types import Ptr, f16, f32, i32

ARCHS = ["sm_80", "sm_90a"]
CHECK = re.compile(r"& 15\) == 0")  # the run-time test that a 16-byte group is aligned (memory.vector_condition)


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


HINTED = textwrap.dedent("""
    # Offsets the analysis cannot follow (% n), and the promises that make their 16-byte groups whole again.
    kernel copy_mod(x, out, n, BLOCK: constexpr, HINT: constexpr):
        offs = (program_id(0) * BLOCK + arange(0, BLOCK)) % n
        if HINT:
            offs = max_contiguous(multiple_of(offs, BLOCK), BLOCK)
        store(out + offs, load(x + offs) * 2)

    # A 2-D tile whose columns wrap (% N): the promise per dimension (only runs along the columns).
    kernel copy_2d(x, out, M, N, BM: constexpr, BN: constexpr, HINT: constexpr):
        rm = program_id(0) * BM + arange(0, BM)
        rn = (program_id(1) * BN + arange(0, BN)) % N
        offs = rm[:, None] * N + rn[None, :]
        if HINT:
            offs = max_contiguous(multiple_of(offs, (1, BN)), (1, BN))
        mask = rm[:, None] < M
        store(out + offs, load(x + offs, mask=mask), mask=mask)

    # A pointer the launch does not know to be aligned, promised 16-byte aligned.
    kernel scale(x, out, BLOCK: constexpr, HINT: constexpr):
        offs = program_id(0) * BLOCK + arange(0, BLOCK)
        p = x
        if HINT:
            p = multiple_of(x, 16)
        store(out + offs, load(p + offs) + 1)

    # One loop's options: a pipeline deeper than the kernel's, unrolled by 2.
    kernel mm(a, b, c, M, N, K, BM: constexpr, BN: constexpr, BK: constexpr, STAGES: constexpr):
        rm = program_id(0) * BM + arange(0, BM)
        rn = program_id(1) * BN + arange(0, BN)
        acc = zeros([BM, BN], f32)
        for k in range(0, K, BK, num_stages=STAGES, unroll=2):
            rk = k + arange(0, BK)
            av = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            bv = load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc += av @ bv
        store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
""")


def module():
    return newtc.compile(HINTED, "hinted.nk")


def cuda(kernel: str, sig: dict, consts: dict, aligned: tuple, arch="sm_90a", **options) -> str:
    """The kernel's generated CUDA (the body after the prelude) for one specialization."""
    spec = Spec.of(sig, consts, aligned=aligned, arch=arch, **options)
    source = compiler.compile(syntax.parse(HINTED, "hinted.nk"), kernel, spec, until="cuda").cuda.source
    return source.split('extern "C" __global__')[1]


# ---- the analysis and the generated code -----------------------------------------------------------
COPY = ({"x": Ptr(f32), "out": Ptr(f32), "n": i32}, ("x", "out", "n"))
COPY_2D = ({"x": Ptr(f16), "out": Ptr(f16), "M": i32, "N": i32}, ("x", "out", "N"))
SCALE = ({"x": Ptr(f32), "out": Ptr(f32)}, ("out",))  # x not known to be aligned


@pytest.mark.parametrize("kernel, sig_aligned, consts", [
    ("copy_mod", COPY, {"BLOCK": 256}),
    ("copy_2d", COPY_2D, {"BM": 16, "BN": 64}),
    ("scale", SCALE, {"BLOCK": 512}),
], ids=["modulo", "2-D per dimension", "pointer"])
def test_a_hint_makes_the_access_vectorized(kernel, sig_aligned, consts):
    sig, aligned = sig_aligned
    plain = cuda(kernel, sig, {**consts, "HINT": False}, aligned)
    hinted = cuda(kernel, sig, {**consts, "HINT": True}, aligned)
    assert CHECK.search(plain), "without the hint the groups are checked at run time"
    assert not CHECK.search(hinted) and "nk_pack<" in hinted, hinted  # one bare 128-bit access per group
    assert len(re.findall(r"u\.w = \*", hinted)) >= 1


WRAPPED = """\
kernel k(x, out, BLOCK: constexpr, C: constexpr):
    offs = (program_id(0) * BLOCK + arange(0, BLOCK)) % C
    store(out + offs, load(x + offs) * 2)
"""


@pytest.mark.parametrize("c, whole", [(64, True), (4, True), (12, True), (6, False), (2, False)])
def test_a_constant_remainder_keeps_its_runs(c, whole):
    """x % c wraps only at multiples of c: runs of consecutive x that start at multiples of c's largest power-of-two
    divisor stay consecutive, so f32 groups of 4 stay whole where 4 divides c (no hint, no run-time check)."""
    spec = Spec.of({"x": Ptr(f32), "out": Ptr(f32)}, {"BLOCK": 256, "C": c}, aligned=("x", "out"))
    source = compiler.compile(syntax.parse(WRAPPED, "wrapped.nk"), "k", spec, until="cuda").cuda.source
    assert (CHECK.search(source) is None) == whole


def test_hints_are_ops_the_analysis_reads():
    ir_text = module().copy_mod.ir(torch.empty(64), torch.empty(64), 64, BLOCK=64, HINT=True)
    assert "hint(" in ir_text and "multiple_of=(64,)" in ir_text and "max_contiguous=(64,)" in ir_text


MM_SIG = {"a": Ptr(f16), "b": Ptr(f16), "c": Ptr(f32), "M": i32, "N": i32, "K": i32}
MM = {"BM": 64, "BN": 64, "BK": 32}


@pytest.mark.parametrize("arch", ARCHS)
def test_range_num_stages_overrides_the_kernels(arch):
    aligned = tuple(MM_SIG)
    deeper = cuda("mm", MM_SIG, {**MM, "STAGES": 3}, aligned, arch, num_stages=1)
    assert "cp.async" in deeper  # the loop's own pipeline, though the kernel asks for none
    flat = cuda("mm", MM_SIG, {**MM, "STAGES": 1}, aligned, arch, num_stages=3)
    assert "cp.async" not in flat  # and none for this loop, though the kernel asks for three stages
    assert "#pragma unroll 2\n" in deeper and "#pragma unroll 2\n" in flat


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel, args, meta", [
    ("copy_mod", (torch.empty(256), torch.empty(256), 256), {"BLOCK": 256, "HINT": True}),
    ("copy_2d", (torch.empty(64, dtype=torch.float16), torch.empty(64, dtype=torch.float16), 1, 64),
     {"BM": 16, "BN": 64, "HINT": True}),
    ("scale", (torch.empty(512), torch.empty(512)), {"BLOCK": 512, "HINT": True}),
    ("mm", (*(torch.empty(64, 64, dtype=torch.float16) for _ in range(2)), torch.empty(64, 64), 64, 64, 64),
     {**MM, "STAGES": 3}),
], ids=["copy_mod", "copy_2d", "scale", "mm"])
def test_nvrtc_compiles(kernel, args, meta, arch):
    assert ".entry nk_" + kernel in getattr(module(), kernel).ptx(*args, arch=arch, **meta)


# ---- results: the interpreter ignores hints, the GPU relies on them ---------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
@pytest.mark.parametrize("hint", [False, True])
def test_hinted_copies_match_torch(device, dtype, hint):
    mod = module()
    n, block = 1024, 256
    x = (torch.randn(n) * 100).to(dtype).to(device)
    out = torch.full((n,), 77, dtype=dtype, device=device)
    mod.copy_mod[(n // block,)](x, out, n, BLOCK=block, HINT=hint)
    assert torch.equal(out, x * 2)
    m, cols = 37, 128  # odd rows: the mask is uniform along each row's 16-byte groups
    x2 = (torch.randn(m, cols) * 100).to(dtype).to(device)
    out2 = torch.full((m, cols), 77, dtype=dtype, device=device)
    mod.copy_2d[(-(-m // 16), cols // 64)](x2, out2, m, cols, BM=16, BN=64, HINT=hint)
    assert torch.equal(out2, x2)
    y = torch.randn(n).to(dtype).to(device)
    out3 = torch.full((n,), 77, dtype=dtype, device=device)
    mod.scale[(n // 512,)](y, out3, BLOCK=512, HINT=hint)
    assert torch.equal(out3, y + 1)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("stages, kernel_stages", [(3, 1), (1, 3), (2, 2)])
def test_loop_options_keep_the_result(device, stages, kernel_stages):
    m, n, k = 70, 33, 100
    a = torch.randn(m, k).to(torch.float16).to(device)
    b = torch.randn(k, n).to(torch.float16).to(device)
    c = torch.full((m, n), float("nan"), device=device)
    module().mm[(-(-m // 64), -(-n // 64))](a, b, c, m, n, k, **MM, STAGES=stages, num_stages=kernel_stages)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-2)
