"""newtc/check.py: AST + specialization -> typed tile IR.

Each test types a small kernel with `check(parse(text), name, sig, constexprs, num_warps)`, runs the IR
verifier on the result, and inspects op kinds, result types and the printed IR.
"""
import concurrent.futures
import random
import re
import textwrap

import pytest

from newtc import ir
from newtc.check import check
from newtc.compiler import Spec
from newtc.errors import NkError
from newtc.syntax import parse
from newtc.types import DTYPES, Ptr, Type, bf16, bool_, f16, f32, f64, f8e4m3, f8e5m2, i8, i16, i32, i64, u8, u32

# every op kind the checker may emit (ir.py's list); in particular no "call"
KNOWN_KINDS = (ir.ELEMENTWISE | ir.VIEWS | {"const", "program_id", "num_programs", "arange", "load", "store",
                                            "atomic", "reduce", "dot", "for", "if", "yield", "print", "assert", "asm",
                                            "barrier"})


def typed(body: str, sig: dict | None = None, constexprs: dict | None = None, *, params: str | None = None,
          helpers: str = "", num_warps: int = 4, idx64: bool = False) -> ir.Kernel:
    """Type `body` as the body of `kernel k(...)`; the params default to sig's names then the constexprs."""
    sig, constexprs = sig or {}, constexprs or {}
    if params is None:
        params = ", ".join([*sig, *(f"{c}: constexpr" for c in constexprs)])
    text = textwrap.dedent(helpers) + f"kernel k({params}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    k = check(parse(text, "t.nk"), "k", Spec.of(sig, constexprs, num_warps=num_warps, idx64=idx64))
    ir.verify(k)
    assert {op.kind for op in ir.walk(k.body)} <= KNOWN_KINDS
    return k


def ops(k: ir.Kernel, kind: str | None = None) -> list:
    return [op for op in ir.walk(k.body) if kind is None or op.kind == kind]


def value(k: ir.Kernel, name: str) -> ir.Value:
    """The last value the program bound to `name` (the checker names values after their variables)."""
    found = [r for op in ir.walk(k.body) for r in op.results if r.name == name]
    assert found, f"no value named {name!r} in\n{ir.print_kernel(k)}"
    return found[-1]


def kinds(k: ir.Kernel) -> list[str]:
    return [op.kind for op in ops(k)]


def consts(k: ir.Kernel) -> list:
    return [op.attrs["value"] for op in ops(k, "const")]


# ---- dtype promotion ------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b, want", [
    (i32, f32, f32),
    (f16, bf16, f32),
    (bf16, f16, f32),
    (i32, i64, i64),
    (i64, i32, i64),
    (f16, f32, f32),
    (f32, f64, f64),
    (f16, i64, f16),
    (i8, i16, i16),
    (u32, i32, u32),
    (i32, u32, u32),
    (bool_, i8, i8),
    (u8, bool_, u8),
    (f32, f32, f32),
    (f8e4m3, f8e4m3, f8e4m3),  # fp8, as Triton: two formats meet in f16, bf16 in f32
    (f8e4m3, f8e5m2, f16),
    (f8e5m2, f16, f16),
    (bf16, f8e4m3, f32),
    (f8e5m2, f32, f32),
    (f64, f8e4m3, f64),
])
def test_promotion_of_two_runtime_scalars(a, b, want):
    k = typed("t = a + b\n", {"a": a, "b": b})
    t = value(k, "t")
    assert t.type == Type((), want)
    add = ops(k, "add")[0]
    assert [x.type.dtype for x in add.args] == [want, want]
    half = {name for name, t in (("a", a), ("b", b)) if t.is_float and t.bits < 32}  # such a scalar arrives as f32
    entry = [op for op in ops(k, "cast") if op.args[0] in k.params and op.args[0].name in half]
    assert [op.args[0].type.dtype for op in entry] == [f32] * len(half)
    promotions = [op for op in ops(k, "cast") if op not in entry]
    assert len(promotions) == (a != want) + (b != want)


def test_promotion_in_blocks():
    k = typed("""\
        a = load(x + arange(0, 8))
        b = load(y + arange(0, 8))
        t = a * b
    """, {"x": Ptr(f16), "y": Ptr(bf16)})
    assert value(k, "t").type == Type((8,), f32)
    assert [op.result.type for op in ops(k, "cast")] == [Type((8,), f32)] * 2


