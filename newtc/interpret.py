"""Runs the typed tile IR on the CPU: one program instance after another, each op block-wide in torch.

Values are torch tensors of the IR dtype (0-d for scalars); a pointer is a `_Ptr`: a flat view of the
storage span of the tensor it came from plus int64 element offsets. The semantics follow the generated
CUDA: C integer wrap-around and truncating division, f16/bf16 math done in f32 and rounded back,
saturating float->int casts, fminf/fmaxf for float min/max, and checked memory (any live lane outside
its tensor raises NkError at the op's span).

u16/u32 are held as int64 in [0, 2**bits) and u64 as the int64 with the same bits, because torch has
no arithmetic on uint16/32/64; the few u64 ops whose result depends on signedness go through numpy.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from . import ir
from . import types as T
from .errors import NkError, flag

# The torch dtype an IR dtype has in memory (unsigned wider than a byte: the same-width signed type).
_TORCH = {T.bool_: torch.bool, T.i8: torch.int8, T.i16: torch.int16, T.i32: torch.int32, T.i64: torch.int64,
          T.u8: torch.uint8, T.u16: torch.int16, T.u32: torch.int32, T.u64: torch.int64,
          T.f16: torch.float16, T.bf16: torch.bfloat16, T.f32: torch.float32, T.f64: torch.float64,
          T.f8e4m3: torch.float8_e4m3fn, T.f8e5m2: torch.float8_e5m2}
_MASK = {T.u16: 0xFFFF, T.u32: 0xFFFFFFFF}
_I64_MIN = -(2 ** 63)
MAX_ITERATIONS = 1 << 20  # of one `for` loop, or of `while` loops, in one program: minutes in Python, or never ending


class _Ptr(NamedTuple):
    base: torch.Tensor  # flat view of the tensor's storage span, in the pointee's memory dtype
    off: torch.Tensor  # int64 element offsets from the tensor's data_ptr


@dataclass
class _State:
    env: dict
    pid: tuple
    grid: tuple
    verify: bool  # NEWT_VERIFY: every op's values must have its result's IR type
    iterations: int = 0  # of `while` loops so far


def _held(dt: T.DType) -> torch.dtype:
    return torch.int64 if dt in _MASK else _TORCH[dt]


def _fit(x: torch.Tensor, dt: T.DType) -> torch.Tensor:
    """Convert to dt's held form: torch's .to wraps ints like C and rounds floats to nearest even."""
    if dt in T.FP8 and x.dtype != _TORCH[dt]:  # through f32 as the GPU does; e4m3 saturates (torch >= 2.12 too)
        x = x.float().clamp(-448.0, 448.0) if dt == T.f8e4m3 else x.float()
    x = x.to(_held(dt))
    return x & _MASK[dt] if dt in _MASK else x


def _const(v, dt: T.DType) -> torch.Tensor:
    if dt.is_int:  # any Python int, wrapped to 64 bits and then to dt like a C conversion
        return _fit(torch.tensor((int(v) - _I64_MIN) % 2 ** 64 + _I64_MIN), dt)
    return _fit(torch.tensor(float(v), dtype=torch.float64), dt) if dt.is_float else torch.tensor(bool(v))


def _up(x: torch.Tensor) -> torch.Tensor:
    """f16/bf16/fp8 math runs in f32 (the result is rounded back by _fit), as the CUDA does."""
    return x.float() if x.is_floating_point() and x.element_size() < 4 else x


def _np(x: torch.Tensor) -> np.ndarray:
    """A u64 value's bits as numpy uint64."""
    return x.numpy().view(np.uint64)


def _nz(b: torch.Tensor) -> torch.Tensor:
    # x/0 and INT_MIN/-1 trap the host CPU (SIGFPE); those lanes divide by 1 and are patched by the caller
    return torch.where((b == 0) | (b == -1), 1, b)


def _floordiv(a, b):
    if a.is_floating_point():
        return torch.floor(a / b)
    return torch.where(b == -1, -a, torch.div(a, _nz(b), rounding_mode="trunc"))  # C truncation; x // 0 = x


_BIN = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "floordiv": _floordiv,
        "mod": lambda a, b: torch.fmod(a, b if a.is_floating_point() else _nz(b)),  # C fmod / %; x % 0 = 0
        "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,  # past the width: 0 / sign, like PTX
        "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
        "minimum": torch.fmin, "maximum": torch.fmax,  # fminf/fmaxf: a NaN operand yields the other
        "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
