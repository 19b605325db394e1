"""fp8 (f8e4m3, f8e5m2: torch.float8_e4m3fn and torch.float8_e5m2) against torch.

Conversions: every fp8 code to f32, f16, bf16 and f64; to fp8 from a dense sweep of f32 and f64 (every fp8 value, the
ties between neighbours and one ulp either side, subnormals, overflow, inf, nan, both signs) and from every f16 and
bf16 value. Then arithmetic (in f32, rounded back; Triton's promotion), reductions, a scalar parameter, and the
vectorized memory access. Each runs in the interpreter (cpu) and on the GPU (cuda, marker gpu) twice: with the
hardware cvt (sm_89+) and with the software path sm_80 uses (compiled with -DNK_FP8_SOFTWARE). NVRTC compiles both
paths for sm_80 and sm_90a. Outputs start as the bitwise complement of the expected values.

e4m3 saturates to +-448 (inf too) as torch >= 2.12 does (older torch gave NaN past 464): the oracle clamps first so
that it holds on any torch, and test_the_oracle_is_torch ties it to torch's own conversion where torch saturates.
"""
import re

import pytest
import torch

import newtc
from newtc import driver, jit, nvrtc
from newtc import ir as jit_ir

FORMATS = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
TORCH_SATURATES = tuple(map(int, re.findall(r"\d+", torch.__version__)[:2])) >= (2, 12)
BLOCK = 1024

KERNELS = newtc.compile("""\
kernel copy(x, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)

kernel arith(a, b, twice, mixed, total, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    x = load(a + offs, mask=m, other=0)
    y = load(b + offs, mask=m, other=0)
    store(twice + offs, x * 2 + 1, mask=m)
    store(mixed + offs, x + y, mask=m)
    store(total + program_id(0) * 2, sum(x, axis=0))
    store(total + program_id(0) * 2 + 1, max(x, axis=0))

kernel dot8(a, b, c, sam, sak, sbk, sbn, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = arange(0, BM)
    rn = arange(0, BN)
    rk = arange(0, BK)
    x = load(a + rm[:, None] * sam + rk[None, :] * sak)
    y = load(b + rk[:, None] * sbk + rn[None, :] * sbn)
    store(c + rm[:, None] * BN + rn[None, :], dot(x, y))

kernel kloop(a, b, c, K, FOLD: constexpr, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = arange(0, BM)
    rn = arange(0, BN)
    rk = arange(0, BK)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        x = load(a + rm[:, None] * K + (k + rk)[None, :])
        y = load(b + rn[None, :] * K + (k + rk)[:, None])
        if FOLD:
            acc = dot(x, y, acc)
        else:
            acc += dot(x, y)
    store(c + rm[:, None] * BN + rn[None, :], acc)

kernel scale(x, out, s: f8e4m3, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) * s, mask=offs < n)
""", "fp8_tests.nk")


def paths():
    """(device, fp8 path): the interpreter, and the GPU with the hardware and the software conversions."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu),
            pytest.param("cuda-software", marks=pytest.mark.gpu)]


def launch(kernel, path: str, n: int, *args, **meta):
    grid = (-(-n // BLOCK),)
    if path != "cuda-software":
        return kernel[grid](*args, n, BLOCK=BLOCK, **meta)
    # the kernel's own CUDA, with the sm_80 conversions, launched by hand
    args, meta = (*args, n), {"BLOCK": BLOCK, **meta}
    out = kernel.output(args, meta, "cuda")
    device = args[0].device.index or 0
    cubin = nvrtc.compile(out.cuda.source, out.cuda.name, driver.arch(device), ("-DNK_FP8_SOFTWARE",)).cubin
    binary = jit.Binary(out.cuda.name, cubin, out.cuda.threads, out.cuda.smem_bytes,
                        [p.type.dtype for p in out.kernel.params])
    previous = driver.current_context()
    driver.set_device(device)
    try:
        run = jit.Launcher(binary, device).function()
    finally:
        driver.set_context(previous)
    run(jit._stream(device), [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args], *grid)
    torch.cuda.synchronize(device)


def on(path: str) -> str:
    return path.split("-")[0]


def to_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """torch's conversion (from f64 through f32, as torch does), e4m3 clamped first as torch >= 2.12 saturates."""
    x = x.float()
    return (x.clamp(-448.0, 448.0) if fmt == "f8e4m3" else x).to(FORMATS[fmt])


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(BITS[x.element_size()])


def poisoned(expected: torch.Tensor) -> torch.Tensor:
    """The bitwise complement of what the kernel must write: no element can pass unwritten."""
    return (~bits(expected)).view(expected.dtype)


def assert_same(out: torch.Tensor, expected: torch.Tensor, nan_sign: bool) -> None:
    """Equal bits, except that a NaN need only be a NaN (of the same sign when `nan_sign`): no payload is promised."""
    out, expected = out.cpu(), expected.cpu()
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan)
    if nan_sign:
        assert torch.equal(out.signbit()[nan], expected.signbit()[nan])
    bad = (bits(out) != bits(expected)) & ~nan
    assert not bad.any(), (out[bad][:8].tolist(), expected[bad][:8].tolist())


