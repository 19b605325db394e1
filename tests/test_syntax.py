"""grammar/nk.lark + newtc/syntax.py: .nk text -> AST with spans, and syntax errors as NkError."""
import pytest

from newtc import ast
from newtc.errors import NkError
from newtc.syntax import parse

DESIGN_EXAMPLE = '''\
# Row-wise softmax: one program per row.
kernel softmax(x, out, n_cols, stride, BLOCK: constexpr):
    row = program_id(0)
    cols = arange(0, BLOCK)
    mask = cols < n_cols
    v = load(x + row * stride + cols, mask=mask, other=-inf)
    v = v - max(v, axis=0)
    num = exp(v)
    store(out + row * stride + cols, num / sum(num, axis=0), mask=mask)

def gelu(v):                      # helper: inlined at each call site
    return 0.5 * v * (1.0 + erf(v * 0.7071067811865476))

tile matmul(x, y, out):
    for tm, tn in tiles(x.shape[0], y.shape[1]):
        acc = zeros([tm, tn], f32)
        for tk in tiles(x.shape[1]):
            acc += x[tm, tk] @ y[tk, tn]
        out[tm, tn] = acc.to(out.dtype)

kernel k(x: *f16, n: i32, B: constexpr = 128):
    for i in static_range(4):
        if i == 0:
            pass
        elif i == 1:
            static_assert(B > 0, "B must be positive")
        else:
            x = x
'''


def body(src: str) -> list:
    """The statements of `src` wrapped in a kernel, one indentation level deep."""
    text = "kernel f():\n" + "".join(f"    {line}\n" for line in src.splitlines())
    return parse(text, "t.nk").defs[0].body


def expr(src: str):
    return body(src)[0].value


def shape(e) -> str:
    """An expression as a fully parenthesized string, to check structure and precedence."""
    match e:
        case ast.Name(id=i):
            return i
        case ast.Num(value=v) | ast.Const(value=v) | ast.Str(value=v):
            return repr(v)
        case ast.BinOp(op=op, left=left, right=right):
            return f"({shape(left)} {op} {shape(right)})"
        case ast.UnaryOp(op=op, operand=x):
            return f"({op} {shape(x)})"
        case ast.Call(func=func, args=args, kwargs=kwargs):
            return f"{shape(func)}({', '.join([shape(a) for a in args] + [f'{k}={shape(v)}' for k, v in kwargs])})"
        case ast.Attribute(value=v, attr=a):
            return f"{shape(v)}.{a}"
        case ast.Subscript(value=v, index=index):
            return f"{shape(v)}[{', '.join(shape(i) for i in index)}]"
        case ast.Slice(lower=lo, upper=up, step=st):
            return ":".join("" if x is None else shape(x) for x in (lo, up, st))
        case ast.TupleExpr(items=items):
            return f"tuple({', '.join(shape(i) for i in items)})"
        case ast.ListExpr(items=items):
            return f"[{', '.join(shape(i) for i in items)}]"
    raise AssertionError(e)


def where(node) -> tuple:
    s = node.span
    return (s.line, s.col, s.end_line, s.end_col)


# ---- definitions -----------------------------------------------------------------------------
def test_design_example_parses():
    module = parse(DESIGN_EXAMPLE, "example.nk")
    assert [(d.kind, d.name) for d in module.defs] == [
        ("kernel", "softmax"), ("def", "gelu"), ("tile", "matmul"), ("kernel", "k")]
    assert module.file == "example.nk" and module.source == DESIGN_EXAMPLE
    assert module.defs[0].span.source is DESIGN_EXAMPLE  # every span can quote its file
    assert where(module.defs[0]) == (2, 1, 9, 72)
    assert where(module.defs[3]) == (21, 1, 28, 18)


