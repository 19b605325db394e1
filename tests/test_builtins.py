"""Triton's builtins beyond the core (issue 15): math, random numbers, the memory model of atomics, debugging.

Each feature runs in the interpreter and (marker gpu) on the GPU against a torch or numpy oracle, on fresh random
inputs with outputs poisoned first, and compiles through NVRTC for sm_80 and sm_90a. Random numbers are checked bit
for bit against a pure-numpy Philox that is itself checked against Random123's known-answer vectors.
"""
import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import newtc
from newtc import check, compiler, nvrtc, syntax
from newtc.types import Ptr, bf16, f16, f32, f64, i8, i32, i64, u64

ARCHS = ["sm_80", "sm_90a"]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def module(text: str, name: str = "builtins.nk"):
    return newtc.compile(textwrap.dedent(text), name)


def sass(text: str, kernel: str, sig: dict, consts: dict, arch: str) -> set:
    """NVRTC compiles it for arch (no GPU needed); the opcodes of its SASS."""
    m = syntax.parse(textwrap.dedent(text), "builtins.nk")
    out = compiler.compile(m, kernel, compiler.Spec.of(sig, consts, arch=arch))
    return set(OPCODE.findall(nvrtc.disassemble(out.binary.cubin)))


def tol(dtype) -> dict:
    """About 2 ulp of the dtype (CUDA's math library is within 1 to 4 ulp; torch's CPU math within 1)."""
    return {torch.float32: dict(rtol=4e-6, atol=1e-6), torch.float64: dict(rtol=1e-13, atol=1e-15),
            torch.float16: dict(rtol=2e-3, atol=1e-4), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-3)}[dtype]


def assert_close(got, ref, dtype, exact=False, **kw):
    """got against the float64 oracle rounded to the output dtype, NaN where the oracle has NaN."""
    ref = ref.to(dtype).double()
    if exact:
        assert torch.equal(got.double().nan_to_num(1234.5), ref.nan_to_num(1234.5)), (got, ref)
    else:
        torch.testing.assert_close(got.double(), ref, equal_nan=True, **(tol(dtype) | kw))


# ---- math ------------------------------------------------------------------------------------------------
UNARY = """\
kernel k(x, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    store(out + offs, FN(load(x + offs, mask=m)), mask=m)
"""
BINARY = """\
kernel k(x, y, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    store(out + offs, FN(load(x + offs, mask=m), load(y + offs, mask=m)), mask=m)
"""


def sym(n, scale):
    return (torch.rand(n, dtype=torch.float64) * 2 - 1) * scale


def halves(n):
    """Exact halves (ties for round/rint) mixed with other values."""
    ties = torch.randint(-40, 40, (n,)).double() * 0.5
    return torch.where(torch.rand(n) < 0.5, ties, sym(n, 20))


def round_half_away(x):
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


# builtin: (oracle in float64, inputs, compared exactly)
UNARY_CASES = {
    "asin": (torch.asin, lambda n: sym(n, 0.99), False), "acos": (torch.acos, lambda n: sym(n, 0.99), False),
    "atan": (torch.atan, lambda n: sym(n, 8), False), "sinh": (torch.sinh, lambda n: sym(n, 4), False),
    "cosh": (torch.cosh, lambda n: sym(n, 4), False),
    "log1p": (torch.log1p, lambda n: torch.rand(n, dtype=torch.float64) * 10 - 0.9, False),
    "expm1": (torch.expm1, lambda n: sym(n, 4), False), "erfinv": (torch.erfinv, lambda n: sym(n, 0.99), False),
    "rint": (torch.round, halves, True), "round": (round_half_away, halves, True),
    "trunc": (torch.trunc, lambda n: sym(n, 20), True),
}