def f32_sweep() -> torch.Tensor:
    """Every fp8 value of both formats, the ties halfway between neighbours and one ulp either side, dense runs
    through both ranges and past them, every power of two down to f32 subnormals, the special values; both signs."""
    parts = []
    for t in FORMATS.values():
        v = torch.arange(256, dtype=torch.uint8).view(t).float()
        fin = v[v.isfinite()].unique()
        mid = (fin[1:] + fin[:-1]) / 2  # exact in f32
        parts += [fin, mid, torch.nextafter(mid, torch.tensor(float("inf"))),
                  torch.nextafter(mid, torch.tensor(float("-inf")))]
    parts += [torch.linspace(0, 600, 12001), torch.linspace(0, 70000, 14001), torch.exp2(torch.arange(-149, 128.0)),
              torch.tensor([float("inf"), float("nan"), 3.4e38, 1e-45, 2.0 ** -10, 2.0 ** -17, 464.0, 480.0, 61440.0,
                            65536.0])]
    x = torch.cat(parts)
    return torch.cat([x, -x])


SOURCES = {
    "f32": f32_sweep,
    "f64": lambda: torch.cat([f32_sweep().double(), torch.tensor([1.0625 + 1e-12, 1.0625 - 1e-12, 447.99999999999])]),
    "f16": lambda: torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.float16),
    "bf16": lambda: torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16),
}


# ---- conversions ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", paths())
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_every_code_widens_like_torch(path, fmt, dst):
    x = torch.arange(256, dtype=torch.uint8).view(FORMATS[fmt]).to(on(path))
    expected = x.float().to(dst)
    out = poisoned(expected)
    launch(KERNELS.copy, path, 256, x, out)
    assert_same(out, expected, nan_sign=dst == torch.float32)


@pytest.mark.parametrize("path", paths())
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("src", SOURCES)
def test_narrowing_rounds_like_torch(path, fmt, src):
    x = SOURCES[src]().to(on(path))
    expected = to_fp8(x, fmt)
    out = poisoned(expected)
    launch(KERNELS.copy, path, x.numel(), x, out)
    assert torch.equal(bits(out).cpu(), bits(expected).cpu())  # every bit, the sign of a NaN included


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_oracle_is_torch(device, fmt):
    if fmt == "f8e4m3" and not TORCH_SATURATES:
        pytest.skip(f"torch {torch.__version__} gives NaN past 464 for e4m3; 2.12 and later saturate")
    for src in SOURCES.values():
        x = src().to(device)
        assert torch.equal(bits(x.to(FORMATS[fmt])).cpu(), bits(to_fp8(x, fmt)).cpu())


# ---- arithmetic, reductions, parameters ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", paths())
@pytest.mark.parametrize("fa, fb, promoted", [("f8e4m3", "f8e4m3", "f8e4m3"), ("f8e4m3", "f8e5m2", torch.float16),
                                              ("f8e5m2", torch.bfloat16, torch.float32),
                                              ("f8e5m2", torch.float16, torch.float16)])
def test_arithmetic_runs_in_f32_and_promotes_like_triton(path, fa, fb, promoted):
    n = 1000
    a = to_fp8(torch.randint(-64, 64, (n,)) / 8, fa)  # multiples of 1/8: sums are exact in any order
    b = to_fp8(torch.randn(n) * 8, fb) if fb in FORMATS else (torch.randn(n) * 8).to(fb)
    t = to_fp8(to_fp8(a.float() * 2, fa).float() + 1, fa)  # each op rounds back to fp8
    s = a.float() + b.float()
    mixed = (to_fp8(s, promoted) if promoted in FORMATS else s.to(promoted)).float()
    total = torch.stack([to_fp8(a.float().sum(), fa).float(), a.float().max().clamp(min=0)])  # masked lanes load 0
    outs = [poisoned(v.to(on(path))) for v in (t, mixed, total)]
    launch(KERNELS.arith, path, n, a.to(on(path)), b.to(on(path)), *outs)
    for out, want in zip(outs, (t, mixed, total)):
        assert torch.equal(bits(out).cpu(), bits(want))


