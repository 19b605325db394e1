"""AST + specialization -> typed tile IR.

The checker is an abstract interpreter over the AST: compile-time values (constexprs, Python
number literals, dtypes, tuples) are plain Python objects folded as it goes; runtime values are IR
Values emitted into the current region. Helpers (`def`) and `static_range` loops are inlined here,
and `if` on a constexpr picks its branch here, so the IR holds only what runs.
"""
from __future__ import annotations

import difflib
import inspect
import itertools
import math
import sys

import numpy as np
from dataclasses import dataclass, replace

from . import ast as A
from . import ir
from .errors import NkError, Span
from .types import DTYPES, FP8, DType, Ptr, Type, bf16, bool_, f16, f32, f64, i32, i64, promote, u32, u64

BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod", "<<": "shl",
          ">>": "shr", "&": "and", "|": "or", "^": "xor", "<": "lt", "<=": "le", ">": "gt", ">=": "ge",
          "==": "eq", "!=": "ne"}
INT_ONLY = {"shl", "shr", "and", "or", "xor"}
NOT_ON_BOOLS = {"add", "sub", "mul", "floordiv", "mod", "shl", "shr"}  # C would compute them in int
MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "floor", "ceil"}
REDUCTIONS = {"sum", "max", "min", "argmax", "argmin"}
ATOMICS = {"atomic_add": "add", "atomic_max": "max", "atomic_min": "min", "atomic_xchg": "xchg", "atomic_or": "or",
           "atomic_and": "and", "atomic_xor": "xor"}
SEMS, SCOPES = ("relaxed", "acquire", "release", "acq_rel"), ("gpu", "cta", "sys")
# Triton's math builtins and the CUDA math library (callable as libdevice.NAME: NAMEf on f32, NAME on f64), by arity
LIBM_BUILTINS = {**dict.fromkeys("asin acos atan sinh cosh log1p expm1 rint round trunc erfinv".split(), 1),
                 "pow": 2, "atan2": 2, "div_rn": 2}
LIBM = {**LIBM_BUILTINS, **dict.fromkeys(
    "acosh asinh atanh cbrt ceil cos cospi cyl_bessel_i0 cyl_bessel_i1 erf erfc erfcinv erfcx exp exp10 exp2 fabs floor "
    "j0 j1 lgamma log log10 log2 logb nearbyint normcdf normcdfinv rcbrt rsqrt sin sinpi sqrt tan tanh tgamma y0 y1".split(), 1),
        **dict.fromkeys("copysign fdim fmax fmin fmod hypot nextafter remainder rhypot".split(), 2),
        **dict.fromkeys(("fma", "norm3d", "rnorm3d"), 3)}
# Philox (Random123, as Triton's random.py uses it) by counter width: key increments A, B and round multipliers A, B
PHILOX = {32: (0x9E3779B9, 0xBB67AE85, 0xD2511F53, 0xCD9E8D57),
          64: (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B, 0xD2E7470EE14C6C93, 0xCA5A826395121157)}
CONSTANTS = {"inf": math.inf, "nan": math.nan, **DTYPES}
LOOPS = ("range", "static_range")
# Limits that keep every later stage (and NVRTC) within seconds; docs/language.md lists them.
MAX_BLOCK = 2**20  # elements of one block, as in Triton
CLUSTERS = (1, 2, 4, 8)  # CTAs a cluster may have: the portable sizes
MAX_STAGES = 32  # ring slots of a pipelined loop: its prologue copies each, before shared memory is counted
MAX_PER_THREAD = 512  # elements of one block per thread (num_warps * 32 threads); NVRTC time grows faster
MAX_STATEMENTS = 2**17  # statements checked, after static_range unrolling and helper inlining
MAX_CONST = 2**64  # compile-time integers stay within (-MAX_CONST, MAX_CONST)


# Hidden names in the environment (keywords, so no user name can clash): whether this path has left the loop
# body (`break`, `continue`) or the definition (`return`), the value it returns, and a `while` loop's condition.
BREAK, CONTINUE, RETURN, RESULT, COND = "break", "continue", "return", "return value", "while"
EXITS = (BREAK, CONTINUE, RETURN)


class Undefined:
    """The value of a name on a path that has left: the name is merged with what it is on the other paths."""


UNDEF = Undefined()


@dataclass
class Method:
    """`x.to` (or a tensor descriptor's `desc.load`, `desc.store`) before it is called."""
    value: object
    name: str


@dataclass
class Iteration:
    """One iteration of a static_range loop, as a statement: after a `break` under a runtime condition, the
    later ones run under an `if`, as any statement does."""
    name: str
    value: int
    body: list
    span: Span


@dataclass(frozen=True)
class Func:
    """A builtin or a helper, named: what a call's callee evaluates to (a string is only a string)."""
    name: str


@dataclass(frozen=True)
class BlockPtr:
    """make_block_ptr's value: a compile-time record of runtime scalars (a TMA descriptor's fields and a tile's
    coordinates). Loops and `if`s carry its scalars; load and store expand it (block_access)."""
    base: ir.Value
    shape: tuple
    strides: tuple
    offsets: tuple
    block_shape: tuple
    order: tuple

    def leaves(self) -> list:
        return [self.base, *self.shape, *self.strides, *self.offsets]

    def rebuild(self, parts: list) -> "BlockPtr":
        n = len(self.block_shape)
        return replace(self, base=parts[0], shape=tuple(parts[1:1 + n]), strides=tuple(parts[1 + n:1 + 2 * n]),
                       offsets=tuple(parts[1 + 2 * n:]))


def leaves(v) -> list:
    """The parts a loop or an `if` carries for a value: a block pointer's scalars, a tuple's items, or itself."""
    return v.leaves() if isinstance(v, BlockPtr) else list(v) if isinstance(v, tuple) else [v]


def rebuild(v, parts: list):
    """v (as leaves took it apart) with these parts."""
    return v.rebuild(parts) if isinstance(v, BlockPtr) else tuple(parts) if isinstance(v, tuple) else parts[0]


def pairs(name: str, a, b, span: Span) -> list:
    """The runtime parts of two values of one name (two branches, or a loop's start and end), side by side."""
    if isinstance(a, BlockPtr) != isinstance(b, BlockPtr) or \
            isinstance(a, BlockPtr) and a.rebuild([None] * len(leaves(a))) != b.rebuild([None] * len(leaves(b))):
        raise NkError(f"'{name}' is {describe(a)} on one path and {describe(b)} on another", span,
                      "a name keeps one kind of value, and a block pointer its block shape and order "
                      "(a descriptor: and padding)")
    return list(zip(leaves(a), leaves(b)))


def c_div(a, b):
    """Integer division as C does it (truncation), which the language promises."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def fold(op: str, a, b):
    """Fold a binary operator on two compile-time values with the language's semantics."""
    both_int = isinstance(a, int) and isinstance(b, int)
    if op == "@":
        raise TypeError("'@' multiplies blocks")
    if op == "<<" and both_int and b >= 128:  # checked before Python builds a huge integer
        raise OverflowError
    if op in ("//", "%") and both_int:
        if b == 0:
            raise ZeroDivisionError
        q = c_div(a, b)
        return q if op == "//" else a - q * b
    if op == "%":
        return float(np.fmod(np.float64(a), np.float64(b)))
    if op == "//":
        return float(np.floor(np.float64(a) / np.float64(b)))
    if op == "/":
        return float(np.float64(a) / np.float64(b))
    if op in ("<<", ">>") and b < 0:
        raise ValueError("negative shift count")
    if op == "and":
        return a and b
    if op == "or":
        return a or b
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
            "<<": lambda: a << b, ">>": lambda: a >> b, "&": lambda: a & b, "|": lambda: a | b,
            "^": lambda: a ^ b, "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b,
            ">=": lambda: a >= b, "==": lambda: a == b, "!=": lambda: a != b}[op]()


def is_const(v) -> bool:
    return not isinstance(v, ir.Value)


def is_number(v) -> bool:
    return isinstance(v, (bool, int, float))


def literal_dtype(v) -> DType:
    """The dtype a Python literal takes when nothing else decides it."""
    if isinstance(v, bool):
        return bool_
    if isinstance(v, int):
        return i32 if -2**31 <= v < 2**31 else i64
    return f32


def weak_dtype(lit, other: DType) -> DType:
    """A weakly typed literal adopts the other operand's dtype, except an int meeting a float literal."""
    if isinstance(lit, float) and not other.is_float:
        return f32
    if other.kind == "b" and not isinstance(lit, bool):
        return literal_dtype(lit)
    return other


def broadcast_shapes(a: tuple, b: tuple, span: Span) -> tuple:
    ra, rb = len(a), len(b)
    a, b = (1,) * (rb - ra) + a, (1,) * (ra - rb) + b
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise NkError(f"shapes {list(a)} and {list(b)} do not broadcast", span,
                          "dimensions must be equal, or one of them 1")
        out.append(max(x, y))
    return tuple(out)


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


BUILTINS: dict = {}


def builtin(*names):
    def register(fn):
        for n in names:
            BUILTINS[n] = fn
        return fn
    return register


def int_range(dtype: DType) -> tuple[int, int]:
    """The lowest and highest value of an integer dtype."""
    return (0, (1 << dtype.bits) - 1) if dtype.kind == "u" else (-(1 << dtype.bits - 1), (1 << dtype.bits - 1) - 1)


def saturate(value: float, dtype: DType) -> int:
    """A float converted to an integer dtype as the GPU does (cvt.rzi.sat): toward zero, clamped, NaN -> 0."""
    lo, hi = int_range(dtype)
    return 0 if math.isnan(value) else lo if value <= lo else hi if value >= hi else int(value)