def test_params_and_annotations():
    (k,) = parse("kernel k(x: *f16, n: i32, B: constexpr = 128, s = 2, t,):\n    pass\n").defs
    x, n, b, s, t = k.params
    assert (x.name, shape(x.annotation), x.default) == ("x", "(* f16)", None)
    assert isinstance(x.annotation, ast.UnaryOp) and x.annotation.operand.id == "f16"
    assert where(x) == (1, 10, 1, 17) and where(x.annotation) == (1, 13, 1, 17)
    assert where(x.annotation.operand) == (1, 14, 1, 17)
    assert (n.name, shape(n.annotation)) == ("n", "i32")
    assert (shape(b.annotation), shape(b.default)) == ("constexpr", "128")
    assert (s.annotation, shape(s.default)) == (None, "2")
    assert (t.name, t.annotation, t.default) == ("t", None, None)


def test_no_params_comments_and_blank_lines():
    src = "\n# leading comment\n\ndef h():   # trailing\n\n    # inside\n    pass\n\n\n# between\ntile t():\n    return\n"
    h, t = parse(src).defs
    assert (h.kind, h.params, where(h.body[0])) == ("def", [], (7, 5, 7, 9))
    assert t.kind == "tile" and isinstance(t.body[0], ast.Return) and t.body[0].value is None


def test_kernel_and_tile_are_names_inside_bodies():
    (a,) = body("tile = kernel + 1")
    assert (shape(a.targets[0]), shape(a.value)) == ("tile", "(kernel + 1)")


def test_empty_file_and_missing_final_newline():
    assert parse("").defs == [] and parse("# only a comment").defs == []
    assert isinstance(parse("kernel f():\n    pass").defs[0].body[0], ast.Pass)


def test_tabs_alone_are_fine():
    assert len(parse("kernel f():\n\tif x:\n\t\tpass\n\ty = 1\n").defs[0].body) == 2


# ---- statements ------------------------------------------------------------------------------
def test_assignments():
    a, b, c, d = body("a = 1\na, b = f(x)\nx[i, j] = e\n(p, q) = r")
    assert [shape(t) for t in a.targets] == ["a"] and shape(a.value) == "1"
    assert [shape(t) for t in b.targets] == ["a", "b"] and shape(b.value) == "f(x)"
    assert [shape(t) for t in c.targets] == ["x[i, j]"]
    assert [shape(t) for t in d.targets] == ["p", "q"]
    assert where(b) == (3, 5, 3, 16) and where(b.targets[1]) == (3, 8, 3, 9)


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "//", "%", "&", "|", "^", "<<", ">>"])
def test_augmented_assignment(op):
    (s,) = body(f"acc[i] {op}= x @ y")
    assert isinstance(s, ast.AugAssign)
    assert (shape(s.target), s.op, shape(s.value)) == ("acc[i]", op, "(x @ y)")


def test_expression_statement_return_pass():
    e, r, p = body("store(p, v, mask=m)\nreturn a + 1\npass")
    assert isinstance(e, ast.ExprStmt) and shape(e.value) == "store(p, v, mask=m)"
    assert isinstance(r, ast.Return) and shape(r.value) == "(a + 1)" and where(r) == (3, 5, 3, 17)
    assert isinstance(p, ast.Pass) and where(p) == (4, 5, 4, 9)


def test_for_loops():
    outer, single = body("for tm, tn in tiles(a, b):\n    for k in range(0, n, 2):\n        acc += 1\nfor i in r:\n    x = i")
    assert isinstance(outer.target, ast.TupleExpr) and [n.id for n in outer.target.items] == ["tm", "tn"]
    assert where(outer.target) == (2, 9, 2, 15) and shape(outer.iter) == "tiles(a, b)"
    inner = outer.body[0]
    assert isinstance(inner, ast.For) and shape(inner.iter) == "range(0, n, 2)"
    assert isinstance(inner.body[0], ast.AugAssign)
    assert where(outer) == (2, 5, 4, 21)
    assert isinstance(single.target, ast.Name) and single.target.id == "i"


def test_if_elif_else():
    (s,) = body("if a:\n    x = 1\nelif b:\n    x = 2\nelif c:\n    pass\nelse:\n    x = 3")
    assert shape(s.cond) == "a" and len(s.body) == 1
    (e1,) = s.orelse
    assert isinstance(e1, ast.If) and shape(e1.cond) == "b" and where(e1) == (4, 5, 9, 14)
    (e2,) = e1.orelse
    assert shape(e2.cond) == "c" and isinstance(e2.body[0], ast.Pass)
    assert shape(e2.orelse[0].value) == "3"
    assert where(s) == (2, 5, 9, 14)
    (plain,) = body("if a:\n    pass")
    assert plain.orelse == []


