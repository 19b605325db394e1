"""Tile programs run by torch: the host statements of every call, and the eager oracle.

One evaluator serves both. Host statements (allocations, sizes, `return`) always run here. A `for` over
`tiles(...)` outside any other tile loop is a launch grid: the compiled path hands it to `hook` (lowering
and launch); without a hook its body runs here with every tile a whole slice and every `grid(n)` index a
Python loop. That is the eager oracle the autotuner checks candidates against, and what users debug with.
"""
from __future__ import annotations

import itertools
import math
import operator
from typing import NamedTuple

import torch

from newtc import ast as A
from newtc.check import fold, is_constexpr_annot
from newtc.errors import NkError
from newtc.types import DTYPES, DType

TORCH = {"bool": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
         "u8": torch.uint8, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
DTYPE_OF = {t: DTYPES[n] for n, t in TORCH.items()}
CONSTANTS = {"inf": math.inf, "nan": math.nan, **DTYPES}
MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "floor", "ceil", "abs"}
REDUCTIONS = {"sum", "max", "min", "argmax", "argmin"}
ATOMICS = {"atomic_add": torch.add, "atomic_max": torch.maximum, "atomic_min": torch.minimum}
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "<<": operator.lshift,
       ">>": operator.rshift, "&": operator.and_, "|": operator.or_, "^": operator.xor, "<": operator.lt,
       "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


class Tile(NamedTuple):
    """A tile in the eager oracle: the whole range [begin, end)."""
    begin: int
    end: int
    device: torch.device

    @property
    def size(self) -> int:
        return self.end - self.begin

    @property
    def index(self) -> torch.Tensor:
        return torch.arange(self.begin, self.end, dtype=torch.int32, device=self.device)


class Grid(NamedTuple):
    """`grid(n)` inside `tiles(...)`: a scalar index per program instead of a tile."""
    n: int


class _Return(Exception):
    def __init__(self, value):
        self.value = value


def is_tiles(s) -> bool:
    return isinstance(s, A.For) and isinstance(s.iter, A.Call) and isinstance(s.iter.func, A.Name) \
        and s.iter.func.id == "tiles"


def is_tunable(p: A.Param) -> bool:
    return isinstance(p.annotation, A.Name) and p.annotation.id == "tunable"


def literal(e):
    """A literal (a number, a negated number, True/False/None) in a position that must be one."""
    if isinstance(e, (A.Num, A.Const)):
        return e.value
    if isinstance(e, A.UnaryOp) and e.op == "-" and isinstance(e.operand, A.Num):
        return -e.operand.value
    raise NkError("expected a literal here", e.span)