class Checker:
    def __init__(self, module: A.Module, spec):
        self.module = module
        self.defs = {d.name: d for d in module.defs}
        self.idx64 = spec.idx64
        self.threads = 32 * spec.num_warps
        self.region = ir.Region()
        self.env: dict = {}
        self.depth = 0
        self.statements = 0

    # ---- emission ----------------------------------------------------------------------------
    def emit(self, kind: str, args, rtype: Type | None, span: Span, attrs=None, name: str = "") -> ir.Value | None:
        if rtype is not None and rtype.numel > min(MAX_BLOCK, MAX_PER_THREAD * self.threads):
            raise NkError(f"a block of {rtype.numel} elements ({rtype}) is over the limit of {MAX_BLOCK} per program "
                          f"and {MAX_PER_THREAD} per thread ({self.threads} threads here)", span,
                          "use a smaller block and loop over the data, or more warps")
        results = [ir.Value(rtype, name)] if rtype is not None else []
        self.region.ops.append(ir.Op(kind, list(args), results, attrs or {}, span))
        return results[0] if results else None

    def const(self, value, dtype: DType, span: Span) -> ir.Value:
        if dtype.is_float:  # as the dtype holds it: 1e39 is an f32 inf, and f16/bf16 round from that f32
            with np.errstate(over="ignore"):
                value = float(value) if dtype == f64 else float(np.float32(value))
        elif dtype.kind == "b":
            value = bool(value)
        elif isinstance(value, float):  # a float literal given an integer type converts like x.to(i32)
            value = saturate(value, dtype)
        else:
            lo, hi = int_range(dtype)
            if not lo <= value <= hi:
                raise NkError(f"the integer {value} does not fit in {dtype}", span,
                              f"{dtype} holds {lo} to {hi}; convert the other operand first, e.g. x.to(i64)")
            value = int(value)
        return self.emit("const", [], Type((), dtype), span, {"value": value})

    def value(self, v, span: Span, dtype: DType | None = None) -> ir.Value:
        """A runtime value for v: compile-time numbers become constants."""
        if isinstance(v, ir.Value):
            return v
        if isinstance(v, (bool, int, float)):
            return self.const(v, dtype or literal_dtype(v), span)
        raise NkError(f"expected a number or a block, got {describe(v)}", span)

    def cast(self, v: ir.Value, dtype, span: Span) -> ir.Value:
        if v.type.dtype == dtype:
            return v
        if isinstance(dtype, Ptr) or isinstance(v.type.dtype, Ptr):
            raise NkError(f"cannot convert {v.type.dtype} to {dtype}", span)
        return self.emit("cast", [v], v.type.with_dtype(dtype), span)

    def to_shape(self, v: ir.Value, shape: tuple, span: Span) -> ir.Value:
        if v.type.shape == shape:
            return v
        if not v.type.shape:
            return self.emit("splat", [v], Type(shape, v.type.dtype), span)
        if broadcast_shapes(v.type.shape, shape, span) != shape:
            raise NkError(f"cannot broadcast {v.type} to {list(shape)}", span)
        while len(v.type.shape) < len(shape):
            v = self.emit("expand_dims", [v], Type((1,) + v.type.shape, v.type.dtype), span, {"axis": 0})
        if v.type.shape != shape:
            v = self.emit("broadcast", [v], Type(shape, v.type.dtype), span)
        return v

    def unify(self, vals: list, span: Span, dtype=None) -> list[ir.Value]:
        """Promote runtime values and literals to one dtype and one broadcast shape."""
        for v in vals:
            if not isinstance(v, (ir.Value, bool, int, float)):
                raise NkError(f"expected a number or a block, got {describe(v)}", span)
        runtime = [v for v in vals if isinstance(v, ir.Value)]
        ptrs = {v.type.dtype for v in runtime if isinstance(v.type.dtype, Ptr)}
        if ptrs and (len(ptrs) > 1 or len(ptrs) != len({v.type.dtype for v in runtime}) or len(runtime) < len(vals)):
            raise NkError("pointers only mix with pointers of the same type here", span,
                          "offset a pointer with + or -; compare or select pointers of one type")
        if dtype is None:
            dtypes = [v.type.dtype for v in runtime]
            if any(d in FP8 for d in dtypes) and not all(d.is_float for d in dtypes):  # Triton's rule too
                raise NkError(f"fp8 values mix only with floats: got {' and '.join(sorted({str(d) for d in dtypes}))}",
                              span, "convert one operand first, e.g. x.to(f32)")
            dtype = dtypes[0] if dtypes else None
            for d in dtypes[1:]:
                dtype = promote(dtype, d)
            for v in vals:
                if not isinstance(v, ir.Value):
                    dtype = weak_dtype(v, dtype) if dtype is not None else literal_dtype(v)
        shape = ()
        for v in runtime:
            shape = broadcast_shapes(shape, v.type.shape, span)
        return [self.to_shape(self.cast(self.value(v, span, dtype), dtype, span), shape, span) for v in vals]

    # ---- expressions -------------------------------------------------------------------------
    def expr(self, e):
        method = getattr(self, "expr_" + type(e).__name__)
        return method(e)

    def expr_Num(self, e: A.Num):
        return e.value

    def expr_Const(self, e: A.Const):
        return e.value

    def expr_Str(self, e: A.Str):
        return e.value

    def expr_TupleExpr(self, e: A.TupleExpr):
        return tuple(self.expr(x) for x in e.items)

    def expr_ListExpr(self, e: A.ListExpr):
        return [self.expr(x) for x in e.items]

    def expr_Name(self, e: A.Name):
        if e.id in self.env:
            return self.env[e.id]
        if e.id in CONSTANTS:
            return CONSTANTS[e.id]
        if e.id in BUILTINS or e.id in self.defs or e.id in LOOPS:
            return Func(e.id)
        known = list(self.env) + list(BUILTINS) + list(self.defs) + list(CONSTANTS)
        close = difflib.get_close_matches(e.id, known, n=1)
        raise NkError(f"unknown name '{e.id}'", e.span, f"did you mean '{close[0]}'?" if close else "")

    def expr_Attribute(self, e: A.Attribute):
        v = self.expr(e.value)
        if isinstance(v, ir.Value):
            if e.attr == "dtype":
                return v.type.dtype
            if e.attr == "shape":
                return v.type.shape
            if e.attr == "to":
                return Method(v, "to")
            if e.attr == "T":
                return self.call_builtin("trans", [v], {}, e.span)
        elif isinstance(v, (bool, int, float)) and e.attr == "to":
            return Method(self.value(v, e.span), "to")
        elif isinstance(v, TensorDesc) and e.attr in ("load", "store"):
            return Method(v, f"{e.attr}_tensor_descriptor")
        elif v == Func("libdevice"):
            if e.attr not in LIBM:
                close = difflib.get_close_matches(e.attr, list(LIBM), n=3)
                raise NkError(f"'libdevice.{e.attr}' is not a CUDA math function newt knows", e.span,
                              f"did you mean {', '.join(f'libdevice.{m}' for m in close)}?" if close else
                              "libdevice.NAME calls the CUDA math function NAMEf (f32) or NAME (f64)")
            return Func(f"libdevice.{e.attr}")
        raise NkError(f"{describe(v)} has no attribute '{e.attr}'", e.span)

    def expr_Subscript(self, e: A.Subscript):
        v = self.expr(e.value)
        if isinstance(v, (tuple, list)):
            if len(e.index) != 1:
                raise NkError("a tuple takes one index", e.span)
            item = e.index[0]
            if isinstance(item, A.Slice):  # shape[1:], with Python's rules
                bounds = [None if b is None else self.constexpr(self.expr(b), "a slice bound", b.span)
                          for b in (item.lower, item.upper, item.step)]
                if not all(b is None or type(b) is int for b in bounds) or bounds[2] == 0:
                    raise NkError(f"a tuple slice takes integers (and a step other than 0), got {bounds}", item.span)
                return v[slice(*bounds)]
            i = self.constexpr(self.expr(item), "a tuple index", item.span)
            if type(i) is not int or not -len(v) <= i < len(v):
                raise NkError(f"index {describe(i)} is not an integer in range for a tuple of {len(v)}", e.span)
            return v[i]
        if not isinstance(v, ir.Value) or not v.type.shape:
            raise NkError(f"cannot index {describe(v)}", e.span,
                          "blocks take `x[:, None]` / `x[None, :]` to add an axis; pointers use `p + offset`")
        shape, axis = v.type.shape, 0
        for item in e.index:
            if isinstance(item, A.Const) and item.value is None:
                v = self.emit("expand_dims", [v], Type(shape[:axis] + (1,) + shape[axis:], v.type.dtype), item.span,
                              {"axis": axis})
                shape = v.type.shape
                axis += 1
            elif isinstance(item, A.Slice) and item.lower is item.upper is item.step is None:
                axis += 1
            else:
                raise NkError("only `:` and `None` can index a block", item.span,
                              "load from a pointer block to select elements")
        if axis != len(shape):
            raise NkError(f"{len(e.index)} indices for a block of rank {len(v.type.shape)}", e.span)
        return v

    def expr_UnaryOp(self, e: A.UnaryOp):
        v = self.expr(e.operand)
        if is_const(v):
            if not isinstance(v, (bool, int, float)) or (e.op == "~" and isinstance(v, float)):
                raise NkError(f"bad operand for unary '{e.op}': {describe(v)}", e.span)
            return {"-": lambda: -v, "+": lambda: v, "~": lambda: ~v, "not": lambda: not v}[e.op]()
        if isinstance(v.type.dtype, Ptr):
            raise NkError(f"unary '{e.op}' does not apply to a pointer", e.span)
        if e.op == "+":
            return v
        if e.op == "-":
            if v.type.dtype == bool_:
                raise NkError(f"unary '-' needs a number, got {v.type}", e.span, "use `not` or `~` to negate a bool")
            return self.emit("neg", [v], v.type, e.span)
        if e.op == "not":
            v = self.truth(v, e.span)
        elif not (v.type.dtype.is_int or v.type.dtype == bool_):
            raise NkError(f"'~' needs an integer operand, got {v.type}", e.span)
        return self.emit("not", [v], v.type, e.span)

    def truth(self, v: ir.Value, span: Span) -> ir.Value:
        if v.type.dtype == bool_:
            return v
        if isinstance(v.type.dtype, Ptr):
            raise NkError(f"a pointer ({v.type}) cannot be a condition or a mask", span,
                          "compare offsets instead, e.g. mask=offs < n")
        zero = self.to_shape(self.const(0, v.type.dtype, span), v.type.shape, span)
        return self.emit("ne", [v, zero], v.type.with_dtype(bool_), span)

    def expr_BinOp(self, e: A.BinOp):
        a = self.expr(e.left)
        if e.op in ("and", "or") and is_const(a):  # short-circuit on a compile-time left side
            if (e.op == "and") != bool(a):
                return a
            return self.expr(e.right)
        b = self.expr(e.right)
        return self.binary(e.op, a, b, e.span)

    def binary(self, op: str, a, b, span: Span):
        if is_const(a) and is_const(b):
            if not all(isinstance(x, (bool, int, float)) for x in (a, b)):
                if op in ("==", "!=") or (op == "+" and type(a) is type(b) and isinstance(a, (tuple, list))):
                    return fold(op, a, b)
                raise NkError(f"unsupported operands for '{op}': {describe(a)} and {describe(b)}", span)
            try:
                with np.errstate(all="ignore"):
                    r = fold(op, a, b)
                if type(r) is int and not -MAX_CONST < r < MAX_CONST:
                    raise OverflowError
                return r
            except ZeroDivisionError:
                raise NkError("integer division by zero in a constant expression", span) from None
            except OverflowError:
                raise NkError(f"the constant {describe(a)} {op} {describe(b)} does not fit in 64 bits", span) from None
            except (TypeError, ValueError) as e:
                raise NkError(f"bad operands for '{op}': {describe(a)} and {describe(b)} ({e})", span) from None
        if op == "@":
            return self.call_builtin("dot", [a, b], {}, span)
        if op in ("and", "or"):
            x, y = self.unify([a, b], span)
            return self.emit(op, [self.truth(x, span), self.truth(y, span)], x.type.with_dtype(bool_), span)
        pa = isinstance(a, ir.Value) and isinstance(a.type.dtype, Ptr)
        pb = isinstance(b, ir.Value) and isinstance(b.type.dtype, Ptr)
        if pa or pb:
            return self.pointer_arith(op, a, b, pa, span)
        kind = BINOPS[op]
        x, y = self.unify([a, b], span)
        dt = x.type.dtype
        if kind in INT_ONLY and dt.is_float:
            raise NkError(f"'{op}' needs integer operands, got {dt}", span)
        if kind in NOT_ON_BOOLS and dt == bool_:
            raise NkError(f"'{op}' of two bools", span, "convert one first, e.g. x.to(i32); & | ^ are logical on bools")
        if kind == "div" and not dt.is_float:
            x, y = self.cast(x, f32, span), self.cast(y, f32, span)
        if kind in ir.COMPARISONS:
            return self.emit(kind, [x, y], x.type.with_dtype(bool_), span)
        return self.emit(kind, [x, y], x.type, span)

    def pointer_arith(self, op: str, a, b, a_is_ptr: bool, span: Span):
        ptr, off = (a, b) if a_is_ptr else (b, a)
        if op not in ("+", "-") or (op == "-" and not a_is_ptr) or \
                (isinstance(off, ir.Value) and not off.type.dtype.is_int) or isinstance(off, float):
            raise NkError(f"unsupported pointer arithmetic: {describe(a)} {op} {describe(b)}", span,
                          "a pointer takes + or - of an integer offset (in elements)")
        off = self.value(off, span)
        if op == "-":
            off = self.emit("neg", [off], off.type, span)
        shape = broadcast_shapes(ptr.type.shape, off.type.shape, span)
        ptr, off = self.to_shape(ptr, shape, span), self.to_shape(off, shape, span)
        return self.emit("ptradd", [ptr, off], ptr.type, span)

    def expr_Call(self, e: A.Call):
        f = self.expr(e.func)
        args = [self.expr(a) for a in e.args]
        kwargs = {k: self.expr(v) for k, v in e.kwargs}
        if isinstance(f, Method):
            if f.name != "to":  # desc.load(offs) is load_tensor_descriptor(desc, offs)
                return self.call_builtin(f.name, [f.value, *args], kwargs, e.span)
            return self.method_to(f.value, args, kwargs, e.span)
        if isinstance(f, Func):  # a helper, else a builtin (a helper never takes a builtin's name), else a kernel
            d = self.defs.get(f.name)
            if d is not None and d.kind == "def":
                return self.inline(d, args, kwargs, e.span)
            if f.name.partition(".")[0] in BUILTINS:  # libdevice.NAME is the builtin libdevice
                return self.call_builtin(f.name, args, kwargs, e.span)
            if d is not None:
                raise NkError(f"'{d.name}' is a {d.kind}; only `def` helpers can be called from a kernel", e.func.span)
        raise NkError(f"{describe(f)} is not callable", e.span)

    def method_to(self, v: ir.Value, args, kwargs, span):
        if len(args) != 1 or set(kwargs) - {"bitcast"} or not isinstance(args[0], (DType, Ptr)):
            raise NkError("x.to() takes one dtype, e.g. x.to(f16)", span)
        if kwargs.get("bitcast"):
            if isinstance(args[0], Ptr) != isinstance(v.type.dtype, Ptr):
                raise NkError(f"bitcast between a pointer and a number: {v.type.dtype} to {args[0]}", span)
            if args[0].bits != v.type.dtype.bits:
                raise NkError(f"bitcast needs equal widths: {v.type.dtype} and {args[0]}", span)
            return self.emit("bitcast", [v], v.type.with_dtype(args[0]), span)
        if isinstance(args[0], Ptr) or isinstance(v.type.dtype, Ptr):  # only explicitly: an address is 64 bits
            if not all(isinstance(t, Ptr) or t in (i64, u64) for t in (args[0], v.type.dtype)):
                raise NkError(f"cannot convert {v.type.dtype} to {args[0]}", span,
                              "a pointer converts to another pointer type or to and from a 64-bit integer (i64, u64)")
            return self.emit("cast", [v], v.type.with_dtype(args[0]), span)
        return self.cast(v, args[0], span)

    def call_builtin(self, name: str, args, kwargs, span: Span):
        fn = BUILTINS[name.partition(".")[0]]
        sig = inspect.signature(fn)
        try:
            bound = sig.bind(self, span, *args, **kwargs)
        except TypeError as err:
            params = [p for p in list(sig.parameters)[2:] if p != "_name"]
            close = [m for k in kwargs if k not in params for m in difflib.get_close_matches(k, params, n=1)]
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise NkError(f"{name}(): {str(err).replace(fn.__name__ + '()', '').strip()}", span,
                          f"{hint}signature: {name}({', '.join(params)})") from None
        if "_name" in sig.parameters:
            bound.arguments["_name"] = name
        return fn(*bound.args, **bound.kwargs)

    def constexpr(self, v, what: str, span: Span):
        if isinstance(v, ir.Value):
            raise NkError(f"{what} must be a compile-time constant", span,
                          "declare the kernel parameter it comes from as `NAME: constexpr`")
        return v

    def block_shape(self, shape, span: Span) -> tuple:
        shape = self.constexpr(shape, "a block shape", span)
        if isinstance(shape, int):
            shape = (shape,)
        if isinstance(shape, (tuple, list)) and any(isinstance(d, ir.Value) for d in shape):
            raise NkError("each block dimension must be a compile-time constant", span,
                          "declare the kernel parameter it comes from as `NAME: constexpr`")
        if not isinstance(shape, (tuple, list)) or not all(type(d) is int for d in shape):
            raise NkError(f"a block shape is a list of integers, got {describe(shape)}", span)
        for d in shape:
            if not is_pow2(d):
                raise NkError(f"block dimension {d} is not a power of two", span,
                              "round the block size up (e.g. with a constexpr) and mask the extra lanes")
        return tuple(shape)

    # ---- statements --------------------------------------------------------------------------
    def block(self, stmts: list):
        for i, s in enumerate(stmts):
            left = [f for f in EXITS if self.env.get(f) is True or isinstance(self.env.get(f), ir.Value)]
            if left:  # the rest runs only on the paths that have not left
                return None if any(self.env[f] is True for f in left) else self.guard(left, stmts[i:])
            self.statements += not isinstance(s, Iteration)  # the statements of an iteration count, not it
            if self.statements > MAX_STATEMENTS:
                raise NkError(f"the kernel is too long: over {MAX_STATEMENTS} statements once static_range loops, "
                              "`while` loops on compile-time conditions and helpers are unrolled", s.span,
                              "use a runtime loop")
            getattr(self, "stmt_" + type(s).__name__)(s)

    def guard(self, flags: list, rest: list) -> None:
        """`rest` under a runtime `if` on the paths where no flag is set. Inside, every flag is False; on the other
        side, a single flag is known to be True."""
        span = rest[0].span
        left = self.env[flags[0]]
        for f in flags[1:]:
            left = self.emit("or", [left, self.env[f]], Type((), bool_), span)
        stay = self.emit("not", [left], Type((), bool_), span)
        known = {flags[0]: True} if len(flags) == 1 else {}
        self.branch(stay, [(rest, dict.fromkeys(flags, False)), ([], known)], span)

    def stmt_Pass(self, s):
        pass

    def stmt_ExprStmt(self, s: A.ExprStmt):
        self.expr(s.value)

    def stmt_Return(self, s: A.Return):
        if RESULT not in self.env and s.value is not None:
            raise NkError("a kernel cannot return a value; store results through pointers", s.span)
        if RESULT in self.env:
            self.env[RESULT] = self.expr(s.value) if s.value is not None else None
        self.env[RETURN] = True

    def stmt_Break(self, s):
        flag = type(s).__name__.lower()  # "break" or "continue": set in loop bodies only
        if self.env.get(flag) is None:
            raise NkError(f"'{flag}' outside a loop", s.span)
        self.env[flag] = True

    stmt_Continue = stmt_Break

    def assign(self, target, value, span: Span):
        if isinstance(target, A.Name):
            if isinstance(value, ir.Value) and not value.name:
                value.name = target.id
            self.env[target.id] = value
        elif isinstance(target, A.TupleExpr):
            self.unpack(target.items, value, span)
        else:
            raise NkError("only names can be assigned in a kernel", getattr(target, "span", span),
                          "write memory with store(pointer, value)")

    def unpack(self, targets, value, span):
        if not isinstance(value, (tuple, list)) or len(value) != len(targets):
            raise NkError(f"cannot unpack {describe(value)} into {len(targets)} names", span)
        for t, v in zip(targets, value):
            self.assign(t, v, span)

    def stmt_Assign(self, s: A.Assign):
        value = self.expr(s.value)
        if s.annotation is not None:  # `B: constexpr = 16`
            if not is_constexpr_annot(s.annotation):
                raise NkError("a local name takes only the annotation `constexpr`", s.annotation.span,
                              "write `B: constexpr = 16`, or convert the value with .to(dtype)")
            if not is_constexpr_value(self.constexpr(value, f"constexpr '{s.targets[0].id}'", s.value.span)):
                raise NkError(f"constexpr '{s.targets[0].id}' cannot be {describe(value)}", s.value.span,
                              "a constexpr is an int, a float, a bool, a string, a dtype or a tuple of these")
        if len(s.targets) == 1:
            self.assign(s.targets[0], value, s.span)
        else:
            self.unpack(s.targets, value, s.span)

    def stmt_AugAssign(self, s: A.AugAssign):
        self.assign(s.target, self.binary(s.op, self.expr(s.target), self.expr(s.value), s.span), s.span)

    def stmt_If(self, s: A.If):
        cond = self.expr(s.cond)
        if is_const(cond):
            self.block(s.body if cond else s.orelse)
            return
        if cond.type.shape:
            raise NkError(f"an `if` condition must be a scalar, got a block {cond.type}", s.cond.span,
                          "use where(cond, a, b) to choose per element")
        self.branch(self.truth(cond, s.cond.span), [(s.body, {}), (s.orelse, {})], s.span)

    def branch(self, cond: ir.Value, arms: list, span: Span) -> None:
        """A runtime `if`: each arm (statements, names known on that side) in its own region. A name that differs
        after them becomes a result of the op; a path that has left (break, continue, return) does not count."""
        before, outer = dict(self.env), self.region
        envs, regions = [], []
        for body, known in arms:
            self.env, self.region = {**before, **known}, ir.Region()
            self.block(body)
            envs.append(self.env)
            regions.append(self.region)
        inner = {id(r) for region in regions for op in ir.walk(region) for r in op.results}
        gone = [any(env.get(f) is True for f in EXITS) for env in envs]
        names = sorted(n for n in envs[0].keys() | envs[1].keys()
                       if (n in envs[0] or gone[0]) and (n in envs[1] or gone[1]))
        sides = [[env.get(n, UNDEF) for n in names] for env in envs]
        joined = [self.join(n, a, b, inner, span) for n, a, b in zip(names, *sides)]
        for region, side in zip(regions, sides):
            self.region = region
            self.emit("yield", [v for n, j, x in zip(names, joined, side) for v in self.fill(j, x, n, span)], None,
                      span)
        self.region = outer
        op = ir.Op("if", [cond], [ir.Value(t, n) for n, j in zip(names, joined) for t in merged(j)], {}, span, regions)
        self.region.ops.append(op)
        results = iter(op.results)
        self.env = {n: rebuild_merged(j, results) for n, j in zip(names, joined)}

    def join(self, name: str, a, b, inner: set, span: Span):
        """What `name` is after a runtime `if` whose arms leave it a and b: the same value (compile-time, or a
        runtime value from before the `if`), a Type (a result of the op) or a tuple of these."""
        if a is UNDEF:
            a, b = b, a
        if a is b or (is_const(a) and is_const(b) and a == b):
            return a
        if b is UNDEF:  # only the other path goes on
            if isinstance(a, (tuple, BlockPtr)):
                return rebuild(a, [self.join(name, x, UNDEF, inner, span) for x in leaves(a)])
            return a.type if isinstance(a, ir.Value) and id(a) in inner else a
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            return tuple(self.join(name, x, y, inner, span) for x, y in zip(a, b))
        if isinstance(a, BlockPtr) or isinstance(b, BlockPtr):  # its runtime parts, one by one
            return a.rebuild([self.join(name, x, y, inner, span) for x, y in pairs(name, a, b, span)])
        try:
            t = self.join_type(name, a, b, span)
            if name != RESULT or not any(isinstance(v, ir.Value) and v.type != t for v in (a, b)):
                return t
        except NkError:
            if name != RESULT:
                raise
        raise NkError(f"this helper returns {describe(a)} on one path and {describe(b)} on another", span,
                      "return values of one shape and dtype on every path")

    def fill(self, j, v, name: str, span: Span) -> list:
        """The values an arm yields for the merged structure j (from join); v is the arm's value."""
        if isinstance(j, Type):
            return [self.coerce(v, j, name, span)]
        if isinstance(j, (tuple, BlockPtr)):
            return [x for i, y in enumerate(leaves(j))
                    for x in self.fill(y, UNDEF if v is UNDEF else leaves(v)[i], name, span)]
        return []

    def join_type(self, name: str, a, b, span: Span) -> Type:
        ta = a.type if isinstance(a, ir.Value) else None
        tb = b.type if isinstance(b, ir.Value) else None
        for v in (a, b):
            if not isinstance(v, (ir.Value, bool, int, float)):
                raise NkError(f"'{name}' is a compile-time {describe(v)} on one path and differs on another", span)
        if ta is None and tb is None:  # two different literals: one runtime value of their common dtype
            return Type((), promote(literal_dtype(a), literal_dtype(b)))
        if ta is None or tb is None:
            t = ta or tb
            lit = a if ta is None else b
            return t.with_dtype(weak_dtype(lit, t.dtype)) if t.dtype != bool_ else t
        shape = ta.shape if ta.shape == tb.shape else None
        if shape is None:
            if not ta.shape or not tb.shape:
                shape = ta.shape or tb.shape
            else:
                raise NkError(f"'{name}' is {ta} on one path and {tb} on another", span)
        if isinstance(ta.dtype, Ptr) or isinstance(tb.dtype, Ptr):
            if ta.dtype != tb.dtype:
                raise NkError(f"'{name}' is {ta} on one path and {tb} on another", span)
            return Type(shape, ta.dtype)
        return Type(shape, promote(ta.dtype, tb.dtype))

    def coerce(self, v, t: Type, name: str, span: Span) -> ir.Value:
        if v is UNDEF:  # a path that has left: any value of the type does (a null pointer for a pointer)
            v = self.emit("const", [], Type((), t.dtype), span, {"value": 0}) if isinstance(t.dtype, Ptr) else 0
        v = self.cast(self.value(v, span, t.dtype if not isinstance(t.dtype, Ptr) else None), t.dtype, span)
        return self.to_shape(v, t.shape, span)

    def stmt_For(self, s: A.For):
        if not (isinstance(s.iter, A.Call) and isinstance(s.iter.func, A.Name)
                and s.iter.func.id in ("range", "static_range")):
            raise NkError("a kernel loop iterates over range(...) or static_range(...)", s.iter.span,
                          "tile loops (`tiles(...)`) belong to tile programs, which deuteron compiles")
        args = [self.expr(a) for a in s.iter.args]
        static = s.iter.func.id == "static_range"
        options = {k: self.constexpr(self.expr(v), f"{k}=", v.span) for k, v in s.iter.kwargs}
        if not 1 <= len(args) <= 3 or options.keys() - ({"num_stages", "unroll", "warp_specialize"} if not static
                                                         else set()):
            raise NkError(f"{s.iter.func.id}() takes 1 to 3 positional arguments"
                          + ("" if static else " and the options num_stages=, unroll= and warp_specialize="),
                          s.iter.span)
        for k, v in options.items():
            if k == "warp_specialize" and type(v) is not bool:
                raise NkError(f"range(warp_specialize=) must be True or False, got {describe(v)}", s.iter.span)
            if k != "warp_specialize" and (type(v) is not int or v < 1):
                raise NkError(f"range({k}=) must be an integer of at least 1, got {describe(v)}", s.iter.span)
            if k == "num_stages" and v > MAX_STAGES:
                raise NkError(f"range(num_stages={v}) is more than {MAX_STAGES} slots", s.iter.span,
                              "a ring deeper than a few slots hides no more latency; use 2 to 8")
        lo, hi, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if not isinstance(s.target, A.Name):
            raise NkError("a range loop binds one name", s.target.span)
        if static:
            for v, what in ((lo, "start"), (hi, "end"), (step, "step")):
                if type(self.constexpr(v, f"static_range {what}", s.iter.span)) is not int:
                    raise NkError(f"static_range {what} must be an integer, got {describe(v)}", s.iter.span)
            if step == 0:
                raise NkError("static_range() step must not be zero", s.iter.span)
            outer = {f: self.env.get(f) for f in (BREAK, CONTINUE)}
            self.env[BREAK] = self.env[CONTINUE] = False
            iterations = itertools.islice(range(lo, hi, step), MAX_STATEMENTS + 1)  # each runs a statement at least
            self.block([Iteration(s.target.id, i, s.body, s.span) for i in iterations])
            self.env.update(outer)
            return
        self.runtime_for(s, lo, hi, step, options)

    def stmt_Iteration(self, s: Iteration):
        self.env[s.name] = s.value
        self.block(s.body)
        self.env[CONTINUE] = False  # the iteration is over, on every path

    def runtime_for(self, s: A.For, lo, hi, step, options: dict):
        if is_const(step) and step == 0:
            raise NkError("range() step must not be zero", s.iter.span)
        down = is_number(step) and step < 0
        lo, hi, step = self.unify([lo, hi, step], s.iter.span)
        if lo.type.shape or not lo.type.dtype.is_int:
            raise NkError("range() bounds must be integer scalars", s.iter.span)
        if not breaks(s.body):
            def run(own):
                self.env[s.target.id] = own[0]
                self.block(s.body)
                return []
            return self.runtime_loop("for", [lo, hi, step], [(s.target.id, lo.type)], s, run, options)

        def run(own):  # a loop that may break is a `while` over its counter (so it is not software-pipelined)
            self.env[s.target.id] = own[1]
            self.block(s.body)
            i = self.binary("+", own[1], step, s.span)
            more, broke = self.binary(">" if down else "<", i, hi, s.span), self.env[BREAK]
            return [False if broke is True else more if broke is False else
                    self.binary("and", more, self.emit("not", [broke], broke.type, s.span), s.span), i]
        first = self.binary(">" if down else "<", lo, hi, s.span)
        own = [(COND, Type((), bool_)), (s.target.id, lo.type)]
        self.runtime_loop("while", [first, lo], own, s, run, {k: v for k, v in options.items() if k == "unroll"})

    def stmt_While(self, s: A.While):
        """Iterations whose condition is a compile-time value are unrolled; from the first that is not, or that may
        leave under a runtime condition (it is taken back), the rest is a runtime loop."""
        outer = {f: self.env.get(f) for f in (BREAK, CONTINUE)}
        while True:
            cond = self.expr(s.cond)
            if is_const(cond):
                if not cond:
                    break
                mark = len(self.region.ops), dict(self.env), self.statements
                self.env[BREAK] = self.env[CONTINUE] = False
                self.block(s.body)
                if not any(isinstance(self.env.get(f), ir.Value) for f in EXITS):
                    if self.env[BREAK] is True or self.env.get(RETURN) is True:
                        break
                    continue
                del self.region.ops[mark[0]:]
                self.env, self.statements = mark[1], mark[2]
            self.runtime_while(s, cond)
            break
        self.env.update(outer)

    def runtime_while(self, s: A.While, cond):
        if isinstance(cond, ir.Value) and cond.type.shape:
            raise NkError(f"a `while` condition must be a scalar, got a block {cond.type}", s.cond.span,
                          "reduce it first, e.g. max(v, axis=0)")

        def run(own):
            self.block(s.body)
            self.env[CONTINUE] = self.env[COND] = False  # after a `break`, the condition is not evaluated
            self.block([A.Assign([A.Name(COND, s.cond.span)], s.cond, s.cond.span)])
            return [self.env[COND]]
        first = self.truth(self.value(cond, s.cond.span), s.cond.span)
        self.runtime_loop("while", [first], [(COND, Type((), bool_))], s, run, {})

    def runtime_loop(self, kind: str, args: list, own: list, s, run, attrs: dict) -> None:
        """A `for` or `while` op, traced until the types of its carried values settle. `own` are the region's
        leading parameters (name, type): the counter, a `while`'s condition; run(their values) runs the body
        once and returns their next values. A block pointer is carried as its scalars, and a part the body
        leaves as it is (a block pointer's shape, say) is not carried."""
        carried = [n for n in assigned_names(s.body) if n in self.env and n not in dict(own)
                   and isinstance(self.env[n], (ir.Value, bool, int, float, BlockPtr))]
        before = dict(self.env)
        init = {(n, i): v for n in carried for i, v in enumerate(leaves(before[n]))}  # a slot per runtime part
        slots = list(init)
        types = {k: v.type if isinstance(v, ir.Value) else Type((), literal_dtype(v)) for k, v in init.items()}
        for attempt in range(4):
            outer = self.region
            body = self.region = ir.Region([ir.Value(t, n) for n, t in own] + [ir.Value(types[k], k[0]) for k in slots])
            params = dict(zip(slots, body.params[len(own):]))
            self.env = {**before, BREAK: False, CONTINUE: False}
            for n in carried:
                self.env[n] = rebuild(before[n], [params.get((n, i), v) for i, v in enumerate(leaves(before[n]))])
            nexts = run(body.params[:len(own)])
            if self.env.get(RETURN) not in (None, False):
                raise NkError("`return` inside a runtime loop is not supported", s.span,
                              "break out of the loop and return after it")
            ends = {(n, i): y for n in carried for i, (x, y) in enumerate(pairs(n, before[n], self.env[n], s.span))}
            self.region = outer
            kept = [k for k in slots if ends[k] is not params[k]]
            new = {k: self.join_type(k[0], ends[k], params[k], s.span) for k in kept}
            if kept == slots and all(new[k] == types[k] for k in slots):
                break
            slots, types = kept, new  # a literal or narrower init met a wider value in the body: widen and trace again
        else:
            raise NkError("loop-carried types did not settle", s.span)
        self.region = body
        self.emit("yield", [self.coerce(v, t, n, s.span) for v, (n, t) in zip(nexts, own)]
                  + [self.coerce(ends[k], types[k], k[0], s.span) for k in slots], None, s.span)
        self.region = outer
        self.env = before
        inits = [self.coerce(init[k], types[k], k[0], s.span) for k in slots]
        results = [ir.Value(t, n) for n, t in own if kind == "while"] + [ir.Value(types[k], k[0]) for k in slots]
        op = ir.Op(kind, args + inits, results, attrs, s.span, [body])
        self.region.ops.append(op)
        out = dict(zip(slots, op.results[len(op.results) - len(slots):]))
        for n in carried:
            self.env[n] = rebuild(before[n], [out.get((n, i), v) for i, v in enumerate(leaves(before[n]))])

    # ---- helpers -----------------------------------------------------------------------------
    def inline(self, d: A.FuncDef, args, kwargs, span: Span):
        if self.depth > 32:
            raise NkError(f"helper '{d.name}' calls itself too deeply (recursion is not supported)", span)
        env = self.bind(d, args, kwargs, span)
        saved, self.env = self.env, {**env, RETURN: False, RESULT: UNDEF}
        self.depth += 1
        try:
            self.block(d.body)
            done, result = self.env[RETURN], self.env[RESULT]
        finally:
            self.env = saved
            self.depth -= 1
        if done is not True and result is not UNDEF and result is not None:
            raise NkError(f"helper '{d.name}' returns a value on some paths and none on others", d.span,
                          "end it with a `return`")
        return None if result is UNDEF else result

    def bind(self, d: A.FuncDef, args, kwargs, span: Span) -> dict:
        names = [p.name for p in d.params]
        if len(args) > len(names):
            raise NkError(f"{d.name}() takes {len(names)} arguments, {len(args)} given", span)
        env = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise NkError(f"{d.name}() has no parameter '{k}'", span)
            if k in env:
                raise NkError(f"{d.name}() got two values for '{k}'", span)
            env[k] = v
        for p in d.params:
            if p.name not in env:
                if p.default is None:
                    raise NkError(f"{d.name}() is missing argument '{p.name}'", span)
                env[p.name] = self.expr(p.default)
            if is_constexpr_annot(p.annotation):
                self.constexpr(env[p.name], f"argument '{p.name}'", span)
        return env


