"""Tile programs run by torch: the host code of every call, and the eager oracle.

Host statements (allocations, sizes, `return`) always run here. A `for` over `tiles(...)` outside any other
tile loop is a launch grid: the compiled path hands it to `hook` (lowering, launch); without a hook its body
runs here with each tile a whole slice and each `grid(n)` index a Python loop: the oracle.
"""
import itertools
import operator
from typing import NamedTuple

import torch

from newtc import ast as A
from newtc.check import BINOPS, CONSTANTS, MATH, REDUCTIONS, fold, is_constexpr_annot
from newtc.errors import NkError
from newtc.interpret import extremum, f2i
from newtc.types import DTYPES

TORCH = {"bool": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
         "u8": torch.uint8, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
         "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}
DTYPE_OF = {t: DTYPES[n] for n, t in TORCH.items()}
ATOMICS = {"atomic_add": torch.add, "atomic_max": torch.fmax, "atomic_min": torch.fmin}  # as maximum, minimum


Tile = NamedTuple("Tile", [("begin", int), ("end", int), ("size", int), ("index", torch.Tensor)])  # the oracle's: [0, size)


class _Return(Exception):
    """`return` in the host code or a helper: the value is args[0]."""


def require(ok, message: str, span) -> None:
    """An error in the tile program at `span`, unless `ok`."""
    if not ok:
        raise NkError(message, span)


def callee(e) -> str | None:
    """The name that a call `name(...)` calls; None for anything else."""
    return e.func.id if isinstance(e, A.Call) and isinstance(e.func, A.Name) else None


def header(s: A.For) -> tuple:
    """A loop's kind (tiles, range or static_range) and its names: one per dimension of tiles(...), else one."""
    kind = callee(s.iter)
    names = [t.id for t in (s.target.items if isinstance(s.target, A.TupleExpr) else [s.target])]
    require(kind in ("tiles", "range", "static_range") and len(names) == (len(s.iter.args) if kind == "tiles" else 1),
            "a loop goes over tiles(...) with a name per dimension, or over range(...)", s.iter.span)
    return kind, names


def device_of(args, kwargs) -> torch.device:
    """Where a call's tensors are (the CPU without any)."""
    return next((a.device for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)), torch.device("cpu"))