def test_comparisons_produce_bool_after_promotion():
    k = typed("t = a < b\n", {"a": i32, "b": f32})
    assert value(k, "t").type == Type((), bool_)
    lt = ops(k, "lt")[0]
    assert lt.args[0].type.dtype == lt.args[1].type.dtype == f32


def test_true_division_of_ints_is_f32():
    k = typed("t = a / b\n", {"a": i32, "b": i64})
    assert value(k, "t").type.dtype == f32
    assert ops(k, "div")[0].args[0].type.dtype == f32


# ---- weak literals ---------------------------------------------------------------------------------
def test_int_literal_keeps_f16():
    k = typed("v = load(x + arange(0, 8))\nt = v * 2\n", {"x": Ptr(f16)})
    assert value(k, "t").type == Type((8,), f16)
    assert not ops(k, "cast")
    (two,) = [op for op in ops(k, "const") if op.attrs["value"] == 2]
    assert two.result.type == Type((), f16)


def test_float_literal_keeps_f16():
    k = typed("v = load(x + arange(0, 8))\nt = 0.5 * v\n", {"x": Ptr(f16)})
    assert value(k, "t").type == Type((8,), f16)
    assert not ops(k, "cast")


def test_float_literal_next_to_int_gives_f32():
    k = typed("t = i + 1.5\n", {"i": i32})
    assert value(k, "t").type == Type((), f32)
    assert [op.result.type.dtype for op in ops(k, "cast")] == [f32]


def test_int_literal_keeps_i64_and_u8():
    k = typed("t = n + 1\nu = b - 1\n", {"n": i64, "b": u8})
    assert value(k, "t").type.dtype == i64
    assert value(k, "u").type.dtype == u8
    assert not ops(k, "cast")


def test_int_literal_next_to_float_block_keeps_its_dtype():
    k = typed("t = arange(0, 4) + 1.0\n")
    assert value(k, "t").type == Type((4,), f32)


def test_int_literal_next_to_bool_is_i32():
    k = typed("t = (n > 0) + 1\n", {"n": i32})
    assert value(k, "t").type.dtype == i32


# ---- scalars, blocks, broadcasting -----------------------------------------------------------------
def test_scalar_and_block_values():
    k = typed("pid = program_id(0)\noffs = pid * 128 + arange(0, 128)\n")
    assert value(k, "pid").type == Type((), i32) and not value(k, "pid").type.is_block
    assert value(k, "offs").type == Type((128,), i32) and value(k, "offs").type.is_block
    assert ops(k, "splat")[0].result.type == Type((128,), i32)


def test_outer_broadcast_shapes():
    k = typed("""\
        a = load(x + arange(0, 8))
        b = load(x + arange(0, 16))
        t = a[:, None] + b[None, :]
    """, {"x": Ptr(f32)})
    assert value(k, "t").type == Type((8, 16), f32)
    exp = ops(k, "expand_dims")
    assert [(op.attrs["axis"], op.result.type.shape) for op in exp] == [(1, (8, 1)), (0, (1, 16))]
    assert [op.result.type.shape for op in ops(k, "broadcast")] == [(8, 16), (8, 16)]
    assert "add(" in ir.print_kernel(k) and "f32[8, 16]" in ir.print_kernel(k)


def test_broadcast_aligns_ranks_on_the_right():
    k = typed("t = arange(0, 4)[:, None] + arange(0, 16)\n")
    assert value(k, "t").type == Type((4, 16), i32)


def test_pointer_arithmetic_broadcasts_to_a_block_of_pointers():
    k = typed("p = x + arange(0, 4)[:, None] * 8 + arange(0, 8)[None, :]\n", {"x": Ptr(f16)})
    assert value(k, "p").type == Type((4, 8), Ptr(f16))
    assert all(op.result.type.dtype == Ptr(f16) for op in ops(k, "ptradd"))


def test_shape_mismatch_is_an_error():
    with pytest.raises(NkError, match=r"shapes \[128\] and \[64\] do not broadcast"):
        typed("t = arange(0, 128) + arange(0, 64)\n")


# ---- power-of-two shapes ----------------------------------------------------------------------------
@pytest.mark.parametrize("expr", ["arange(0, 12)", "arange(4, 10)", "zeros([6])", "full([4, 3], 1.0)",
                                  "reshape(arange(0, 8), [2, 3])", "zeros([0])"])
def test_non_power_of_two_shapes_are_rejected(expr):
    with pytest.raises(NkError, match="power of two|element counts differ"):
        typed(f"t = {expr}\n")