def is_constexpr_annot(a) -> bool:
    return isinstance(a, A.Name) and a.id == "constexpr"


def annotation_type(a: A.Expr | None):
    """The dtype or pointer type an annotation fixes, or None."""
    if isinstance(a, A.Name) and a.id in DTYPES:
        return DTYPES[a.id]
    if isinstance(a, A.UnaryOp) and a.op == "*" and isinstance(a.operand, A.Name) and a.operand.id in DTYPES:
        return Ptr(DTYPES[a.operand.id])
    if a is None or is_constexpr_annot(a):
        return None
    raise NkError("unknown type annotation", a.span, "use constexpr, a dtype such as i32, or a pointer such as *f16")


def assigned_names(stmts) -> list[str]:
    """Names a loop body may assign, in first-assignment order (candidates for loop-carried values)."""
    out: list[str] = []

    def add(t):
        if isinstance(t, A.Name) and t.id not in out:
            out.append(t.id)
        elif isinstance(t, A.TupleExpr):
            for x in t.items:
                add(x)

    for s in stmts:
        if isinstance(s, A.Assign):
            for t in s.targets:
                add(t)
        elif isinstance(s, A.AugAssign):
            add(s.target)
        elif isinstance(s, A.If):
            for n in assigned_names(s.body) + assigned_names(s.orelse):
                add(A.Name(n, s.span))
        elif isinstance(s, (A.For, A.While)):
            for n in assigned_names(s.body):
                add(A.Name(n, s.span))
    return out


