""".nk text -> AST (newtc.ast) with a source span on every node.

The grammar is grammar/nk.lark; lark's LALR parser builds a parse tree and `_ToAst` turns it into
the AST dataclasses. Every syntax error becomes an NkError pointing at the offending token.
Parsing is re-entrant: the one lark parser holds no per-parse state, so threads may parse at once.
"""
from __future__ import annotations

import ast as pyast
import functools
import hashlib
import warnings
from pathlib import Path

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedToken, VisitError
from lark.indenter import DedentError, Indenter

from . import ast, cache
from .errors import NkError, Span
from .paths import data_dir

MAX_DEPTH = 200  # levels of nesting in a definition (statements and expressions); deeper is an error
MAX_INT = 2**64  # integer literals stay below: the widest dtype is 64 bits


def decode(data: bytes, filename: str) -> str:
    """A source file's bytes as text: UTF-8, or an error at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = len(data[data.rfind(b"\n", 0, e.start) + 1:e.start].decode("utf-8", "replace")) + 1
        raise NkError(f"{filename} is not UTF-8 text: byte 0x{data[e.start]:02x} cannot start a character",
                      Span(filename, line, col, line, col + 1, data.decode("utf-8", "replace")),
                      "save the file as UTF-8") from None


def parse(text: str, filename: str = "<string>") -> ast.Module:
    """Parse one .nk file; raises NkError on a syntax error."""
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write is not code
    parser = _parser()
    try:
        # A final newline closes the last statement and any open blocks, whatever the file ends with.
        tree = parser.parse(text + "\n")
        _check_depth(tree, filename, text)
        return ast.Module(filename, text, _ToAst(filename, text).transform(tree))
    except UnexpectedToken as e:
        raise _unexpected_token(e, text, filename, parser) from None
    except UnexpectedCharacters as e:
        char = text[e.pos_in_stream]
        message = "unterminated string" if char in "'\"" else f"unexpected character {char!r}"
        raise NkError(message, Span(filename, e.line, e.column, e.line, e.column + 1, text)) from None
    except _BadIndent as e:
        raise NkError(e.message, Span(filename, *e.where, text)) from None
    except VisitError as e:  # an NkError raised while building the AST
        raise e.orig_exc from None


@functools.cache
def _format() -> str:
    """What the AST of a text depends on besides the text: the grammar, lark, and the code that builds it."""
    here = Path(__file__).resolve().parent
    files = [data_dir("grammar") / "nk.lark", here / "syntax.py", here / "ast.py", here / "errors.py"]
    return hashlib.sha256(lark.__version__.encode() + b"".join(f.read_bytes() for f in files)).hexdigest()


def parse_cached(text: str, filename: str) -> ast.Module:
    """parse(), or the AST stored in the disk cache as JSON: a warm process never builds the grammar's tables.
    An entry that does not decode to a well-formed AST is a miss."""
    key = cache.key(_format(), "ast", filename, text)
    disk = cache.shared()
    data = disk.get(key)
    if data is not None:
        try:
            return ast.from_json(data, filename, text)
        except ValueError:
            pass  # not an AST of this format: parse again, and overwrite it
    module = parse(text, filename)
    disk.put(key, ast.to_json(module))
    return module


@functools.cache
def _parser() -> lark.Lark:
    """The one lark parser, built on first use (its tables take ~0.2 s), then only read."""
    grammar = (data_dir("grammar") / "nk.lark").read_text()
    return lark.Lark(grammar, parser="lalr", postlex=_PostLex(), propagate_positions=True)


class _BadIndent(Exception):
    """Raised by the postlexer, which does not know the file: parse() makes it an NkError."""

    def __init__(self, message: str, where: tuple):
        self.message, self.where = message, where  # (line, col, end_line, end_col)


class _PostLex(lark.lark.PostLex):
    """What lark holds: it makes a fresh _Indenter for each parse, so that parses share no state."""

    always_accept = ("_NEWLINE",)

    def process(self, stream):
        return _Indenter().process(stream)


class _Indenter(Indenter):
    """Python's indentation rules, for one parse."""

    NL_type = "_NEWLINE"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8
    style = ""  # the first indentation character seen: every indent must use only it

    def process(self, stream):
        return super().process(self._first(stream))

    def _first(self, stream):
        for i, tok in enumerate(stream):
            if i == 0 and tok.column > 1 and tok.type != self.NL_type:  # no newline precedes line 1's indent
                raise _BadIndent("unexpected indentation", (tok.line, tok.column, tok.line, tok.column + 1))
            yield tok

    def handle_NL(self, token):
        indent = token.rsplit("\n", 1)[1]
        where = (token.end_line, 1, token.end_line, token.end_column)
        if self.paren_level == 0 and indent:
            self.style = self.style or indent[0]
            if indent.strip(self.style):
                raise _BadIndent("inconsistent use of tabs and spaces in indentation", where)
        try:
            yield from super().handle_NL(token)
        except DedentError:
            raise _BadIndent("unindent does not match any outer indentation level", where) from None