# ---- expressions -----------------------------------------------------------------------------
@pytest.mark.parametrize("src, tree", [
    ("a + b * c", "(a + (b * c))"),
    ("a - b - c", "((a - b) - c)"),
    ("a * b // c % d @ e", "((((a * b) // c) % d) @ e)"),
    ("a < b and c", "((a < b) and c)"),
    ("a or b and not c", "(a or (b and (not c)))"),
    ("not a == b", "(not (a == b))"),
    ("a | b ^ c & d", "(a | (b ^ (c & d)))"),
    ("a << 1 + b", "(a << (1 + b))"),
    ("a & b == c", "((a & b) == c)"),
    ("-x.y * ~z", "((- x.y) * (~ z))"),
    ("+-a", "(+ (- a))"),
    ("(a + b) * c", "((a + b) * c)"),
    ("a <= b != c >= d", None),
])
def test_precedence(src, tree):
    if tree is None:  # comparisons do not chain
        with pytest.raises(NkError):
            expr(f"x = {src}")
    else:
        assert shape(expr(f"x = {src}")) == tree


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_comparisons(op):
    assert shape(expr(f"x = a {op} b")) == f"(a {op} b)"


def test_postfix():
    assert shape(expr("y = f(a, b, mask=m, other=-inf)")) == "f(a, b, mask=m, other=(- inf))"
    assert shape(expr("y = x.to(f16)")) == "x.to(f16)"
    assert shape(expr("y = x.shape[0]")) == "x.shape[0]"
    assert shape(expr("y = f()(1)[2].z")) == "f()(1)[2].z"
    call = expr("y = f(a,\n      b=1,\n)")
    assert call.kwargs[0][0] == "b" and where(call) == (2, 9, 4, 6)


def test_subscripts_and_slices():
    e = expr("y = x[:, None]")
    assert isinstance(e.index[0], ast.Slice) and (e.index[0].lower, e.index[0].upper, e.index[0].step) == (None,) * 3
    assert isinstance(e.index[1], ast.Const) and e.index[1].value is None
    assert where(e.index[0]) == (2, 11, 2, 12) and where(e.index[1]) == (2, 14, 2, 18)
    assert shape(expr("y = x[None, :]")) == "x[None, ::]"
    assert shape(expr("y = x[tm, tk]")) == "x[tm, tk]"
    assert shape(expr("y = x[1:3]")) == "x[1:3:]"
    assert shape(expr("y = x[::2, a:, :b]")) == "x[::2, a::, :b:]"
    assert shape(expr("y = x[i:j:k]")) == "x[i:j:k]"


@pytest.mark.parametrize("src, value", [
    ("42", 42), ("0", 0), ("1_000", 1000), ("0xff", 255), ("0XFF_FF", 0xFFFF), ("0b1010", 10),
    ("1.0", 1.0), ("1e-5", 1e-5), (".5", 0.5), ("1.", 1.0), ("2.5E+3", 2500.0), ("0.7071067811865476", 0.7071067811865476),
])
def test_numbers(src, value):
    e = expr(f"x = {src}")
    assert isinstance(e, ast.Num) and e.value == value and type(e.value) is type(value)
    assert where(e) == (2, 9, 2, 9 + len(src))


def test_other_atoms():
    assert expr("x = 'a\\tb'").value == "a\tb" and expr('x = "it\'s"').value == "it's"
    assert [expr(f"x = {c}").value for c in ("True", "False", "None")] == [True, False, None]
    assert all(isinstance(expr(f"x = {c}"), ast.Const) for c in ("True", "False", "None"))
    assert isinstance(expr("x = inf"), ast.Name) and expr("x = nan").id == "nan"
    assert shape(expr("x = (a, b)")) == "tuple(a, b)" and shape(expr("x = (a,)")) == "tuple(a)"
    assert shape(expr("x = ()")) == "tuple()"
    assert shape(expr("x = [tm, tn]")) == "[tm, tn]" and shape(expr("x = []")) == "[]"
    t = expr("x = (a, b)")
    assert where(t) == (2, 9, 2, 15)