def test_arange_with_offset_start():
    k = typed("t = arange(8, 16)\n")
    (op,) = ops(k, "arange")
    assert op.attrs == {"start": 8, "end": 16} and op.result.type == Type((8,), i32)


def test_verifier_rejects_a_non_power_of_two_block():
    k = typed("t = arange(0, 8)\n")
    ops(k, "arange")[0].results[0].type = Type((6,), i32)
    with pytest.raises(NkError, match="not a power of two"):
        ir.verify(k)


def test_verifier_rejects_mismatched_operands():
    k = typed("t = a + b\n", {"a": i32, "b": i32})
    ops(k, "add")[0].args[1] = ir.Value(Type((), i64))
    with pytest.raises(NkError, match="internal IR error"):
        ir.verify(k)


# ---- constexpr folding ------------------------------------------------------------------------------
@pytest.mark.parametrize("cond", [
    "-7 // 2 == -3", "-7 % 2 == -1", "7 // -2 == -3", "7 % -2 == 1", "-8 // 2 == -4", "7 // 2 == 3",
    "-7.0 // 2 == -4.0", "-7.0 % 2 == -1.0", "7 / 2 == 3.5",
    "B * 4 + 1 == 33", "(B << 2) | 1 == 33", "B // 3 == 2", "-B % 3 == -2", "max(B, 3) == 8", "min(B, 3) == 3",
    "cdiv(B + 1, 4) == 3", "B == 8 and not B == 9", "MODE == 'sum'", "DT == f16",
])
def test_constexpr_folding_is_c_like(cond):
    k = typed(f"static_assert({cond}, 'folded')\n", constexprs={"B": 8, "MODE": "sum", "DT": f16})
    assert ops(k) == []  # compile-time arithmetic produces no code


def test_folded_constant_reaches_the_ir_as_one_const():
    k = typed("store(x, -7 // 2)\nstore(x + 1, -7 % 2)\nstore(x + 2, B * B - 1)\n", {"x": Ptr(i32)}, {"B": 4})
    assert [op.result.type.dtype for op in ops(k, "const")] == [i32] * 5
    assert [v.attrs["value"] for v in ops(k, "const")] == [-3, 1, -1, 2, 15]
    assert not ops(k, "floordiv") and not ops(k, "mod") and not ops(k, "mul")


def test_constant_division_by_zero():
    with pytest.raises(NkError, match="division by zero"):
        typed("t = B // 0\n", constexprs={"B": 4})


# ---- static_assert ----------------------------------------------------------------------------------
def test_static_assert_passes_silently():
    k = typed("static_assert(B % 2 == 0, 'even')\n", constexprs={"B": 64})
    assert ops(k) == []


def test_static_assert_failure_carries_the_message():
    with pytest.raises(NkError, match="static_assert failed: B must be even") as e:
        typed("static_assert(B % 2 == 0, 'B must be even')\n", constexprs={"B": 7})
    assert e.value.span.line == 2


def test_static_assert_needs_a_constant():
    with pytest.raises(NkError, match="must be a compile-time constant"):
        typed("static_assert(n > 0)\n", {"n": i32})


def test_static_assert_message_is_a_string():  # a mutant of the fuzzer's: a constexpr in its place was a TypeError
    with pytest.raises(NkError, match="message is a string"):
        typed("static_assert(B > 0, B)\n", constexprs={"B": 8})


# ---- helpers ----------------------------------------------------------------------------------------
def test_helpers_are_inlined():
    k = typed("""\
        v = load(x + arange(0, 16))
        store(x + arange(0, 16), gelu(scale(v, 2.0)))
    """, {"x": Ptr(f32)}, helpers="""\
        def scale(v, f):
            return v * f

        def gelu(v):
            return 0.5 * v * (1.0 + erf(v * 0.7071067811865476))

    """)
    assert "call" not in kinds(k)
    assert kinds(k).count("mul") == 4 and "erf" in kinds(k)
    assert ops(k, "store")[0].args[1].type == Type((16,), f32)


def test_helper_defined_after_the_kernel_and_with_keywords_and_defaults():
    text = textwrap.dedent("""\
        kernel k(x):
            store(x, h(1.0, b=3.0))
            store(x + 1, h(2.0))
        def h(a, b=10.0):
            return a * b
    """)
    k = check(parse(text, "t.nk"), "k", Spec.of({"x": Ptr(f32)}))
    ir.verify(k)
    assert [op.attrs["value"] for op in ops(k, "const")] == [3.0, 1, 20.0]  # folded: h of constants