def breaks(stmts) -> bool:
    """Whether a loop body may `break` (a `break` in a nested loop is that loop's)."""
    return any(isinstance(s, A.Break) or isinstance(s, A.If) and breaks(s.body + s.orelse) for s in stmts)


def drop_unread_merges(body: ir.Region) -> None:
    """Drop the results of `if` ops that nothing reads (after an early exit, every name the rest of the block
    makes is merged, though the code after it rarely reads them), until none is left."""
    while True:
        read = {id(a) for op in ir.walk(body) for a in op.args}
        unread = [(op, i) for op in ir.walk(body) if op.kind == "if" for i, r in enumerate(op.results)
                  if id(r) not in read]
        if not unread:
            return
        for op, i in reversed(unread):
            del op.results[i]
            for r in op.regions:
                del r.ops[-1].args[i]


def merged(j) -> list:
    """The types of the results that a merged structure (Checker.join) takes."""
    if isinstance(j, (tuple, BlockPtr)):
        return [t for x in leaves(j) for t in merged(x)]
    return [j] if isinstance(j, Type) else []


def rebuild_merged(j, results):
    """A merged structure with each of its types replaced by the next result."""
    if isinstance(j, (tuple, BlockPtr)):
        return rebuild(j, [rebuild_merged(x, results) for x in leaves(j)])
    return next(results) if isinstance(j, Type) else j


def describe(v) -> str:
    if isinstance(v, ir.Value):
        return f"a {'block' if v.type.shape else 'scalar'} of type {v.type}"
    if isinstance(v, Func):
        return f"the function '{v.name}'"
    if isinstance(v, DType):
        return f"the dtype {v}"
    if isinstance(v, BlockPtr):
        kind = "tensor descriptor" if isinstance(v, TensorDesc) else "block pointer"
        return f"a {kind} to {v.base.type.dtype.elem}{list(v.block_shape)}"
    if isinstance(v, str):
        return f"the string {v!r}"
    return f"{type(v).__name__} {v!r}"