class Interp:
    """Evaluates a tile program: `config` holds tunable values; `poison` fills `empty` outputs with NaN (or -1);
    `depth` counts the tile loops around the statement running."""

    def __init__(self, defs: dict, device, hook=None, config=None, poison=False):
        self.defs, self.device, self.hook, self.config, self.poison, self.depth = defs, device, hook, config or {}, poison, 0

    def call(self, d: A.FuncDef, args, kwargs):
        env, depth, self.depth = self.bind(d, args, kwargs), self.depth, 0
        try:
            self.block(d.body, env)
        except _Return as r:
            return r.args[0]
        finally:
            self.depth = depth

    def tunables(self, d: A.FuncDef) -> dict:
        """Each tunable parameter's choices; the oracle and the default config take the first."""
        out = {}
        for p in (p for p in d.params if isinstance(p.annotation, A.Name) and p.annotation.id == "tunable"):
            out[p.name] = self.expr(p.default, {}) if p.default else None
            require(isinstance(out[p.name], list) and out[p.name],
                    f"tunable '{p.name}' needs a list of choices: {p.name}: tunable = [1, 2]", p.span)
        return out

    def bind(self, d: A.FuncDef, args, kwargs) -> dict:
        tunables = self.tunables(d)
        params = [p.name for p in d.params if p.name not in tunables]
        require(len(args) <= len(params) and set(kwargs) <= set(params),
                f"{d.name}() takes the arguments ({', '.join(params)})", d.span)
        env = {**dict(zip(params, args)), **kwargs, **{n: self.config.get(n, c[0]) for n, c in tunables.items()}}
        for p in d.params:
            if p.name not in env:
                require(p.default is not None, f"{d.name}() is missing argument '{p.name}'", d.span)
                env[p.name] = self.expr(p.default, env)
            require(not (is_constexpr_annot(p.annotation) and isinstance(env[p.name], torch.Tensor)),
                    f"'{p.name}' is a constexpr: pass a number, bool, string or dtype", p.span)
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
        require(not self.depth, "`return` belongs to the host code, after the tile loops", s.span)
        raise _Return(None if s.value is None else self.expr(s.value, env))

    def s_Assign(self, s, env):
        values = [self.expr(s.value, env)] if len(s.targets) == 1 else self.expr(s.value, env)  # several: unpacked
        require(isinstance(values, (list, tuple)) and len(values) == len(s.targets),
                f"cannot unpack into {len(s.targets)} names", s.span)
        for t, v in zip(s.targets, values):
            self.assign(t, v, env)

    def s_AugAssign(self, s, env):
        self.assign(s.target, self.binop(s.op, self.expr(s.target, env), self.expr(s.value, env)), env)

    def assign(self, t, v, env):
        if isinstance(t, A.Name):
            env[t.id] = v
        else:  # a store into a tensor's tile
            operator.setitem(*self.place(t, env), v)

    def s_If(self, s, env):
        self.block(s.body if bool(self.expr(s.cond, env)) else s.orelse, env)

    def s_For(self, s, env):
        kind, names = header(s)
        if kind == "tiles" and self.depth == 0 and self.hook is not None:
            return self.hook(s, env)
        args = [self.expr(a, env) for a in s.iter.args]
        ranges = [range(*map(int, args))] if kind != "tiles" else \
            [a if isinstance(a, range) else [Tile(0, int(a), int(a), torch.arange(int(a), device=self.device).int())]
             for a in args]  # grid(n) is a range: a scalar index per program instead of a tile
        self.depth += kind == "tiles"  # an error inside ends the call, which restores the depth
        for values in itertools.product(*ranges):
            env.update(zip(names, values))
            self.block(s.body, env)
        self.depth -= kind == "tiles"

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e, env):
        return getattr(self, "e_" + type(e).__name__)(e, env)

    def e_Num(self, e, env):
        return e.value

    e_Const = e_Str = e_Num

    def e_ListExpr(self, e, env):
        return (list if isinstance(e, A.ListExpr) else tuple)(self.expr(x, env) for x in e.items)

    e_TupleExpr = e_ListExpr

    def e_Name(self, e, env):
        if e.id in env:
            return env[e.id]
        require(any(e.id in names for names in (CONSTANTS, BUILTINS, ATOMICS, self.defs)), f"unknown name '{e.id}'", e.span)
        return CONSTANTS.get(e.id, e.id)  # a function is its name

    def e_Attribute(self, e, env):
        v = self.expr(e.value, env)
        if isinstance(v, torch.Tensor) and e.attr in ("shape", "dtype"):
            return tuple(v.shape) if e.attr == "shape" else DTYPE_OF[v.dtype]
        require(isinstance(v, Tile) and e.attr in Tile._fields, f"no attribute '{e.attr}' here", e.span)
        return getattr(v, e.attr)

    def e_Subscript(self, e, env):
        v = self.expr(e.value, env)
        if isinstance(v, (tuple, list)):
            return v[self.expr(e.index[0], env)]
        t, index = self.place(e, env)
        return t[index].clone()  # a load copies: a later store to the tensor must not change it

    def place(self, e: A.Subscript, env):
        """The tensor and torch index of `x[tm, :, i, None]`: a tile is its slice."""
        t = self.expr(e.value, env)
        require(isinstance(t, torch.Tensor), "only tensors take tile subscripts", e.span)
        return t, tuple(slice(v.begin, v.end) if isinstance(v, Tile) else v for v in (self.expr(i, env) for i in e.index))

    def e_Slice(self, e, env):
        return slice(*(None if x is None else self.expr(x, env) for x in (e.lower, e.upper, e.step)))

    def e_UnaryOp(self, e, env):
        return UNARY[e.op](self.expr(e.operand, env))

    def e_BinOp(self, e, env):
        a = self.expr(e.left, env)
        if e.op in ("and", "or") and not isinstance(a, torch.Tensor):  # short-circuit, as in kernels
            return a if (e.op == "and") != bool(a) else self.expr(e.right, env)
        return self.binop(e.op, a, self.expr(e.right, env))

    def binop(self, op, a, b):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            return fold(op, a, b)  # host numbers: the language's semantics (C division)
        return OPS[op](self.tensor(a), self.tensor(b))

    def e_Call(self, e, env):
        if isinstance(e.func, A.Attribute) and e.func.attr == "to":  # float -> int saturates, NaN -> 0, as the kernels
            x, dt = self.tensor(self.expr(e.func.value, env)), self.expr(e.args[0], env)
            return (f2i(x, dt) if x.is_floating_point() and dt.is_int else x).to(TORCH[dt.name])
        f = self.expr(e.func, env)
        if f in ATOMICS:  # the first argument is a place
            return self.assign(e.args[0], ATOMICS[f](self.expr(e.args[0], env), self.expr(e.args[1], env)), env)
        args, kwargs = [self.expr(a, env) for a in e.args], {k: self.expr(v, env) for k, v in e.kwargs}
        if f in self.defs:
            return self.call(self.defs[f], args, kwargs)
        require(f in BUILTINS, f"{f}() is not supported in tile programs" if isinstance(f, str) else "not callable", e.span)
        try:
            return BUILTINS[f](self, *args, **kwargs)
        except TypeError as err:
            raise NkError(f"{f}(): {err}", e.span) from None

    def tensor(self, x) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.tensor(x, device=self.device)

    def shape(self, shape) -> list:
        return [s.size if isinstance(s, Tile) else int(s) for s in (shape if isinstance(shape, (list, tuple)) else [shape])]


