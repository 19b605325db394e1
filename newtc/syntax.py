""".nk text -> AST (newtc.ast) with a source span on every node.

The grammar is grammar/nk.lark; lark's LALR parser builds a parse tree and `_ToAst` turns it into
the AST dataclasses. Every syntax error becomes an NkError pointing at the offending token.
"""
from __future__ import annotations

import ast as pyast

import hashlib

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedToken, VisitError
from lark.indenter import DedentError, Indenter

from . import ast
from .errors import SOURCES, NkError, Span
from .cache import default_dir
from .paths import data_dir


def parse(text: str, filename: str = "<string>") -> ast.Module:
    """Parse one .nk file; raises NkError on a syntax error."""
    text = text.removeprefix("\ufeff")  # a byte-order mark some editors write is not code
    SOURCES[filename] = text
    parser = _parser()
    parser.options.postlex.file = filename
    try:
        # A final newline closes the last statement and any open blocks, whatever the file ends with.
        tree = parser.parse(text + "\n")
        return ast.Module(filename, text, _ToAst(filename).transform(tree))
    except UnexpectedToken as e:
        raise _unexpected_token(e, text, filename, parser) from None
    except UnexpectedCharacters as e:
        char = text[e.pos_in_stream]
        message = "unterminated string" if char in "'\"" else f"unexpected character {char!r}"
        raise NkError(message, Span(filename, e.line, e.column, e.line, e.column + 1)) from None
    except VisitError as e:  # an NkError raised while building the AST
        raise e.orig_exc from None


_PARSER: lark.Lark | None = None


def _parser() -> lark.Lark:
    global _PARSER
    if _PARSER is None:
        grammar = (data_dir("grammar") / "nk.lark").read_text()
        # lark's table cache makes a fresh process's first parse ~10x cheaper; named by grammar and lark version
        digest = hashlib.sha256(f"{lark.__version__}\n{grammar}".encode()).hexdigest()[:16]
        cache_file = default_dir() / f"grammar-{digest}.lark"
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            cache = str(cache_file)
        except OSError:
            cache = False
        _PARSER = lark.Lark(grammar, parser="lalr", postlex=_Indenter(), propagate_positions=True, cache=cache)
    return _PARSER


class _Indenter(Indenter):
    """Python's indentation rules, reporting bad indentation as NkError."""

    NL_type = "_NEWLINE"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8
    file = "<string>"

    def process(self, stream):
        self.style = ""  # the first indentation character seen: every indent must use only it
        self.brackets: list[lark.Token] = []  # open brackets, to point at an unclosed one on an error
        return super().process(self._track(stream))

    def _track(self, stream):
        for i, tok in enumerate(stream):
            if i == 0 and tok.column > 1 and tok.type != self.NL_type:  # no newline precedes line 1's indent
                raise NkError("unexpected indentation", Span(self.file, tok.line, tok.column, tok.line, tok.column + 1))
            if tok.type in self.OPEN_PAREN_types:
                self.brackets.append(tok)
            elif tok.type in self.CLOSE_PAREN_types and self.brackets:
                self.brackets.pop()
            yield tok

    def handle_NL(self, token):
        indent = token.rsplit("\n", 1)[1]
        span = Span(self.file, token.end_line, 1, token.end_line, token.end_column)
        if self.paren_level == 0 and indent:
            self.style = self.style or indent[0]
            if indent.strip(self.style):
                raise NkError("inconsistent use of tabs and spaces in indentation", span)
        try:
            yield from super().handle_NL(token)
        except DedentError:
            raise NkError("unindent does not match any outer indentation level", span) from None


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

    brackets = parser.options.postlex.brackets
    hint = ""
    if brackets and brackets[-1].line < line:
        hint = f"the '{brackets[-1]}' at {brackets[-1].line}:{brackets[-1].column} is still open here"
    return NkError(message, Span(filename, line, col, end_line, end_col), hint)


def _terminal_text(name: str, parser: lark.Lark) -> str:
    if name in _EXPECTED:
        return _EXPECTED[name]
    pattern = parser.get_terminal(name).pattern
    return f"'{pattern.value}'" if isinstance(pattern, lark.lexer.PatternStr) else name


# ---- parse tree -> AST -----------------------------------------------------------------------
def _until(meta, last: ast.Stmt) -> Span:
    """A block statement's span: from its keyword to the end of its last statement."""
    return Span(last.span.file, meta.line, meta.column, last.span.end_line, last.span.end_col)


@lark.v_args(meta=True)
class _ToAst(lark.Transformer):
    def __init__(self, filename: str):
        super().__init__()
        self.file = filename

    def _span(self, m) -> Span:
        return Span(self.file, m.line, m.column, m.end_line, m.end_column)

    def _tok_span(self, tok: lark.Token) -> Span:
        return Span(self.file, tok.line, tok.column, tok.end_line, tok.end_column)

    def _target(self, e: ast.Expr) -> ast.Expr:
        if not isinstance(e, (ast.Name, ast.Subscript)):
            raise NkError("cannot assign to this expression", e.span, "assign to a name or a subscript such as x[i, j]")
        return e

    # definitions
    def start(self, m, defs):
        return defs

    def funcdef(self, m, c):
        kind, name, *params, body = c
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
        return ast.Num(int(c[0], 0), self._span(m))

    def float(self, m, c):
        return ast.Num(float(c[0]), self._span(m))

    def string(self, m, c):
        return ast.Str(pyast.literal_eval(c[0]), self._span(m))

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