def test_helper_returns_a_tuple():
    k = typed("""\
        v = load(x + arange(0, 8))
        a, b = stats(v)
        store(x, a + b)
    """, {"x": Ptr(f32)}, helpers="""\
        def stats(v):
            return sum(v, axis=0), max(v, axis=0)

    """)
    assert value(k, "a").type == Type((), f32) and value(k, "b").type == Type((), f32)
    assert [op.attrs["kind"] for op in ops(k, "reduce")] == ["sum", "max"]


@pytest.mark.parametrize("dt,summed", [(i8, i32), (i16, i32), (u8, u32), (i64, i64), (f16, f16)])
def test_sum_of_narrow_integers_is_32_bit(dt, summed):
    """As Triton's sum (and cumsum): integers narrower than 32 bits sum in 32, so 512 bytes of 127 do not wrap."""
    k = typed("""\
        s = sum(load(x + arange(0, 8)), axis=0)
        store(y, s)
    """, {"x": Ptr(dt), "y": Ptr(summed)})
    assert value(k, "s").type == Type((), summed)


def test_helper_constexpr_parameter_must_be_constant():
    helpers = "def rep(v, N: constexpr):\n    return v * N\n\n"
    typed("t = rep(n, 4)\n", {"n": i32}, helpers=helpers)
    with pytest.raises(NkError, match="argument 'N' must be a compile-time constant"):
        typed("t = rep(n, n)\n", {"n": i32}, helpers=helpers)


def test_a_kernel_cannot_be_called():
    with pytest.raises(NkError, match="is a kernel"):
        typed("t = k(x)\n", {"x": Ptr(f32)})


# ---- static_range -----------------------------------------------------------------------------------
def test_static_range_unrolls():
    k = typed("""\
        for i in static_range(4):
            store(x + i, i * 10)
    """, {"x": Ptr(i32)})
    assert "for" not in kinds(k)
    assert len(ops(k, "store")) == 4
    stored = [op.args[1] for op in ops(k, "store")]
    defs = {id(op.result): op for op in ops(k, "const")}
    assert [defs[id(v)].attrs["value"] for v in stored] == [0, 10, 20, 30]


def test_static_range_with_start_and_step_and_a_runtime_accumulator():
    k = typed("""\
        acc = load(x)
        for i in static_range(1, 8, 3):
            acc = acc + load(x + i)
        store(x, acc)
    """, {"x": Ptr(f32)})
    assert len(ops(k, "load")) == 1 + len(range(1, 8, 3))
    assert "for" not in kinds(k)


def test_static_range_needs_constants():
    with pytest.raises(NkError, match="static_range end must be a compile-time constant"):
        typed("for i in static_range(n):\n    pass\n", {"n": i32})


# ---- constexpr if -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, want", [("sum", "add"), ("max", "maximum"), ("min", "minimum")])
def test_constexpr_if_picks_one_branch(mode, want):
    k = typed("""\
        if MODE == "sum":
            t = a + b
        elif MODE == "max":
            t = maximum(a, b)
        elif MODE == "min":
            t = minimum(a, b)
        else:
            t = this_name_does_not_exist
    """, {"a": f32, "b": f32}, {"MODE": mode})
    assert kinds(k) == [want]
    assert "if" not in kinds(k)


def test_constexpr_if_skips_the_ill_typed_branch():
    k = typed("""\
        if HAS_BIAS:
            t = load(bias) + undefined
        else:
            t = 0.0
        store(x, t)
    """, {"x": Ptr(f32), "bias": Ptr(f32)}, {"HAS_BIAS": False})
    assert kinds(k) == ["const", "store"]


# ---- runtime for ------------------------------------------------------------------------------------
def test_runtime_for_with_a_literal_init_widened_by_the_body():
    k = typed("""\
        s = 0
        for i in range(0, n):
            s += load(x + i)
        store(x, s)
    """, {"x": Ptr(f32), "n": i32})
    (loop,) = ops(k, "for")
    assert [r.type for r in loop.results] == [Type((), f32)]
    init = loop.args[3]
    init_op = next(op for op in ops(k) if init in op.results)
    assert init_op.kind == "const" and init_op.attrs["value"] == 0.0 and init.type.dtype == f32
    body = loop.regions[0]
    assert [p.type for p in body.params] == [Type((), i32), Type((), f32)]
    assert body.ops[-1].kind == "yield" and body.ops[-1].args[0].type == Type((), f32)
    assert ops(k, "store")[0].args[1] is loop.results[0]  # after the loop, `s` is the final value
    assert "cast" not in kinds(k)