@pytest.mark.parametrize("path", paths())
def test_an_fp8_scalar_parameter_is_rounded_on_entry(path):
    x = torch.randn(300)
    want = x * to_fp8(torch.tensor(0.3), "f8e4m3").float()  # 0.3 arrives as 0.3125
    out = poisoned(want).to(on(path))
    launch(KERNELS.scale, path, 300, x.to(on(path)), out, 0.3)
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fa, fb", [("f8e4m3", "f8e4m3"), ("f8e5m2", "f8e5m2"), ("f8e4m3", "f8e5m2")])
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_dot_of_fp8_blocks_sums_exact_products_in_f32(device, fa, fb, b_major):
    """dot of fp8 blocks: the f32 sum of products exact in f32, here equal to the exact product (quarters up to 2
    in magnitude, 64 long: every partial sum is exact in any order). On sm_90a wgmma's fp8 form where B holds K
    contiguous, else mma.sync on values converted to f16; two formats meet in f16 (Triton's promotion)."""
    m = n = k = 64
    a = to_fp8(torch.randint(-8, 9, (m, k)) / 4, fa)
    b = to_fp8(torch.randint(-8, 9, (n, k)) / 4, fb).t() if b_major == "k" else \
        to_fp8(torch.randint(-8, 9, (k, n)) / 4, fb)
    want = (a.double() @ b.double()).float()
    c = poisoned(want).to(device)
    a, b = a.to(device), b.to(device)
    KERNELS.dot8[(1,)](a, b, c, *a.stride(), *b.stride(), BM=m, BN=n, BK=k, num_warps=4)
    assert torch.equal(c.cpu(), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fold", [True, False])
def test_fp8_sums_in_f32_where_asked(device, fold):
    """`acc += dot(x, y)` on fp8 blocks adds each K step's product in f32 registers (Hopper's tensor cores keep a
    running fp8 sum at reduced precision); `dot(x, y, acc)` accumulates on the tensor cores. The fold of one into the
    other (passes/fold.py) leaves fp8 dots alone: one add per K step stays in the kernel. Both match the exact product
    (integers up to 2 in magnitude: every partial sum is under 2^11, exact even in the tensor cores' narrower running
    sum), on the interpreter and the GPU."""
    m, n, k = 64, 64, 512
    a, b = to_fp8(torch.randint(-2, 3, (m, k)), "f8e4m3"), to_fp8(torch.randint(-2, 3, (n, k)), "f8e4m3").t()
    args = (a, b, torch.empty(m, n), k)
    meta = dict(FOLD=fold, BM=m, BN=n, BK=128, num_warps=4)
    body = KERNELS.kloop.output(args, meta, "ir", "sm_90a").kernel
    loop = next(op for op in jit_ir.walk(body.body) if op.kind == "for")
    tiles = [op.kind for op in jit_ir.walk(loop.regions[0]) if op.kind in ("dot", "add") and op.result.type.shape == (m, n)]
    assert tiles == ["dot"] + ["add"] * (not fold)
    want = (a.double() @ b.double()).float()
    c = poisoned(want).to(device)
    KERNELS.kloop[(1,)](a.to(device), b.to(device), c, k, **meta)
    assert torch.equal(c.cpu(), want)


@pytest.mark.parametrize("arch, fmt, b_major, expect", [("sm_90a", "f8e4m3", "k", "QGMMA"), ("sm_90a", "f8e5m2", "k", "QGMMA"),
                                                        ("sm_90a", "f8e4m3", "n", "HMMA"), ("sm_80", "f8e4m3", "k", "HMMA")])
def test_dot_of_fp8_blocks_runs_on_the_tensor_cores(arch, fmt, b_major, expect):
    """sm_90a: wgmma's fp8 form (QGMMA) where B holds K contiguous (it transposes only 16-bit tiles), else mma.sync
    in f16 (HMMA), as on sm_80."""
    a, b = torch.empty(64, 64, dtype=FORMATS[fmt]), torch.empty(64, 64, dtype=FORMATS[fmt])
    b = b.t() if b_major == "k" else b
    text = KERNELS.dot8.sass(a, b, torch.empty(64, 64), *a.stride(), *b.stride(), BM=64, BN=64, BK=64, num_warps=4,
                             arch=arch)
    assert expect in text and "LDL" not in text


# ---- the generated code --------------------------------------------------------------------------------------------
def sass(kernel, arch: str, *args) -> set:
    text = kernel.sass(*args, 4096, BLOCK=BLOCK, arch=arch)
    return set(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", text))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_moves_16_bytes_per_access_and_converts_per_arch(arch, fmt):
    """16 fp8 values per 128-bit load and store; sm_90a converts with F2FP (cvt), sm_80 in software."""
    x8 = torch.empty(4096, dtype=FORMATS[fmt])
    ops = sass(KERNELS.copy, arch, x8, torch.empty(4096, dtype=FORMATS[fmt]))
    assert {"LDG.E.128", "STG.E.128"} <= ops, sorted(ops)
    narrow = sass(KERNELS.copy, arch, torch.empty(4096), x8)
    assert any(op.startswith("F2FP") for op in narrow) == (arch == "sm_90a"), sorted(narrow)
    assert not any(op.startswith(("LDL", "STL")) for op in narrow)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_software_path_compiles_on_every_arch(arch):
    x = torch.empty(4096, dtype=torch.float8_e4m3fn)
    out = KERNELS.arith.output((x, x.to(torch.float8_e5m2), torch.empty(4096), torch.empty(4096), torch.empty(8),
                                4096), {"BLOCK": BLOCK}, "cuda", arch)
    for options in ((), ("-DNK_FP8_SOFTWARE",)):
        assert nvrtc.compile(out.cuda.source, out.cuda.name, arch, options).cubin.startswith(b"\x7fELF")
