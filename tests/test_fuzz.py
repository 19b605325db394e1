"""A mutation fuzzer over the stdlib kernels and a few seeds that use the rest of the language.

Each mutant (token and line edits, byte flips, truncation, deep nesting, long lines, huge literals,
unicode) goes through `newtc --check`, then `newtc.compile` + `.ir` + `.source` + NVRTC + an interpreter
launch of every kernel it defines. Every outcome must be a success or a diagnostic (NkError); anything
else fails the test and prints the mutant. NVRTC rejecting generated code counts as a failure too, and
so does a verifier's finding (NEWT_VERIFY: the IR after every pass, the interpreter's values per op).

CI runs a fixed-seed sample. A longer run, for the team:

    NEWT_FUZZ=20000 NEWT_FUZZ_SEED=1 python -m pytest -q -s tests/test_fuzz.py

NEWT_FUZZ_FIRST=5000 NEWT_FUZZ=5000 runs mutants 5000 to 9999 of the seed: one seed's run split over processes.
"""
from __future__ import annotations

import collections
import contextlib
import io
import os
import random
import re
import signal
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

import newtc
from newtc import cli, interpret, nvrtc
from newtc.types import Ptr

ROOT = Path(__file__).resolve().parent.parent
COUNT = int(os.environ.get("NEWT_FUZZ", "300"))
SEED = int(os.environ.get("NEWT_FUZZ_SEED", "0"))
FIRST = int(os.environ.get("NEWT_FUZZ_FIRST", "0"))  # the first mutant's index: a long run split over processes
NVRTC_EVERY = int(os.environ.get("NEWT_FUZZ_NVRTC_EVERY", "4"))  # NVRTC is the slow stage: one mutant in 4
TIMEOUT_S = 60  # per mutant, all stages: far above any here (a hang is a finding too)