def test_runtime_for_carries_blocks_and_literals():
    k = typed("""\
        acc = zeros([B], f32)
        m = -inf
        count = 0
        for start in range(0, n, B):
            v = load(x + start + arange(0, B))
            acc += v
            m = maximum(m, v)
            count += 1
        store(x + arange(0, B), acc + m)
        store(x, count)
    """, {"x": Ptr(f32), "n": i32}, {"B": 16})
    (loop,) = ops(k, "for")
    assert [(r.name, r.type) for r in loop.results] == [
        ("acc", Type((16,), f32)), ("m", Type((16,), f32)), ("count", Type((), i32))]
    assert loop.args[2].type == Type((), i32)  # the step, the constexpr B
    assert "v" not in {r.name for r in loop.results}  # first assigned in the body: not carried


def test_runtime_for_induction_variable_takes_the_promoted_bound_dtype():
    k = typed("for i in range(0, n):\n    store(x + i, 1.0)\n", {"x": Ptr(f32), "n": i64})
    (loop,) = ops(k, "for")
    assert loop.regions[0].params[0].type == Type((), i64)
    assert [a.type.dtype for a in loop.args[:3]] == [i64] * 3


def test_runtime_for_counting_down():
    k = typed("for i in range(n, 0, -1):\n    store(x + i, 1.0)\n", {"x": Ptr(f32), "n": i32})
    (loop,) = ops(k, "for")
    step = next(op for op in ops(k) if loop.args[2] in op.results)
    assert step.kind == "const" and step.attrs["value"] == -1


def test_nested_runtime_loops_carry_through_both():
    k = typed("""\
        s = 0.0
        for i in range(0, n):
            for j in range(0, n):
                s += load(x + i * n + j)
        store(x, s)
    """, {"x": Ptr(f32), "n": i32})
    outer, inner = ops(k, "for")
    assert outer.results[0].type == inner.results[0].type == Type((), f32)
    assert inner.args[3] is outer.regions[0].params[1]


def test_names_first_assigned_in_a_loop_are_not_visible_after():
    with pytest.raises(NkError, match="unknown name 't'"):
        typed("""\
            for i in range(0, n):
                t = load(x + i)
            store(x, t)
        """, {"x": Ptr(f32), "n": i32})


def test_carried_shape_must_stay_the_same():
    with pytest.raises(NkError, match=r"'acc' is f32\[8, 8\] on one path and f32\[8\] on another"):
        typed("""\
            acc = zeros([8], f32)
            for i in range(0, n):
                acc = acc[:, None] + zeros([8, 8], f32)
        """, {"n": i32})


def test_zero_step_is_rejected():
    with pytest.raises(NkError, match="step must not be zero"):
        typed("for i in range(0, n, 0):\n    pass\n", {"n": i32})


# ---- runtime if -------------------------------------------------------------------------------------
def test_runtime_if_joins_a_literal_and_an_int_to_f32():
    k = typed("""\
        if n > 0:
            y = 1.5
        else:
            y = n
        store(x, y)
    """, {"x": Ptr(f32), "n": i32})
    (br,) = ops(k, "if")
    assert [(r.name, r.type) for r in br.results] == [("y", Type((), f32))]
    for region in br.regions:
        assert region.ops[-1].kind == "yield" and region.ops[-1].args[0].type == Type((), f32)
    assert br.args[0].type == Type((), bool_)


def test_runtime_if_joins_a_block_with_the_value_before():
    k = typed("""\
        v = 0.0
        if n > 0:
            v = load(x + arange(0, 8))
        store(x + arange(0, 8), v)
    """, {"x": Ptr(f16), "n": i32})
    (br,) = ops(k, "if")
    assert br.results[0].type == Type((8,), f16)
    assert br.regions[1].ops[-1].args[0].type == Type((8,), f16)  # the else side: the literal, splat


def test_runtime_if_with_an_int_condition_tests_nonzero():
    k = typed("if n:\n    store(x, 1.0)\n", {"x": Ptr(f32), "n": i32})
    (br,) = ops(k, "if")
    assert br.args[0].type == Type((), bool_)
    assert "ne" in kinds(k)


