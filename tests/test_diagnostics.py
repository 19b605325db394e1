"""User mistakes render as `file.nk:LINE:COL: error: ...`, quote the source line with a caret under the
span, and never show Python internals. Parse and check errors come through `newtc.compile` and CPU
launches (which run in the interpreter), as a user meets them; the CLI is run as `python -m newtc`.
"""
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

import pytest
import torch

import newtc
from newtc import cache, jit
from newtc.check import check
from newtc.compiler import Spec
from newtc.syntax import parse
from newtc.types import Ptr, f32, i32

ROOT = Path(__file__).resolve().parent.parent
INTERNALS = ("Traceback", '.py"', "lark", "newtc/", "File \"")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Parsed modules are cached on disk: keep this module's entries out of the user's cache."""
    monkeypatch.setenv("NEWT_CACHE_DIR", str(tmp_path / "cache"))


def src(text: str) -> str:
    return textwrap.dedent(text)


def assert_diagnostic(err: newtc.NkError, file: str, line: int, col: int | None, message: str,
                      hint: str | None = None) -> str:
    """The rendered error names file:line:col, quotes that line of the source with a caret under col."""
    out = err.render(color=False)
    assert "\033[" not in out
    for bad in INTERNALS:
        assert bad not in out, out
    lines = out.splitlines()
    head = re.match(rf"^{re.escape(file)}:(\d+):(\d+): error: (.*)$", lines[0])
    assert head, out
    assert int(head.group(1)) == line, out
    if col is not None:
        assert int(head.group(2)) == col, out
    col = int(head.group(2))
    assert re.search(message, head.group(3)), out
    text = err.span.source  # the span carries its file's text
    assert lines[1] == "  " + text.splitlines()[line - 1], out
    assert re.fullmatch(r"  " + " " * (col - 1) + r"\^~*", lines[2]), out
    if hint is not None:
        assert any(ln.startswith("  hint: ") and re.search(hint, ln) for ln in lines[3:]), out
    assert str(err) == out
    return out


def compile_error(text: str, file: str) -> newtc.NkError:
    with pytest.raises(newtc.NkError) as e:
        newtc.compile(src(text), file)
    return e.value


def launch_error(text: str, file: str, *args, **meta) -> newtc.NkError:
    mod = newtc.compile(src(text), file)
    name = list(mod.kernels)[-1]
    with pytest.raises(newtc.NkError) as e:
        getattr(mod, name)[(1,)](*args, **meta)
    return e.value


def typing_error(body: str, file: str, sig=None, constexprs=None) -> newtc.NkError:
    """Type a kernel `k(x: *f32, n: i32, ...)` whose body is `body` (its first line is line 2)."""
    sig = sig or {"x": Ptr(f32), "n": i32}
    params = ", ".join([*sig, *(f"{c}: constexpr" for c in constexprs or {})])
    text = f"kernel k({params}):\n" + textwrap.indent(src(body), "    ")
    with pytest.raises(newtc.NkError) as e:
        check(parse(text, file), "k", Spec.of(sig, constexprs))
    return e.value


def x4():
    return torch.zeros(4)


# ---- syntax errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, line, col, message", [
    ("kernel k(x):\n    y = (1 +\n", 2, 13, "unexpected end of input; expected an expression"),
    ("kernel k(x):\n    y = x +* 2\n", 2, 12, r"unexpected '\*'"),
    ("kernel k(x):\n  y = 1\n    z = 2\n", 3, 5, "unexpected indentation"),
    ("kernel k(x):\n    y = 1 $ 2\n", 2, 11, r"unexpected character '\$'"),
    ("kernel k(x):\n\ty = 1\n        z = 2\n", 3, 1, "inconsistent use of tabs and spaces"),
    ("kernel k(x)\n    y = 1\n", 1, 12, "expected ':'"),
    ("kernel k(x):\n    y = 'abc\n", 2, 9, "unterminated string"),
    ("kernel k(x):\n    y = 1 < 2 < 3\n", 2, 15, "unexpected '<'"),
    ("kernel k(x):\n    else:\n        pass\n", 2, 5, "unexpected 'else'"),
    ("kernel k(x):\n        a = 1\n      b = 2\n", 3, 1, "unindent does not match"),
    ("kernel k(x):\n    y = [1, 2\n", 2, 14, r"expected ',' or '\]'"),
    ("kernel (x):\n    pass\n", 1, 8, "expected a name"),
    ("kernel k(x):\n    for in range(3):\n        pass\n", 2, 9, "unexpected 'in'"),
    ("kernel k(x):\n", 1, 13, "expected an indented block"),
    ("kernel k(x):\n    y = {}\n", 2, 9, r"unexpected character '\{'"),
])
def test_syntax_errors(text, line, col, message):
    err = compile_error(text, "syntax.nk")
    assert_diagnostic(err, "syntax.nk", line, col, message)


# ---- names ----------------------------------------------------------------------------------------------
def test_unknown_builtin_suggests_the_right_one():
    err = launch_error("""\
        kernel k(x, n):
            offs = arange(0, 4)
            v = lod(x + offs, mask=offs < n)
    """, "names.nk", x4(), 4)
    out = assert_diagnostic(err, "names.nk", 3, 9, "unknown name 'lod'", "did you mean 'load'")
    assert out.splitlines()[2] == "          ^~~"


def test_unknown_local_suggests_the_local():
    err = launch_error("""\
        kernel k(x, n):
            offsets = arange(0, 4)
            store(x + ofsets, 1.0)
    """, "local.nk", x4(), 4)
    assert_diagnostic(err, "local.nk", 3, 15, "unknown name 'ofsets'", "did you mean 'offsets'")


def test_unknown_name_without_a_close_match_has_no_hint():
    err = typing_error("y = zzzzqqq + 1\n", "nohint.nk")
    out = assert_diagnostic(err, "nohint.nk", 2, 9, "unknown name 'zzzzqqq'")
    assert "  hint:" not in out


def test_error_inside_a_helper_points_into_the_helper():
    err = launch_error("""\
        def scale(v):
            return v * facter

        kernel k(x):
            store(x, scale(load(x)))
    """, "helper.nk", x4())
    assert_diagnostic(err, "helper.nk", 2, 16, "unknown name 'facter'")


# ---- builtin calls ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, col, message, hint", [
    ("y = load(x, maks=n > 0)\n", 9, "load\\(\\): got an unexpected keyword argument 'maks'",
     r"signature: load\(ptr, mask, other, boundary_check, padding_option\)"),
    ("y = load(x, n > 0, 0.0, 1)\n", 9, r"load\(\): too many positional arguments", "signature"),
    ("y = load()\n", 9, r"load\(\): missing a required argument: 'ptr'", "signature"),
    ("y = arange(8)\n", 9, r"arange\(\): missing a required argument: 'end'", r"arange\(start, end\)"),
    ("y = program_id(3)\n", 9, "axis must be 0, 1 or 2", None),
    ("y = load(x, other=1.0)\n", 9, r"load\(other=...\) needs a mask", None),
    ("y = load(n)\n", 9, r"load\(\) needs a pointer, got a scalar of type i32", None),
    ("y = sum(1.0)\n", 9, r"sum\(\) reduces a block", None),
    ("y = n.to(f16, bitcast=True)\n", 9, "bitcast needs equal widths: i32 and f16", None),
    ("y = dot(zeros([16, 16]), zeros([8, 16]))\n", 9, "inner dimensions differ", None),
    ("static_assert(n == 4)\n", 5, "a static_assert condition must be a compile-time constant", "constexpr"),
    ("static_assert(1 == 2, 'one is not two')\n", 5, "static_assert failed: one is not two", None),
])
def test_builtin_misuse(body, col, message, hint):
    err = typing_error(body, "builtin.nk")
    assert_diagnostic(err, "builtin.nk", 2, col, message, hint)


def test_helper_arity():
    err = launch_error("""\
        def h(a):
            return a

        kernel k(x):
            store(x, h(1.0, 2.0))
    """, "arity.nk", x4())
    assert_diagnostic(err, "arity.nk", 5, 14, r"h\(\) takes 1 arguments, 2 given")


def test_calling_a_kernel():
    err = launch_error("kernel j(x):\n    pass\n\nkernel k(x):\n    j(x)\n", "callk.nk", x4())
    assert_diagnostic(err, "callk.nk", 5, 5, "'j' is a kernel; only `def` helpers can be called")


# ---- dtypes, shapes, constants ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, col, message", [
    ("y = 1.5 << n\n", 9, "'<<' needs integer operands, got f32"),
    ("y = ~load(x)\n", 9, "'~' needs an integer operand, got f32"),
    ("y = load(x) & 1\n", 9, "'&' needs integer operands"),
    ("y = x + 1.5\n", 9, "unsupported pointer arithmetic"),
    ("y = x + x\n", 9, "unsupported pointer arithmetic"),
    ("y = 1 - x\n", 9, "unsupported pointer arithmetic"),
    ("y = exp(x)\n", 9, r"cannot convert \*f32 to f32"),
    ("y = load(x + arange(0, 128)) + load(x + arange(0, 64))\n", 9, r"shapes \[128\] and \[64\] do not broadcast"),
    ("y = arange(0, 100)\n", 9, r"arange\(0, 100\) has 100 elements, not a power of two"),
    ("y = zeros([3, 4])\n", 9, "block dimension 3 is not a power of two"),
    ("y = arange(0, n)\n", 9, "arange end must be a compile-time constant"),
    ("y = zeros(n)\n", 9, "a block shape must be a compile-time constant"),
    ("y = sum(load(x + arange(0, 4)), axis=n)\n", 9, "the reduction axis must be a compile-time constant"),
    ("y = 7 // 0\n", 9, "division by zero in a constant expression"),
    ("y = n[0]\n", 9, "cannot index a scalar"),
    ("y = arange(0, 4)[0]\n", 22, "only `:` and `None` can index a block"),
    ("y = x.foo\n", 9, "has no attribute 'foo'"),
    ("a, b = 1\n", 5, "cannot unpack int 1 into 2 names"),
    ("x[0] = 1.0\n", 5, "only names can be assigned"),
    ("for i in range(0, n, 0):\n    pass\n", 14, "step must not be zero"),
    ("for i in range(0.5, n):\n    pass\n", 14, "bounds must be integer scalars"),
    ("for i in tiles(4):\n    pass\n", 14, "iterates over range"),
])
def test_type_errors(body, col, message):
    err = typing_error(body, "types.nk")
    assert_diagnostic(err, "types.nk", 2, col, message)


def test_runtime_value_where_a_constexpr_is_needed_has_a_hint():
    err = launch_error("""\
        kernel k(x, n):
            offs = arange(0, n)
            store(x + offs, 1.0)
    """, "constexpr.nk", x4(), 4)
    assert_diagnostic(err, "constexpr.nk", 2, 12, "arange end must be a compile-time constant",
                      "`NAME: constexpr`")


def test_block_if_condition():
    err = launch_error("""\
        kernel k(x, n):
            offs = arange(0, 4)
            if offs < n:
                store(x + offs, 1.0)
    """, "blockif.nk", x4(), 4)
    assert_diagnostic(err, "blockif.nk", 3, 8, r"an `if` condition must be a scalar, got a block bool\[4\]",
                      r"where\(cond, a, b\)")


def test_non_power_of_two_constexpr_at_launch_points_at_the_arange():
    err = launch_error("""\
        kernel k(x, n, BLOCK: constexpr):
            offs = program_id(0) * BLOCK + arange(0, BLOCK)
            store(x + offs, 1.0, mask=offs < n)
    """, "pow2.nk", x4(), 4, BLOCK=100)
    assert_diagnostic(err, "pow2.nk", 2, 36, "100 elements, not a power of two", "mask the extra lanes")


def test_shape_mismatch_at_launch():
    err = launch_error("""\
        kernel k(x):
            a = load(x + arange(0, 128))
            b = load(x + arange(0, 64))
            store(x + arange(0, 128), a + b)
    """, "shape.nk", torch.zeros(128))
    assert_diagnostic(err, "shape.nk", 4, 31, r"shapes \[128\] and \[64\] do not broadcast",
                      "equal, or one of them 1")


def test_return_from_a_helper_inside_a_runtime_loop():
    err = launch_error("""\
        def first(x, n):
            for i in range(0, n):
                return load(x + i)

        kernel k(x, n):
            store(x, first(x, n))
    """, "retloop.nk", x4(), 4)
    assert_diagnostic(err, "retloop.nk", 2, 5, "`return` inside a runtime loop is not supported")


# ---- launches ---------------------------------------------------------------------------------------------
ADD = """\
kernel add(x, y, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
"""


def add_args():
    return torch.randn(100), torch.randn(100), torch.empty(100), 100


def test_missing_constexpr_at_launch():
    err = launch_error(ADD, "launch1.nk", *add_args())
    assert_diagnostic(err, "launch1.nk", 1, 26, "missing constexpr 'BLOCK' for kernel 'add'",
                      r"add\[grid\]\(\.\.\., BLOCK=\.\.\.\)")


def test_wrong_argument_count_at_launch():
    x, y, out, n = add_args()
    err = launch_error(ADD, "launch2.nk", x, y, out, BLOCK=128)
    assert_diagnostic(err, "launch2.nk", 1, 1, r"kernel 'add' takes 4 runtime arguments \(x, y, out, n\), got 3")
    err = launch_error(ADD, "launch3.nk", x, y, out, n, n, BLOCK=128)
    assert_diagnostic(err, "launch3.nk", 1, 1, "takes 4 runtime arguments .*, got 5")


def test_unknown_constexpr_at_launch():
    err = launch_error(ADD, "launch4.nk", *add_args(), BLOCK=128, BLOK=64)
    assert_diagnostic(err, "launch4.nk", 1, 1, "kernel 'add' has no constexpr parameter 'BLOK'",
                      "constexpr parameters: BLOCK")


def test_bad_num_warps_at_launch():
    err = launch_error(ADD, "launch5.nk", *add_args(), BLOCK=128, num_warps=3)
    assert_diagnostic(err, "launch5.nk", 1, 1, "num_warps=3 must be a power of two")


def test_bad_num_ctas_at_launch():
    err = launch_error(ADD, "launch7.nk", *add_args(), BLOCK=128, num_ctas=3)
    assert_diagnostic(err, "launch7.nk", 1, 1, "num_ctas=3 must be 1, 2, 4 or 8")
    mod = newtc.compile(ADD, "launch8.nk")
    with pytest.raises(newtc.NkError, match="num_ctas=2: clusters need sm_90 or later, not sm_80"):
        mod.add.output(add_args(), dict(BLOCK=128, num_ctas=2), "checked", "sm_80")
    err = launch_error(ADD, "launch9.nk", *add_args(), BLOCK=128, num_ctas=2)  # a grid of (1,)
    assert_diagnostic(err, "launch9.nk", 1, 1, "a grid of 1 programs along x is not whole clusters of num_ctas=2",
                      "launch a multiple of 2 programs along x")


def test_unsupported_argument_types():
    mod = newtc.compile(ADD, "launch6.nk")
    x, y, out, n = add_args()
    with pytest.raises(newtc.NkError, match="cannot pass str to a kernel") as e:
        mod.add[(1,)](x, y, out, "100", BLOCK=128)
    assert "hint: pass tensors" in e.value.render(color=False)
    with pytest.raises(newtc.NkError, match="tensors of torch.complex64 are not supported"):
        mod.add[(1,)](x.to(torch.complex64), y, out, n, BLOCK=128)


def test_annotation_mismatch_at_launch():
    err = launch_error("kernel k(x: *f16):\n    pass\n", "annot.nk", x4())
    assert_diagnostic(err, "annot.nk", 1, 10, r"parameter 'x' is declared \*f16 but got \*f32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA tensor to mix devices")
def test_tensors_on_different_devices():
    x, y, out, n = add_args()
    err = launch_error(ADD, "devices.nk", x.cuda(), y, out, n, BLOCK=128)
    assert_diagnostic(err, "devices.nk", 1, 1, "tensors on different devices", "same device")


# ---- the interpreter's memory checks ---------------------------------------------------------------------
OOB = """\
kernel k(x, out, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    v = load(x + offs)
    store(out + offs, v)
"""


def test_out_of_bounds_load_in_the_interpreter():
    err = launch_error(OOB, "oob.nk", torch.randn(100), torch.empty(128), BLOCK=128)
    out = assert_diagnostic(err, "oob.nk", 3, 9, "out-of-bounds load: offset 100 is outside the tensor's 100 "
                                                 "elements", "mask the lanes")
    assert out.startswith("oob.nk:3:")


def test_out_of_bounds_store_in_the_interpreter():
    out = torch.empty(60)
    err = launch_error(OOB, "oob_store.nk", torch.randn(64), out, BLOCK=64)
    assert_diagnostic(err, "oob_store.nk", 4, 5, "out-of-bounds store: offset 60 is outside the tensor's 60 "
                                                 "elements")


def test_out_of_bounds_inside_a_helper_and_a_loop():
    err = launch_error("""\
        def get(p, i):
            return load(p + i)

        kernel k(x, out, n):
            s = 0.0
            for i in range(0, n):
                s += get(x, i)
            store(out, s)
    """, "oob_loop.nk", torch.ones(4), torch.zeros(1), 5)
    assert_diagnostic(err, "oob_loop.nk", 2, 12, "out-of-bounds load: offset 4 is outside the tensor's 4 elements")


def test_negative_offset_before_a_view():
    base = torch.zeros(8)
    err = launch_error("kernel k(x):\n    store(x - 1, 1.0)\n", "oob_neg.nk", base[2:6])
    assert_diagnostic(err, "oob_neg.nk", 2, 5, "out-of-bounds store: offset -1 is outside the tensor's 4 elements")
    assert torch.equal(base, torch.zeros(8))  # nothing was written


def test_masked_lanes_are_not_out_of_bounds():
    x, out = torch.randn(100), torch.zeros(100)
    mod = newtc.compile(src("""\
        kernel k(x, out, n, BLOCK: constexpr):
            offs = arange(0, BLOCK)
            store(out + offs, load(x + offs, mask=offs < n), mask=offs < n)
    """), "masked.nk")
    mod.k[(1,)](x, out, 100, BLOCK=128)
    assert torch.equal(out, x)


# ---- the command line ------------------------------------------------------------------------------------
def run_cli(tmp_path, *argv):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NO_COLOR="1", NEWT_CACHE_DIR=str(tmp_path / "clicache"))
    return subprocess.run([sys.executable, "-m", "newtc", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_check_reports_a_type_error(tmp_path):
    (tmp_path / "bad.nk").write_text("kernel k(x: *f32, n: i32):\n    y = lod(x)\n")
    p = run_cli(tmp_path, "--check", "bad.nk")
    assert p.returncode == 1
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert lines[0] == "bad.nk:2:9: error: unknown name 'lod'"
    assert lines[1] == "      y = lod(x)"
    assert lines[2] == "          ^~~"
    assert "did you mean 'load'?" in lines[3]
    for bad in INTERNALS:
        assert bad not in p.stderr


def test_cli_check_reports_a_syntax_error(tmp_path):
    (tmp_path / "bad.nk").write_text("kernel k(x):\n    y = (x +\n")
    p = run_cli(tmp_path, "--check", "bad.nk")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("bad.nk:2:13: error: unexpected end of input")
    for bad in INTERNALS:
        assert bad not in p.stderr


def test_cli_check_with_sig_and_defines(tmp_path):
    (tmp_path / "bad.nk").write_text("kernel k(x, n, B: constexpr):\n    y = arange(0, B)\n")
    p = run_cli(tmp_path, "--check", "bad.nk", "--sig", "x=*f32,n=i32", "-D", "B=12")
    assert p.returncode == 1
    assert p.stderr.startswith("bad.nk:2:9: error: arange(0, 12) has 12 elements, not a power of two")
    p = run_cli(tmp_path, "--check", "bad.nk", "--sig", "x=*f32,n=i32", "-D", "B=16")
    assert p.returncode == 0 and p.stderr == ""


def test_cli_missing_file(tmp_path):
    p = run_cli(tmp_path, "--check", "nothere.nk")
    assert p.returncode == 1
    assert "cannot read nothere.nk" in p.stderr and "Traceback" not in p.stderr


# ---- known bugs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("expr", ["~1.5", "1.5 << 2", "1 << -1", "abs('a')", "arange(0, 2.0)",
                                  "sum(load(x + arange(0, 4)), axis=0.5)"])
def test_bad_constant_operands_are_diagnosed(expr):
    err = typing_error(f"y = {expr}\n", "constbad.nk")
    assert_diagnostic(err, "constbad.nk", 2, None, ".")


@pytest.mark.parametrize("expr", ["log(0.0)", "sqrt(-1.0)", "exp(1000.0)", "sigmoid(-1000.0)", "7 % 0.0"])
def test_constant_math_folding_never_leaks_python_errors(expr):
    text = f"kernel k(x: *f32):\n    store(x, {expr})\n"
    try:
        check(parse(text, "constmath.nk"), "k", Spec.of({"x": Ptr(f32)}))
    except newtc.NkError as err:
        assert_diagnostic(err, "constmath.nk", 2, None, ".")


@pytest.mark.parametrize("expr", ["-x", "abs(x)", "minimum(x, x + 1)", "where(n > 0, x, 1)",
                                  "x + program_id(1.0)"])
def test_pointer_and_axis_misuse_is_a_type_error(expr):
    err = typing_error(f"store({expr}, 1.0)\n", "ptrbad.nk")
    assert_diagnostic(err, "ptrbad.nk", 2, None, ".")


def test_diagnostics_quote_their_own_module_when_names_repeat():
    a = newtc.compile("kernel k(x):\n    y = lod(x)\n", "same.nk")
    newtc.compile("kernel k(x):\n    store(x, 1.0)\n", "same.nk")
    with pytest.raises(newtc.NkError) as e:
        a.k[(1,)](x4())
    assert e.value.render(color=False).splitlines()[1] == "      y = lod(x)"


def test_runtime_value_in_a_list_shape():
    err = typing_error("y = zeros([n])\n", "listshape.nk")
    out = assert_diagnostic(err, "listshape.nk", 2, 9, "must be a compile-time constant")
    assert "%" not in out


def test_return_in_a_kernel_points_at_the_return():
    err = launch_error("kernel k(x):\n    pass\n    return 1\n", "kret.nk", x4())
    assert_diagnostic(err, "kret.nk", 3, 5, "a kernel cannot return a value")


def test_integer_literal_that_does_not_fit_its_operand():
    err = typing_error("y = n + 4294967297\n", "wide.nk")
    assert_diagnostic(err, "wide.nk", 2, 9, "does not fit in i32")


def test_misspelled_keyword_suggests_the_parameter():
    err = typing_error("y = load(x, maks=n > 0)\n", "kw.nk")
    assert "did you mean 'mask'" in err.render(color=False)


# ---- issue 14: mistakes that were silent or internal errors ------------------------------------------------
def test_a_block_stored_through_a_scalar_pointer():  # the forgotten `sum`
    err = typing_error("store(x, load(x + arange(0, 8)))\n", "scalarptr.nk")
    assert_diagnostic(err, "scalarptr.nk", 2, 5, r"the value is a block \(f32\[8\]\) but the pointer is a scalar",
                      r"sum\(v\)")


@pytest.mark.parametrize("body, message", [
    ("y = load(x, mask=arange(0, 4) < n)\n", r"the mask is a block \(bool\[4\]\) but the pointer is a scalar"),
    ("y = load(x, mask=n > 0, other=zeros([4]))\n", r"other= is a block \(f32\[4\]\) but the pointer is a scalar"),
    ("store(x, 1.0, mask=arange(0, 4) < n)\n", "the mask is a block"),
])
def test_a_scalar_pointer_takes_scalar_masks_and_others(body, message):
    assert_diagnostic(typing_error(body, "scalarmask.nk"), "scalarmask.nk", 2, 5 if body[0] == "s" else 9, message)


@pytest.mark.parametrize("text, line, col, message", [
    ("def exp(v):\n    return v\n\nkernel k(x):\n    store(x, exp(1.0))\n", 1, 1,
     "helper 'exp' has the name of a builtin"),
    ("def f32(v):\n    return v\n\nkernel k(x):\n    pass\n", 1, 1, "helper 'f32' has the name of a builtin"),
    ("kernel k(x):\n    store(x, 1.0)\n\nkernel k(x):\n    store(x, 2.0)\n", 4, 1,
     "'k' is defined twice"),
    ("def h(v):\n    return v\n\nkernel h(x):\n    pass\n", 4, 1, "'h' is defined twice"),
    ("kernel k(x, x):\n    pass\n", 1, 13, "duplicate parameter 'x' in 'k'"),
])
def test_name_clashes_are_errors_at_the_second_definition(text, line, col, message):
    err = compile_error(text, "clash.nk")
    out = assert_diagnostic(err, "clash.nk", line, col, message)
    if "twice" in message:
        assert "the first definition is at line 1" in out


def test_a_string_is_not_a_function():
    err = typing_error("f = 'exp'\ny = f(1.0)\n", "strcall.nk")
    assert_diagnostic(err, "strcall.nk", 3, 9, "the string 'exp' is not callable")


def test_a_kernel_may_share_a_builtin_name_and_the_builtin_still_works():
    mod = newtc.compile("kernel sum(x, n):\n    store(x, sum(load(x + arange(0, 4)), axis=0) + n)\n", "ksum.nk")
    x = torch.randn(4)
    want = x.sum() + 1
    mod.sum[(1,)](x, 1)
    assert torch.allclose(x[0], want)


@pytest.mark.parametrize("body, col, message", [
    ("y = 2 @ 3\n", 9, "bad operands for '@': int 2 and int 3 .'@' multiplies blocks"),
    ("if x:\n    pass\n", 8, r"a pointer \(\*f32\) cannot be a condition or a mask"),
    ("y = where(x, 1, 2)\n", 9, "a pointer .* cannot be a condition"),
    ("y = load(x, mask=x)\n", 9, "a pointer .* cannot be a condition"),
    ("y = -(arange(0, 4) < n)\n", 9, r"unary '-' needs a number, got bool\[4\]"),
    ("y = abs(arange(0, 4) < n)\n", 9, r"abs\(\) needs a number, got bool\[4\]"),
    ("y = (arange(0, 4) < n) - (arange(0, 4) < 2)\n", 9, "'-' of two bools"),
    ("for i in static_range(0, 4, 0):\n    pass\n", 14, "static_range.. step must not be zero"),
    ("for i in static_range('a'):\n    pass\n", 14, "static_range end must be an integer, got the string 'a'"),
    ("y = max(f32)\n", 9, r"max\(\) reduces a block of numbers, got the dtype f32"),
    ("y = minimum(1, 'a')\n", 9, "expected a number or a block, got the string 'a'"),
    ("y = trans(zeros([2, 4]), 0, 1.0)\n", 9, r"trans\(\) dims \[0, 1.0\] are not a permutation"),
    ("y = arange(0, 4).shape[0.5]\n", 9, "is not an integer in range"),
    ("y = arange(0, 4).shape[1:2:0]\n", 28, "a tuple slice takes integers"),
    ("y = 1 << 200\n", 9, "does not fit in 64 bits"),
    ("y = 4294967296 * 4294967296\n", 9, "does not fit in 64 bits"),
    ("y = sum(zeros([4]), keep_dims=1.5)\n", 9, "keep_dims must be True or False, got float 1.5"),
    ("y = max(x + arange(0, 4), axis=0)\n", 9, r"max\(\) reduces a block of numbers, got a block of type \*f32\[4\]"),
    ("y = dot(x + zeros([2, 2], i32), x + zeros([2, 2], i32))\n", 9, "dot.. takes two 2-D blocks of numbers"),
    ("y = x.to(i64, bitcast=True)\n", 9, r"bitcast between a pointer and a number: \*f32 to i64"),
    ("y = arange(0, 262144)\n", 9, r"a block of 262144 elements .* over the limit"),
    ("y = zeros([65536, 65536])\n", 9, r"a block of 4294967296 elements"),
    ("for i in static_range(10000000):\n    y = 1\n", 9, "the kernel is too long: over 131072 statements"),
])
def test_internal_errors_that_are_now_diagnostics(body, col, message):
    err = typing_error(body, "internal.nk")
    assert_diagnostic(err, "internal.nk", 2 if "static_range(10" not in body else 3, col, message)


# ---- control flow, tuple assignment, local constexprs, min/max, hints and loop options (issue 15) ----------
H = "def h(x, c):\n"
K = "kernel k(x, n):\n    v = load(x + arange(0, 4))\n"


@pytest.mark.parametrize("text, line, col, message, hint", [
    (K + "    y = max(v, 0)\n", 3, 9, r"max\(x, 0\) is ambiguous: a reduction along axis 0 \(Triton\) or the "
     r"elementwise max with 0 \(Python\)", r"max\(x, axis=0\) or maximum\(x, 0\)"),
    (K + "    y = min(v, v, axis=0)\n", 3, 9, r"min\(\) of several values compares them elementwise", None),
    (K + "    y = multiple_of(v, 4)\n", 3, 9, r"multiple_of\(\) takes an integer or pointer value, got a block", None),
    (K + "    y = max_contiguous(arange(0, 4), 3)\n", 3, 9, r"max_contiguous\(\) takes a power of two per dimension",
     "a tuple for more dimensions"),
    (K + "    y = multiple_of(arange(0, 4)[:, None], 4)\n", 3, 9, r"a positive integer per dimension", None),
    (K + "    y = multiple_of(arange(0, 4), n)\n", 3, 9, r"multiple_of\(\) values must be a compile-time constant", None),
    (K + "    for i in range(0, n, num_stages=0):\n        pass\n", 3, 14,
     r"range\(num_stages=\) must be an integer of at least 1, got int 0", None),
    (K + "    for i in range(0, n, num_stages=100000):\n        pass\n", 3, 14,
     r"range\(num_stages=100000\) is more than 32 slots", "use 2 to 8"),
    (K + "    for i in range(0, n, (1, 2)):\n        pass\n", 3, 14, r"expected a number or a block, got tuple \(1, 2\)",
     None),
    (K + "    for i in range(0, n, stages=2):\n        pass\n", 3, 14,
     r"range\(\) takes 1 to 3 positional arguments and the options num_stages=, unroll= and warp_specialize=", None),
    (K + "    for i in range(0, n, warp_specialize=1):\n        pass\n", 3, 14,
     r"range\(warp_specialize=\) must be True or False, got int 1", None),
    (K + "    for i in static_range(0, 4, unroll=2):\n        pass\n", 3, 14,
     r"static_range\(\) takes 1 to 3 positional arguments$", None),
    (K + "    break\n", 3, 5, "'break' outside a loop", None),
    (H + "    continue\n" + K + "    for i in range(0, n):\n        h(x, i)\n", 2, 5, "'continue' outside a loop",
     None),
    (K + "    B: constexpr = n\n", 3, 20, "constexpr 'B' must be a compile-time constant", None),
    (K + "    B: i32 = 3\n", 3, 8, "a local name takes only the annotation `constexpr`", "B: constexpr = 16"),
    (K + "    B: constexpr = exp\n", 3, 20, "constexpr 'B' cannot be the function 'exp'", None),
    (K + "    while v < 1.0:\n        pass\n", 3, 11, r"a `while` condition must be a scalar, got a block bool\[4\]",
     None),
    (H + "    for i in range(0, c):\n        if i > 2:\n            return i\n    return 0\n" + K + "    y = h(x, n)\n",
     2, 5, "`return` inside a runtime loop is not supported", "break out of the loop"),
    (H + "    if c > 0:\n        return load(x)\n    return c\n" + K + "    y = h(x, n)\n", 4, 5,
     r"this helper returns a scalar of type i32 on one path and a scalar of type f32 on another",
     "one shape and dtype on every path"),
    (H + "    if c > 0:\n        return 1, 2\n    return load(x + arange(0, 4))\n" + K + "    y = h(x, n)\n", 4, 5,
     r"this helper returns a block of type f32\[4\] on one path and tuple \(1, 2\) on another", None),
    (H + "    if c > 0:\n        return 1.0\n    y = 2\n" + K + "    y = h(x, n)\n", 1, 1,
     "helper 'h' returns a value on some paths and none on others", "end it with a `return`"),
    (K + "    y = n.T\n", 3, 9, r"trans\(\) needs a block, got a scalar", None),
], ids=["min-max-ambiguous", "min-max-axis", "hint-dtype", "hint-pow2", "hint-rank", "hint-runtime", "num-stages",
        "num-stages-deep", "range-tuple-step", "range-option", "warp-specialize-option", "static-range-option", "break", "continue-in-helper", "constexpr-runtime",
        "annotation", "constexpr-value", "while-block", "return-in-loop", "return-types", "return-tuple", "return-some-paths",
        "T-scalar"])
def test_control_flow_and_hint_mistakes(text, line, col, message, hint):
    with pytest.raises(newtc.NkError) as e:
        check(parse(text, "flow.nk"), "k", Spec.of({"x": Ptr(f32), "n": i32}))
    assert_diagnostic(e.value, "flow.nk", line, col, message, hint)


@pytest.mark.parametrize("update, message", [
    ("i = (i + 1) % 7", r"`while` loops ran over 500 iterations in one program"),
    ("i = i * 1", r"this `while` loop never ends: an iteration changed none of its values"),
], ids=["cycles", "stuck"])
def test_an_endless_while_is_an_error_in_the_interpreter(monkeypatch, update, message):
    monkeypatch.setattr(newtc.interpret, "MAX_ITERATIONS", 500)
    text = f"kernel k(x, n):\n    i = 0\n    while i < n:\n        {update}\n    store(x, i)\n"
    mod = newtc.compile(text, "endless.nk")
    with pytest.raises(newtc.NkError) as e:
        mod.k[(1,)](torch.zeros(1, dtype=torch.int32), 9)
    assert_diagnostic(e.value, "endless.nk", 3, 5, message)


def test_a_loop_too_long_for_the_interpreter_is_an_error_before_it_runs():
    """A fuzzer's mutant stepped a loop down to -2**31: 33 million iterations, a hang in the interpreter."""
    text = "kernel k(x, n):\n    t = 0\n    for i in range(n, -2147483648, -64):\n        t += 1\n    store(x, t)\n"
    mod = newtc.compile(text, "long.nk")
    start = time.perf_counter()
    with pytest.raises(newtc.NkError) as e:
        mod.k[(1,)](torch.zeros(1, dtype=torch.int32), 1000)
    assert time.perf_counter() - start < 10
    assert_diagnostic(e.value, "long.nk", 3, 5, "this loop runs 33554448 iterations: the interpreter takes at most "
                      "1048576 in one program", "run long loops on a GPU")


def test_a_while_true_without_break_is_too_long():
    with pytest.raises(newtc.NkError) as e:
        check(parse("kernel k(x):\n    while True:\n        y = 1\n", "forever.nk"), "k", Spec.of({"x": Ptr(f32)}))
    assert_diagnostic(e.value, "forever.nk", 3, 9, "the kernel is too long: .* `while` loops on compile-time conditions")


def test_the_per_thread_block_limit_follows_num_warps():
    text = "kernel k(x, B: constexpr):\n    store(x + arange(0, B), 1.0)\n"
    mod = newtc.compile(text, "perthread.nk")
    big = torch.empty(65536)
    with pytest.raises(newtc.NkError, match=r"512 per thread \(32 threads here\)"):
        mod.k.ir(big, B=65536, num_warps=1)
    assert "store(" in mod.k.ir(big, B=65536, num_warps=32)


def test_a_float_into_an_integer_type_saturates():
    """`other=`, `full` and `store` convert a float constant like x.to(): toward zero, clamped, NaN to 0."""
    mod = newtc.compile("""\
        kernel k(a, b, c, n, B: constexpr):
            o = arange(0, B)
            store(a + o, load(a + o, mask=o < n, other=300.0))
            store(b + o, load(b + o, mask=o < n, other=-inf))
            store(c + o, full([B], nan, i32) + 7)
    """.replace("        ", ""), "saturate.nk")
    a, b, c = torch.arange(8, dtype=torch.uint8), torch.arange(8, dtype=torch.int32), torch.full((8,), -1, dtype=torch.int32)
    mod.k[(1,)](a, b, c, 2, B=8)
    assert a.tolist() == [0, 1] + [255] * 6
    assert b.tolist() == [0, 1] + [-2**31] * 6
    assert c.tolist() == [7] * 8


def test_tuple_slices_and_bool_argmax():
    mod = newtc.compile("""\
        kernel k(x, out, B: constexpr):
            v = load(x + arange(0, B))
            s = zeros([B, 2]).shape[1:]
            store(out, argmax(v > 0.5, axis=0) + s[0] * 100)
    """.replace("        ", ""), "slices.nk")
    x, out = torch.tensor([0.1, 0.2, 0.9, 0.7]), torch.full((1,), -1, dtype=torch.int32)
    mod.k[(1,)](x, out, B=4)
    assert out.item() == 2 + 200


@pytest.mark.parametrize("make", [
    lambda: ("x" + " + x" * 499),
    lambda: "-" * 500 + "x",
    lambda: "abs(" * 200 + "x" + ")" * 200,
    lambda: "[" * 300 + "x" + "]" * 300,
], ids=["500-terms", "500-minus", "200-calls", "300-lists"])
def test_deep_nesting_is_a_diagnostic(make):
    err = compile_error(f"kernel k(x: *f32):\n    y = {make()}\n", "deep.nk")
    assert_diagnostic(err, "deep.nk", 2, None, "nested too deeply: more than 200 levels", "intermediate names")


def test_nesting_below_the_limit_compiles_and_caches(tmp_path):
    """Parentheses only group: they add no level (1000 of them here)."""
    text = "kernel k(x, n):\n    y = " + "abs(" * 150 + "(" * 1000 + "load(x) + n" + ")" * 1150 + "\n    store(x, y)\n"
    for _ in range(2):  # the second module comes from the AST cache
        mod = newtc.compile(text, "deepok.nk")
        x = torch.tensor([-2.5])
        mod.k[(1,)](x, 1)
        assert x.item() == 1.5


def test_names_are_ascii():  # they become C++ identifiers
    err = compile_error("kernel k(x):\n    café = 1\n", "ascii.nk")
    assert_diagnostic(err, "ascii.nk", 2, 8, "unexpected character 'é'")


def test_huge_integer_literal():
    err = compile_error("kernel k(x):\n    y = " + "9" * 5000 + "\n", "huge.nk")
    assert_diagnostic(err, "huge.nk", 2, 9, "integer literal too large")
    err = compile_error("kernel k(x):\n    y = 18446744073709551616\n", "huge.nk")
    assert_diagnostic(err, "huge.nk", 2, 9, "integer literal too large")
    newtc.compile("kernel k(x):\n    y = 0xffff_ffff_ffff_ffff\n", "huge.nk")  # u64's largest is fine


def test_bad_escape_in_a_string():
    err = compile_error("kernel k(x):\n    static_assert(False, '\\x4')\n", "escape.nk")
    assert_diagnostic(err, "escape.nk", 2, 26, "invalid string literal")


def test_a_source_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.nk"
    path.write_bytes("kernel k(x):\n    # café\n    store(x, 1.0)\n".encode("latin-1"))
    with pytest.raises(newtc.NkError) as e:
        newtc.load(path)
    out = assert_diagnostic(e.value, str(path), 2, 10, "is not UTF-8 text: byte 0xe9", "save the file as UTF-8")
    assert "# caf\ufffd" in out
    p = subprocess.run([sys.executable, "-m", "newtc", "--check", str(path)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 1 and "latin1.nk:2:10: error: " in p.stderr and "Traceback" not in p.stderr


def test_compile_takes_bytes():
    mod = newtc.compile(b"kernel k(x):\n    store(x, 3.0)\n", "bytes.nk")
    x = torch.zeros(1)
    mod.k[(1,)](x)
    assert x.item() == 3.0
    with pytest.raises(TypeError, match="takes str"):
        newtc.compile(None)


# ---- launch errors name the parameter and the kernel's definition (issue 14, items 3 and 11) ----------------
SCALAR = """\
kernel k(x, n, m: i32, u: u8, f: bool, B: constexpr):
    store(x + arange(0, B), (n + m + u.to(i64)).to(f32) + f.to(f32))
"""


@pytest.mark.parametrize("args, param, message", [
    ((2**64 + 5, 1, 1, True), "n", "does not fit i64"),
    ((-2**63 - 1, 1, 1, True), "n", "does not fit i64"),
    ((1, 2**40 + 7, 1, True), "m", r"does not fit i32 \(-2147483648 to 2147483647\)"),
    ((1, 1000.5, 1, True), "m", "is not an integer; the parameter is i32"),
    ((1, 1, 300, True), "u", r"does not fit u8 \(0 to 255\)"),
    ((1, 1, -1, True), "u", "does not fit u8"),
    ((1, 1, 1, 2), "f", "is not a bool"),
])
def test_scalars_that_do_not_fit_their_parameter(args, param, message):
    mod = newtc.compile(SCALAR, "scalar.nk")
    x = torch.full((4,), float("nan"))
    mod.k[(1,)](x, 1, 2, 3, True, B=4)  # fine values first: the bad ones go through a cached launch path
    assert torch.equal(x, torch.full((4,), 7.0))
    with pytest.raises(newtc.NkError) as e:
        mod.k[(1,)](x, *args, B=4)
    col = SCALAR.index(f" {param}") + 2
    assert_diagnostic(e.value, "scalar.nk", 1, col, rf"kernel 'k': argument '{param}' = .* {message}")


@pytest.mark.parametrize("arg, message", [
    (None, "argument 'y': cannot pass NoneType to a kernel"),
    (torch.zeros(4, dtype=torch.complex64), "argument 'y': tensors of torch.complex64 are not supported"),
    (torch.zeros(4, device="meta"), "argument 'y' is a tensor on the 'meta' device"),
    ([1.0], "argument 'y': cannot pass list"),
])
def test_bad_arguments_name_the_parameter(arg, message):
    err = launch_error("kernel k(x, y, B: constexpr):\n    pass\n", "args.nk", x4(), arg, B=4)
    assert_diagnostic(err, "args.nk", 1, 13, message)


@pytest.mark.parametrize("meta, col, message", [
    ({"B": [1024]}, 13, r"constexpr 'B' of kernel 'k' cannot be list \[1024\]"),
    ({"B": 4, "num_warps": 4.0}, 1, "num_warps=4.0 must be a power of two"),
    ({"B": 4, "num_warps": "4"}, 1, "num_warps='4' must be a power of two"),
    ({"B": 4, "num_stages": 0}, 1, "num_stages=0 must be an integer from 1 to 32"),
    ({"B": 4, "maxnreg": 8}, 1, "maxnreg=8 must be an integer from 16 to 255"),
    ({"B": 4, "num_warps": 32, "maxnreg": 72}, 1, "maxnreg=72 must be an integer from 16 to 64"),
    ({"B": 4, "num_stages": 2**64 + 5}, 1, "num_stages=18446744073709551621 must be an integer from 1 to 32"),
])
def test_bad_meta_values_are_named(meta, col, message):
    mod = newtc.compile("kernel k(x, B: constexpr):\n    store(x + arange(0, B), 1.0)\n", "meta.nk")
    mod.k[(1,)](x4(), B=4)  # a cached launch path first
    with pytest.raises(newtc.NkError) as e:
        mod.k[(1,)](x4(), **meta)
    assert_diagnostic(e.value, "meta.nk", 1, col, message)


def test_numpy_and_torch_constexprs_are_plain():
    mod = newtc.compile("kernel k(x, B: constexpr, T: constexpr):\n    store(x + arange(0, B), full([B], 2, T))\n",
                        "npmeta.nk")
    x = torch.zeros(8)
    mod.k[(1,)](x, B=np.int64(8), T=torch.float16)
    assert torch.equal(x, torch.full((8,), 2.0))
    assert "[B=8, T=f16]" in mod.k.ir(x, B=np.int64(8), T=torch.float16)


def test_a_float_constant_beyond_its_dtype_is_inf():
    """A constant holds what its dtype holds: 1e39 as f32 is inf, on both targets (NVRTC refused 1e+39f)."""
    mod = newtc.compile("kernel k(x):\n    store(x + arange(0, 2), full([2], 1e39, f32) * where(arange(0, 2) == 0, "
                        "1.0, -1.0))\n", "bigfloat.nk")
    x = torch.zeros(2)
    mod.k[(1,)](x)
    assert x.tolist() == [float("inf"), float("-inf")]
    assert ".entry nk_k" in mod.k.ptx(x, arch="sm_90a")


# ---- fp8 and block pointers ------------------------------------------------------------------------------------
BP = "p = make_block_ptr(x, (n, 64), (64, 1), (0, 0), (16, 32), (1, 0))\n"


@pytest.mark.parametrize("body, col, message, hint", [
    ("y = load(x + arange(0, 8)).to(f8e4m3) + n\n", 9, "fp8 values mix only with floats: got f8e4m3 and i32",
     r"x\.to\(f32\)"),
    ("y = dot(zeros([16, 16], f8e5m2), zeros([8, 16], f8e5m2))\n", 9, r"dot\(\) inner dimensions differ", None),
    ("p = make_block_ptr(n, (n,), (1,), (0,), (16,), (0,))\n", 9, r"make_block_ptr\(\) needs a pointer, got a scalar",
     None),
    ("p = make_block_ptr(x + arange(0, 4), (n,), (1,), (0,), (16,), (0,))\n", 9, "needs a scalar pointer", None),
    ("p = make_block_ptr(x, (n,), (1, 1), (0,), (16,), (0,))\n", 9,
     r"make_block_ptr\(\) strides takes 1 integers \(one per block dimension\), got tuple \(1, 1\)", None),
    ("p = make_block_ptr(x, (n,), (1,), (0.5,), (16,), (0,))\n", 9, r"offsets takes 1 integers", None),
    ("p = make_block_ptr(x, (n,), (1,), (0,), (12,), (0,))\n", 9, "block dimension 12 is not a power of two", None),
    ("p = make_block_ptr(x, (n,), (1,), (0,), (n,), (0,))\n", 9, "each block dimension must be a compile-time",
     "constexpr"),
    ("p = make_block_ptr(x, (n, n), (1, 1), (0, 0), (16, 16), (0, 0))\n", 9, "order is a permutation of the 2 dim",
     r"\(1, 0\)"),
    ("p = advance(x, (1,))\n", 9, r"advance\(\) moves a block pointer \(from make_block_ptr\), got a scalar", None),
    (BP + "p = advance(p, (1,))\n", 9, r"advance\(\) offsets takes 2 integers", None),
    (BP + "y = load(p, mask=n > 0)\n", 9, r"load\(\) through a block pointer takes boundary_check=", None),
    (BP + "y = load(p, boundary_check=(0, 2))\n", 9, r"boundary_check names distinct dimensions of the block \(0 to 1\)",
     r"boundary_check=\(0, 1\)"),
    (BP + "y = load(p, boundary_check=(1, 1))\n", 9, "boundary_check names distinct dimensions", None),
    (BP + "y = load(p, boundary_check=(0,), padding_option='inf')\n", 9, "padding_option is 'zero' or 'nan'", None),
    (BP + "store(p, 1.0, mask=n > 0)\n", 5, r"store\(\) through a block pointer takes boundary_check=", None),
    (BP + "store(p, zeros([32, 16]))\n", 5, r"shapes \[16, 32\] and \[32, 16\] do not broadcast", None),
    ("y = load(x, boundary_check=(0,))\n", 9, r"load\(\): boundary_check and padding_option take a block pointer",
     "mask= and other="),
    (BP + "y = p + 1\n", 9, "unsupported operands for '\\+': a block pointer to f32\\[16, 32\\] and int 1", None),
    (BP + "for i in range(0, n):\n    p = make_block_ptr(x, (n,), (1,), (i,), (16,), (0,))\n", 5,
     r"'p' is a block pointer to f32\[16, 32\] on one path and a block pointer to f32\[16\] on another", None),
])
def test_fp8_and_block_pointer_misuse(body, col, message, hint):
    err = typing_error(body, "blockptr.nk")
    assert_diagnostic(err, "blockptr.nk", 3 if body.startswith(BP) else 2, col, message, hint)


def test_nan_padding_needs_floats():
    err = typing_error("p = make_block_ptr(x, (n,), (1,), (0,), (16,), (0,))\ny = load(p, boundary_check=0, "
                       "padding_option='nan')\n", "pad.nk", sig={"x": Ptr(i32), "n": i32})
    assert_diagnostic(err, "pad.nk", 3, 9, "padding_option is 'zero' or 'nan' \\(for floats\\), got the string 'nan' "
                      "for i32")


# ---- tensor descriptors ------------------------------------------------------------------------------------------
TD = "d = make_tensor_descriptor(x, [n, 64], [64, 1], [16, 32])\n"


@pytest.mark.parametrize("body, col, message, hint", [
    ("d = make_tensor_descriptor(n, [n], [1], [16])\n", 9, r"make_tensor_descriptor\(\) needs a pointer, got a scalar",
     None),
    ("d = make_tensor_descriptor(x, [n, n], [n, n], [16, 16])\n", 9,
     r"the last stride must be the constant 1, got a scalar of type i32", "make_block_ptr"),
    ("d = make_tensor_descriptor(x, [n, n], [1], [16, 16])\n", 9,
     r"make_tensor_descriptor\(\) strides takes 2 integers \(one per block dimension\)", None),
    ("d = make_tensor_descriptor(x, [n], [1], [24])\n", 9, "block dimension 24 is not a power of two", None),
    ("d = make_tensor_descriptor(x, [n], [1], [n])\n", 9, "each block dimension must be a compile-time", "constexpr"),
    ("d = make_tensor_descriptor(x, [n, n], [n, 1], [16, 2])\n", 9, r"a block row is at least 16 bytes, got 2 of f32",
     None),
    ("d = make_tensor_descriptor(x, [n], [1], [16], padding_option='inf')\n", 9,
     r"make_tensor_descriptor\(\): padding_option is 'zero' or 'nan' \(for floats\), got the string 'inf'", None),
    (TD + "if n > 0:\n    d = make_tensor_descriptor(x, [n, 64], [64, 1], [16, 32], padding_option='nan')\n", 5,
     r"'d' is a tensor descriptor to f32\[16, 32\] on one path and a tensor descriptor", r"\(a descriptor: and padding\)"),
    (TD + "y = d.load([0])\n", 9, r"load_tensor_descriptor\(\) offsets takes 2 integers \(one per block dim", None),
    (TD + "y = d.load([0, 1.5])\n", 9, r"offsets takes 2 integers", None),
    (TD + "d.store([0, 0], zeros([32, 16]))\n", 5, r"shapes \[16, 32\] and \[32, 16\] do not broadcast", None),
    (TD + "d.store([0, 0])\n", 5, r"store_tensor_descriptor\(\): missing a required argument: 'value'", None),
    ("y = load_tensor_descriptor(x, [0])\n", 9,
     r"load_tensor_descriptor\(\) takes a tensor descriptor \(from make_tensor_descriptor\), got a scalar", None),
    (BP + "store_tensor_descriptor(p, [0, 0], 1.0)\n", 5, r"takes a tensor descriptor .*, got a block pointer", None),
    (TD + "y = load(d)\n", 9, r"load\(\) of a tensor descriptor", r"desc\.load\(offsets\)"),
    (TD + "d = advance(d, [0, 1])\n", 9, r"advance\(\) moves a block pointer .*, got a tensor descriptor", None),
    ("y = load(x).load([0])\n", 9, "a scalar of type f32 has no attribute 'load'", None),
    (TD + "for i in range(0, n):\n    d = make_block_ptr(x, (n, 64), (64, 1), (0, 0), (16, 32), (1, 0))\n", 5,
     r"'d' is a tensor descriptor to f32\[16, 32\] on one path and a block pointer to f32\[16, 32\] on another", None),
])
def test_tensor_descriptor_misuse(body, col, message, hint):
    err = typing_error(body, "desc.nk")
    assert_diagnostic(err, "desc.nk", 3 if body.startswith((TD, BP)) else 2, col, message, hint)


# ---- math, random numbers, memory model and debugging builtins (issue 15) --------------------------------
@pytest.mark.parametrize("body, col, message, hint", [
    ("y = libdevice.j00(load(x))\n", 9, r"'libdevice.j00' is not a CUDA math function", r"did you mean libdevice.j0"),
    ("y = libdevice.zzzz(1.0)\n", 9, r"'libdevice.zzzz' is not a CUDA math function", r"libdevice.NAME calls .* NAMEf"),
    ("y = libdevice(1.0)\n", 9, "libdevice is the CUDA math library, not a function", r"libdevice.j0\(x\)"),
    ("y = pow(load(x))\n", 9, r"pow\(\) takes 2 arguments, got 1", None),
    ("y = libdevice.hypot(1.0, 2.0, 3.0)\n", 9, r"libdevice.hypot\(\) takes 2 arguments, got 3", None),
    ("y = asin(x)\n", 9, r"asin\(\) needs numbers, got \*f32", None),
    ("y = round(load(x), mode=1)\n", 9, r"round\(\): got an unexpected keyword argument 'mode'", None),
    ("y = umulhi(load(x), 3)\n", 9, r"umulhi\(\) takes 32- or 64-bit integers, got f32", None),
    ("y = umulhi(arange(0, 4).to(i16), 3)\n", 9, r"umulhi\(\) takes 32- or 64-bit integers, got i16", None),
    ("y = clamp(arange(0, 4) < n, False, True)\n", 9, r"clamp\(\) needs numbers, got bool\[4\]", None),
    ("y = clamp(load(x))\n", 9, r"clamp\(\): missing a required argument: 'lo'", r"signature: clamp\(x, lo, hi\)"),
    ("y = rand(n, load(x + arange(0, 4)))\n", 9, "random numbers take a scalar integer seed and 32- or 64-bit "
     r"integer offsets, got a scalar of type i32 and a block of type f32\[4\]", None),
    ("y = rand(arange(0, 4), arange(0, 4))\n", 9, "random numbers take a scalar integer seed", None),
    ("y = randn(1.5, arange(0, 4))\n", 9, "random numbers take a scalar integer seed", None),
    ("y = randint(n, arange(0, 4).to(i16))\n", 9, "32- or 64-bit integer offsets", None),
    ("y = rand(n, arange(0, 4), n)\n", 9, "n_rounds must be a compile-time constant", "constexpr"),
    ("y = rand(n, arange(0, 4), 0)\n", 9, "n_rounds must be an integer from 1 to 64, got int 0", None),
    ("y = atomic_add(x, 1.0, sem='seq_cst')\n", 9, r"sem=the string 'seq_cst' is not one of 'relaxed', 'acquire', "
     "'release', 'acq_rel'", "the PTX memory model"),
    ("y = atomic_max(x, 1.0, scope='block')\n", 9, r"scope=the string 'block' is not one of 'gpu', 'cta', 'sys'", None),
    ("y = atomic_cas(x, 1.0, 2.0, sem=n)\n", 9, r"sem=a scalar of type i32 is not one of", None),
    ("y = atomic_or(x, 1)\n", 9, "atomic_or needs integer elements, got f32", None),
    ("y = atomic_xor(x, 1, sem='relaxed', order=2)\n", 9, r"atomic_xor\(\): got an unexpected keyword argument 'order'",
     r"signature: atomic_xor\(ptr, val, mask, sem, scope\)"),
    ("debug_barrier(1)\n", 5, r"debug_barrier\(\): too many positional arguments", None),
    ("device_assert(n > 0, 42)\n", 5, r"device_assert\(\) takes a string message, got int 42", None),
    ("device_assert(x, 'no pointers')\n", 5, r"a pointer \(\*f32\) cannot be a condition or a mask", None),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', n, i32, True, 2)\n", 9,
     r"constraints '=r,r' must be 2 output\(s\) \('=r'\) and then 2 input\(s\)", "pack=2 elements per asm statement"),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', n, i32, True, 3)\n", 9,
     r"inline_asm_elementwise\(pack=int 3\): pack is a power of two from 1 to 16", None),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', n < 3, i32, True, 1)\n", 9,
     r"inline_asm_elementwise\(\) takes numbers", "convert bools and pointers to an integer type"),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r', [n], i32, True, 1)\n", 9,
     r"constraints '=r' must be 1 output\(s\) \('=r'\) and then 1 input\(s\)", None),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,l', [n], i32, True, 1)\n", 9,
     "constraint 'l' does not fit 32 bits", "'h' holds 16 bits"),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [n], i32, 1, 1)\n", 9,
     r"inline_asm_elementwise\(\) takes the asm and constraint strings", None),
    ("y = inline_asm_elementwise('mov.b32 $0, $1;', '=r,r', [n], (i32, i32), True, 1)\n", 9,
     r"inline_asm_elementwise\(\) takes the asm and constraint strings, a list of arguments, one result dtype", None),
    ("y = n.to(pointer_type(f32))\n", 9, r"cannot convert i32 to \*f32", "to and from a 64-bit integer"),
    ("y = x.to(f32)\n", 9, r"cannot convert \*f32 to f32", None),
    ("y = x.to(pointer_type(3))\n", 14, r"pointer_type\(\) takes a dtype, got int 3", None),
])
def test_builtin_misuse_is_a_diagnostic(body, col, message, hint):
    err = typing_error(body, "misuse.nk")
    assert_diagnostic(err, "misuse.nk", 2, col, message, hint)