def _math(name):
    def run(it, x):
        if isinstance(x, torch.Tensor):
            return getattr(torch, name)(x if x.is_floating_point() else x.float())
        return float(getattr(torch, name)(torch.tensor(float(x), dtype=torch.float64)))  # host math stays a number
    return run


def _reduce(name):
    def run(it, x, axis=None, keep_dims=False):  # max and min NaN-ignoring, as the kernels (torch.amax keeps a NaN)
        return (x.int() if x.dtype == torch.bool else x).sum(dim=axis, keepdim=keep_dims) if name == "sum" else \
            extremum(name, x, axis, keep_dims).to(torch.int32 if name.startswith("arg") else x.dtype)
    return run


def _dot(it, a, b, acc=None):
    """In f32 (f64 for f64 inputs), or acc's dtype, as newt's dot."""
    wide = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    out = torch.matmul(a.to(wide), b.to(wide))
    return out if acc is None else (acc + out).to(acc.dtype)


def _empty(it, shape, dtype=DTYPES["f32"]):
    t = torch.empty(it.shape(shape), dtype=TORCH[dtype.name], device=it.device)
    return t.fill_(float("nan") if t.is_floating_point() else -1) if it.poison else t  # to see what is never written


def _full(it, shape, value, dtype=DTYPES["f32"]):
    return torch.full(it.shape(shape), value, dtype=TORCH[dtype.name], device=it.device)


def _static_assert(it, cond, msg=""):
    require(cond, f"static_assert failed{': ' + msg if msg else ''}", None)


# The oracle's operators on tensors: newt's binary operators by the operator module's names (a number as a 0-d tensor
# promotes as a scalar would); // floors floats and truncates ints, and % is fmod, as in C.
OPERATOR = {"div": "truediv", "shl": "lshift", "shr": "rshift", "and": "and_", "or": "or_"}  # where they differ from newt's
OPS = {**{op: getattr(operator, OPERATOR.get(name, name)) for op, name in BINOPS.items()},
       "//": lambda a, b: torch.div(a, b, rounding_mode="floor" if a.is_floating_point() or b.is_floating_point() else "trunc"),
       "%": torch.fmod, "@": lambda a, b: _dot(None, a, b), "and": torch.logical_and, "or": torch.logical_or}
UNARY = {"-": operator.neg, "+": operator.pos, "~": operator.invert,
         "not": lambda v: torch.logical_not(v) if isinstance(v, torch.Tensor) else not v}
BUILTINS = {
    **{n: _math(n) for n in [*MATH, "abs"]}, **{n: _reduce(n) for n in REDUCTIONS},
    "dot": _dot, "empty": _empty, "full": _full, "static_assert": _static_assert, "print": lambda it, *v: print(*v),
    "zeros": lambda it, shape, dtype=DTYPES["f32"]: _full(it, shape, 0, dtype),
    "empty_like": lambda it, x: _empty(it, x.shape, DTYPE_OF[x.dtype]),
    "minimum": lambda it, a, b: torch.fmin(it.tensor(a), it.tensor(b)),
    "maximum": lambda it, a, b: torch.fmax(it.tensor(a), it.tensor(b)),
    "where": lambda it, c, a, b: torch.where(it.tensor(c), a, b),
    "cdiv": lambda it, a, b: it.binop("//", it.binop("+", a, b - 1), b),
    "fma": lambda it, a, b, c: a * b + c, "grid": lambda it, n: range(int(n)),
    "trans": lambda it, x, *dims: x.permute(*(dims or reversed(range(x.dim())))),
}