# Features the stdlib does not use, so that mutants reach them.
SEEDS = '''\
def clip(v, lo, hi):
    return minimum(maximum(v, lo), hi)

kernel features(x, y, out, idx, n, scale: f32, BLOCK: constexpr, MODE: constexpr = "sum"):
    pid = program_id(0)
    offs = pid * BLOCK + arange(0, BLOCK)
    mask = offs < n
    a = load(x + offs, mask=mask, other=0.0)
    b = load(y + offs, mask=mask, other=1.0)
    keep = a > b
    c = where(keep & mask, a * scale, clip(b, -1.0, 1.0))
    i = load(idx + offs, mask=mask, other=0)
    j = ((i * 3 + 7) // 2 % 5 << 1 >> 1) & 15 | 2 ^ 1
    t = trans(reshape(c, [BLOCK // 2, 2]))
    s = sum(t, axis=1, keep_dims=True)
    am = argmax(c, axis=0)
    for k in static_range(0, 2):
        c = c + k
    acc = 0.0
    for k in range(0, n, BLOCK):
        cols = k + arange(0, BLOCK)
        acc += sum(load(x + cols, mask=cols < n, other=0.0))
    if MODE == "sum":
        c = c + acc + max(c, axis=0) + am.to(f32) + j.to(f32)
    elif pid > 0:
        c = exp(c) / (1.0 + abs(c)) + sqrt(abs(c)) * s.shape[0]
    store(out + offs, c, mask=mask)
    store(out + n + pid, sum(s))
    atomic_add(out + n + 8 + arange(0, BLOCK) % 4, 1.0, mask=keep)
    u = load(idx + offs, mask=mask, other=0).to(u8)
    store(idx + offs, (u >> 1).to(i32) + cdiv(n, 7), mask=not keep)

def running_max(v, i, w, j):
    take = w > v
    return where(take, w, v), where(take, j, i)

kernel moves(x, out, idx, n, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    mask = offs < n
    a = load(x + program_id(0) * BLOCK + offs, mask=mask, other=0.0)
    i = load(idx + offs, mask=mask, other=0)
    c = cumsum(a, axis=0) + cumprod(a, 0, reverse=True) + cumsum(i.to(i8), 0).to(f32)
    m, at = associative_scan((a, offs), 0, running_max)
    t = reshape(a, [BLOCK // 8, 8])
    s = sort(t, dim=1, descending=True) + flip(t, 0) + max(topk(trans(t), 4, dim=0), axis=0)[:, None]
    g = gather(a, i & (BLOCK - 1), 0)
    h = histogram(i & 15, 16, mask=mask)
    lo, hi = split(join(a, g))
    both = cat(lo, hi, can_reorder=True)
    store(out + offs, c + m + at.to(f32) + reshape(s, [BLOCK]) + lo - hi + zeros_like(a) + full_like(a, 2.0), mask=mask)
    store(out + BLOCK + arange(0, 2 * BLOCK), both)
    store(out + 3 * BLOCK + arange(0, 16), h.to(f32))

kernel mm(a, b, c, M, N, K, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rn = program_id(1) * BN + arange(0, BN)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        rk = k + arange(0, BK)
        av = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        bv = load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += av @ bv
    store(c + rm[:, None] * N + rn[None, :], acc.to(f16).to(f32), mask=(rm[:, None] < M) & (rn[None, :] < N))

kernel tiles(x, out, x8, M, N, BM: constexpr, BN: constexpr):
    p = make_block_ptr(x, (M, N), (N, 1), (program_id(0) * BM, 0), (BM, BN), (1, 0))
    acc = zeros([BM, BN], f32)
    for k in range(0, N, BN):
        v = load(p, boundary_check=(0, 1), padding_option="zero").to(f8e5m2)
        w = load(x8 + arange(0, BN))
        acc += v.to(f32) * w[None, :] + (v * 2).to(f32)
        p = advance(p, (0, BN))
    q = make_block_ptr(base=out, shape=(M, N), strides=(N, 1), offsets=(program_id(0) * BM, 0), block_shape=(BM, BN),
                       order=(1, 0))
    store(q, acc.to(f8e4m3).to(f32), boundary_check=(0, 1))

kernel rng(x, out, idx, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    u = rand(n, offs)
    a, b, c, d = randint4x(n + 2**33, offs.to(i64), n_rounds=7)
    device_assert(u < 1.0, "rand is below 1", mask=mask)
    v = load(x + offs, mask=mask, other=0.5)
    r = pow(v, 2.0) + asin(clamp(v, -1, 1)) + atan2(v, u) + round(v) + rint(v) + trunc(v) + div_rn(v, 3.0) + randn(n, offs)
    r += log1p(abs(v)) + expm1(u) + sinh(u) + cosh(u) + acos(u) + atan(v) + erfinv(u) + libdevice.erfcx(v)
    static_print("rng", BLOCK, r)
    store(out + offs, r, mask=mask)
    debug_barrier()
    p = (out + offs).to(i64).to(pointer_type(f32))
    atomic_add(p, 1.0, mask=mask, sem="relaxed", scope="cta")
    i = umulhi(load(idx + offs, mask=mask, other=0), 7919) ^ (a ^ b ^ c ^ d).to(i32)
    atomic_or(idx + offs % 16, i, mask=mask, sem="release")
    atomic_xor(idx + offs % 8, i, mask=mask, scope="sys")
    atomic_and(idx + offs % 4, i | 1, mask=mask, sem="acquire", scope="gpu")

kernel asm(x, idx, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    v = inline_asm_elementwise("shf.l.wrap.b32 $0, $1, $2, $3;", "=r,r,r,r", [offs, n, 3], i32, True, 1)
    store(idx + offs, v, mask=offs < n)
    h = inline_asm_elementwise("add.rn.f16x2 $0, $1, $1;", "=r,r", load(x + offs, mask=offs < n).to(f16), f16, True, 2)
    store(x + offs, h, mask=offs < n)

def first_big(v, limit):
    if max(v, axis=0) > limit:
        return minimum(v, limit), 1
    return v, 0

kernel flow(x, out, n, BLOCK: constexpr):
    pid = program_id(0)
    if pid >= 2:
        return
    HALF: constexpr = BLOCK // 2
    offs = max_contiguous(multiple_of(pid * BLOCK + arange(0, BLOCK), BLOCK), BLOCK)
    acc, col, hits = zeros([BLOCK], f32), 0, 0
    while col < n:
        cols = multiple_of(col, 16) + arange(0, BLOCK)
        v = load(x + cols, mask=cols < n, other=0.0)
        col += BLOCK
        if sum(v, axis=0) < -5.0:
            continue
        v, hit = first_big(v, 2.0)
        acc, hits = acc + v, hits + hit
        if hits > 3:
            break
    a, b = 0, 1
    for i in range(0, n, num_stages=2, unroll=2):
        a, b = b, a + b % 7
        if b > 50:
            break
    t = reshape(acc, [2, HALF]).T
    store(out + offs, max(acc, min(a, b, hits), 0.5), mask=offs < n)
    store(out + n + pid, sum(t) + max(t))
'''
CORPUS = {p.name: p.read_text() for p in sorted((ROOT / "stdlib").glob("*.nk"))} | {"seeds.nk": SEEDS}