def test_spans_of_expressions():
    e = expr("v = load(x + row * stride, mask=m)")
    assert where(e) == (2, 9, 2, 39)
    plus = e.args[0]
    assert where(plus) == (2, 14, 2, 30) and where(plus.right) == (2, 18, 2, 30)
    assert where(plus.right.left) == (2, 18, 2, 21) and where(e.kwargs[0][1]) == (2, 37, 2, 38)
    assert str(e.span) == "t.nk:2:9"


# ---- syntax errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("src, at, words", [
    ("kernel f(x:\n    pass", "2:5", ["unexpected 'pass'", "a name"]),
    ("kernel f():\n    x = (1 +\n", "2:13", ["end of input", "expected an expression"]),
    ("kernel f():\n    y = 1 +", "2:12", ["expected an expression"]),
    ("kernel f():\n    y = 1 +\n    z = 2\n", "2:12", ["unexpected end of line", "expected an expression"]),
    ("kernel f()\n    pass\n", "1:11", ["expected ':'"]),
    ("kernel f():\n    x = )\n", "2:9", ["unexpected ')'", "expected an expression"]),
    ("kernel f():\n    f(a b)\n", "2:9", ["unexpected name 'b'", "')'", "','"]),
    ("kernel f():\n    for i range(3):\n        pass\n", "2:11", ["'in'"]),
    ("kernel f():\n    x = 1\n        y = 2\n", "3:9", ["unexpected indentation"]),
    ("  kernel f():\n    pass\n", "1:3", ["unexpected indentation"]),
    ("kernel f():\n    if x:\n    pass\n", "3:5", ["expected an indented block"]),
    ("kernel f():\n", "1:12", ["expected an indented block"]),
    ("kernel f():\n    if x:\n        y = 1\n      z = 2\n", "4:1", ["unindent does not match any outer indentation level"]),
    ("kernel f():\n    x = 1\n\ty = 2\n", "3:1", ["inconsistent use of tabs and spaces"]),
    ("x = 1\n", "1:1", ["'kernel'", "'def'", "'tile'"]),
    ("kernel f():\n    x = for\n", "2:9", ["unexpected 'for'"]),
    ("kernel f():\n    x = 'abc\n", "2:9", ["unterminated string"]),
    ("kernel f():\n    x = 1 $ 2\n", "2:11", ["unexpected character '$'"]),
    ("kernel f():\n    f(x) = 3\n", "2:5", ["cannot assign"]),
    ("kernel f():\n    f(a=1, 2)\n", "2:12", ["positional argument follows keyword argument"]),
])
def test_syntax_errors(src, at, words):
    with pytest.raises(NkError) as info:
        parse(src, "bad.nk")
    text = str(info.value)
    assert f"bad.nk:{at}: error:" in text
    for w in words:
        assert w in text
    assert "Token" not in text and "lark" not in text and "Traceback" not in text


def test_unclosed_bracket_hint():
    with pytest.raises(NkError) as info:
        parse("kernel f(x:\n    pass", "bad.nk")
    assert "'(' at 1:9" in info.value.diagnostics[0].hint


@pytest.mark.parametrize("text, hint", [
    ("kernel k(x):\n    y = f(a, [1, 2], (3,\n    z = 1\n", "the '(' at 2:22 is still open here"),
    ("kernel k(x):\n    y = f(a, [1,\n      2]\n    z = 3\n", "the '(' at 2:10 is still open here"),
    ("kernel k(x):\n    y = [f(1)\n    z = 3\n", "the '[' at 2:9 is still open here"),
    ("kernel k(x):\n    y = (1 + 2) +\n", None),  # nothing open: no hint
])
def test_the_innermost_open_bracket_is_named(text, hint):
    """Read off the parser's stack: closed pairs (even across lines) drop out, the innermost open one is named."""
    with pytest.raises(NkError) as info:
        parse(text, "open.nk")
    got = info.value.diagnostics[0].hint
    assert got == hint if hint else not got