def _check_depth(tree: lark.Tree, filename: str, text: str) -> None:
    """Every later stage recurses over the nesting, so a limit here keeps them all within Python's stack."""
    stack = [(tree, 1, tree.meta)]
    while stack:
        t, depth, m = stack.pop()
        m = m if t.meta.empty else t.meta  # the nearest node that has a position
        if depth > MAX_DEPTH:
            raise NkError(f"nested too deeply: more than {MAX_DEPTH} levels of statements and expressions",
                          Span(filename, m.line, m.column, m.end_line, m.end_column, text),
                          "split the expression with intermediate names")
        stack.extend((c, depth + 1, m) for c in t.children if isinstance(c, lark.Tree))


# ---- syntax errors ---------------------------------------------------------------------------
_EXPR_START = {"NAME", "INT", "FLOAT", "STRING", "LPAR", "LSQB", "MINUS", "PLUS", "TILDE", "NOT", "TRUE", "FALSE", "NONE"}
# Operators that could continue a complete expression; listing them all in an error is noise.
_CONTINUATIONS = set("+ - * / // % @ << >> & | ^ < <= > >= == != and or . ( [".split())
_CONTINUATIONS |= {op + "=" for op in "+ - * / // % & | ^ << >>".split()}
_EXPECTED = {"_NEWLINE": "end of line", "_INDENT": "an indented block", "_DEDENT": "end of block"}
_FOUND = {"_NEWLINE": "end of line", "_INDENT": "indentation", "_DEDENT": "end of block",
          "NAME": "name '{}'", "INT": "number {}", "FLOAT": "number {}", "STRING": "string {}"}


def _unexpected_token(e: UnexpectedToken, text: str, filename: str, parser: lark.Lark) -> NkError:
    tok = e.token
    # e.expected can be a merged LALR lookahead set; replaying each terminal gives the true one.
    expected = e.interactive_parser.accepts()
    at_end = tok.type == "$END" or tok.start_pos >= len(text.rstrip())
    if tok.type == "_INDENT":
        message = "unexpected indentation"
    else:
        if "KERNEL" in expected:  # at the top level, blank lines and end of input are also fine but unhelpful
            expected = {"KERNEL", "DEF", "TILE"}
        elif "OR" in expected:  # after a complete expression: operators that would continue it are noise
            expected = {name for name in expected if _terminal_text(name, parser).strip("'") not in _CONTINUATIONS}
        words = {_terminal_text(name, parser) for name in expected - _EXPR_START}
        if len(expected & _EXPR_START) > 2:
            words.add("an expression")
        elif "NAME" in expected:
            words.add("a name")
        found = "end of input" if at_end else _FOUND.get(tok.type, "'{}'").format(tok)
        ordered = sorted(words, key=lambda w: (w != "an expression", w))
        wanted = ", ".join(ordered[:-1]) + " or " + ordered[-1] if len(ordered) > 1 else "".join(ordered)
        message = f"unexpected {found}" + (f"; expected {wanted}" if wanted else "")

    if at_end:  # point just after the code on the last non-blank line
        lines = text.rstrip().splitlines() or [""]
        line, col, end_line, end_col = len(lines), len(lines[-1]) + 1, len(lines), len(lines[-1]) + 2
    elif tok.type in ("_INDENT", "_DEDENT"):  # these borrow the preceding newline's position
        line, col, end_line, end_col = tok.end_line, tok.end_column, tok.end_line, tok.end_column + 1
    elif tok.type == "_NEWLINE":
        line, col, end_line, end_col = tok.line, tok.column, tok.line, tok.column + 1
    else:
        line, col, end_line, end_col = tok.line, tok.column, tok.end_line, tok.end_column

    brackets = _open_brackets(e.interactive_parser.parser_state.value_stack)
    hint = ""
    if brackets and brackets[-1].line < line:
        hint = f"the '{brackets[-1]}' at {brackets[-1].line}:{brackets[-1].column} is still open here"
    return NkError(message, Span(filename, line, col, end_line, end_col, text), hint)