# Launch arguments by parameter name (the stdlib names them consistently): mutants that rename or add
# parameters still get a launch. Tensors are large enough for every kernel at these sizes.
TENSORS = {"target": lambda: torch.randint(0, 50, (8,)), "idx": lambda: torch.randint(-9, 9, (1024,), dtype=torch.int32),
           "x8": lambda: torch.randn(1024).to(torch.float8_e4m3fn)}
SCALARS = {"n": 300, "n_cols": 50, "stride": 64, "out_stride": 64, "M": 20, "N": 12, "K": 24, "x_stride": 12,
           "eps": 1e-5, "scale": 0.5}
CONSTEXPRS = {"BLOCK": 64, "BM": 16, "BN": 16, "BK": 16, "WARPS": 1, "VEC": 1, "OP": "sum"}
GRID = (3, 2)

# ---- mutations -----------------------------------------------------------------------------------
TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|'[^'\n]*'|\"[^\"\n]*\"|\*\*|//|<<|>>|[<>=!]=|\S")
BUILTIN_NAMES = ("program_id", "num_programs", "arange", "zeros", "full", "load", "store", "where", "cdiv", "minimum",
                 "maximum", "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "sigmoid", "erf", "floor", "fma", "sum", "max",
                 "min", "argmax", "argmin", "reshape", "broadcast_to", "trans", "dot", "atomic_add", "atomic_max",
                 "atomic_cas", "atomic_xchg", "static_range", "static_assert", "to", "shape", "dtype", "i8", "u32", "f64",
                 "make_block_ptr", "advance", "f8e4m3", "f8e5m2",
                 "rand", "randn", "randint", "randint4x", "pow", "clamp", "umulhi", "libdevice", "libdevice.j0", "round",
                 "div_rn", "atomic_or", "atomic_and", "atomic_xor", "debug_barrier", "device_assert", "static_print",
                 "inline_asm_elementwise", "pointer_type", "sem='relaxed'", "scope='cta'",
                 "cumsum", "cumprod", "associative_scan", "sort", "topk", "flip", "gather", "histogram", "join", "split",
                 "cat", "zeros_like", "full_like",
                 "multiple_of", "max_contiguous", "T")
EXTRA = BUILTIN_NAMES + ("kernel", "def", "tile", "if", "elif", "else", "for", "while", "break", "continue", "in", "return",
         "pass", "and", "or", "not", "None", "num_stages=3", "unroll=4", ": constexpr =",
         "True", "False", "inf", "nan", "constexpr", "static_range", "range", "static_assert", "print", "dot",
         "atomic_cas", "atomic_xchg", "full", "broadcast_to", "bitcast=True", "i64", "u64", "f16", "bf16", "bool",
         "0", "-1", "1.5", "2**31", "4294967296", "1e39", "0x7fffffffffffffff", "0.0", "\"mean\"", "x.shape[0:1]",
         "boundary_check=(0, 1)", "padding_option=\"nan\"",
         "[1024]", "(1, 2)", "[]", "()", "[:, None]", "@", ":", ",", "=", "\t", "\\", "$")