def run_unary(device, fn, x, out_dtype, n):
    out = torch.full((n,), float("nan"), dtype=out_dtype, device=device)
    module(UNARY.replace("FN", fn), f"{fn}.nk").k[(-(-n // 256),)](x, out, n, BLOCK=256)
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", list(UNARY_CASES))
def test_unary_math(device, dtype, fn):
    oracle, inputs, exact = UNARY_CASES[fn]
    n = 1000 if device == "cpu" else 100_003
    x = inputs(n).to(dtype).to(device)
    out = run_unary(device, fn, x, dtype, n)
    assert_close(out.cpu(), oracle(x.cpu().double()), dtype, exact)


@pytest.mark.parametrize("device", devices())
def test_math_of_integers_runs_in_f32(device):
    x = torch.randint(-30, 30, (333,), dtype=torch.int32, device=device)
    for fn, oracle in (("round", torch.round), ("sinh", torch.sinh)):
        out = run_unary(device, fn, x, torch.float32, 333)
        assert_close(out.cpu(), oracle(x.cpu().double()), torch.float32)


def powers(n):
    """Negative bases with integer exponents (a real result) and with fractional ones (NaN), as torch.pow."""
    base = sym(n, 3)
    exp = torch.where(torch.rand(n) < 0.5, torch.randint(-4, 5, (n,)).double(), sym(n, 3))
    return base, exp


BINARY_CASES = {"pow": (torch.pow, powers, False), "atan2": (torch.atan2, lambda n: (sym(n, 5), sym(n, 5)), False),
                "div_rn": (torch.div, lambda n: (sym(n, 100), sym(n, 3)), True)}  # IEEE division is exact


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fn", list(BINARY_CASES))
def test_binary_math(device, dtype, fn):
    oracle, inputs, exact = BINARY_CASES[fn]
    n = 999 if device == "cpu" else 100_003
    x, y = (t.to(dtype).to(device) for t in inputs(n))
    out = torch.full((n,), float("nan"), dtype=dtype, device=device)
    module(BINARY.replace("FN", fn), f"{fn}.nk").k[(-(-n // 128),)](x, y, out, n, BLOCK=128)
    ref = oracle(x.cpu().double(), y.cpu().double())
    if fn == "pow":
        assert ref.isnan().any() and (ref[x.cpu() < 0] < 0).any()  # the case that matters is there
    assert_close(out.cpu(), ref, dtype, exact)


@pytest.mark.gpu
def test_div_rn_is_ieee_where_slash_is_approximate():
    """`/` on f32 is div.full (2 ulp, as Triton's); div_rn is correctly rounded."""
    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    mod = module(BINARY.replace("FN(load(x + offs, mask=m), load(y + offs, mask=m))",
                                "load(x + offs, mask=m) / load(y + offs, mask=m)"), "slash.nk")
    mod.k[(n // 1024,)](x, y, out, n, BLOCK=1024)
    assert not torch.equal(out, x / y)
    module(BINARY.replace("FN", "div_rn"), "div_rn.nk").k[(n // 1024,)](x, y, out, n, BLOCK=1024)
    assert torch.equal(out, x / y)


CLAMP = """\
kernel k(x, lo, hi, out, out2, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    v = load(x + offs, mask=m)
    store(out + offs, clamp(v, load(lo + offs, mask=m), load(hi + offs, mask=m)), mask=m)
    store(out2 + offs, clamp(v, -3, 5), mask=m)
"""


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.int64])
def test_clamp_matches_torch(device, dtype):
    n = 777
    if dtype.is_floating_point:
        x = (torch.randn(n) * 8).to(dtype)
        x[::17] = float("nan")  # NaN stays NaN, as torch.clamp
    else:
        x = torch.randint(-10, 10, (n,), dtype=dtype)
    lo = torch.randint(-6, 2, (n,)).to(dtype)
    hi = torch.randint(-1, 6, (n,)).to(dtype)  # lo > hi in places: then hi, as torch
    x, lo, hi = x.to(device), lo.to(device), hi.to(device)
    out, out2 = (torch.full((n,), 99, dtype=dtype, device=device) for _ in range(2))
    module(CLAMP).k[(-(-n // 64),)](x, lo, hi, out, out2, n, BLOCK=64)
    assert torch.equal(out.cpu().nan_to_num(1e4), torch.clamp(x, lo, hi).cpu().nan_to_num(1e4))
    assert torch.equal(out2.cpu().nan_to_num(1e4), torch.clamp(x, -3, 5).cpu().nan_to_num(1e4))


UMULHI = """\
kernel k(x, y, out, n, BLOCK: constexpr, U: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    a = load(x + offs, mask=m)
    b = load(y + offs, mask=m)
    if U:
        a = a.to(U, bitcast=True)
        b = b.to(U, bitcast=True)
    store(out + offs, umulhi(a, b), mask=m)
"""


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype, unsigned", [(torch.int32, None), (torch.int32, "u32"), (torch.int64, None),
                                             (torch.int64, "u64")])
def test_umulhi_is_the_high_half_of_the_unsigned_product(device, dtype, unsigned):
    n, bits = 513, 32 if dtype == torch.int32 else 64
    info = torch.iinfo(dtype)
    x, y = (torch.randint(info.min, info.max, (n,), dtype=dtype) for _ in range(2))
    x[:3] = torch.tensor([info.min, -1, info.max])
    out = torch.zeros(n, dtype=dtype, device=device)
    meta = {"U": newtc.types.DTYPES[unsigned] if unsigned else 0}
    module(UMULHI).k[(-(-n // 128),)](x.to(device), y.to(device), out, n, BLOCK=128, **meta)
    hi = [((a % 2**bits) * (b % 2**bits)) >> bits for a, b in zip(x.tolist(), y.tolist())]
    assert out.cpu().tolist() == [h - 2**bits if h >= 2**(bits - 1) else h for h in hi]


# libdevice.NAME: (oracle, inputs, arity) for names the interpreter has, and names only the GPU runs
LIBDEVICE = {"j0": (torch.special.bessel_j0, lambda n: sym(n, 20), 1),
             "y1": (torch.special.bessel_y1, lambda n: torch.rand(n, dtype=torch.float64) * 20 + 0.5, 1),
             "erfcx": (torch.special.erfcx, lambda n: sym(n, 5), 1),
             "cyl_bessel_i0": (torch.special.i0, lambda n: sym(n, 5), 1),
             "normcdf": (torch.special.ndtr, lambda n: sym(n, 5), 1),
             "normcdfinv": (torch.special.ndtri, lambda n: torch.rand(n, dtype=torch.float64) * 0.98 + 0.01, 1),
             "log10": (torch.log10, lambda n: torch.rand(n, dtype=torch.float64) * 100 + 0.01, 1),
             "exp": (torch.exp, lambda n: sym(n, 20), 1),
             "hypot": (torch.hypot, lambda n: (sym(n, 10), sym(n, 10)), 2),
             "copysign": (torch.copysign, lambda n: (sym(n, 10), sym(n, 10)), 2)}
GPU_ONLY = {"tgamma": (lambda x: torch.exp(torch.lgamma(x)), lambda n: torch.rand(n, dtype=torch.float64) * 8 + 0.1, 1),
            "cbrt": (lambda x: torch.sign(x) * x.abs() ** (1 / 3), lambda n: sym(n, 100), 1),
            "fma": (lambda a, b, c: a * b + c, lambda n: (sym(n, 3), sym(n, 3), sym(n, 3)), 3)}


def libdevice_kernel(fn: str, arity: int) -> str:
    names = "xyz"[:arity]
    loads = ", ".join(f"load({v} + offs, mask=m)" for v in names)
    return f"""\
kernel k({', '.join(names)}, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    store(out + offs, libdevice.{fn}({loads}), mask=m)
"""


def run_libdevice(device, fn, spec, dtype, n=1001):
    oracle, inputs, arity = spec
    args = inputs(n)
    args = [a.to(dtype).to(device) for a in (args if isinstance(args, tuple) else (args,))]
    out = torch.full((n,), float("nan"), dtype=dtype, device=device)
    module(libdevice_kernel(fn, arity), f"{fn}.nk").k[(-(-n // 256),)](*args, out, n, BLOCK=256)
    return out.cpu(), oracle(*(a.cpu().double() for a in args))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("fn", list(LIBDEVICE))
def test_libdevice_calls_the_cuda_math_function(device, dtype, fn):
    got, ref = run_libdevice(device, fn, LIBDEVICE[fn], dtype)
    # beyond |x| = 8 CUDA bounds j0, y1 absolutely (2.2e-6 in f32), which is loose near their zeros; in f64 the
    # oracle is the coarse one: torch's bessel_j0/y1 are 3.6e-7/8.4e-7 off mpmath's on these inputs
    bessel = {torch.float32: 2e-5, torch.float64: 2e-6}.get(dtype) if fn in ("j0", "y1") else None
    assert_close(got, ref, dtype, **({"atol": bessel} if bessel else {}))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", list(GPU_ONLY))
def test_libdevice_functions_beyond_the_interpreter(dtype, fn):
    got, ref = run_libdevice("cuda", fn, GPU_ONLY[fn], dtype)
    assert_close(got, ref, dtype, rtol=1e-5 if dtype == torch.float32 else 1e-12)


def test_libdevice_function_without_an_interpreter_rule_is_a_diagnostic():
    with pytest.raises(newtc.NkError) as e:
        run_libdevice("cpu", "tgamma", GPU_ONLY["tgamma"], torch.float32)
    out = e.value.render(color=False)
    assert "tgamma.nk:4:" in out and "libdevice.tgamma is not in the interpreter" in out and "Traceback" not in out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [f32, f64])
def test_every_libdevice_function_compiles(arch, dt):
    """Each name newt accepts is a CUDA math function NVRTC knows, as NAMEf (f32) and NAME (f64)."""
    lines = [f"    r += libdevice.{fn}({', '.join('abc'[:arity])})" for fn, arity in check.LIBM.items()]
    text = "\n".join(["kernel k(x, BLOCK: constexpr):", "    offs = arange(0, BLOCK)", "    a = load(x + offs)",
                      "    b = a * 0.5", "    c = a + 2.0", "    r = a", *lines, "    store(x + offs, r)", ""])
    sass(text, "k", {"x": Ptr(dt)}, {"BLOCK": 128}, arch)

MATH_ALL = """\
kernel k(x, y, z, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    a = load(x + offs, mask=m)
    b = load(y + offs, mask=m)
    r = asin(a) + acos(a) + atan(a) + sinh(a) + cosh(a) + log1p(a) + expm1(a) + rint(a) + round(a) + trunc(a)
    r += erfinv(a) + pow(a, b) + atan2(a, b) + div_rn(a, b) + clamp(a, -1, b) + libdevice.j0(a)
    r += libdevice.fma(a, b, a) + libdevice.tgamma(b)
    store(out + offs, r, mask=m)
    store(z + offs, umulhi(offs, 7919), mask=m)
"""


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [f32, f64, f16, bf16])
def test_math_compiles(arch, dt):
    ops = sass(MATH_ALL, "k", {"x": Ptr(dt), "y": Ptr(dt), "z": Ptr(i32), "out": Ptr(dt), "n": i32}, {"BLOCK": 256},
               arch)
    if dt != f64:  # CUDA's f64 trigonometry reduces large arguments through a local array
        assert not any(o.startswith(("LDL", "STL")) for o in ops), sorted(ops)


# ---- random numbers ----------------------------------------------------------------------------------------
def philox(counter, key, rounds: int, bits: int) -> list:
    """Random123's Philox4xW-R in numpy (uint64 for W = 32, whose products fit; Python ints for W = 64): each round
    multiplies counter words 0 and 2, the key is bumped before every round but the first."""
    mask, dtype = (1 << bits) - 1, np.uint64 if bits == 32 else object
    m0, m1 = (0xD2511F53, 0xCD9E8D57) if bits == 32 else (0xD2E7470EE14C6C93, 0xCA5A826395121157)
    w0, w1 = (0x9E3779B9, 0xBB67AE85) if bits == 32 else (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)
    c = [np.asarray(v, dtype=dtype) & mask for v in counter]
    k = [np.asarray(v, dtype=dtype) & mask for v in key]
    for r in range(rounds):
        if r:
            k = [(k[0] + w0) & mask, (k[1] + w1) & mask]
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> bits) ^ c[1] ^ k[0], p1 & mask, (p0 >> bits) ^ c[3] ^ k[1], p0 & mask]
    return c


def signed(x, bits: int) -> np.ndarray:
    """Unsigned words as the signed integers of their bits."""
    x = np.asarray(x)
    return x.astype(np.uint32).view(np.int32) if bits == 32 else np.array([int(v) for v in x], np.uint64).view(np.int64)


KAT = """\
philox4x32 7 00000000 00000000 00000000 00000000 00000000 00000000   5f6fb709 0d893f64 4f121f81 4f730a48
philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
philox4x64 10 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000 0000000000000000   16554d9eca36314c db20fe9d672d0fdc d7e772cee186176b 7e68b68aec7ba23b
philox4x64 10 ffffffffffffffff ffffffffffffffff ffffffffffffffff ffffffffffffffff ffffffffffffffff ffffffffffffffff   87b092c3013fe90b 438c3c67be8d0224 9cc7d7c69cd777b6 a09caebf594f0ba0
philox4x64 10 243f6a8885a308d3 13198a2e03707344 a4093822299f31d0 082efa98ec4e6c89 452821e638d01377 be5466cf34e90c6c   a528f45403e61d95 38c72dbd566e9788 a5a1610e72fd18b5 57bd43b5e52b7fe6
"""  # Random123 tests/kat_vectors (github.com/DEShawResearch/random123 at 9545ff6): name, rounds, ctr, key, expected


@pytest.mark.parametrize("line", KAT.strip().splitlines(), ids=lambda s: " ".join(s.split()[:3]))
def test_reference_philox_matches_random123(line):
    name, rounds, *words = line.split()
    words = [int(w, 16) for w in words]
    got = philox(words[:4], words[4:6], int(rounds), 32 if name == "philox4x32" else 64)
    assert [int(v) for v in got] == words[6:]


def triton_randint4x(seed: int, offsets, rounds: int = 10) -> list:
    """Triton's random.py: counter (offset, 0, 0, 0); key: the seed's 32-bit halves (32-bit offsets, Philox4x32)
    or (seed, 0) (64-bit offsets, Philox4x64)."""
    bits = offsets.element_size() * 8
    seed %= 1 << 64
    key = (seed & 0xFFFFFFFF, seed >> 32) if bits == 32 else (seed, 0)
    words = offsets.numpy().astype(np.uint32 if bits == 32 else np.uint64)
    return philox([words.astype(np.uint64) if bits == 32 else words.astype(object), 0, 0, 0], key, rounds, bits)


def uniform(x, bits: int) -> np.ndarray:
    """Triton's uint_to_uniform_float: as a signed int, -x - 1 where negative, times 2**-31 (2**-63) in float32."""
    x = signed(x, bits).astype(np.int64)
    x = np.where(x < 0, -x - 1, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10 if bits == 32 else 1.0842020432385337e-19)


def box_muller(u1, u2):
    r = np.sqrt(np.float32(-2.0) * np.log(np.maximum(np.float32(1e-7), u1)))
    th = np.float32(6.283185307179586) * u2
    return r * np.cos(th), r * np.sin(th)


RANDOM = """\
kernel ints(o0, o1, o2, o3, seed, n, base, BLOCK: constexpr, ROUNDS: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    a, b, c, d = randint4x(seed, offs + base, ROUNDS)
    store(o0 + offs, a, mask=m)
    store(o1 + offs, b, mask=m)
    store(o2 + offs, c, mask=m)
    store(o3 + offs, d, mask=m)
    device_assert(randint(seed, offs + base, n_rounds=ROUNDS) == a, "randint is randint4x's first", mask=m)

kernel floats(u, z, u4, z4, seed, n, base, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    store(u + offs, rand(seed, offs + base), mask=m)
    store(z + offs, randn(seed, offs + base), mask=m)
    a, b, c, d = rand4x(seed, offs + base)
    e, f, g, h = randn4x(seed, offs + base)
    store(u4 + 4 * offs, a, mask=m)
    store(u4 + 4 * offs + 1, b, mask=m)
    store(u4 + 4 * offs + 2, c, mask=m)
    store(u4 + 4 * offs + 3, d, mask=m)
    store(z4 + 4 * offs, e, mask=m)
    store(z4 + 4 * offs + 1, f, mask=m)
    store(z4 + 4 * offs + 2, g, mask=m)
    store(z4 + 4 * offs + 3, h, mask=m)

kernel const_seed(o, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(o + offs, randint(0xFFFFFFFFFFFFFFFB, offs), mask=offs < n)

kernel u64_seed(o, seed: u64, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(o + offs, randint(seed, offs), mask=offs < n)
"""
SEEDS = [0, 12345, -7, 2**32 + 17, 2**62 + 3]  # beyond 2**32 the key's high word is used (Triton takes 64-bit seeds)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("base", [0, -1000, 2**40 + 5])  # 64-bit offsets run Philox4x64, as in Triton
def test_randint4x_is_tritons_stream_bit_for_bit(device, seed, base):
    wide = base >= 2**31
    n = 1000 if device == "cpu" else 30_001 if wide else 1_000_003  # the 64-bit reference runs on Python ints
    dtype = torch.int64 if wide else torch.int32
    outs = [torch.full((n,), 7, dtype=dtype, device=device) for _ in range(4)]
    for rounds in (10, 7):
        module(RANDOM).ints[(-(-n // 256),)](
            *outs, seed, n, base, BLOCK=256, ROUNDS=rounds)
        offsets = torch.arange(n, dtype=dtype) + base
        ref = triton_randint4x(seed, offsets, rounds)
        for got, want in zip(outs, ref):
            assert np.array_equal(got.cpu().numpy(), signed(want, 64 if wide else 32))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("seed", SEEDS[:4])
@pytest.mark.parametrize("base", [0, 2**33])
def test_rand_and_randn_follow_triton(device, seed, base):
    """rand is bit for bit (an int-to-float conversion and one multiply); randn goes through log, sqrt, cos, sin,
    so it matches the float32 reference to a few ulp."""
    n = 999 if device == "cpu" else 30_001 if base else 1_000_003
    u, z = (torch.full((n,), float("nan"), device=device) for _ in range(2))
    u4, z4 = (torch.full((n, 4), float("nan"), device=device) for _ in range(2))
    mod = module(RANDOM)
    mod.floats[(-(-n // 128),)](u, z, u4, z4, seed, n, base, BLOCK=128)
    offsets = torch.arange(n, dtype=torch.int64 if base else torch.int32) + base
    bits = 64 if base else 32
    us = [uniform(w, bits) for w in triton_randint4x(seed, offsets)]
    assert np.array_equal(u.cpu().numpy(), us[0])
    assert np.array_equal(u4.cpu().numpy(), np.stack(us, 1))
    assert 0 <= u.min() and u.max() < 1
    n1, n2 = box_muller(us[0], us[1])
    n3, n4 = box_muller(us[2], us[3])
    np.testing.assert_allclose(z.cpu().numpy(), n1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z4.cpu().numpy(), np.stack([n1, n2, n3, n4], 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", devices())
def test_seeds_beyond_63_bits(device):
    n = 300
    mod = module(RANDOM)
    for kernel, args in (("const_seed", ()), ("u64_seed", (2**64 - 5,))):
        o = torch.zeros(n, dtype=torch.int32, device=device)
        getattr(mod, kernel)[(3,)](o, *args, n, BLOCK=128)
        want = triton_randint4x(2**64 - 5, torch.arange(n, dtype=torch.int32))[0]
        assert np.array_equal(o.cpu().numpy(), signed(want, 32))


@pytest.mark.parametrize("arch", ARCHS)
def test_random_compiles_without_local_memory(arch):
    ops = sass(RANDOM, "floats", {**{k: Ptr(f32) for k in ("u", "z", "u4", "z4")}, "seed": i64, "n": i32, "base": i64},
               {"BLOCK": 1024}, arch)
    assert not any(o.startswith(("LDL", "STL")) for o in ops), sorted(ops)
    assert any(o.startswith("IMAD.WIDE.U32") or o.startswith("IMAD.HI") for o in ops), sorted(ops)  # umulhi


# ---- the memory model of atomics ---------------------------------------------------------------------------
BITWISE = """\
kernel k(dst, val, n, BLOCK: constexpr, OP: constexpr, SEM: constexpr, SCOPE: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    v = load(val + offs, mask=m)
    if OP == "or":
        atomic_or(dst + offs % 5, v, mask=m, sem=SEM, scope=SCOPE)
    elif OP == "and":
        atomic_and(dst + offs % 5, v, mask=m, sem=SEM, scope=SCOPE)
    else:
        atomic_xor(dst + offs % 5, v, mask=m, sem=SEM, scope=SCOPE)
    atomic_add(dst + 5, 1, mask=m, sem=SEM, scope=SCOPE)
"""
SEMS, SCOPES = ["relaxed", "acquire", "release", "acq_rel"], ["gpu", "cta", "sys"]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["or", "and", "xor"])
@pytest.mark.parametrize("sem, scope", [("acq_rel", "gpu"), ("relaxed", "cta"), ("release", "sys"), ("acquire", "gpu")])
def test_bitwise_atomics(device, dtype, op, sem, scope):
    n = 1001 if device == "cpu" else 1_000_003
    info = torch.iinfo(dtype)
    val = torch.randint(info.min, info.max, (n,), dtype=dtype)
    start = torch.randint(info.min, info.max, (6,), dtype=dtype)
    start[5] = 0
    dst = start.clone().to(device)
    module(BITWISE).k[(-(-n // 256),)](dst, val.to(device), n, BLOCK=256, OP=op, SEM=sem, SCOPE=scope)
    fold = {"or": np.bitwise_or, "and": np.bitwise_and, "xor": np.bitwise_xor}[op]
    want = [fold.reduce(np.concatenate([[start[i].item()], val[i::5].numpy()])) for i in range(5)]
    assert dst.cpu().tolist() == want + [n]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("sem, scope, expect, absent", [
    ("acq_rel", "gpu", ["ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU", "MEMBAR.ALL.GPU"], []),
    ("relaxed", "gpu", ["ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU"], ["MEMBAR"]),
    ("relaxed", "cta", ["ATOMG.E.ADD.F32.FTZ.RN.STRONG.SM"], ["MEMBAR"]),
    ("release", "sys", ["ATOMG.E.ADD.F32.FTZ.RN.STRONG.SYS", "MEMBAR"], []),
    ("acquire", "cta", ["ATOMG.E.ADD.F32.FTZ.RN.STRONG.SM", "MEMBAR.ALL.CTA"], []),
])
def test_sem_and_scope_in_sass(arch, sem, scope, expect, absent):
    """sem is a fence.acq_rel before (release), after (acquire) or around the atomic: the SASS of
    atom.acq_rel.gpu is the same MEMBAR, ATOMG and cache invalidation."""
    text = f"""\
    kernel k(dst, val, old, n, BLOCK: constexpr):
        offs = arange(0, BLOCK)
        store(old + offs, atomic_add(dst + offs % 7, load(val + offs), sem="{sem}", scope="{scope}"))
    """
    ops = sass(text, "k", {"dst": Ptr(f32), "val": Ptr(f32), "old": Ptr(f32), "n": i32}, {"BLOCK": 128}, arch)
    for e in expect:
        assert any(o.startswith(e) for o in ops), (e, sorted(ops))
    for a in absent:
        assert not any(o.startswith(a) for o in ops), (a, sorted(ops))


SUMS = """\
kernel k(dst, val, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    v = load(val + offs, mask=m)
    atomic_add(dst + offs % 64, v, mask=m)
    atomic_add(dst + 64 + offs % 7, v, mask=m)
"""


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("n", [4096, 1001])
def test_atomic_sums_whose_old_values_are_unread(device, n):
    """Their SASS is RED (below); the sums: 4096 takes whole groups of four, 1001 masks the last one unevenly."""
    val = torch.randn(n)
    dst = torch.randn(71)
    module(SUMS).k[(-(-n // 256),)](out := dst.to(device, copy=True), val.to(device), n, BLOCK=256)
    i = torch.arange(n)
    want = dst.double().index_add(0, i % 64, val.double()).index_add(0, 64 + i % 7, val.double())
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("arch, red", [("sm_80", "RED.E.ADD.F32.FTZ.RN.STRONG.GPU"),
                                       ("sm_90a", "REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU")])
def test_unread_atomics_are_reductions(arch, red):
    """The first sums' groups of four are whole where n is a multiple of 16 and the pointers 16-byte aligned."""
    m = syntax.parse(SUMS, "builtins.nk")
    spec = compiler.Spec.of({"dst": Ptr(f32), "val": Ptr(f32), "n": i32}, {"BLOCK": 256}, arch=arch,
                            aligned=("dst", "val", "n"))
    text = nvrtc.disassemble(compiler.compile(m, "k", spec).binary.cubin)
    assert f"{red} " in text and "ATOM" not in text, sorted(set(OPCODE.findall(text)))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [i32, i64, u64, f32, f64])
def test_every_unread_atomic_compiles(arch, dt):
    """Adds (and integer max, min, or, and, xor) whose old values are unread are RED at every scope; the rest stay
    atomics."""
    ops = ["add", "max", "min", "xchg"] + (["or", "and", "xor"] if dt.is_int else [])
    lines = [f'    atomic_{op}(dst + offs % 7, load(val + offs), sem="relaxed", scope="{s}")' for op in ops
             for s in ("cta", "gpu", "sys")]
    text = "\n".join(["kernel k(dst, val, BLOCK: constexpr):", "    offs = arange(0, BLOCK)", *lines, ""])
    found = sass(text, "k", {"dst": Ptr(dt), "val": Ptr(dt)}, {"BLOCK": 64}, arch)
    assert any(o.startswith("RED") for o in found), sorted(found)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", [i32, i64, u64, f32, f64])
def test_every_atomic_compiles_at_every_scope(arch, dt):
    ops = ["add", "max", "min", "xchg"] + (["or", "and", "xor"] if dt.is_int else [])
    orders = [("relaxed", "cta"), ("acquire", "gpu"), ("release", "sys"), ("acq_rel", "cta")]
    lines = [f'    r += atomic_{op}(dst + offs % 7, load(val + offs), sem="{m}", scope="{s}")' for op in ops for m, s in orders]
    cas = ['    atomic_cas(dst, 1, 2, sem="release", scope="cta")'] if dt.is_int else []
    text = "\n".join(["kernel k(dst, val, BLOCK: constexpr):", "    offs = arange(0, BLOCK)", "    r = load(val + offs)",
                      *lines, *cas, "    store(val + offs, r)", ""])
    assert any(o.startswith("ATOMG") for o in sass(text, "k", {"dst": Ptr(dt), "val": Ptr(dt)}, {"BLOCK": 64}, arch))


# ---- debugging ---------------------------------------------------------------------------------------------
BARRIER = """\
kernel k(buf, out, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(buf + offs, offs * 3)
    debug_barrier()
    store(out + offs, load(buf + (offs + 37) % BLOCK))
"""


@pytest.mark.parametrize("device", devices())
def test_debug_barrier_orders_memory_within_a_program(device):
    buf, out = (torch.full((1024,), -1, dtype=torch.int32, device=device) for _ in range(2))
    module(BARRIER).k[(1,)](buf, out, BLOCK=1024)
    assert out.cpu().tolist() == [(i + 37) % 1024 * 3 for i in range(1024)]


@pytest.mark.parametrize("arch", ARCHS)
def test_debug_barrier_is_a_bar_sync(arch):
    assert "BAR.SYNC.DEFER_BLOCKING" in sass(BARRIER, "k", {"buf": Ptr(i32), "out": Ptr(i32)}, {"BLOCK": 1024}, arch)


ASSERT = """\
kernel k(x, n, limit, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    v = load(x + offs, mask=m)
    device_assert(v < limit, "x is \\"small\\" 100%", mask=m)
    device_assert(n > 0, "n is positive")
"""


@pytest.mark.parametrize("device", devices())
def test_device_assert_that_holds(device):
    x = torch.rand(1000, device=device)
    module(ASSERT).k[(4,)](x, 1000, 1.0, BLOCK=256)
    if device == "cuda":
        torch.cuda.synchronize()


def test_device_assert_in_the_interpreter_names_the_line_the_program_and_the_lane():
    x = torch.rand(1000)
    x[700] = 5.0
    with pytest.raises(newtc.NkError) as e:
        module(ASSERT, "assert.nk").k[(4,)](x, 1000, 1.0, BLOCK=256)
    out = e.value.render(color=False)
    assert out.splitlines()[0] == 'assert.nk:5:5: error: device_assert failed: x is "small" 100%'
    assert "program (2, 0, 0), element [188]" in out and "Traceback" not in out


@pytest.mark.gpu
def test_device_assert_on_the_gpu_reports_the_nk_line():
    """A failed assert traps the kernel (the CUDA context is lost), so it runs in a child process."""
    script = textwrap.dedent(f"""\
        import torch, newtc
        mod = newtc.compile({ASSERT!r}, "assert.nk")
        x = torch.rand(1000, device="cuda")
        x[700] = 5.0
        mod.k[(4,)](x, 1000, 1.0, BLOCK=256)
        torch.cuda.synchronize()
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "assert.nk:5" in out and 'x is "small" 100%' in out, out


@pytest.mark.parametrize("arch", ARCHS)
def test_device_assert_compiles(arch):
    m = syntax.parse(textwrap.dedent(ASSERT), "assert.nk")
    gen = compiler.compile(m, "k", compiler.Spec.of({"x": Ptr(f32), "n": i32, "limit": f32}, {"BLOCK": 256}, arch=arch))
    assert '__assertfail("x is \\042small\\042 100%", "assert.nk", 5, "k", 1);' in gen.cuda.source


def test_static_print_prints_once_per_specialization(capsys):
    mod = module("""\
    kernel k(x, BLOCK: constexpr):
        v = load(x + arange(0, BLOCK))
        static_print("block", BLOCK, v, v.dtype)
        store(x + arange(0, BLOCK), v + 1)
    """, "sp.nk")
    x = torch.zeros(64)
    for block in (32, 32, 64, 32):
        mod.k[(1,)](x, BLOCK=block)
    assert capsys.readouterr().err.splitlines() == ["sp.nk:3: block 32 f32[32] f32", "sp.nk:3: block 64 f32[64] f32"]
    assert x[:32].tolist() == [4.0] * 32 and x[32:].tolist() == [1.0] * 32


ASM = """\
kernel k(x, y, s, f, out, fout, sgn, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    a = load(x + offs, mask=m)
    b = load(y + offs, mask=m)
    store(out + offs, inline_asm_elementwise("shf.l.wrap.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, s], i32, True, 1), mask=m)
    v = load(f + offs, mask=m)
    store(fout + offs, inline_asm_elementwise("fma.rn.f32 $0, $1, $1, $2;", "=f,f,f", [v, 0.5], f32, True, 1), mask=m)
    r = inline_asm_elementwise("{ .reg .pred %p; setp.lt.s32 %p, $1, 0; selp.s32 $0, -1, 1, %p; }", "=r,r", a, i32,
                               False, 1)
    store(sgn + offs, r, mask=m)
"""


@pytest.mark.gpu
def test_inline_asm_elementwise_on_the_gpu():
    n = 1001
    x, y = (torch.randint(-2**31, 2**31, (n,), dtype=torch.int32, device="cuda") for _ in range(2))
    f = torch.randn(n, device="cuda")
    out, sgn = (torch.zeros(n, dtype=torch.int32, device="cuda") for _ in range(2))
    fout = torch.full((n,), float("nan"), device="cuda")
    module(ASM).k[(-(-n // 256),)](x, y, 5, f, out, fout, sgn, n, BLOCK=256)
    lo, hi = (t.cpu().numpy().view(np.uint32).astype(np.uint64) for t in (x, y))  # funnel shift: the high word
    assert np.array_equal(out.cpu().numpy(), signed((((hi << 32 | lo) << 5) >> 32) & 0xFFFFFFFF, 32))  # of hi:lo << 5
    torch.testing.assert_close(fout.cpu(), (f.cpu().double() ** 2 + 0.5).float(), rtol=2e-7, atol=0)  # one rounding
    assert torch.equal(sgn.cpu(), torch.where(x.cpu() < 0, -1, 1).int())


@pytest.mark.parametrize("arch", ARCHS)
def test_inline_asm_compiles(arch):
    ops = sass(ASM, "k", {"x": Ptr(i32), "y": Ptr(i32), "s": i32, "f": Ptr(f32), "out": Ptr(i32), "fout": Ptr(f32),
                          "sgn": Ptr(i32), "n": i32}, {"BLOCK": 256}, arch)
    assert any(o.startswith("SHF.L.W") for o in ops), sorted(ops)


def test_inline_asm_in_the_interpreter_is_a_diagnostic():
    n = 8
    args = [torch.zeros(n, dtype=torch.int32)] * 2 + [5, torch.zeros(n)] + [torch.zeros(n, dtype=torch.int32),
                                                                           torch.zeros(n), torch.zeros(n, dtype=torch.int32), n]
    with pytest.raises(newtc.NkError) as e:
        module(ASM, "asm.nk").k[(1,)](*args, BLOCK=8)
    assert e.value.render(color=False).startswith("asm.nk:6:23: error: inline_asm_elementwise() runs PTX")


ASM_PACK = """\
kernel k(a, b, h, g, v, u, band, hsum, neg, wide, sc, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    x = load(a + offs, mask=m)
    store(band + offs, inline_asm_elementwise("and.b32 $0, $1, $2;", "=r,r,r", [x, load(b + offs, mask=m)], i8, True, 4),
          mask=m)
    hs = inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [load(h + offs, mask=m), load(g + offs, mask=m)],
                                f16, True, 2)
    store(hsum + offs, hs, mask=m)
    store(neg + offs, inline_asm_elementwise("neg.f32 $0, $2; neg.f32 $1, $3;", "=f,=f,f,f", load(v + offs, mask=m),
                                             f32, True, 2) - inline_asm_elementwise("neg.f32 $0, $2; neg.f32 $1, $3;",
                                                                                    "=f,=f,f,f", sc, f32, True, 2), mask=m)
    w = inline_asm_elementwise("WIDEN", "=r,=r,=r,=r,r", load(u + offs, mask=m), i32, True, 4)
    store(wide + offs, w, mask=m)
""".replace("WIDEN", "{ .reg .b8 t<4>; mov.b32 {t0, t1, t2, t3}, $4; "
            "cvt.u32.u8 $0, t0; cvt.u32.u8 $1, t1; cvt.u32.u8 $2, t2; cvt.u32.u8 $3, t3; }")


@pytest.mark.gpu
@pytest.mark.parametrize("block", [256, 1024])
def test_inline_asm_packs_elements_as_triton(block):
    """pack=4 i8 and pack=2 f16 share one 32-bit register (element 0 in the low bits); pack=2 f32 takes two (a scalar:
    one element and a padding one)."""
    n = 1001  # not a multiple of pack * threads: the last group of a thread is padded
    a, b, u = (torch.randint(-128, 128, (n,), dtype=torch.int8, device="cuda") for _ in range(3))
    h, g = (torch.randn(n, device="cuda").half() for _ in range(2))
    v = torch.randn(n, device="cuda")
    band = torch.zeros(n, dtype=torch.int8, device="cuda")
    hsum = torch.full((n,), float("nan"), dtype=torch.float16, device="cuda")
    neg = torch.full((n,), float("nan"), device="cuda")
    wide = torch.full((n,), -1, dtype=torch.int32, device="cuda")
    module(ASM_PACK).k[(-(-n // block),)](a, b, h, g, v, u, band, hsum, neg, wide, 0.75, n, BLOCK=block)
    assert torch.equal(band, a & b) and torch.equal(hsum, h + g) and torch.equal(neg, -v + 0.75)
    assert torch.equal(wide, u.int() & 255)


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_inline_asm_compiles(arch):
    sig = {"a": Ptr(i8), "b": Ptr(i8), "h": Ptr(f16), "g": Ptr(f16), "v": Ptr(f32), "u": Ptr(i8), "band": Ptr(i8),
           "hsum": Ptr(f16), "neg": Ptr(f32), "wide": Ptr(i32), "sc": f32, "n": i32}
    for block in (64, 1024):
        assert "HADD2" in sass(ASM_PACK, "k", sig, {"BLOCK": block}, arch)

# ---- integers as pointers ----------------------------------------------------------------------------------
POINTERS = """\
kernel k(x, addr, bits, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    p = (load(addr + offs, mask=m, other=0) + 4 * offs).to(pointer_type(f32))
    q = (x + offs).to(i64).to(u64).to(x.dtype)
    store(out + offs, load(p, mask=m) + load(q, mask=m), mask=m)
    store(bits + offs, load(x.to(pointer_type(i32)) + offs, mask=m), mask=m)
"""


@pytest.mark.parametrize("device", devices())
def test_integers_and_pointers_convert(device):
    n = 1000
    x = torch.randn(n + 3, device=device)[3:]  # addresses need not be 16-byte aligned
    addr = torch.full((n,), x.data_ptr(), dtype=torch.int64, device=device)
    out = torch.full((n,), float("nan"), device=device)
    bits = torch.zeros(n, dtype=torch.int32, device=device)
    module(POINTERS).k[(-(-n // 256),)](x, addr, bits, out, n, BLOCK=256)
    assert torch.equal(out, x + x)
    assert torch.equal(bits, x.view(torch.int32))


def test_an_address_outside_the_launchs_tensors_is_a_diagnostic():
    n = 8
    x = torch.randn(n)
    addr = torch.full((n,), 64, dtype=torch.int64)
    with pytest.raises(newtc.NkError) as e:
        module(POINTERS, "ptr.nk").k[(1,)](x, addr, torch.zeros(n, dtype=torch.int32), torch.zeros(n), n, BLOCK=8)
    assert e.value.render(color=False).startswith("ptr.nk:4:9: error: the interpreter follows addresses inside")


@pytest.mark.parametrize("arch", ARCHS)
def test_pointer_casts_compile(arch):
    sass(POINTERS, "k", {"x": Ptr(f32), "addr": Ptr(i64), "bits": Ptr(i32), "out": Ptr(f32), "n": i32}, {"BLOCK": 256},
         arch)