def test_names_assigned_in_one_branch_only_are_not_visible_after():
    with pytest.raises(NkError, match="unknown name 'y'"):
        typed("""\
            if n > 0:
                y = 1.0
            store(x, y)
        """, {"x": Ptr(f32), "n": i32})


def test_block_if_condition_is_rejected():
    with pytest.raises(NkError, match="must be a scalar"):
        typed("if arange(0, 4) < n:\n    pass\n", {"n": i32})


# ---- reductions -------------------------------------------------------------------------------------
TILE = "v = load(x + arange(0, 4)[:, None] * 8 + arange(0, 8)[None, :])\n"


@pytest.mark.parametrize("kind", ["sum", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("axis, keep, shape", [
    (0, False, (8,)), (1, False, (4,)), (-1, False, (4,)), (0, True, (1, 8)), (1, True, (4, 1)),
    (None, False, ()),
])
def test_reduction_shapes(kind, axis, keep, shape):
    k = typed(TILE + f"t = {kind}(v, axis={axis}, keep_dims={keep})\n", {"x": Ptr(f16)})
    t = value(k, "t")
    assert t.type == Type(shape, i32 if kind.startswith("arg") else f16)
    op = ops(k, "reduce")[0]
    assert op.attrs["kind"] == kind and op.attrs["keep_dims"] == keep
    assert op.attrs["axis"] == ({None: 0, -1: 1}.get(axis, axis))


def test_full_reduction_with_keep_dims_keeps_the_rank():
    k = typed(TILE + "t = sum(v, keep_dims=True)\n", {"x": Ptr(f32)})
    assert value(k, "t").type == Type((1, 1), f32)


def test_sum_of_bool_is_i32():
    k = typed("t = sum(arange(0, 16) < n, axis=0)\n", {"n": i32})
    assert value(k, "t").type == Type((), i32)


def test_reduction_axis_out_of_range():
    with pytest.raises(NkError, match="axis 2 is out of range for a block of rank 2"):
        typed(TILE + "t = sum(v, axis=2)\n", {"x": Ptr(f32)})


def test_max_of_two_constants_folds():
    k = typed("static_assert(max(3, B) == 5)\n", constexprs={"B": 5})
    assert ops(k) == []


# ---- shape ops, dot, conversions ---------------------------------------------------------------------
def test_reshape_trans_broadcast_to():
    k = typed(TILE + textwrap.dedent("""\
        r = reshape(v, [32])
        r2 = reshape(v, [2, 2, 8])
        t = trans(v)
        t3 = trans(r2, 2, 0, 1)
        t4 = trans(r2, [1, 0, 2])
        b = broadcast_to(load(x + arange(0, 8))[None, :], [4, 8])
        s = broadcast_to(n, [2, 4])
    """), {"x": Ptr(f32), "n": i32})
    assert value(k, "r").type.shape == (32,)
    assert value(k, "r2").type.shape == (2, 2, 8)
    assert value(k, "t").type.shape == (8, 4)
    assert ops(k, "trans")[0].attrs["perm"] == (1, 0)
    assert value(k, "t3").type.shape == (8, 2, 2) and ops(k, "trans")[1].attrs["perm"] == (2, 0, 1)
    assert value(k, "t4").type.shape == (2, 2, 8)
    assert value(k, "b").type == Type((4, 8), f32)
    assert value(k, "s").type == Type((2, 4), i32)


@pytest.mark.parametrize("expr, match", [
    ("reshape(v, [64])", "element counts differ"),
    ("trans(v, 0, 0)", "not a permutation"),
    ("broadcast_to(v, [8, 8])", "do not broadcast"),
    ("broadcast_to(v, [8])", "cannot broadcast|do not broadcast"),
])
def test_shape_op_errors(expr, match):
    with pytest.raises(NkError, match=match):
        typed(TILE + f"t = {expr}\n", {"x": Ptr(f32)})


@pytest.mark.parametrize("elem, acc, want", [(f16, None, f32), (f32, None, f32), (f64, None, f64),
                                             (f16, "f16", f16), (bf16, "f32", f32)])
def test_dot_shapes_and_dtypes(elem, acc, want):
    acc_arg = f", zeros([16, 8], {acc})" if acc else ""
    k = typed(f"""\
        a = load(x + arange(0, 16)[:, None] * 32 + arange(0, 32)[None, :])
        b = load(x + arange(0, 32)[:, None] * 8 + arange(0, 8)[None, :])
        c = dot(a, b{acc_arg})
        d = a @ b
    """, {"x": Ptr(elem)})
    assert value(k, "c").type == Type((16, 8), want)
    assert value(k, "d").type == Type((16, 8), f64 if elem == f64 else f32)
    assert all(op.args[2].type == op.result.type for op in ops(k, "dot"))


def test_dot_inner_dimensions_must_agree():
    with pytest.raises(NkError, match="inner dimensions differ"):
        typed("c = dot(zeros([16, 16]), zeros([8, 16]))\n")


def test_to_converts_and_bitcasts():
    k = typed("""\
        v = load(x + arange(0, 8))
        h = v.to(f16)
        bits = v.to(i32, bitcast=True)
        same = v.to(f32)
        n16 = n.to(bf16)
    """, {"x": Ptr(f32), "n": i32})
    assert value(k, "h").type == Type((8,), f16)
    assert value(k, "bits").type == Type((8,), i32)
    assert [op.kind for op in ops(k) if op.results and op.result.name in ("h", "bits")] == ["cast", "bitcast"]
    assert value(k, "n16").type == Type((), bf16)
    assert len(ops(k, "cast")) == 2  # .to(f32) of an f32 is no op


def test_bitcast_needs_equal_widths():
    with pytest.raises(NkError, match="bitcast needs equal widths"):
        typed("t = n.to(f16, bitcast=True)\n", {"n": i32})


def test_store_converts_to_the_element_type():
    k = typed("store(x + arange(0, 4), arange(0, 4))\n", {"x": Ptr(f16)})
    (st,) = ops(k, "store")
    assert st.args[1].type == Type((4,), f16)


def test_store_value_must_broadcast_to_the_pointer_shape():
    with pytest.raises(NkError):
        typed("v = load(x + arange(0, 4))\nstore(x + arange(0, 4), v[:, None])\n", {"x": Ptr(f32)})


def test_load_mask_and_other():
    k = typed("""\
        offs = arange(0, 8)
        v = load(x + offs, mask=offs < n, other=-inf)
    """, {"x": Ptr(f16), "n": i32})
    (ld,) = ops(k, "load")
    assert ld.args[1].type == Type((8,), bool_)
    assert ld.args[2].type == Type((8,), f16)
    assert value(k, "v").type == Type((8,), f16)


# ---- annotations and index width -------------------------------------------------------------------
def test_annotations_fix_and_check_parameter_types():
    k = typed("store(x, n)\n", {"x": Ptr(f16), "n": i32}, params="x: *f16, n: i64")
    assert [p.type for p in k.params] == [Type((), Ptr(f16)), Type((), i64)]
    assert "%n" in ir.print_kernel(k).splitlines()[0] and ": i64" in ir.print_kernel(k).splitlines()[0]


def test_pointer_annotation_mismatch():
    with pytest.raises(NkError, match=r"declared \*f16 but got \*f32"):
        typed("pass\n", {"x": Ptr(f32)}, params="x: *f16")


def test_constexpr_default_and_missing_constexpr():
    k = typed("t = arange(0, B)\n", {}, {}, params="B: constexpr = 32")
    assert value(k, "t").type.shape == (32,)
    with pytest.raises(NkError, match="missing constexpr 'B'"):
        typed("t = arange(0, B)\n", {}, {}, params="B: constexpr")


@pytest.mark.parametrize("idx64, want", [(False, i32), (True, i64)])
def test_index_width(idx64, want):
    k = typed("""\
        pid = program_id(0)
        npg = num_programs(1)
        offs = pid * B + arange(0, B)
        local = arange(0, B) + 1
        store(x + offs, 1.0)
    """, {"x": Ptr(f32)}, {"B": 64}, idx64=idx64)
    assert value(k, "pid").type == Type((), want)
    assert value(k, "npg").type == Type((), want)
    assert value(k, "offs").type == Type((64,), want)
    assert value(k, "local").type == Type((64,), i32)  # offsets from arange alone stay i32
    assert ops(k, "program_id")[0].attrs == {"axis": 0}


def test_print_kernel_format():
    k = typed("""\
        offs = arange(0, B)
        v = load(x + offs, mask=offs < n)
        store(x + offs, v * 2, mask=offs < n)
    """, {"x": Ptr(f32), "n": i32}, {"B": 128})
    text = ir.print_kernel(k)
    lines = text.splitlines()
    assert lines[0].startswith("kernel @k(") and "num_warps=4" in lines[0] and "[B=128]" in lines[0]
    assert lines[-1] == "}"
    assert any("= load(" in ln and ": f32[128]" in ln and ln.endswith("# 3") for ln in lines)
    assert any(ln.strip().startswith("store(") for ln in lines)
    assert "arange() {start=0 end=128} : i32[128]" in text


def test_every_dtype_name_is_a_constant():
    for name, dt in DTYPES.items():
        k = typed(f"t = zeros([2], {name})\n")
        assert value(k, "t").type == Type((2,), dt)


# ---- the front end is re-entrant: an autotuner compiles from many threads --------------------------
THREAD_SOURCES = {
    "ok.nk": "kernel k(x, n, B: constexpr):\n    o = arange(0, B)\n    store(x + o, load(x + o, mask=o < n) * 2.0,"
             " mask=o < n)\n",
    "loop.nk": "def twice(v):\n    return v + v\n\nkernel k(x, n, B: constexpr):\n    acc = zeros([B], f32)\n"
               "    for i in range(0, n, B):\n        acc += twice(load(x + i + arange(0, B), mask=i + arange(0, B) < n))"
               "\n    store(x + arange(0, B), acc)\n",
    "open.nk": "kernel k(x, n, B: constexpr):\n    v = load(x + (arange(0, B),\n    store(x, 1.0)\n",
    "indent.nk": "kernel k(x, n, B: constexpr):\n    o = arange(0, B)\n      store(x + o, 1.0)\n",
    "tabs.nk": "kernel k(x, n, B: constexpr):\n\tif n > 0:\n\t        store(x, 1.0)\n",
    "type.nk": "kernel k(x, n, B: constexpr):\n    store(x + arange(0, B), load(x + arange(0, 2 * B)))\n",
    "helper.nk": "def f(v):\n    return v << 1.5\n\nkernel k(x, n, B: constexpr):\n    store(x, f(n))\n",
}
# the same file name for two texts: each diagnostic quotes its own text
THREAD_SOURCES["same.nk"] = "kernel k(x, n, B: constexpr):\n    store(x, nope)\n"
THREAD_JOBS = [*THREAD_SOURCES.items(), ("same.nk", "\n\nkernel k(x, n, B: constexpr):\n    y = 1\n    store(x, nah)\n")]


def canonical_ir(text: str) -> str:
    """IR text with value names renumbered by first appearance (ids come from a process-wide counter)."""
    names: dict = {}
    return re.sub(r"%\w+", lambda m: names.setdefault(m.group(), f"%{len(names)}"), text)


def front_end(job) -> str:
    from newtc import compiler

    file, text = job
    try:
        out = compiler.compile(parse(text, file), "k", Spec.of({"x": Ptr(f32), "n": i32}, {"B": 128}), until="cuda")
        return canonical_ir(ir.print_kernel(out.kernel)) + out.cuda.source
    except NkError as e:
        return e.render(color=False)


def test_compiling_from_many_threads_matches_serial():
    serial = [front_end(job) for job in THREAD_JOBS]
    assert sum("error:" in r for r in serial) == len(THREAD_JOBS) - 2  # two compile, the others are diagnostics
    assert "the '(' at 2:18 is still open here" in serial[2] and "same.nk:5:14" in serial[-1]
    jobs = [i for _ in range(12) for i in range(len(THREAD_JOBS))]
    random.Random(0).shuffle(jobs)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda i: (i, front_end(THREAD_JOBS[i])), jobs))
    for i, result in got:
        assert result == serial[i], THREAD_JOBS[i][0]


def test_random_numbers_are_elementwise_integer_ops():
    """Philox is unrolled by the checker into u32 multiplies, xors and umulhi: every later stage already knows them."""
    k = typed("store(x + arange(0, 8), rand(n, arange(0, 8), n_rounds=3))\n", {"x": Ptr(f32), "n": i32})
    hi = ops(k, "libm")
    assert [op.attrs["fn"] for op in hi] == ["umulhi"] * 6 and {op.result.type for op in hi} == {Type((8,), u32)}
    assert {op.kind for op in ops(k)} <= ir.ELEMENTWISE | {"const", "arange", "splat", "store"}


def test_atomics_carry_their_memory_order():
    k = typed("y = atomic_add(x, 1.0)\nz = atomic_xor(p, 1, sem='relaxed', scope='cta')\n",
              {"x": Ptr(f32), "p": Ptr(i32)})
    assert [(op.attrs["sem"], op.attrs["scope"]) for op in ops(k, "atomic")] == [("acq_rel", "gpu"), ("relaxed", "cta")]