UNICODE = ("é", "λ", "𝑥", "\u200b", "\u2028", "\u202e", "\x00", "\x0c", "\ufeff", "中", "🙂", "\r", "\t")


def lines_of(text: str) -> list[str]:
    return text.split("\n")


def m_token(text, rng, vocab):
    toks = [m for m in TOKEN.finditer(text)]
    if not toks:
        return text
    t = rng.choice(toks)
    action = rng.randrange(4)
    if action == 0:
        new = rng.choice(vocab)
    elif action == 1:
        new = ""
    elif action == 2:
        new = t.group() + " " + t.group()
    else:
        new = rng.choice(toks).group()
    return text[:t.start()] + new + text[t.end():]


def m_same_kind(text, rng, vocab):
    """Replace a token by another of its kind (a name by a name, ...): mutants that still parse."""
    toks = [m for m in TOKEN.finditer(text)]
    if not toks:
        return text
    t = rng.choice(toks)
    same = [v for v in vocab if kind(v) == kind(t.group())] or vocab
    return text[:t.start()] + rng.choice(same) + text[t.end():]


# Values of every sort, to put where another belongs: type confusion reaches the checker's rules.
FRAGMENTS = ("arange(0, 4)", "zeros([2, 2])", "zeros([4], i8)", "1.5", "-inf", "nan", "(1, 2)", "[8]", "'s'", "f32",
             "None", "True", "program_id(0)", "load(x)", "x", "x + arange(0, 4)", "arange(0, 4) < 2", "n", "2**31",
             "4294967296", "-1", "0", "x.dtype", "arange(0, 4).shape", "exp", "sum", "full([4], 1, u8)",
             "reshape(arange(0, 8), [2, 4])", "trans(zeros([2, 4]))", "zeros([2, 4]) @ zeros([4, 2])", "not mask")


def m_fragment(text, rng, vocab):
    """Put a value of another sort where a name or a number was."""
    toks = [m for m in TOKEN.finditer(text) if kind(m.group()) in ("name", "number")]
    if not toks:
        return text
    t = rng.choice(toks)
    return text[:t.start()] + rng.choice(FRAGMENTS) + text[t.end():]


def kind(tok: str) -> str:
    return "name" if tok[:1].isalpha() or tok[:1] == "_" else "number" if tok[:1].isdigit() else \
        "string" if tok[:1] in "'\"" else "operator"


def m_line(text, rng, vocab):
    ls = lines_of(text)
    i, j = rng.randrange(len(ls)), rng.randrange(len(ls))
    action = rng.randrange(5)
    if action == 0:
        del ls[i]
    elif action == 1:
        ls.insert(j, ls[i])
    elif action == 2:
        ls[i], ls[j] = ls[j], ls[i]
    elif action == 3:
        ls[i] = rng.choice(("    ", "  ", "\t", "        ")) + ls[i]
    else:
        ls[i] = ls[i][rng.choice((1, 2, 4)):]
    return "\n".join(ls)


def m_bytes(data: bytes, rng) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_truncate(text, rng, vocab):
    return text[:rng.randrange(len(text) + 1)]


def m_nest(text, rng, vocab):
    """Wrap a name in deep nesting, or make a long chain of it."""
    names = [m for m in re.finditer(r"\b[a-z_]\w*\b", text)]
    if not names:
        return text
    t = rng.choice(names)
    n = rng.choice((20, 150, 210, 400, 1200))
    name = t.group()
    form = rng.randrange(5)
    if form == 0:
        new = "(" * n + name + ")" * n
    elif form == 1:
        new = "abs(" * n + name + ")" * n
    elif form == 2:
        new = "-" * n + name
    elif form == 3:
        new = " + ".join([name] * n)
    else:
        new = "[" * n + name + "]" * n
    return text[:t.start()] + new + text[t.end():]


