"""AST dataclasses for `.nk` source; every node carries the span it came from.

syntax.py builds these from the lark parse tree; check.py consumes them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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


Stmt = Assign | AugAssign | ExprStmt | For | If | Return | Pass


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