_NP64 = {"floordiv": np.floor_divide, "mod": np.fmod, "shr": np.right_shift, "minimum": np.minimum,
         "maximum": np.maximum, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
# ~ on a bool tensor is logical not, on ints bitwise not
_UN = {"neg": torch.neg, "not": torch.bitwise_not, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2,
       "log": torch.log, "log2": torch.log2, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
       "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "floor": torch.floor,
       "ceil": torch.ceil}


def _binary(kind: str, a, b, dt: T.DType, out: T.DType) -> torch.Tensor:
    if dt == T.u64 and kind in _NP64:
        with np.errstate(all="ignore"):
            r = np.asarray(_NP64[kind](_np(a), _np(b)))
        return _fit(torch.from_numpy(r.view(np.int64) if r.dtype == np.uint64 else r), out)
    return _fit(_BIN[kind](_up(a), _up(b)), out)


def f2i(x: torch.Tensor, dt: T.DType) -> torch.Tensor:
    """Float -> int truncates toward zero and saturates, NaN -> 0 (PTX cvt.rzi), as int64 bits."""
    lo, hi = (0, 2 ** dt.bits - 1) if dt.kind == "u" else (-2 ** (dt.bits - 1), 2 ** (dt.bits - 1) - 1)
    x = torch.nan_to_num(x.double(), nan=0.0)
    i = x.clamp(-2.0 ** 63, 2.0 ** 63 - 1024).to(torch.int64)
    if dt == T.u64:  # [2**63, 2**64) only fits int64 as the unsigned bit pattern
        i = torch.where(x >= 2.0 ** 63, (x.clamp(max=2.0 ** 64 - 2048) - 2.0 ** 64).to(torch.int64), i)
    return torch.where(x <= lo, lo, torch.where(x >= hi, hi - 2 ** 64 if hi >= 2 ** 63 else hi, i))


def _cast(st, op, x, bitcast=False):
    src, dst = op.args[0].type.dtype, op.result.type.dtype
    if isinstance(x, _Ptr) and isinstance(dst, T.Ptr):  # reinterpret the memory at the same byte address
        byte = x.off * src.elem.itemsize
        if (byte % dst.elem.itemsize).any():
            raise NkError(f"a {src} address that is not aligned for {dst}", op.span)
        return _Ptr(x.base.view(_TORCH[dst.elem]), byte // dst.elem.itemsize)
    if isinstance(x, _Ptr):
        return _fit(x.base.data_ptr() + x.off * src.elem.itemsize, dst)
    if isinstance(dst, T.Ptr):
        return _address(st, op, x, dst.elem)
    if bitcast:
        return _fit(x.to(_TORCH[src]).view(_TORCH[dst]), dst)
    if dst == T.bool_:
        return x != 0
    if src.is_float and dst.is_int:
        return _fit(f2i(x, dst), dst)
    if src == T.u64 and dst.is_float:
        x = torch.from_numpy(_np(x).astype(np.float64))
    return _fit(x, dst)


def _address(st, op, addr: torch.Tensor, elem: T.DType) -> _Ptr:
    """An integer turned pointer: an address inside one of the launch's tensors (lanes outside it are then
    out of bounds there, which a load or store reports unless they are masked)."""
    for p in st.env.values():
        if isinstance(p, _Ptr) and p.base.numel():
            byte = addr - p.base.data_ptr()
            inside = (byte >= 0) & (byte < p.base.numel() * p.base.element_size())
            if inside.any():
                if (byte[inside] % elem.itemsize).any():
                    raise NkError(f"an address that is not aligned for {elem}", op.span)
                return _Ptr(p.base.view(_TORCH[elem]), torch.div(byte, elem.itemsize, rounding_mode="floor"))
    raise NkError("the interpreter follows addresses inside this launch's tensors only, and no lane has one", op.span)


def _check(op, p: _Ptr, mask, what: str) -> None:
    n = p.base.numel()
    bad = (p.off < 0) | (p.off >= n)
    if mask is not None:
        bad = bad & mask
    if bad.any():
        off = int(torch.broadcast_to(p.off, bad.shape)[bad][0])
        raise NkError(f"out-of-bounds {what}: offset {off} is outside the tensor's {n} elements", op.span,
                      hint="mask the lanes that fall outside the tensor")


def _live(mask) -> torch.Tensor:
    return torch.ones((), dtype=torch.bool) if mask is None else mask


def _load(st, op, p, mask=None, other=None):
    _check(op, p, mask, "load")
    safe = torch.where(_live(mask), p.off, 0)  # masked-off lanes may point anywhere: never touch them
    v = p.base[safe] if p.base.numel() else torch.zeros(safe.shape, dtype=p.base.dtype)
    v = _fit(v, op.result.type.dtype)
    return v if mask is None else torch.where(mask, v, torch.zeros((), dtype=v.dtype) if other is None else other)


def _store(st, op, p, val, mask=None):
    _check(op, p, mask, "store")
    off, val, m = torch.broadcast_tensors(p.off, val, _live(mask))
    off, val = off[m], val[m].to(p.base.dtype)
    s, perm = torch.sort(off, stable=True)
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]  # lanes hitting one address: the last in row-major order wins
    p.base[s[last]] = val[perm[last]]


def _atomic(st, op, p, *rest):
    kind, dt = op.attrs["kind"], op.result.type.dtype
    n = 2 if kind == "cas" else 1  # (val, mask) or (cmp, val, mask); the mask may be left off
    vals, mask = rest[:n], rest[n] if len(rest) > n else None
    _check(op, p, mask, f"atomic_{kind}")
    off, m, *vals = (t.reshape(-1) for t in torch.broadcast_tensors(p.off, _live(mask), *vals))
    old = torch.zeros(off.shape, dtype=_held(dt))  # masked-off lanes return 0
    lanes = m.nonzero()[:, 0]
    s, perm = torch.sort(off[lanes], stable=True)
    rank = torch.empty_like(perm)
    rank[perm] = torch.arange(len(s)) - torch.searchsorted(s, s)  # how many earlier lanes share the address
    for r in range(int(rank.max()) + 1 if len(rank) else 0):  # one round per duplicate depth keeps lane order
        sel = lanes[rank == r]
        cur, v = _fit(p.base[off[sel]], dt), vals[-1][sel]
        if kind == "cas":
            new = torch.where(cur == vals[0][sel], v, cur)
        else:
            new = v if kind == "xchg" else _binary({"max": "maximum", "min": "minimum"}.get(kind, kind), cur, v, dt, dt)
        p.base[off[sel]] = new.to(p.base.dtype)
        old[sel] = cur
    return old.reshape(op.result.type.shape)


def _reduce(st, op, x):
    kind, axis, keep = op.attrs["kind"], op.attrs["axis"], op.attrs.get("keep_dims", False)
    dt, out = op.args[0].type.dtype, op.result.type.dtype
    if kind == "sum":  # ints sum in int64 and wrap back; f16/bf16 accumulate in f32
        return _fit(_up(x).sum(axis, keepdim=keep), out)
    flip = dt == T.u64  # with the sign bit flipped, signed order is unsigned order
    r = extremum(kind, _up(x ^ _I64_MIN if flip else x), axis, keep)
    return _fit(r ^ _I64_MIN if flip and kind in ("max", "min") else r, out)


def extremum(kind: str, x: torch.Tensor, axis: int | None, keep: bool = False) -> torch.Tensor:
    """max, min, argmax or argmin of x along axis (None: all of it) as a kernel reduces: NaN-ignoring, like a tree of
    fmaxf/fminf (a NaN only where all are NaN), the first index among ties (torch's rule). deuteron's oracle too."""
    nan = x.isnan() if x.is_floating_point() else None
    if nan is not None:
        x = torch.where(nan, float("-inf") if kind in ("max", "argmax") else float("inf"), x)
    fn = {"max": torch.amax, "min": torch.amin, "argmax": torch.argmax, "argmin": torch.argmin}[kind]
    r = fn(x, axis, keepdim=keep)
    return torch.where(nan.all(axis, keepdim=keep), float("nan"), r) if nan is not None and kind in ("max", "min") \
        else r


def _dot(st, op, a, b, acc):
    out = op.result.type.dtype
    if not out.is_float:  # integer dot: exact in int64, wrapped to the accumulator's width
        return _fit(acc.long() + a.long() @ b.long(), out)
    w = torch.float64 if torch.float64 in (a.dtype, b.dtype, acc.dtype) else torch.float32
    return _fit(acc.to(w) + a.to(w) @ b.to(w), out)


def _fma(st, op, a, b, c):
    dt = op.result.type.dtype
    if not dt.is_float:
        return _fit(a * b + c, dt)
    # the f64 product of f32 (or narrower) inputs is exact, so this rounds about once like fmaf
    return _fit((a.double() * b.double() + c.double()).to(torch.float64 if dt == T.f64 else torch.float32), dt)


def _where(st, op, c, a, b):
    if not isinstance(a, _Ptr):
        return torch.where(c, a, b)
    if a.base is not b.base:
        raise NkError("the interpreter cannot select between pointers into different tensors", op.span)
    return _Ptr(a.base, torch.where(c, a.off, b.off))


def _view(f):
    """Shape ops act on a pointer's offsets and keep its base."""
    return lambda st, op, x: _Ptr(x.base, f(x.off, op)) if isinstance(x, _Ptr) else f(x, op)


def _for(st, op, lo, hi, step, *carried):
    body = op.regions[0]
    if int(step) == 0:
        raise NkError("for loop with step 0", op.span)
    steps = range(int(lo), int(hi), int(step))  # Python range semantics, negative steps included
    if len(steps) > MAX_ITERATIONS:
        raise NkError(f"this loop runs {len(steps)} iterations: the interpreter takes at most {MAX_ITERATIONS} in one "
                      "program", op.span, "the interpreter is for small shapes: run long loops on a GPU")
    for i in steps:
        st.env[body.params[0]] = _const(i, body.params[0].type.dtype)
        st.env.update(zip(body.params[1:], carried))
        carried = _exec(st, body)
    return list(carried)


def _constant(st, op):
    dt = op.result.type.dtype
    if isinstance(dt, T.Ptr):  # null, on a path that has left: any access through it is out of bounds
        return _Ptr(torch.empty(0, dtype=_TORCH[dt.elem]), torch.zeros((), dtype=torch.int64))
    return _const(op.attrs["value"], dt).expand(op.result.type.shape)


def _same(a, b) -> bool:
    if isinstance(a, _Ptr):
        return a.base is b.base and torch.equal(a.off, b.off)
    return torch.equal(a, b)


def _while(st, op, *carried):
    body = op.regions[0]
    # without writes to memory, an iteration that changes no carried value is repeated forever
    pure = not any(o.kind in ("store", "atomic") for o in ir.walk(body))
    while bool(carried[0]):
        st.iterations += 1
        if st.iterations > MAX_ITERATIONS:
            raise NkError(f"`while` loops ran over {MAX_ITERATIONS} iterations in one program: this one does not seem "
                          "to end", op.span)
        st.env.update(zip(body.params, carried))
        carried, last = _exec(st, body), carried
        if pure and all(map(_same, carried, last)):
            raise NkError("this `while` loop never ends: an iteration changed none of its values", op.span,
                          "update a value that its condition reads")
    return list(carried)


def _if(st, op, cond):
    return _exec(st, op.regions[0 if bool(cond) else 1])


def _show(v, t: ir.Value):
    if isinstance(v, _Ptr):
        return v.off.tolist()
    return (_np(v) if t.type.dtype == T.u64 else v).tolist()


def _print(st, op, *vals):
    print(f"pid {st.pid} {op.attrs.get('prefix', '')}", *(_show(v, a) for v, a in zip(vals, op.args)))


def _round(x):
    """Half away from zero, as C's round (x - trunc(x) is exact)."""
    t = torch.trunc(x)
    return t + torch.where((x - t).abs() >= 0.5, torch.sign(x), torch.zeros((), dtype=x.dtype))


def _umulhi(a, b, dt: T.DType):
    """The high half of the unsigned product, from 32-bit limbs in uint64."""
    m, k = np.uint64(0xFFFFFFFF), np.uint64(32)
    a, b = (_np(x.long() & 0xFFFFFFFF if dt.bits == 32 else x.long()) for x in (a, b))
    al, ah, bl, bh = a & m, a >> k, b & m, b >> k
    ll, lh, hl = al * bl, al * bh, ah * bl
    hi = ah * bh + (lh >> k) + (hl >> k) + (((ll >> k) + (lh & m) + (hl & m)) >> k)
    return _fit(torch.from_numpy(np.asarray(ll >> k if dt.bits == 32 else hi).view(np.int64)), dt)


# the CUDA math functions the interpreter has (the rest raise); f16/bf16 in f32, as on the GPU
_LIBM = {"asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
         "log1p": torch.log1p, "expm1": torch.expm1, "rint": torch.round, "nearbyint": torch.round, "round": _round,
         "trunc": torch.trunc, "erfinv": torch.erfinv, "pow": torch.pow, "atan2": torch.atan2, "div_rn": torch.div,
         "acosh": torch.acosh, "asinh": torch.asinh, "atanh": torch.atanh, "ceil": torch.ceil, "cos": torch.cos,
         "erf": torch.erf, "erfc": torch.erfc, "erfcx": torch.special.erfcx, "exp": torch.exp, "exp2": torch.exp2,
         "exp10": lambda x: torch.pow(10.0, x), "fabs": torch.abs, "floor": torch.floor, "j0": torch.special.bessel_j0,
         "j1": torch.special.bessel_j1, "y0": torch.special.bessel_y0, "y1": torch.special.bessel_y1,
         "cyl_bessel_i0": torch.special.i0, "cyl_bessel_i1": torch.special.i1, "lgamma": torch.lgamma,
         "log": torch.log, "log10": torch.log10, "log2": torch.log2, "normcdf": torch.special.ndtr,
         "normcdfinv": torch.special.ndtri, "rsqrt": torch.rsqrt, "sin": torch.sin, "sqrt": torch.sqrt,
         "tan": torch.tan, "tanh": torch.tanh, "copysign": torch.copysign, "fmax": torch.fmax, "fmin": torch.fmin,
         "fmod": torch.fmod, "hypot": torch.hypot, "nextafter": torch.nextafter}


def _libm(st, op, *xs):
    fn, dt = op.attrs["fn"], op.result.type.dtype
    if fn == "umulhi":
        return _umulhi(*xs, dt)
    if fn not in _LIBM:
        raise NkError(f"libdevice.{fn} is not in the interpreter", op.span,
                      f"run it on a GPU, or write it with other builtins; the interpreter has {', '.join(sorted(_LIBM))}")
    return _fit(_LIBM[fn](*map(_up, xs)), dt)


def _assert(st, op, cond, mask=None):
    bad = ~cond & _live(mask)
    if bad.any():
        where = [i.tolist() for i in bad.nonzero()[0]] if bad.dim() else []
        raise NkError(f"device_assert failed: {op.attrs['msg']}", op.span,
                      f"program {st.pid}" + (f", element {where}" if where else ""))


def _asm(st, op, *args):
    raise NkError("inline_asm_elementwise() runs PTX, which the interpreter cannot", op.span, "run it on a GPU")


_expand = _view(lambda x, op: x.expand(op.result.type.shape))
OPS = {
    "const": _constant,
    "program_id": lambda st, op: _const(st.pid[op.attrs["axis"]], op.result.type.dtype),
    "num_programs": lambda st, op: _const(st.grid[op.attrs["axis"]], op.result.type.dtype),
    "arange": lambda st, op: _fit(torch.arange(op.attrs["start"], op.attrs["end"]), op.result.type.dtype),
    "splat": _expand, "broadcast": _expand,
    "expand_dims": _view(lambda x, op: x.unsqueeze(op.attrs["axis"])),
    "reshape": _view(lambda x, op: x.reshape(op.result.type.shape)),
    "trans": _view(lambda x, op: x.permute(tuple(op.attrs["perm"]))),
    **{k: (lambda st, op, a, b, k=k: _binary(k, a, b, op.args[0].type.dtype, op.result.type.dtype)) for k in _BIN},
    **{k: (lambda st, op, x, k=k: _fit(_UN[k](_up(x)), op.result.type.dtype)) for k in _UN},
    "fma": _fma, "where": _where, "cast": _cast,
    "bitcast": lambda st, op, x: _cast(st, op, x, bitcast=True),
    "ptradd": lambda st, op, p, o: _Ptr(p.base, p.off + o.long()),
    "load": _load, "store": _store, "atomic": _atomic, "reduce": _reduce, "dot": _dot,
    "for": _for, "while": _while, "if": _if, "print": _print, "hint": lambda st, op, x: x,
    "libm": _libm, "assert": _assert, "asm": _asm, "barrier": lambda st, op: [],
}


def _scan(st, op, *xs):
    """Hillis-Steele: log2(n) steps, each combining every element with the one d before it (the combine
    region's scalar ops run on whole slices). A reverse scan is the scan of the flipped block, flipped."""
    axis, region, rev = op.attrs["axis"], op.regions[0], op.attrs["reverse"]
    xs = [x.flip(axis) if rev else x for x in xs]
    inner, n, d = _State(st.env, st.pid, st.grid, False), xs[0].shape[axis], 1
    while d < n:
        st.env.update(zip(region.params, [x.narrow(axis, 0, n - d) for x in xs] + [x.narrow(axis, d, n - d) for x in xs]))
        xs = [torch.cat([x.narrow(axis, 0, d), y.expand(x.narrow(axis, d, n - d).shape)], axis)
              for x, y in zip(xs, _exec(inner, region))]
        d *= 2
    return [x.flip(axis) if rev else x for x in xs]


def _gather(st, op, src, index):
    n, i = src.shape[op.attrs["axis"]], index.long()
    bad = (i < 0) | (i >= n)
    if bad.any():
        raise NkError(f"gather() index {int(i[bad][0])} is outside [0, {n})", op.span, "clamp or mask the indices")
    return torch.gather(src, op.attrs["axis"], i)


def _histogram(st, op, x, mask=None):
    bins, x = op.result.type.shape[0], x.long()  # a u64 past 2**63 reads negative: out of range either way
    keep = (x >= 0) & (x < bins) & _live(mask)
    return torch.bincount(x[keep], minlength=bins).to(torch.int32)


OPS.update({  # scans and data movement along an axis
    "scan": _scan, "gather": _gather, "histogram": _histogram,
    "exchange": lambda st, op, x: x.index_select(op.attrs["axis"], torch.arange(x.shape[op.attrs["axis"]]) ^ op.attrs["xor"]),
    "join": lambda st, op, a, b: torch.stack([a, b], -1), "split": lambda st, op, x: list(x.unbind(-1)),
})


def _exec(st: _State, region: ir.Region) -> list:
    """Run a region's ops; returns the values of its closing yield (none for the kernel body)."""
    for op in region.ops:
        if op.kind == "yield":
            return [st.env[a] for a in op.args]
        fn = OPS.get(op.kind)
        if fn is None:
            raise NkError(f"the interpreter has no rule for op '{op.kind}'", op.span)
        out = fn(st, op, *(None if a is None else st.env[a] for a in op.args))
        out = out if isinstance(out, list) else [out]
        if st.verify:
            _verify(op, out)
        st.env.update(zip(op.results, out))
    return []


def _verify(op: ir.Op, values: list) -> None:
    """A value of the wrong dtype or shape is a silent wrong result later (a bool mask held as int64 selects
    lanes by index): catch it at the op that made it."""
    for r, v in zip(op.results, values):
        t, ptr = r.type, isinstance(v, _Ptr)
        held = v.off if ptr else v
        if ptr != isinstance(t.dtype, T.Ptr) or tuple(held.shape) != t.shape or (not ptr and v.dtype != _held(t.dtype)):
            got = f"{'pointer' if ptr else v.dtype} {list(held.shape)}"
            raise NkError(f"internal interpreter error in {op.kind}: a value of {got} for {t}", op.span)


def _arg(p: ir.Value, a, kernel: ir.Kernel):
    dt = p.type.dtype
    if not isinstance(dt, T.Ptr):
        return _const(a, dt)
    if not isinstance(a, torch.Tensor) or a.device.type != "cpu" or a.element_size() != dt.elem.itemsize:
        raise NkError(f"argument '{p.name}' of kernel {kernel.name} must be a CPU tensor of {dt.elem}, "
                      f"got {a.dtype if isinstance(a, torch.Tensor) else type(a).__name__}", kernel.span)
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride())) if a.numel() else 0
    flat = torch.as_strided(a.detach(), (span,), (1,), a.storage_offset())  # writes go through to the caller
    return _Ptr(flat.view(_TORCH[dt.elem]), torch.zeros((), dtype=torch.int64))


def run(kernel: ir.Kernel, grid: tuple[int, int, int], args: list) -> None:
    """Run every program instance of the grid in turn on the CPU; stores land in the argument tensors."""
    if len(args) != len(kernel.params):
        raise NkError(f"kernel {kernel.name} takes {len(kernel.params)} arguments, got {len(args)}", kernel.span)
    grid = tuple(grid) + (1,) * (3 - len(grid))
    params = {p: _arg(p, a, kernel) for p, a in zip(kernel.params, args)}
    verify = flag("NEWT_VERIFY")
    for z, y, x in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        _exec(_State(dict(params), (x, y, z), grid, verify), kernel.body)