def check_names(module: A.Module) -> None:
    """A helper named like a builtin or a constant could never be called: say so at its definition."""
    for d in module.defs:
        if d.kind == "def" and (d.name in BUILTINS or d.name in CONSTANTS or d.name in LOOPS):
            raise NkError(f"helper '{d.name}' has the name of a builtin, which it would never replace", d.span,
                          "rename the helper")


def is_constexpr_value(v) -> bool:
    """What a constexpr may be: a number, a string, a dtype, None, or a tuple of these."""
    if isinstance(v, tuple):
        return all(map(is_constexpr_value, v))
    return v is None or isinstance(v, (str, DType)) or (is_number(v) and not (type(v) is int and abs(v) >= MAX_CONST))


def check(module: A.Module, name: str, spec) -> ir.Kernel:
    """Type one kernel of a module for one specialization (a compiler.Spec)."""
    d = next((d for d in module.defs if d.name == name), None)
    if d is None or d.kind != "kernel":
        kernels = [k.name for k in module.defs if k.kind == "kernel"]
        raise NkError(f"no kernel named '{name}' in {module.file}", None,
                      f"kernels: {', '.join(kernels)}" if kernels else "")
    check_names(module)
    if type(spec.num_warps) is not int or not is_pow2(spec.num_warps) or spec.num_warps > 32:
        raise NkError(f"num_warps={spec.num_warps!r} must be a power of two from 1 to 32", d.span)
    if type(spec.num_stages) is not int or not 1 <= spec.num_stages <= MAX_STAGES:
        raise NkError(f"num_stages={spec.num_stages!r} must be an integer from 1 to {MAX_STAGES}", d.span)
    if type(spec.num_ctas) is not int or spec.num_ctas not in CLUSTERS:
        raise NkError(f"num_ctas={spec.num_ctas!r} must be 1, 2, 4 or 8 (a portable cluster)", d.span)
    most = min(255, 65536 // (32 * spec.num_warps))  # an SM's 64K registers must hold one program's threads
    if type(spec.maxnreg) is not int or spec.maxnreg and not 16 <= spec.maxnreg <= most:
        raise NkError(f"maxnreg={spec.maxnreg!r} must be an integer from 16 to {most} (0: no cap)", d.span,
                      f"{32 * spec.num_warps} threads share an SM's 65536 registers")
    if spec.num_ctas > 1 and int("".join(filter(str.isdigit, spec.arch))) < 90:
        raise NkError(f"num_ctas={spec.num_ctas}: clusters need sm_90 or later, not {spec.arch}", d.span,
                      "launch with num_ctas=1 on this GPU")
    c = Checker(module, spec)
    sig, constexprs = spec.types, spec.values
    params = []
    for p in d.params:
        if is_constexpr_annot(p.annotation):
            if p.name in constexprs:
                if not is_constexpr_value(constexprs[p.name]):
                    raise NkError(f"constexpr '{p.name}' of kernel '{name}' cannot be {describe(constexprs[p.name])}",
                                  p.span, "a constexpr is an int, a float, a bool, a string, a dtype or a tuple of these")
                c.env[p.name] = constexprs[p.name]
            elif p.default is not None:
                c.env[p.name] = c.expr(p.default)
            else:
                raise NkError(f"missing constexpr '{p.name}' for kernel '{name}'", p.span,
                              f"pass it by keyword at launch, e.g. {name}[grid](..., {p.name}=...)")
            continue
        fixed = annotation_type(p.annotation)
        t = sig.get(p.name)
        if t is None:
            raise NkError(f"no type for parameter '{p.name}'", p.span)
        if fixed is not None:
            if isinstance(fixed, Ptr) != isinstance(t, Ptr) or (isinstance(fixed, Ptr) and fixed != t):
                raise NkError(f"parameter '{p.name}' is declared {fixed.name} but got {t.name}", p.span)
            t = fixed
        # a 16- or 8-bit float scalar travels as f32 (launch slots hold 32 or 64 bits) and is rounded on entry
        v = ir.Value(Type((), f32 if t.is_float and t.bits < 32 else t), p.name)
        params.append(v)
        c.env[p.name] = c.cast(v, t, p.span)
    c.env[RETURN] = False  # a bare `return` ends the program early
    c.block(d.body)
    drop_unread_merges(c.region)
    k = ir.Kernel(name, params, c.region, spec, d.span)
    ir.maybe_verify(k)
    return k


# ---- builtins --------------------------------------------------------------------------------
# Each takes (checker, span, *arguments); the signature is what users see in arity errors.

@builtin("program_id", "num_programs")
def _program_id(c: Checker, span, axis, *, _name=""):
    axis = c.constexpr(axis, "the axis", span)
    if type(axis) is not int or axis not in (0, 1, 2):
        raise NkError(f"axis must be 0, 1 or 2, got {axis!r}", span)
    return c.emit(_name, [], Type((), i64 if c.idx64 else i32), span, {"axis": axis})


@builtin("arange")
def _arange(c: Checker, span, start, end):
    start, end = c.constexpr(start, "arange start", span), c.constexpr(end, "arange end", span)
    if type(start) is not int or type(end) is not int:
        raise NkError(f"arange() takes integer bounds, got {start!r} and {end!r}", span)
    if not is_pow2(end - start):
        raise NkError(f"arange({start}, {end}) has {end - start} elements, not a power of two", span,
                      "use a power-of-two range and mask the extra lanes")
    return c.emit("arange", [], Type((end - start,), i32), span, {"start": start, "end": end})


@builtin("zeros")
def _zeros(c: Checker, span, shape, dtype=f32):
    return _full(c, span, shape, 0, dtype)


@builtin("full")
def _full(c: Checker, span, shape, value, dtype=f32):
    shape = c.block_shape(shape, span)
    if not isinstance(dtype, DType):
        raise NkError(f"expected a dtype, got {describe(dtype)}", span)
    v = c.cast(c.value(value, span, dtype), dtype, span)
    return c.to_shape(v, shape, span)


def need_pointer(ptr, what: str, span: Span) -> None:
    if not isinstance(ptr, ir.Value) or not isinstance(ptr.type.dtype, Ptr):
        raise NkError(f"{what} needs a pointer, got {describe(ptr)}", span)


def memory_mask(c: Checker, mask, shape: tuple, span: Span):
    """A load/store/atomic mask as bool, and the access shape it broadcasts with."""
    if mask is None:
        return None, shape
    mask = c.value(mask, span, bool_)
    shape = broadcast_shapes(shape, mask.type.shape, span)
    return c.to_shape(c.truth(mask, span), shape, span), shape


def scalar_access(ptr: ir.Value, what: str, v, span: Span) -> None:
    """Through a scalar pointer, one lane accesses memory: a block value, mask or `other` is a mistake
    (a block stored through a scalar pointer would store one of its lanes; usually a `sum` is missing)."""
    if not ptr.type.shape and isinstance(v, ir.Value) and v.type.shape:
        raise NkError(f"{what} is a block ({v.type}) but the pointer is a scalar ({ptr.type})", span,
                      "reduce it first (e.g. sum(v)), or offset the pointer by a block (p + arange(0, N))")


@builtin("load")
def _load(c: Checker, span, ptr, mask=None, other=None, *, boundary_check=None, padding_option=None):
    ptr, mask, other = block_access(c, span, ptr, mask, other, boundary_check, padding_option, "load()")
    need_pointer(ptr, "load()", span)
    scalar_access(ptr, "the mask", mask, span)
    scalar_access(ptr, "other=", other, span)
    mask, shape = memory_mask(c, mask, ptr.type.shape, span)
    elem = ptr.type.dtype.elem
    if other is not None:
        if mask is None:
            raise NkError("load(other=...) needs a mask", span)
        other = c.to_shape(c.cast(c.value(other, span, elem), elem, span), shape, span)
    ptr = c.to_shape(ptr, shape, span)
    return c.emit("load", [ptr, mask, other], Type(shape, elem), span)


@builtin("store")
def _store(c: Checker, span, ptr, value, mask=None, *, boundary_check=None):
    ptr, mask, _ = block_access(c, span, ptr, mask, None, boundary_check, None, "store()")
    need_pointer(ptr, "store()", span)
    scalar_access(ptr, "the value", value, span)
    scalar_access(ptr, "the mask", mask, span)
    value = c.value(value, span, ptr.type.dtype.elem)
    shape = broadcast_shapes(ptr.type.shape, value.type.shape, span)
    mask, shape = memory_mask(c, mask, shape, span)
    if ptr.type.shape and broadcast_shapes(ptr.type.shape, value.type.shape, span) != ptr.type.shape:
        raise NkError(f"store() of a {value.type} value through a {ptr.type} pointer block", span,
                      "the value must broadcast to the pointer's shape")
    value = c.to_shape(c.cast(value, ptr.type.dtype.elem, span), shape, span)
    c.emit("store", [c.to_shape(ptr, shape, span), value, mask], None, span)


# ---- block pointers: Triton's make_block_ptr / advance, expanded at each load and store ----------
def index_tuple(v, rank: int, what: str, span: Span) -> tuple:
    if not isinstance(v, (tuple, list)) or len(v) != rank or not all(
            type(x) is int or isinstance(x, ir.Value) and not x.type.shape and x.type.dtype.is_int for x in v):
        raise NkError(f"{what} takes {rank} integers (one per block dimension), got {describe(v)}", span)
    return tuple(v)


@builtin("make_block_ptr")
def _make_block_ptr(c: Checker, span, base, shape, strides, offsets, block_shape, order, *, _name="make_block_ptr"):
    need_pointer(base, f"{_name}()", span)
    if base.type.shape:
        raise NkError(f"{_name}() needs a scalar pointer, got {describe(base)}", span)
    block = c.block_shape(block_shape, span)
    order = c.constexpr(order, "the order", span)
    if not block or not isinstance(order, (tuple, list)) or not all(type(d) is int for d in order) \
            or sorted(order) != list(range(len(block))):
        raise NkError(f"make_block_ptr(): order is a permutation of the {len(block)} dimensions of a block, fastest "
                      f"varying first, got {describe(order)} for block_shape {list(block)}", span, "e.g. (1, 0)")
    rank = len(block)
    return BlockPtr(base, index_tuple(shape, rank, f"{_name}() shape", span),
                    index_tuple(strides, rank, f"{_name}() strides", span),
                    index_tuple(offsets, rank, f"{_name}() offsets", span), block, tuple(order))


@builtin("advance")
def _advance(c: Checker, span, base, offsets):
    if not isinstance(base, BlockPtr) or isinstance(base, TensorDesc):
        raise NkError(f"advance() moves a block pointer (from make_block_ptr), got {describe(base)}", span)
    steps = index_tuple(offsets, len(base.block_shape), "advance() offsets", span)
    return replace(base, offsets=tuple(o if type(d) is int and d == 0 else c.binary("+", o, d, span)
                                       for o, d in zip(base.offsets, steps)))


def block_access(c: Checker, span, ptr, mask, other, boundary_check, padding_option, what: str):
    """(pointers, mask, other) of a load or store: a block pointer becomes a block of pointers, and a mask of its
    boundary-checked dimensions (0 <= index < shape, as in Triton); other arguments pass through."""
    if not isinstance(ptr, BlockPtr):
        if boundary_check is not None or padding_option is not None:
            raise NkError(f"{what}: boundary_check and padding_option take a block pointer (from make_block_ptr)",
                          span, "a block of pointers takes mask= and other=")
        return ptr, mask, other
    if isinstance(ptr, TensorDesc):
        raise NkError(f"{what} of a tensor descriptor", span, "write desc.load(offsets) or desc.store(offsets, value)")
    if mask is not None or other is not None:
        raise NkError(f"{what} through a block pointer takes boundary_check= (and padding_option=), not mask= or other=",
                      span)
    rank, elem = len(ptr.block_shape), ptr.base.type.dtype.elem
    check = c.constexpr(() if boundary_check is None else boundary_check, "boundary_check", span)
    check = (check,) if type(check) is int else check
    if not isinstance(check, (tuple, list)) or len(set(check)) != len(check) or \
            not all(type(d) is int and 0 <= d < rank for d in check):
        raise NkError(f"{what}: boundary_check names distinct dimensions of the block (0 to {rank - 1}), "
                      f"got {describe(boundary_check)}", span, "e.g. boundary_check=(0, 1)")
    check_padding(padding_option, elem, what, span)
    base, mask = ptr.base, None
    for d, n in enumerate(ptr.block_shape):
        idx = c.binary("+", ptr.offsets[d], _arange(c, span, 0, n), span)
        for a in range(rank):  # along dimension d of the block
            if a != d:
                shape = idx.type.shape[:a] + (1,) + idx.type.shape[a:]
                idx = c.emit("expand_dims", [idx], Type(shape, idx.type.dtype), span, {"axis": a})
        base = c.binary("+", base, c.binary("*", idx, ptr.strides[d], span), span)
        if d in check:
            inside = c.binary("&", c.binary(">=", idx, 0, span), c.binary("<", idx, ptr.shape[d], span), span)
            mask = inside if mask is None else c.binary("&", mask, inside, span)
    other = {"zero": 0, "nan": math.nan}.get(padding_option) if mask is not None else None
    return base, mask, other


def check_padding(option, elem: DType, what: str, span: Span) -> None:
    if option not in (None, "", "zero", "nan") or option == "nan" and not elem.is_float:
        raise NkError(f"{what}: padding_option is 'zero' or 'nan' (for floats), got {describe(option)} for {elem}",
                      span)


# ---- tensor descriptors: Triton's make_tensor_descriptor, lowered onto block pointers (TMA later) -----------------
@dataclass(frozen=True)
class TensorDesc(BlockPtr):
    """make_tensor_descriptor's value: a row-major block pointer at the origin; each access moves it to its offsets
    and checks every dimension (out of bounds loads `padding` and does not store, as in Triton)."""
    padding: str = "zero"


@builtin("make_tensor_descriptor")
def _make_tensor_descriptor(c: Checker, span, base, shape, strides, block_shape, padding_option="zero"):
    rank = len(c.block_shape(block_shape, span))
    p = _make_block_ptr(c, span, base, shape, strides, (0,) * rank, block_shape, tuple(range(rank))[::-1],
                        _name="make_tensor_descriptor")
    if isinstance(p.strides[-1], ir.Value) or p.strides[-1] != 1:  # Triton's rule, and TMA's: rows are contiguous
        raise NkError(f"make_tensor_descriptor(): the last stride must be the constant 1, "
                      f"got {describe(p.strides[-1])}", span,
                      "write 1 (or declare its parameter constexpr); for other strides use make_block_ptr")
    if p.block_shape[-1] * p.base.type.dtype.elem.bits < 128:
        raise NkError(f"make_tensor_descriptor(): a block row is at least 16 bytes, got {p.block_shape[-1]} of "
                      f"{p.base.type.dtype.elem}", span, "as in Triton (TMA copies 16-byte units)")
    check_padding(padding_option, p.base.type.dtype.elem, "make_tensor_descriptor()", span)
    return TensorDesc(**vars(p), padding=padding_option or "zero")


def desc_at(span, desc, offsets, what: str) -> BlockPtr:
    """The descriptor's block pointer moved to these offsets."""
    if not isinstance(desc, TensorDesc):
        raise NkError(f"{what} takes a tensor descriptor (from make_tensor_descriptor), got {describe(desc)}", span)
    offsets = index_tuple(offsets, len(desc.block_shape), f"{what} offsets", span)
    return BlockPtr(desc.base, desc.shape, desc.strides, offsets, desc.block_shape, desc.order)


@builtin("load_tensor_descriptor")
def _load_tensor_descriptor(c: Checker, span, desc, offsets):
    p = desc_at(span, desc, offsets, "load_tensor_descriptor()")
    v = _load(c, span, p, boundary_check=tuple(range(len(p.block_shape))), padding_option=desc.padding)
    if desc.padding == "zero":  # what TMA fills with: passes.pipeline may make the load a TMA copy (the IR keeps it)
        # as passes.pipeline reads a tile: no outer dimensions, not transposed
        c.region.ops[-1].attrs["desc"] = (desc.base, desc.shape, desc.strides, p.offsets, [], False)
    return v


@builtin("store_tensor_descriptor")
def _store_tensor_descriptor(c: Checker, span, desc, offsets, value):
    p = desc_at(span, desc, offsets, "store_tensor_descriptor()")
    _store(c, span, p, value, boundary_check=tuple(range(len(p.block_shape))))


@builtin(*ATOMICS)
def _atomic(c: Checker, span, ptr, val, mask=None, sem="acq_rel", scope="gpu", *, _name=""):
    return atomic(c, span, ATOMICS[_name], ptr, [val], mask, sem, scope)


@builtin("atomic_cas")
def _atomic_cas(c: Checker, span, ptr, cmp, val, mask=None, sem="acq_rel", scope="gpu"):
    return atomic(c, span, "cas", ptr, [cmp, val], mask, sem, scope)


def atomic(c: Checker, span, kind, ptr, vals, mask, sem, scope):
    need_pointer(ptr, "an atomic", span)
    elem = ptr.type.dtype.elem
    if elem.bits < 32 and kind != "cas" or elem == bool_:
        raise NkError(f"atomic_{kind} on {elem} is not supported", span, "use 32- or 64-bit elements")
    if kind in ("or", "and", "xor") and not elem.is_int:
        raise NkError(f"atomic_{kind} needs integer elements, got {elem}", span)
    for what, v, allowed in (("sem", sem, SEMS), ("scope", scope, SCOPES)):
        if v not in allowed:
            raise NkError(f"{what}={describe(v)} is not one of {', '.join(map(repr, allowed))}", span,
                          "the PTX memory model: sem orders other memory accesses around the atomic, scope says "
                          "which threads that ordering is for (the CTA, the GPU, the whole system)")
    vals = [c.cast(c.value(v, span, elem), elem, span) for v in vals]
    shape = ptr.type.shape
    for v in vals:
        shape = broadcast_shapes(shape, v.type.shape, span)
    mask, shape = memory_mask(c, mask, shape, span)
    args = [c.to_shape(ptr, shape, span)] + [c.to_shape(v, shape, span) for v in vals] + [mask]
    return c.emit("atomic", args, Type(shape, elem), span, {"kind": kind, "sem": sem, "scope": scope})


@builtin("where")
def _where(c: Checker, span, cond, a, b):
    if is_const(cond):
        return a if cond else b
    cond = c.truth(c.value(cond, span), span)
    a, b = c.unify([a, b], span)
    shape = broadcast_shapes(cond.type.shape, a.type.shape, span)
    return c.emit("where", [c.to_shape(cond, shape, span), c.to_shape(a, shape, span), c.to_shape(b, shape, span)],
                  Type(shape, a.type.dtype), span)


@builtin("cdiv")
def _cdiv(c: Checker, span, a, b):
    return c.binary("//", c.binary("-", c.binary("+", a, b, span), 1, span), b, span)


@builtin("minimum", "maximum")
def _minmax(c: Checker, span, a, b, *, _name=""):
    if is_number(a) and is_number(b):
        return min(a, b) if _name == "minimum" else max(a, b)
    x, y = c.unify([a, b], span)
    if isinstance(x.type.dtype, Ptr):
        raise NkError(f"{_name}() does not apply to pointers", span)
    return c.emit(_name, [x, y], x.type, span)


def _float_operand(c: Checker, x, span) -> ir.Value:
    x = c.value(x, span)
    return x if x.type.dtype.is_float else c.cast(x, f32, span)


@builtin(*MATH)
def _math(c: Checker, span, x, *, _name=""):
    if is_const(x):
        if not isinstance(x, (int, float)):
            raise NkError(f"{_name}() needs a number or a block, got {describe(x)}", span)
        if _name == "erf":
            return math.erf(x)
        fn = {"rsqrt": lambda v: 1 / np.sqrt(v), "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
              "floor": np.floor, "ceil": np.ceil}.get(_name) or getattr(np, _name)
        with np.errstate(all="ignore"):  # C semantics: log(0) = -inf, sqrt(-1) = nan, exp(1000) = inf
            return float(fn(np.float64(x)))
    x = _float_operand(c, x, span)
    return c.emit(_name, [x], x.type, span)


@builtin("abs")
def _abs(c: Checker, span, x):
    if is_const(x):
        if not isinstance(x, (int, float)):
            raise NkError(f"abs() needs a number or a block, got {describe(x)}", span)
        return abs(x)
    if isinstance(x.type.dtype, Ptr) or x.type.dtype == bool_:
        raise NkError(f"abs() needs a number, got {x.type}", span)
    return c.emit("abs", [x], x.type, span)


@builtin("fma")
def _fma(c: Checker, span, a, b, d):
    a, b, d = c.unify([a, b, d], span)
    if not a.type.dtype.is_float:
        raise NkError("fma() needs float operands", span)
    return c.emit("fma", [a, b, d], a.type, span)


def sum_dtype(dt: DType) -> DType:
    """The dtype a sum (or cumsum) of dt values has, as Triton's: narrow integers and bools in 32 bits (torch would use
    i64), the rest their own."""
    return i32 if dt == bool_ or dt.kind == "i" and dt.bits < 32 else u32 if dt.kind == "u" and dt.bits < 32 else dt


@builtin(*REDUCTIONS - {"max", "min"})  # max and min also compare several values: _max_min
def _reduce(c: Checker, span, x, axis=None, keep_dims=False, *, _name=""):
    if not isinstance(x, ir.Value) or not x.type.shape or isinstance(x.type.dtype, Ptr):
        raise NkError(f"{_name}() reduces a block of numbers, got {describe(x)}", span)
    axis = c.constexpr(axis, "the reduction axis", span)
    keep_dims = c.constexpr(keep_dims, "keep_dims", span)
    if type(keep_dims) is not bool:
        raise NkError(f"keep_dims must be True or False, got {describe(keep_dims)}", span)
    if axis is not None and type(axis) is not int:
        raise NkError(f"the reduction axis must be an integer, got {axis!r}", span)
    if axis is None:
        rank = len(x.type.shape)
        if rank > 1:
            x = c.emit("reshape", [x], Type((x.type.numel,), x.type.dtype), span)
        r = _reduce(c, span, x, 0, False, _name=_name)
        return c.to_shape(r, (1,) * rank, span) if keep_dims else r
    rank = len(x.type.shape)
    if not -rank <= axis < rank:
        raise NkError(f"axis {axis} is out of range for a block of rank {rank}", span)
    axis %= rank
    shape = x.type.shape[:axis] + ((1,) if keep_dims else ()) + x.type.shape[axis + 1:]
    dtype = i32 if _name in ("argmax", "argmin") else sum_dtype(x.type.dtype) if _name == "sum" else x.type.dtype
    if x.type.dtype == bool_ and _name in ("argmax", "argmin"):  # compared as 0 and 1
        x = c.cast(x, i32, span)
    elif _name == "sum" and dtype != x.type.dtype:  # narrow integers (or bools, counted) summed in 32 bits
        x = c.cast(x, dtype, span)
    return c.emit("reduce", [x], Type(shape, dtype), span, {"kind": _name, "axis": axis, "keep_dims": keep_dims})


@builtin("max", "min")
def _max_min(c: Checker, span, x, *values, axis=None, keep_dims=False, _name=""):
    """max(x, axis=...) reduces one block; max(a, b, ...) compares values elementwise, as Python's max does."""
    if not values or values == (None,):
        return _reduce(c, span, x, axis, keep_dims, _name=_name)
    rank = len(x.type.shape) if isinstance(x, ir.Value) else 0
    if len(values) == 1 and type(values[0]) is int and -rank <= values[0] < rank:  # both readings are valid
        raise NkError(f"{_name}(x, {values[0]}) is ambiguous: a reduction along axis {values[0]} (Triton) or the "
                      f"elementwise {_name} with {values[0]} (Python)", span,
                      f"write {_name}(x, axis={values[0]}) or {_name}imum(x, {values[0]})")
    if axis is not None or keep_dims is not False:
        raise NkError(f"{_name}() of several values compares them elementwise: axis= and keep_dims= are for the "
                      "reduction of one block", span)
    for v in values:
        x = _minmax(c, span, x, v, _name=_name + "imum")
    return x


@builtin("multiple_of", "max_contiguous")
def _hint(c: Checker, span, x, values, *, _name=""):
    """A promise about the values of x, which the axis analysis takes as known (Triton's tl.multiple_of and
    tl.max_contiguous): each element, or the first of each run, is a multiple of n; runs of n are consecutive."""
    values = c.constexpr(values, f"{_name}() values", span)
    if type(x) is int:
        return x  # a compile-time integer is known exactly
    if not isinstance(x, ir.Value) or not (x.type.dtype.is_int or isinstance(x.type.dtype, Ptr)):
        raise NkError(f"{_name}() takes an integer or pointer value, got {describe(x)}", span)
    rank = max(1, len(x.type.shape))
    values = (values,) if type(values) is int and rank == 1 else values
    if not (isinstance(values, (tuple, list)) and len(values) == rank and
            all(type(v) is int and v > 0 and (_name == "multiple_of" or is_pow2(v)) for v in values)):
        raise NkError(f"{_name}() takes {'a positive integer' if _name == 'multiple_of' else 'a power of two'} per "
                      f"dimension of {describe(x)}, got {describe(values)}", span,
                      "an int for a scalar or a 1-D block, a tuple for more dimensions")
    return c.emit("hint", [x], x.type, span, {_name: tuple(values)})


@builtin("reshape")
def _reshape(c: Checker, span, x, shape):
    shape = c.block_shape(shape, span)
    x = c.value(x, span)
    if math.prod(shape) != x.type.numel:
        raise NkError(f"cannot reshape {x.type} to {list(shape)}: element counts differ", span)
    return c.emit("reshape", [x], Type(shape, x.type.dtype), span)


@builtin("broadcast_to")
def _broadcast_to(c: Checker, span, x, shape):
    shape = c.block_shape(shape, span)
    x = c.value(x, span)
    if broadcast_shapes(x.type.shape, shape, span) != shape:
        raise NkError(f"cannot broadcast {x.type} to {list(shape)}", span)
    return c.to_shape(x, shape, span)


@builtin("trans")
def _trans(c: Checker, span, x, *dims):
    if not isinstance(x, ir.Value) or not x.type.shape:
        raise NkError(f"trans() needs a block, got {describe(x)}", span)
    rank = len(x.type.shape)
    perm = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else tuple(dims)
    perm = perm or tuple(reversed(range(rank)))
    if any(type(p) is not int for p in perm) or sorted(perm) != list(range(rank)):
        raise NkError(f"trans() dims {list(perm)} are not a permutation of {list(range(rank))}", span)
    shape = tuple(x.type.shape[p] for p in perm)
    return c.emit("trans", [x], Type(shape, x.type.dtype), span, {"perm": perm})


@builtin("dot")
def _dot(c: Checker, span, a, b, acc=None, input_precision="tf32"):
    for v in (a, b):
        if not isinstance(v, ir.Value) or len(v.type.shape) != 2 or isinstance(v.type.dtype, Ptr):
            raise NkError(f"dot() takes two 2-D blocks of numbers, got {describe(v)}", span)
    (m, k), (k2, n) = a.type.shape, b.type.shape
    if k != k2:
        raise NkError(f"dot() inner dimensions differ: {a.type} @ {b.type}", span)
    if input_precision not in ("tf32", "ieee"):
        raise NkError(f"input_precision must be 'tf32' or 'ieee', got {input_precision!r}", span,
                      "'tf32' runs f32 operands on the tensor cores, 'ieee' keeps full f32 (CUDA cores)")
    if a.type.dtype != b.type.dtype:
        dt = promote(a.type.dtype, b.type.dtype)
        a, b = c.cast(a, dt, span), c.cast(b, dt, span)
    dt = a.type.dtype
    natural = f64 if dt == f64 else i32 if dt.is_int or dt == bool_ else f32
    out = acc.type.dtype if isinstance(acc, ir.Value) else natural
    acc = c.to_shape(c.cast(c.value(0 if acc is None else acc, span, out), out, span), (m, n), span)
    attrs = {"precision": input_precision} if dt == f32 else {}
    return c.emit("dot", [a, b, acc], Type((m, n), out), span, attrs)


@builtin("static_assert")
def _static_assert(c: Checker, span, cond, msg=""):
    cond = c.constexpr(cond, "a static_assert condition", span)
    if not isinstance(msg, str):
        raise NkError("static_assert's message is a string", span, 'e.g. static_assert(BLOCK >= 16, "BLOCK >= 16")')
    if not cond:
        raise NkError(f"static_assert failed{': ' + msg if msg else ''}", span)


@builtin("print")
def _print(c: Checker, span, prefix, *values):
    if not isinstance(prefix, str):
        values, prefix = (prefix,) + values, ""
    c.emit("print", [c.value(v, span) for v in values], None, span, {"prefix": prefix})


@builtin("range", "static_range")
def _range(c: Checker, span, *args):
    raise NkError("range() and static_range() only appear as `for` loop iterables", span)


# ---- Triton's math, random numbers, memory model and debugging builtins --------------------------
@builtin(*LIBM_BUILTINS, "libdevice")
def _libm(c: Checker, span, *args, _name=""):
    fn = _name.removeprefix("libdevice.")
    if fn == "libdevice":
        raise NkError("libdevice is the CUDA math library, not a function", span, "call one of it, e.g. libdevice.j0(x)")
    if len(args) != LIBM[fn]:
        raise NkError(f"{_name}() takes {LIBM[fn]} argument{'s' * (LIBM[fn] > 1)}, got {len(args)}", span)
    xs = c.unify(list(args), span)
    if isinstance(xs[0].type.dtype, Ptr):
        raise NkError(f"{_name}() needs numbers, got {xs[0].type}", span)
    xs = [x if x.type.dtype.is_float else c.cast(x, f32, span) for x in xs]  # as the other math: ints in f32
    return c.emit("libm", xs, xs[0].type, span, {"fn": fn})


@builtin("umulhi")
def _umulhi(c: Checker, span, x, y):
    x, y = c.unify([x, y], span)
    if not x.type.dtype.is_int or x.type.dtype.bits < 32:
        raise NkError(f"umulhi() takes 32- or 64-bit integers, got {x.type.dtype}", span)
    return c.emit("libm", [x, y], x.type, span, {"fn": "umulhi"})  # the high half of the unsigned product


@builtin("clamp")
def _clamp(c: Checker, span, x, lo, hi):
    x, lo, hi = c.unify([x, lo, hi], span)
    if isinstance(x.type.dtype, Ptr) or x.type.dtype == bool_:
        raise NkError(f"clamp() needs numbers, got {x.type}", span)
    r = _minmax(c, span, _minmax(c, span, x, lo, _name="maximum"), hi, _name="minimum")
    return _where(c, span, c.binary("!=", x, x, span), x, r) if x.type.dtype.is_float else r  # NaN stays, as torch


@builtin("randint4x")
def _randint4x(c: Checker, span, seed, offset, n_rounds=10):
    """Triton's Philox: counter (offset, 0, 0, 0); the key is the seed's two 32-bit halves (32-bit offsets, 4x32)
    or the seed and 0 (64-bit offsets, 4x64)."""
    n_rounds = c.constexpr(n_rounds, "n_rounds", span)
    offset = c.value(offset, span)
    seed = c.value(seed, span, u64 if type(seed) is int and seed >= 0 else None)
    dt = offset.type.dtype
    if not dt.is_int or dt.bits < 32 or not seed.type.dtype.is_int or seed.type.shape:
        raise NkError(f"random numbers take a scalar integer seed and 32- or 64-bit integer offsets, got "
                      f"{describe(seed)} and {describe(offset)}", span)
    if type(n_rounds) is not int or not 1 <= n_rounds <= 64:
        raise NkError(f"n_rounds must be an integer from 1 to 64, got {describe(n_rounds)}", span)
    u = u32 if dt.bits == 32 else u64
    seed = c.cast(seed, u64, span)
    key = [c.cast(c.binary("&", seed, 0xFFFFFFFF, span), u32, span), c.cast(c.binary(">>", seed, 32, span), u32, span)] \
        if u == u32 else [seed, c.const(0, u64, span)]
    x = [offset if dt == u else c.emit("bitcast", [offset], offset.type.with_dtype(u), span)]
    x += [c.to_shape(c.const(0, u, span), offset.type.shape, span)] * 3
    key_a, key_b, mul_a, mul_b = PHILOX[dt.bits]

    def op(o, a, b):
        return c.binary(o, a, b, span)
    for _ in range(n_rounds):
        x = [op("^", op("^", _umulhi(c, span, mul_b, x[2]), x[1]), key[0]), op("*", mul_b, x[2]),
             op("^", op("^", _umulhi(c, span, mul_a, x[0]), x[3]), key[1]), op("*", mul_a, x[0])]
        key = [op("+", key[0], key_a), op("+", key[1], key_b)]
    return tuple(x)


@builtin("randint", "rand", "rand4x", "randn", "randn4x")
def _random(c: Checker, span, seed, offset, n_rounds=10, *, _name=""):
    r = _randint4x(c, span, seed, offset, n_rounds)
    if _name == "randint":
        return r[0]
    u = []
    for x in r[:1 if _name == "rand" else 2 if _name == "randn" else 4]:  # Triton's uint_to_uniform_float
        x = c.emit("bitcast", [x], x.type.with_dtype(i32 if x.type.dtype == u32 else i64), span)
        x = _where(c, span, c.binary("<", x, 0, span), c.emit("not", [x], x.type, span), x)
        u.append(c.binary("*", x, 4.6566127342e-10 if x.type.dtype == i32 else 1.0842020432385337e-19, span))
    if not _name.startswith("randn"):
        return u[0] if _name == "rand" else tuple(u)
    n = []
    for u1, u2 in zip(u[::2], u[1::2]):  # Box-Muller, as Triton's pair_uniform_to_normal
        u1 = _minmax(c, span, 1.0e-7, u1, _name="maximum")  # the accurate logf: r is small where u1 nears 1
        r = _math(c, span, c.binary("*", -2.0, _libm(c, span, u1, _name="log"), span), _name="sqrt")
        th = c.binary("*", 6.283185307179586, u2, span)
        n += [c.binary("*", r, _math(c, span, th, _name=f), span) for f in ("cos", "sin")]
    return n[0] if _name == "randn" else tuple(n)


@builtin("debug_barrier")
def _debug_barrier(c: Checker, span):
    c.emit("barrier", [], None, span)


@builtin("device_assert")
def _device_assert(c: Checker, span, cond, msg="", mask=None):
    if not isinstance(msg, str):
        raise NkError(f"device_assert() takes a string message, got {describe(msg)}", span)
    cond = c.truth(c.value(cond, span, bool_), span)
    mask, shape = memory_mask(c, mask, cond.type.shape, span)
    c.emit("assert", [c.to_shape(cond, shape, span), mask], None, span, {"msg": msg})


@builtin("static_print")
def _static_print(c: Checker, span, *values):
    # stderr, as a compiler's notes: the language server speaks its protocol on stdout
    print(f"{span.file}:{span.line}:", *(v.type if isinstance(v, ir.Value) else v for v in values), file=sys.stderr)


@builtin("inline_asm_elementwise")
def _inline_asm(c: Checker, span, asm, constraints, args, dtype, is_pure, pack):
    """Triton's inline PTX ($0... the results' registers, then the arguments'), on `pack` elements at a time."""
    args = list(args) if isinstance(args, (tuple, list)) else [args]
    cons = constraints.replace(" ", "").split(",") if isinstance(constraints, str) else []
    if not isinstance(asm, str) or not cons or not isinstance(dtype, DType) or type(is_pure) is not bool:
        raise NkError("inline_asm_elementwise() takes the asm and constraint strings, a list of arguments, one result "
                      "dtype and is_pure=True/False", span)
    if type(pack) is not int or not 1 <= pack <= 16 or pack & (pack - 1):
        raise NkError(f"inline_asm_elementwise(pack={describe(pack)}): pack is a power of two from 1 to 16", span,
                      "the number of elements one asm statement processes")
    vals = [c.value(a, span) for a in args]
    shape = ()
    for v in vals:
        shape = broadcast_shapes(shape, v.type.shape, span)
    types = [dtype] + [v.type.dtype for v in vals]
    if any(t == bool_ or isinstance(t, Ptr) for t in types):
        raise NkError("inline_asm_elementwise() takes numbers", span, "convert bools and pointers to an integer type")
    # as Triton: elements narrower than 32 bits travel packed, as many as fit in 32 bits, into one register each
    bits = [[t.bits * per] * (pack // per) for t in types for per in [min(max(32 // t.bits, 1), pack)]]
    outs, ins = len(bits[0]), sum(map(len, bits[1:]))
    if len(cons) != outs + ins or any((x[:1] == "=") != (i < outs) for i, x in enumerate(cons)):
        raise NkError(f"constraints {constraints!r} must be {outs} output(s) ('=r') and then {ins} input(s)", span,
                      f"pack={pack} elements per asm statement; those narrower than 32 bits share 32-bit registers")
    for b, x in zip(sum(bits, []), cons):  # a value travels as its bits
        if ASM_BITS.get(x.lstrip("=")) != b:
            raise NkError(f"constraint '{x}' does not fit {b} bits", span, "'h' holds 16 bits, 'r' and 'f' 32, "
                          "'l' and 'd' 64")
    return c.emit("asm", [c.to_shape(v, shape, span) for v in vals], Type(shape, dtype), span,
                  {"asm": asm, "constraints": cons, "pure": is_pure, "pack": pack})


ASM_BITS = {"h": 16, "r": 32, "l": 64, "f": 32, "d": 64}


@builtin("pointer_type")
def _pointer_type(c: Checker, span, dtype):
    if not isinstance(dtype, DType):
        raise NkError(f"pointer_type() takes a dtype, got {describe(dtype)}", span)
    return Ptr(dtype)
# ---- scans, sorting and data movement --------------------------------------------------------
def numbers(x, what: str, span: Span) -> None:
    if not isinstance(x, ir.Value) or not x.type.shape or isinstance(x.type.dtype, Ptr):
        raise NkError(f"{what} takes a block of numbers, got {describe(x)}", span)


def axis_of(c: Checker, axis, rank: int, what: str, span: Span) -> int:
    axis = c.constexpr(axis, what, span)
    if type(axis) is not int or not -rank <= axis < rank:
        raise NkError(f"{what} {describe(axis)} is not an axis of a block of rank {rank}", span)
    return axis % rank


def flag(c: Checker, v, what: str, span: Span) -> bool:
    v = c.constexpr(v, what, span)
    if type(v) is not bool:
        raise NkError(f"{what} must be True or False, got {describe(v)}", span)
    return v


def scan(c: Checker, span, xs: list, axis, reverse, combine, name: str) -> list:
    """Inclusive scans of blocks of one shape along axis; combine maps the region's scalar parameters
    (a..., b...) to the combined values, and the scan op keeps it as its region."""
    for x in xs or [None]:
        numbers(x, f"{name}()", span)
    if len({x.type.shape for x in xs}) > 1:
        raise NkError(f"{name}() scans blocks of one shape, got {', '.join(str(x.type) for x in xs)}", span)
    axis = axis_of(c, axis, len(xs[0].type.shape), "the scan axis", span)
    reverse = flag(c, reverse, "reverse", span)
    region = ir.Region([ir.Value(Type((), x.type.dtype), f"{s}{i}") for s in "ab" for i, x in enumerate(xs)])
    outer, c.region = c.region, region
    try:
        out = combine(*region.params)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(out) != len(xs):
            raise NkError(f"the combine function returns {len(out)} values for a scan of {len(xs)} blocks", span)
        ys = []
        for o, x in zip(out, xs):
            if isinstance(o, ir.Value) and o.type.shape:
                raise NkError(f"the combine function returns a block ({o.type}); it combines scalars", span)
            ys.append(c.cast(c.value(o, span, x.type.dtype), x.type.dtype, span))
        c.emit("yield", ys, None, span)
    finally:
        c.region = outer
    bad = next((op for op in region.ops if op.kind not in ir.ELEMENTWISE | {"const", "yield"}), None)
    if bad is not None:
        raise NkError(f"a combine function computes on its arguments only; '{bad.kind}' is not allowed", bad.span)
    op = ir.Op("scan", list(xs), [ir.Value(x.type) for x in xs], {"axis": axis, "reverse": reverse}, span, [region])
    c.region.ops.append(op)
    return op.results


@builtin("cumsum", "cumprod")
def _cumsum(c: Checker, span, x, axis=0, reverse=False, dtype=None, *, _name=""):
    numbers(x, f"{_name}()", span)
    dt = x.type.dtype
    dtype = sum_dtype(dt) if dtype is None else dtype
    if not isinstance(dtype, DType):
        raise NkError(f"dtype must be a dtype, got {describe(dtype)}", span)
    acc = f32 if dtype in (f16, bf16) else dtype  # 16-bit floats accumulate in f32, as sum() does
    op = "+" if _name == "cumsum" else "*"
    r, = scan(c, span, [c.cast(x, acc, span)], axis, reverse, lambda a, b: c.binary(op, a, b, span), _name)
    return c.cast(r, dtype, span)


@builtin("associative_scan")
def _associative_scan(c: Checker, span, x, axis, combine_fn, reverse=False):
    d = c.defs.get(combine_fn.name) if isinstance(combine_fn, Func) else None
    if d is None or d.kind != "def":
        raise NkError(f"combine_fn must name a `def` helper, got {describe(combine_fn)}", span,
                      "e.g. `def add(a, b): return a + b`, then associative_scan(x, 0, add)")
    xs = list(x) if isinstance(x, (tuple, list)) else [x]
    ys = scan(c, span, xs, axis, reverse, lambda *ps: c.inline(d, list(ps), {}, span), "associative_scan")
    return tuple(ys) if isinstance(x, (tuple, list)) else ys[0]


def exchange(c: Checker, x: ir.Value, axis: int, bits: int, span) -> ir.Value:
    """x with element i along axis replaced by element i ^ bits: a sorting network's partner, a flip."""
    return c.emit("exchange", [x], x.type, span, {"axis": axis, "xor": bits})


def axis_bit(c: Checker, shape: tuple, axis: int, bit: int, span) -> ir.Value:
    """Whether bit `bit` of each element's coordinate along axis is set (a bool block of `shape`)."""
    idx = _reshape(c, span, _arange(c, span, 0, shape[axis]), [shape[axis] if d == axis else 1 for d in range(len(shape))])
    return c.to_shape(c.binary("!=", c.binary("&", idx, 1 << bit, span), 0, span), shape, span)


def greater(c: Checker, a, b, span) -> ir.Value:
    """a > b, with NaN above every number (torch.sort's order)."""
    gt = c.binary(">", a, b, span)
    if not a.type.dtype.is_float:
        return gt
    return c.binary("or", gt, c.binary("and", c.binary("!=", a, a, span), c.binary("==", b, b, span), span), span)


def bitonic(c: Checker, x: ir.Value, axis: int, stage: int, descending, span) -> ir.Value:
    """A bitonic merge: runs of 2^stage along axis, each two sorted halves going opposite ways, become
    sorted runs, descending where `descending` (a bool or a bool block) holds."""
    for j in reversed(range(stage)):
        y = exchange(c, x, axis, 1 << j, span)
        swap = c.binary("^", greater(c, x, y, span), axis_bit(c, x.type.shape, axis, j, span), span)
        x = c.emit("where", [c.binary("^", swap, descending, span), y, x], x.type, span)
    return x


def alternate(c: Checker, x: ir.Value, axis: int, stage: int, last: int, descending: bool, span):
    """The direction of each run of 2^stage in a bitonic sort: alternating, until the last stage."""
    return axis_bit(c, x.type.shape, axis, stage, span) if stage < last else descending


@builtin("sort")
def _sort(c: Checker, span, x, dim=None, descending=False):
    numbers(x, "sort()", span)
    axis = axis_of(c, -1 if dim is None else dim, len(x.type.shape), "the sort dim", span)
    descending, n = flag(c, descending, "descending", span), x.type.shape[axis].bit_length() - 1
    for stage in range(1, n + 1):
        x = bitonic(c, x, axis, stage, alternate(c, x, axis, stage, n, descending, span), span)
    return x


@builtin("topk")
def _topk(c: Checker, span, x, k, dim=None):
    numbers(x, "topk()", span)
    axis = axis_of(c, -1 if dim is None else dim, len(x.type.shape), "the topk dim", span)
    k, size = c.constexpr(k, "k", span), x.type.shape[axis]
    if type(k) is not int or not is_pow2(k) or k > size:
        raise NkError(f"k must be a power of two of at most {size} (the size of dim {axis}), got {describe(k)}", span)
    n, lk = size.bit_length() - 1, k.bit_length() - 1
    for stage in range(1, lk + 1):  # sorted runs of k, alternately ascending and descending
        x = bitonic(c, x, axis, stage, alternate(c, x, axis, stage, n, True, span), span)
    for last in range(lk + 1, n + 1):  # the larger of two neighbouring runs, elementwise, holds their top k
        y = exchange(c, x, axis, k, span)
        x = c.emit("where", [greater(c, y, x, span), y, x], x.type, span)
        shape = x.type.shape
        x = _reshape(c, span, x, shape[:axis] + (shape[axis] // (2 * k), 2, k) + shape[axis + 1:])
        x = _reduce(c, span, x, axis + 1, _name="max")  # both runs hold it now: keep one
        x = _reshape(c, span, x, shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:])
        x = bitonic(c, x, axis, lk, axis_bit(c, x.type.shape, axis, lk, span) if last < n else True, span)
    return x


@builtin("flip")
def _flip(c: Checker, span, x, dim=None):
    numbers(x, "flip()", span)
    axis = axis_of(c, -1 if dim is None else dim, len(x.type.shape), "the flip dim", span)
    return exchange(c, x, axis, x.type.shape[axis] - 1, span)


@builtin("gather")
def _gather(c: Checker, span, src, index, axis):
    numbers(src, "gather()", span)
    rank = len(src.type.shape)
    if not isinstance(index, ir.Value) or not index.type.dtype.is_int or len(index.type.shape) != rank:
        raise NkError(f"gather() takes an integer index block of rank {rank}, got {describe(index)}", span)
    axis = axis_of(c, axis, rank, "the gather axis", span)
    if any(a != b for d, (a, b) in enumerate(zip(src.type.shape, index.type.shape)) if d != axis):
        raise NkError(f"gather() index {index.type} and source {src.type} differ outside axis {axis}", span)
    return c.emit("gather", [src, index], Type(index.type.shape, src.type.dtype), span, {"axis": axis})


@builtin("histogram")
def _histogram(c: Checker, span, x, num_bins, mask=None):
    if not isinstance(x, ir.Value) or not x.type.shape or not x.type.dtype.is_int:
        raise NkError(f"histogram() counts a block of integers, got {describe(x)}", span)
    bins = c.constexpr(num_bins, "num_bins", span)
    if type(bins) is not int or not is_pow2(bins):
        raise NkError(f"num_bins must be a power of two, got {describe(bins)}", span)
    if mask is not None:
        mask = c.truth(c.value(mask, span, bool_), span)
        if broadcast_shapes(x.type.shape, mask.type.shape, span) != x.type.shape:
            raise NkError(f"the mask {mask.type} does not broadcast to {x.type}", span)
        mask = c.to_shape(mask, x.type.shape, span)
    return c.emit("histogram", [x, mask], Type((bins,), i32), span)


@builtin("join")
def _join(c: Checker, span, a, b):
    a, b = c.unify([a, b], span)
    if isinstance(a.type.dtype, Ptr):
        raise NkError("join() takes numbers, not pointers", span)
    if not a.type.shape:  # two scalars: a block of 2
        pair = _join(c, span, c.to_shape(a, (1,), span), c.to_shape(b, (1,), span))
        return _reshape(c, span, pair, [2])
    return c.emit("join", [a, b], Type(a.type.shape + (2,), a.type.dtype), span)


@builtin("split")
def _split(c: Checker, span, x):
    numbers(x, "split()", span)
    if x.type.shape[-1] != 2:
        raise NkError(f"split() takes a block whose last dim is 2, got {x.type}", span, "join(a, b) makes one")
    if len(x.type.shape) == 1:  # two scalars: each the one element of a half
        return tuple(_reduce(c, span, h, 0, _name="max") for h in _split(c, span, _reshape(c, span, x, [1, 2])))
    op = ir.Op("split", [x], [ir.Value(Type(x.type.shape[:-1], x.type.dtype)) for _ in range(2)], {}, span)
    c.region.ops.append(op)
    return tuple(op.results)


@builtin("cat")
def _cat(c: Checker, span, a, b, can_reorder=False, dim=0):
    flag(c, can_reorder, "can_reorder", span)  # accepted for Triton's sake: the order is always kept
    numbers(a, "cat()", span)
    numbers(b, "cat()", span)
    if a.type.shape != b.type.shape:
        raise NkError(f"cat() takes two blocks of one shape, got {a.type} and {b.type}", span)
    rank = len(a.type.shape)
    axis = axis_of(c, dim, rank, "the cat dim", span)
    pairs = _trans(c, span, _join(c, span, a, b), *range(axis), rank, *range(axis, rank))  # the new 2 before dim
    shape = a.type.shape
    return _reshape(c, span, pairs, [*shape[:axis], 2 * shape[axis], *shape[axis + 1:]])


@builtin("zeros_like")
def _zeros_like(c: Checker, span, x):
    return _full_like(c, span, x, 0)


@builtin("full_like")
def _full_like(c: Checker, span, x, value, dtype=None):
    if not isinstance(x, ir.Value) or isinstance(x.type.dtype, Ptr):
        raise NkError(f"expected a block or a scalar of numbers, got {describe(x)}", span)
    return _full(c, span, list(x.type.shape), value, x.type.dtype if dtype is None else dtype)