def m_long(text, rng, vocab):
    ls = lines_of(text)
    i = rng.randrange(len(ls))
    filler = rng.choice(("x" * 20000, "# " + "long comment " * 3000, "'" + "s" * 20000 + "'",
                         ", ".join(["0"] * 3000)))
    ls[i] = ls[i] + filler if rng.random() < 0.5 else filler
    return "\n".join(ls)


def m_literal(text, rng, vocab):
    nums = [m for m in re.finditer(r"\b\d[\w.]*", text)]
    big = rng.choice(("9" * 5000, "1" + "0" * 40, "1e400", "0x" + "f" * 17, "18446744073709551616",
                      "0." + "0" * 400 + "1", "2147483648", "-2147483649", "1_000_000_000_000"))
    if not nums:
        return text + big
    t = rng.choice(nums)
    return text[:t.start()] + big + text[t.end():]


def m_unicode(text, rng, vocab):
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice(UNICODE) + text[i:]


TEXT_MUTATIONS = (m_token, m_token, m_same_kind, m_same_kind, m_same_kind, m_fragment, m_fragment, m_fragment, m_line,
                  m_line, m_truncate, m_nest, m_long, m_literal, m_unicode)


ODD_VALUES = (0, 1, 3, -4, 2**20, 2**31, 2**40, 2**64 + 5, 1.5, -0.0, float("inf"), True, "x", None, (16, 16),
              [16], np.int64(64), np.float32(2.0), torch.float16, torch.randn(4), torch.zeros(4, dtype=torch.complex64))


def mutant(seed: int, index: int) -> tuple[str, bytes, dict]:
    """The mutant `index` of a run: (the corpus file it came from, its bytes, launch values to override);
    the same for the same pair."""
    rng = random.Random(seed * 1_000_003 + index)
    name = rng.choice(sorted(CORPUS))
    text = CORPUS[name]
    vocab = [m.group() for m in TOKEN.finditer("\n".join(CORPUS.values()))] + list(EXTRA)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        text = rng.choice(TEXT_MUTATIONS)(text, rng, vocab)
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.08:
        data = m_bytes(data, rng)
    names = sorted([*SCALARS, *CONSTEXPRS, "num_warps", "num_stages", "x", "out"])
    overrides = {rng.choice(names): rng.choice(ODD_VALUES)} if rng.random() < 0.2 else {}
    return name, data, overrides


# ---- running a mutant ----------------------------------------------------------------------------
class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout(f"over {TIMEOUT_S} s")


def launch_args(k, overrides: dict):
    args = []
    for p in k.runtime:
        if p.name in overrides:
            args.append(overrides[p.name])
        elif p.name in SCALARS:
            args.append(SCALARS[p.name])
        else:
            args.append(TENSORS.get(p.name, lambda: torch.randn(1024))())
    meta = {c: CONSTEXPRS.get(c, 32) for c in k.constexpr_names
            if c in CONSTEXPRS or next(q for q in k.defn.params if q.name == c).default is None}
    meta |= {c: v for c, v in overrides.items() if c in k.constexpr_names or c in ("num_warps", "num_stages")}
    return args, meta


def cli_args(k, args, meta) -> list[str]:
    """The command line that checks what the launch compiles (odd values go as their repr: usage errors)."""
    sig = ",".join(f"{p.name}={newtc.jit.arg_type(a, False).name if isinstance(a, (torch.Tensor, int, float)) else a}"
                   for p, a in zip(k.runtime, args))
    options = [f"--{c.replace('_', '-')}={v!r}" for c, v in meta.items() if c in ("num_warps", "num_stages")]
    return ["-k", k.name, *(["--sig", sig] if sig else []), *options,
            *[f"-D{c}={v!r}" for c, v in meta.items() if c not in ("num_warps", "num_stages")]]