class Interp:
    """Evaluates a tile program. `config` gives the tunables; `poison` fills `empty` outputs with NaN (or -1)."""

    def __init__(self, defs: dict, device, hook=None, config=None, poison=False):
        self.defs, self.device, self.hook = defs, device, hook
        self.config, self.poison = config or {}, poison
        self.depth = 0  # enclosing tile loops

    def call(self, d: A.FuncDef, args, kwargs):
        env = self.bind(d, args, kwargs)
        depth, self.depth = self.depth, 0  # a helper returns wherever it is called
        try:
            self.block(d.body, env)
        except _Return as r:
            return r.value
        finally:
            self.depth = depth
        return None

    def bind(self, d: A.FuncDef, args, kwargs) -> dict:
        params = [p for p in d.params if not is_tunable(p)]
        if len(args) > len(params) or set(kwargs) - {p.name for p in params}:
            raise NkError(f"{d.name}() takes the arguments ({', '.join(p.name for p in params)})", d.span)
        env = dict(zip((p.name for p in params), args), **kwargs)
        for p in d.params:
            if is_tunable(p):  # a config value; the eager oracle and the default config take the first choice
                choices = self.expr(p.default, {}) if p.default else None
                if not isinstance(choices, list) or not choices:
                    raise NkError(f"tunable '{p.name}' needs a list of choices, e.g. {p.name}: tunable = [1, 2]", p.span)
                env[p.name] = self.config.get(p.name, choices[0])
            elif p.name not in env:
                if p.default is None:
                    raise NkError(f"{d.name}() is missing argument '{p.name}'", d.span)
                env[p.name] = self.expr(p.default, env)
            elif is_constexpr_annot(p.annotation) and isinstance(env[p.name], torch.Tensor):
                raise NkError(f"'{p.name}' is a constexpr: pass a number, bool, string or dtype", p.span)
        return env

    # ---- statements ----------------------------------------------------------------------------
    def block(self, stmts, env):
        for s in stmts:
            getattr(self, "s_" + type(s).__name__)(s, env)

    def s_Pass(self, s, env):
        pass

    def s_ExprStmt(self, s, env):
        self.expr(s.value, env)

    def s_Return(self, s, env):
        if self.depth:
            raise NkError("`return` belongs to the host code, outside the tile loops", s.span)
        raise _Return(self.expr(s.value, env) if s.value is not None else None)

    def s_Assign(self, s, env):
        value = self.expr(s.value, env)
        if len(s.targets) > 1:
            if not isinstance(value, (tuple, list)) or len(value) != len(s.targets):
                raise NkError(f"cannot unpack into {len(s.targets)} names", s.span)
            for t, v in zip(s.targets, value):
                self.assign(t, v, env)
        else:
            self.assign(s.targets[0], value, env)

    def s_AugAssign(self, s, env):
        self.assign(s.target, self.binop(s.op, self.expr(s.target, env), self.expr(s.value, env), s.span), env)

    def assign(self, t, v, env):
        if isinstance(t, A.Name):
            env[t.id] = v
        else:
            tensor, index = self.place(t, env)
            tensor[index] = v

    def s_If(self, s, env):
        cond = self.expr(s.cond, env)
        self.block(s.body if bool(cond) else s.orelse, env)

    def s_For(self, s, env):
        name = s.iter.func.id if isinstance(s.iter, A.Call) and isinstance(s.iter.func, A.Name) else None
        names = [t.id for t in (s.target.items if isinstance(s.target, A.TupleExpr) else [s.target])]
        if name == "tiles" and self.depth == 0 and self.hook is not None:
            return self.hook(s, env)
        if name not in ("tiles", "range", "static_range"):
            raise NkError("a loop iterates over tiles(...), range(...) or static_range(...)", s.iter.span)
        args = [self.expr(a, env) for a in s.iter.args]
        if name != "tiles":
            ranges = [range(*map(int, args))]
        elif len(args) != len(names):
            raise NkError(f"{len(names)} names for {len(args)} tile dimensions", s.span)
        else:
            ranges = [range(a.n) if isinstance(a, Grid) else [Tile(0, int(a), self.device)] for a in args]
        self.depth += name == "tiles"
        try:
            for values in itertools.product(*ranges):
                env.update(zip(names, values))
                self.block(s.body, env)
        finally:
            self.depth -= name == "tiles"

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e, env):
        return getattr(self, "e_" + type(e).__name__)(e, env)

    def e_Num(self, e, env):
        return e.value

    e_Const = e_Str = e_Num

    def e_TupleExpr(self, e, env):
        return tuple(self.expr(x, env) for x in e.items)

    def e_ListExpr(self, e, env):
        return [self.expr(x, env) for x in e.items]

    def e_Name(self, e, env):
        for scope in (env, CONSTANTS):
            if e.id in scope:
                return scope[e.id]
        if e.id in BUILTINS or e.id in ATOMICS or e.id in self.defs:
            return e.id
        raise NkError(f"unknown name '{e.id}'", e.span)

    def e_Attribute(self, e, env):
        v = self.expr(e.value, env)
        if isinstance(v, torch.Tensor) and e.attr in ("shape", "dtype"):
            return tuple(v.shape) if e.attr == "shape" else DTYPE_OF[v.dtype]
        if isinstance(v, Tile) and e.attr in ("begin", "end", "size", "index"):
            return getattr(v, e.attr)
        raise NkError(f"no attribute '{e.attr}' here", e.span)

    def e_Subscript(self, e, env):
        v = self.expr(e.value, env)
        if isinstance(v, (tuple, list)):
            return v[self.expr(e.index[0], env)]
        tensor, index = self.place(e, env)
        return tensor[index].clone()  # a load copies: a later store to the same tensor must not change it

    def place(self, e: A.Subscript, env):
        """The tensor and torch index of `x[tm, :, i]`: tiles are slices, `None` a new axis."""
        tensor = self.expr(e.value, env)
        if not isinstance(tensor, torch.Tensor):
            raise NkError("only tensors take tile subscripts", e.span)
        index = []
        for item in e.index:
            if isinstance(item, A.Slice):
                index.append(slice(*(self.expr(x, env) if x is not None else None
                                     for x in (item.lower, item.upper, item.step))))
            else:
                v = self.expr(item, env)
                index.append(slice(v.begin, v.end) if isinstance(v, Tile) else v)
        return tensor, tuple(index)

    def e_UnaryOp(self, e, env):
        v = self.expr(e.operand, env)
        if e.op == "not":
            return torch.logical_not(v) if isinstance(v, torch.Tensor) else not v
        if e.op == "~" and isinstance(v, torch.Tensor) and v.dtype == torch.bool:
            return torch.logical_not(v)
        return {"-": operator.neg, "+": operator.pos, "~": operator.invert}[e.op](v)

    def e_BinOp(self, e, env):
        a = self.expr(e.left, env)
        if e.op in ("and", "or") and not isinstance(a, torch.Tensor):  # short-circuit, as in kernels
            return a if (e.op == "and") != bool(a) else self.expr(e.right, env)
        return self.binop(e.op, a, self.expr(e.right, env), e.span)

    def binop(self, op, a, b, span):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            return fold(op, a, b)  # host numbers: the language's own semantics (C division)
        if op == "@":
            return _dot(self, a, b)
        if op in ("and", "or"):
            return (torch.logical_and if op == "and" else torch.logical_or)(torch.as_tensor(a), torch.as_tensor(b))
        floating = any(isinstance(x, float) or (isinstance(x, torch.Tensor) and x.is_floating_point()) for x in (a, b))
        if op == "//":
            return torch.div(a, b, rounding_mode="floor" if floating else "trunc")
        if op == "%":
            return torch.fmod(torch.as_tensor(a), b)  # C's % and fmod: the sign of the dividend
        return OPS[op](a, b)

    def e_Call(self, e, env):
        if isinstance(e.func, A.Attribute) and e.func.attr == "to":
            v, dt = self.expr(e.func.value, env), self.expr(e.args[0], env)
            return torch.as_tensor(v, device=self.device).to(TORCH[dt.name])
        f = self.expr(e.func, env)
        if f in ATOMICS:  # the first argument is a place, not a value
            tensor, index = self.place(e.args[0], env)
            tensor[index] = ATOMICS[f](tensor[index], self.expr(e.args[1], env))
            return None
        args = [self.expr(a, env) for a in e.args]
        kwargs = {k: self.expr(v, env) for k, v in e.kwargs}
        if f in self.defs:  # a helper
            return self.call(self.defs[f], args, kwargs)
        if f == "tiles":
            raise NkError("tiles() only appears in the header of a tile loop", e.span)
        try:
            return BUILTINS[f](self, *args, **kwargs)
        except TypeError as err:
            raise NkError(f"{f}(): {err}", e.span) from None

    def shape(self, shape) -> list:
        return [s.size if isinstance(s, Tile) else int(s) for s in ([shape] if isinstance(shape, (int, Tile)) else shape)]