def test_a_failed_device_assert_in_the_interpreter_is_located():
    x = torch.arange(8.0)
    err = launch_error("""\
        kernel k(x, n):
            offs = arange(0, 8)
            v = load(x + offs)
            device_assert(v < n, "v stays below n", mask=offs < 6)
    """, "assert.nk", x, 5)
    assert_diagnostic(err, "assert.nk", 4, 5, "device_assert failed: v stays below n",
                      r"program \(0, 0, 0\), element \[5\]")
# ---- scans, sorting and data movement ----------------------------------------------------------------------
@pytest.mark.parametrize("body, col, message, hint", [
    ("y = cumsum(n)\n", 9, r"cumsum\(\) takes a block of numbers, got a scalar of type i32", None),
    ("y = cumprod(arange(0, 8), axis=1)\n", 9, "the scan axis int 1 is not an axis of a block of rank 1", None),
    ("y = cumsum(arange(0, 8), reverse=1)\n", 9, "reverse must be True or False, got int 1", None),
    ("y = cumsum(arange(0, 8), dtype=3)\n", 9, "dtype must be a dtype, got int 3", None),
    ("y = associative_scan(arange(0, 8), 0, n)\n", 9, "combine_fn must name a `def` helper", r"def add\(a, b\)"),
    ("y = associative_scan(arange(0, 8), 0, cumsum)\n", 9, "combine_fn must name a `def` helper, got the function",
     None),
    ("y = sort(arange(0, 8), descending=n > 0)\n", 9, "descending must be a compile-time constant", "constexpr"),
    ("y = sort(x)\n", 9, r"sort\(\) takes a block of numbers, got a scalar of type \*f32", None),
    ("y = topk(arange(0, 8), 3)\n", 9, r"k must be a power of two of at most 8 \(the size of dim 0\), got int 3", None),
    ("y = topk(arange(0, 8), 16)\n", 9, "k must be a power of two of at most 8", None),
    ("y = flip(zeros([4, 8]), 2)\n", 9, "the flip dim int 2 is not an axis of a block of rank 2", None),
    ("y = gather(arange(0, 8), 1.0, 0)\n", 9, r"gather\(\) takes an integer index block of rank 1", None),
    ("y = gather(zeros([4, 8]), zeros([2, 8], i32), 1)\n", 9, r"index i32\[2, 8\] and source f32\[4, 8\] differ", None),
    ("y = histogram(zeros([8]), 4)\n", 9, r"histogram\(\) counts a block of integers, got a block of type f32\[8\]", None),
    ("y = histogram(arange(0, 8), 6)\n", 9, "num_bins must be a power of two, got int 6", None),
    ("y = histogram(arange(0, 8), 8, mask=zeros([2, 8]) > 0)\n", 9, r"the mask bool\[2, 8\] does not broadcast", None),
    ("a, b = split(arange(0, 8))\n", 12, r"split\(\) takes a block whose last dim is 2, got i32\[8\]", r"join\(a, b\)"),
    ("y = join(x, x)\n", 9, r"join\(\) takes numbers, not pointers", None),
    ("y = cat(arange(0, 8), arange(0, 4))\n", 9, r"cat\(\) takes two blocks of one shape, got i32\[8\] and i32\[4\]", None),
    ("y = full_like(x, 1.0)\n", 9, "expected a block or a scalar of numbers, got a scalar of type \\*f32", None),
])
def test_scan_and_move_misuse(body, col, message, hint):
    err = typing_error(body, "moves.nk")
    assert_diagnostic(err, "moves.nk", 2, col, message, hint)


@pytest.mark.parametrize("helper, line, col, message", [
    ("def f(a, b):\n    return a, b\n", 4, 9, "the combine function returns 2 values for a scan of 1 blocks"),
    ("def f(a, b):\n    return zeros([4]) + a\n", 4, 9, r"returns a block \(f32\[4\]\); it combines scalars"),
    ("def f(a, b):\n    return a + program_id(0)\n", 2, 16, "a combine function computes on its arguments only"),
    ("def f(a):\n    return a\n", 4, 9, r"f\(\) takes 1 arguments, 2 given"),
])
def test_bad_combine_functions(helper, line, col, message):
    mod = newtc.compile(helper + "kernel k(x):\n    y = associative_scan(arange(0, 8), 0, f)\n", "combine.nk")
    with pytest.raises(newtc.NkError) as e:
        mod.k[(1,)](x4())
    assert_diagnostic(e.value, "combine.nk", line, col, message)
