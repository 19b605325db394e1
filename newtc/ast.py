"""AST dataclasses for `.nk` source; every node carries the span it came from.

syntax.py builds these from the lark parse tree; check.py consumes them.
"""
from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass

from .errors import Span


# ---- expressions -----------------------------------------------------------------------------
@dataclass
class Name:
    id: str
    span: Span


@dataclass
class Num:
    value: int | float
    span: Span


@dataclass
class Const:
    value: bool | None  # True, False, None
    span: Span


@dataclass
class Str:
    value: str
    span: Span


@dataclass
class BinOp:
    op: str  # + - * / // % << >> & | ^ @ < <= > >= == != and or
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass
class UnaryOp:
    op: str  # - + ~ not
    operand: "Expr"
    span: Span


@dataclass
class Call:
    func: "Expr"
    args: list["Expr"]
    kwargs: list[tuple[str, "Expr"]]
    span: Span


@dataclass
class Attribute:
    value: "Expr"
    attr: str
    span: Span


@dataclass
class Slice:
    lower: "Expr | None"
    upper: "Expr | None"
    step: "Expr | None"
    span: Span


@dataclass
class Subscript:
    value: "Expr"
    index: list["Expr"]  # each an Expr, a Slice, or Const(None) for a new axis
    span: Span


@dataclass
class TupleExpr:
    items: list["Expr"]
    span: Span


@dataclass
class ListExpr:
    items: list["Expr"]
    span: Span


Expr = Name | Num | Const | Str | BinOp | UnaryOp | Call | Attribute | Slice | Subscript | TupleExpr | ListExpr


# ---- statements ------------------------------------------------------------------------------
@dataclass
class Assign:
    targets: list[Expr]  # one target, or several for `a, b = ...` (a TupleExpr is flattened here)
    value: Expr
    span: Span
    annotation: Expr | None = None  # `B: constexpr = 16`


@dataclass
class AugAssign:
    target: Expr
    op: str  # the binary operator without '=' ("+", "//", ...)
    value: Expr
    span: Span


@dataclass
class ExprStmt:
    value: Expr
    span: Span


@dataclass
class For:
    target: Expr  # Name, or TupleExpr of Names
    iter: Expr
    body: list["Stmt"]
    span: Span


@dataclass
class While:
    cond: Expr
    body: list["Stmt"]
    span: Span


@dataclass
class Break:
    span: Span


@dataclass
class Continue:
    span: Span


@dataclass
class If:
    cond: Expr
    body: list["Stmt"]
    orelse: list["Stmt"]  # `elif` is an If alone in orelse
    span: Span


@dataclass
class Return:
    value: Expr | None
    span: Span


@dataclass
class Pass:
    span: Span


Stmt = Assign | AugAssign | ExprStmt | For | While | Break | Continue | If | Return | Pass


# ---- definitions -----------------------------------------------------------------------------
@dataclass
class Param:
    name: str
    annotation: Expr | None  # Name('constexpr'), Name('i32'), UnaryOp('*', Name('f16')) for *f16, ...
    default: Expr | None
    span: Span


@dataclass
class FuncDef:
    kind: str  # 'kernel' | 'def' | 'tile'
    name: str
    params: list[Param]
    body: list[Stmt]
    span: Span


@dataclass
class Module:
    file: str
    source: str
    defs: list[FuncDef] = field(default_factory=list)


# ---- walking the AST --------------------------------------------------------------------------
def children(node):
    """The nodes right inside `node` (a keyword argument's value too)."""
    for f in fields(node):
        v = getattr(node, f.name)
        for x in v if isinstance(v, list) else [v]:
            x = x[1] if isinstance(x, tuple) else x  # a keyword argument (name, value)
            if is_dataclass(x) and not isinstance(x, Span):
                yield x


def walk(node):
    """`node` and every node inside it, outermost first."""
    yield node
    for c in children(node):
        yield from walk(c)


# ---- the AST as JSON (the disk cache stores it so; nothing in it executes on load) ---------------
NODES = {cls.__name__: cls for cls in (Name, Num, Const, Str, BinOp, UnaryOp, Call, Attribute, Slice, Subscript,
                                       TupleExpr, ListExpr, Assign, AugAssign, ExprStmt, For, While, Break, Continue,
                                       If, Return, Pass, Param, FuncDef)}


def to_json(module: Module) -> bytes:
    def enc(v):
        if isinstance(v, Span):
            return [v.line, v.col, v.end_line, v.end_col]
        if type(v) in NODES.values():
            return {"node": type(v).__name__, **{f.name: enc(getattr(v, f.name)) for f in fields(v)}}
        return [enc(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps([enc(d) for d in module.defs], separators=(",", ":")).encode()


def from_json(data: bytes, file: str, source: str) -> Module:
    """The module that to_json wrote; ValueError unless every node has exactly its fields, of their types."""
    def dec(v, hint):
        origin, args = PARTS[hint]
        if hint is Span:
            if not (isinstance(v, list) and len(v) == 4 and all(type(x) is int for x in v)):
                raise ValueError(f"bad span {v!r}")
            return Span(file, *v, source)
        if origin is list:
            if not isinstance(v, list):
                raise ValueError(f"expected a list, got {v!r}")
            return [dec(x, args[0]) for x in v]
        if origin is tuple:
            if not (isinstance(v, list) and len(v) == len(args)):
                raise ValueError(f"expected {len(args)} items, got {v!r}")
            return tuple(dec(x, a) for x, a in zip(v, args))
        if origin in (typing.Union, types.UnionType):
            if isinstance(v, dict):
                cls = NODES.get(v.get("node"))
                if cls not in args:
                    raise ValueError(f"a {v.get('node')!r} node where {hint} belongs")
                return dec(v, cls)
            if not any(type(v) is a for a in args):  # exact types: a JSON true is no int here
                raise ValueError(f"{v!r} is not {hint}")
            return v
        if hint in HINTS:
            if not (isinstance(v, dict) and v.get("node") == hint.__name__ and v.keys() == HINTS[hint].keys() | {"node"}):
                raise ValueError(f"expected a {hint.__name__} node, got {v!r}")
            return hint(**{name: dec(v[name], h) for name, h in HINTS[hint].items()})
        if type(v) is not hint:
            raise ValueError(f"{v!r} is not {hint}")
        return v

    try:
        defs = json.loads(data)
        return Module(file, source, dec(defs, list[FuncDef]))
    except (RecursionError, UnicodeDecodeError, TypeError) as e:  # nesting no parse would give; not text
        raise ValueError(str(e)) from None


HINTS = {cls: typing.get_type_hints(cls) for cls in NODES.values()}  # field name -> its type, per node class


def _parts(todo: list) -> dict:
    """(origin, args) of each type and of the types inside it: from_json asks typing once, not at every node."""
    out = {}
    while todo:
        hint = todo.pop()
        if hint not in out:
            out[hint] = typing.get_origin(hint), typing.get_args(hint)
            todo += out[hint][1]
    return out


PARTS = _parts([list[FuncDef], *(t for hints in HINTS.values() for t in hints.values())])