def _open_brackets(stack: list) -> list:
    """The brackets still open where the parser stopped. A closed pair always belongs to one rule, so
    the parser's stack holds a bracket token until its rule is reduced: replay those tokens."""
    open_ = []
    for tok in stack:
        if isinstance(tok, lark.Token) and tok.type in _Indenter.OPEN_PAREN_types:
            open_.append(tok)
        elif isinstance(tok, lark.Token) and tok.type in _Indenter.CLOSE_PAREN_types and open_:
            open_.pop()
    return open_


def _terminal_text(name: str, parser: lark.Lark) -> str:
    if name in _EXPECTED:
        return _EXPECTED[name]
    pattern = parser.get_terminal(name).pattern
    return f"'{pattern.value}'" if isinstance(pattern, lark.lexer.PatternStr) else name


# ---- parse tree -> AST -----------------------------------------------------------------------
def _until(meta, last: ast.Stmt) -> Span:
    """A block statement's span: from its keyword to the end of its last statement."""
    return Span(last.span.file, meta.line, meta.column, last.span.end_line, last.span.end_col, last.span.source)


@lark.v_args(meta=True)
class _ToAst(lark.Transformer):
    def __init__(self, filename: str, text: str):
        super().__init__()
        self.file, self.text = filename, text

    def _span(self, m) -> Span:
        return Span(self.file, m.line, m.column, m.end_line, m.end_column, self.text)

    def _tok_span(self, tok: lark.Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column, self.text)

    def _target(self, e: ast.Expr) -> ast.Expr:
        if not isinstance(e, (ast.Name, ast.Subscript)):
            raise NkError("cannot assign to this expression", e.span, "assign to a name or a subscript such as x[i, j]")
        return e

    # definitions
    def start(self, m, defs):
        seen = {}
        for d in defs:
            if d.name in seen:
                raise NkError(f"'{d.name}' is defined twice", d.span,
                              f"the first definition is at line {seen[d.name].span.line}; rename one of them")
            seen[d.name] = d
        return defs

    def funcdef(self, m, c):
        kind, name, *params, body = c
        for i, p in enumerate(params):
            if any(q.name == p.name for q in params[:i]):
                raise NkError(f"duplicate parameter '{p.name}' in '{name}'", p.span)
        return ast.FuncDef(str(kind), str(name), params, body, _until(m, body[-1]))

    def param(self, m, c):
        name, annotation, default = c
        return ast.Param(str(name), annotation, default, self._span(m))

    def pointer(self, m, c):
        return ast.UnaryOp("*", ast.Name(str(c[0]), self._tok_span(c[0])), self._span(m))

    def suite(self, m, stmts):
        return stmts

    # statements
    def assign(self, m, c):
        *targets, value = c
        if len(targets) == 1 and isinstance(targets[0], ast.TupleExpr):
            targets = targets[0].items
        return ast.Assign([self._target(t) for t in targets], value, self._span(m))

    def annassign(self, m, c):
        name, annotation, value = c
        return ast.Assign([ast.Name(str(name), self._tok_span(name))], value, self._span(m), annotation)

    def augassign(self, m, c):
        target, op, value = c
        return ast.AugAssign(self._target(target), str(op)[:-1], value, self._span(m))

    def expr_stmt(self, m, c):
        return ast.ExprStmt(c[0], self._span(m))

    def return_stmt(self, m, c):
        value = ast.TupleExpr(c, self._span(m)) if len(c) > 1 else c[0]
        return ast.Return(value, self._span(m))

    def pass_stmt(self, m, c):
        return ast.Pass(self._span(m))

    def break_stmt(self, m, c):
        return ast.Break(self._span(m))

    def continue_stmt(self, m, c):
        return ast.Continue(self._span(m))

    def while_stmt(self, m, c):
        return ast.While(c[0], c[1], _until(m, c[1][-1]))

    def for_stmt(self, m, c):
        target, iter_, body = c
        return ast.For(target, iter_, body, _until(m, body[-1]))

    def for_target(self, m, names):
        items = [ast.Name(str(n), self._tok_span(n)) for n in names]
        return items[0] if len(items) == 1 else ast.TupleExpr(items, self._span(m))

    def if_stmt(self, m, c):
        cond, body, *elifs, orelse = c
        orelse = orelse or []
        for e_meta, e_cond, e_body in reversed(elifs):  # `elif` nests as an If alone in orelse
            orelse = [ast.If(e_cond, e_body, orelse, _until(e_meta, (orelse or e_body)[-1]))]
        return ast.If(cond, body, orelse, _until(m, (orelse or body)[-1]))

    def elif_clause(self, m, c):
        return (m, *c)

    # expressions
    def binop(self, m, c):
        return ast.BinOp(str(c[1]), c[0], c[2], self._span(m))

    def unary(self, m, c):
        return ast.UnaryOp(str(c[0]), c[1], self._span(m))

    def call(self, m, c):
        func, *items = c
        first_kw = next((i for i, a in enumerate(items) if isinstance(a, tuple)), len(items))
        args, kwargs = items[:first_kw], items[first_kw:]
        for a in kwargs:
            if not isinstance(a, tuple):
                raise NkError("positional argument follows keyword argument", a.span)
        return ast.Call(func, args, kwargs, self._span(m))

    def kwarg(self, m, c):
        return (str(c[0]), c[1])

    def attribute(self, m, c):
        return ast.Attribute(c[0], str(c[1]), self._span(m))

    def subscript(self, m, c):
        return ast.Subscript(c[0], c[1:], self._span(m))

    def slice(self, m, c):
        return ast.Slice(*c, self._span(m))

    def name(self, m, c):
        return ast.Name(str(c[0]), self._span(m))

    def int(self, m, c):
        digits = c[0].replace("_", "")
        value = int(digits, 0) if len(digits) <= 66 else MAX_INT  # 0b and 64 bits; longer is too big anyway
        if value >= MAX_INT:
            raise NkError("integer literal too large: the widest integer type has 64 bits", self._span(m),
                          f"integers are below 2**64 = {MAX_INT}")
        return ast.Num(value, self._span(m))

    def float(self, m, c):
        return ast.Num(float(c[0]), self._span(m))

    def string(self, m, c):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Python's warning for an unknown escape such as '\\d'
                return ast.Str(pyast.literal_eval(c[0]), self._span(m))
        except (SyntaxError, ValueError) as e:  # a bad escape such as '\\x4' or '\\N{nothing}'
            raise NkError(f"invalid string literal: {getattr(e, 'msg', e)}", self._span(m)) from None

    def true(self, m, c):
        return ast.Const(True, self._span(m))

    def false(self, m, c):
        return ast.Const(False, self._span(m))

    def none(self, m, c):
        return ast.Const(None, self._span(m))

    def tuple(self, m, items):
        return ast.TupleExpr(items, self._span(m))

    def list(self, m, items):
        return ast.ListExpr(items, self._span(m))