def stages(data: bytes, overrides: dict, path: Path, nvrtc_too: bool):
    """Yield (stage, kernel, thunk) for every stage of one mutant."""
    path.write_bytes(data)
    yield "newtc --check", "", lambda: _quiet_cli(["--check", str(path)])
    try:
        mod = newtc.compile(data, "fuzz.nk")
    except newtc.NkError:
        return
    for k in mod.kernels.values():
        try:
            args, meta = launch_args(k, overrides)
            cli = cli_args(k, args, meta)
        except newtc.jit.ArgError:  # an argument the command line cannot spell
            args, meta = launch_args(k, {})
            cli = cli_args(k, args, meta)
        yield "newtc --check -k", k.name, lambda: _quiet_cli(["--check", str(path), *cli])
        yield "ir", k.name, lambda: k.ir(*args, **meta)
        yield "source", k.name, lambda: k.source(*args, **meta)
        if nvrtc_too:
            yield "ptx", k.name, lambda: k.ptx(*args, arch="sm_90a", **meta)
        yield "launch", k.name, lambda: k[GRID](*args, **meta)


def _quiet_cli(argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        rc = cli.main(argv)
    if rc not in (0, 1, 2) or "Traceback" in err.getvalue():
        raise AssertionError(f"newtc exited {rc}:\n{err.getvalue()}")


def site(exc: BaseException) -> str:
    """Where in newtc an exception was raised (its innermost frame in the package)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/newtc/" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__} at {Path(f.filename).name}:{f.lineno} ({f.name})"


def fuzz(seed: int, count: int, tmp: Path, first: int = 0) -> tuple[collections.Counter, list]:
    tally, failures = collections.Counter(), []
    previous = signal.signal(signal.SIGALRM, _alarm)
    torch.manual_seed(seed)
    try:
        for index in range(first, first + count):
            name, data, overrides = mutant(seed, index)
            signal.alarm(TIMEOUT_S)
            stage = kernel = ""
            try:
                for stage, kernel, thunk in stages(data, overrides, tmp / "fuzz.nk", index % NVRTC_EVERY == 0):
                    try:
                        thunk()
                        tally[f"ok: {stage}"] += 1
                    except newtc.NkError as e:
                        if isinstance(e, nvrtc.NvrtcError) or "internal" in str(e):
                            raise  # NVRTC refused generated code, or a verifier caught the compiler: not the user's
                        tally["diagnostics"] += 1
                tally["mutants"] += 1
            except (Exception, Timeout) as e:  # anything but a diagnostic
                failures.append((seed, index, name, f"{stage} {kernel} {overrides}", site(e), data,
                                 traceback.format_exc()))
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return tally, failures


def test_mutants_give_results_or_diagnostics(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEWT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NEWT_VERIFY", "1")  # the IR verifier after every pass, the interpreter's types per op
    start = time.perf_counter()
    tally, failures = fuzz(SEED, COUNT, tmp_path, FIRST)
    by_site = collections.Counter(f[4] for f in failures)
    with capsys.disabled():
        print(f"\nfuzz seed {SEED}: mutants {FIRST} to {FIRST + COUNT - 1} in {time.perf_counter() - start:.0f} s, {dict(tally)}, "
              f"{len(failures)} failures at {len(by_site)} sites")
        for s, n in by_site.most_common():
            print(f"  {n:5d}  {s}")
        for seed, index, name, stage, where, data, tb in failures[:50]:  # tests.test_fuzz.mutant(seed, index)
            print(f"  mutant {index} of seed {seed} ({name}), {stage}: {where}")
    if failures:
        seed, index, name, stage, where, data, tb = failures[0]
        pytest.fail(f"{len(failures)} mutants gave internal errors; the first, mutant {index} of seed {seed} "
                    f"(from {name}), at stage {stage}:\n{data.decode('utf-8', 'replace')[:3000]}\n{tb}")