def _math(name):
    fn = getattr(torch, name)

    def run(it, x):
        if isinstance(x, torch.Tensor):
            return fn(x if x.is_floating_point() else x.float())
        return float(fn(torch.tensor(float(x), dtype=torch.float64)))  # host math on numbers stays a number
    return run


def _reduce(name):
    def run(it, x, axis=None, keep_dims=False):
        if name == "sum" and x.dtype == torch.bool:
            x = x.int()
        dims = tuple(range(x.dim())) if axis is None else axis
        if name == "sum":
            r = x.sum(dims, keepdim=keep_dims)
        elif name in ("max", "min"):
            r = (x.amax if name == "max" else x.amin)(dims, keepdim=keep_dims)
        else:
            r = getattr(x.flatten() if axis is None else x, name)(*(() if axis is None else (axis,)),
                                                                 keepdim=keep_dims and axis is not None).int()
        return r.reshape((1,) * x.dim()) if keep_dims and axis is None else r
    return run


def _dot(it, a, b, acc=None):
    """`a @ b` in f32 (f64 for f64 inputs), or acc's dtype, as newt's dot."""
    wide = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    out = torch.matmul(a.to(wide), b.to(wide))
    return out if acc is None else (acc + out).to(acc.dtype)


def _empty(it, shape, dtype=DTYPES["f32"]):
    t = torch.empty(it.shape(shape), dtype=TORCH[dtype.name], device=it.device)
    if it.poison:  # the autotuner checks that every element is written
        t.fill_(float("nan") if t.is_floating_point() else -1)
    return t


def _full(it, shape, value, dtype=DTYPES["f32"]):
    return torch.full(it.shape(shape), value, dtype=TORCH[dtype.name], device=it.device)


def _tensor(it, x):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, device=it.device)


def _print(it, *values):
    print(*values)


def _static_assert(it, cond, msg=""):
    if not cond:
        raise NkError(f"static_assert failed{': ' + msg if msg else ''}")


BUILTINS = {
    **{n: _math(n) for n in MATH}, **{n: _reduce(n) for n in REDUCTIONS}, "dot": _dot, "full": _full,
    "zeros": lambda it, shape, dtype=DTYPES["f32"]: _full(it, shape, 0, dtype),
    "empty": _empty, "empty_like": lambda it, x: _empty(it, x.shape, DTYPE_OF[x.dtype]),
    "minimum": lambda it, a, b: torch.fmin(_tensor(it, a), _tensor(it, b)),
    "maximum": lambda it, a, b: torch.fmax(_tensor(it, a), _tensor(it, b)),
    "where": lambda it, c, a, b: torch.where(_tensor(it, c), a, b),
    "cdiv": lambda it, a, b: it.binop("//", it.binop("+", a, b - 1, None), b, None),
    "fma": lambda it, a, b, c: a * b + c,
    "trans": lambda it, x, *dims: x.permute(*(dims or reversed(range(x.dim())))),
    "reshape": lambda it, x, shape: x.reshape(it.shape(shape)),
    "broadcast_to": lambda it, x, shape: x.broadcast_to(it.shape(shape)),
    "grid": lambda it, n: Grid(int(n)),
    "tiles": None, "print": _print, "static_assert": _static_assert,
}
