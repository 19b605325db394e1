"""The CPU interpreter against torch oracles: hand-built IR first, then `.nk` source through the checker."""
import contextlib

import numpy as np
import pytest
import torch

from newtc import interpret, ir
from newtc.compiler import Spec
from newtc import types as T
from newtc.errors import NkError, Span


@pytest.fixture(autouse=True)
def verify_values(monkeypatch):
    """Every op's values must have the dtype and shape its IR type gives (interpret._verify)."""
    monkeypatch.setenv("NEWT_VERIFY", "1")


class B:
    """A tiny IR builder: each call appends one op to the innermost open region."""

    def __init__(self):
        self.params, self.stack = [], [ir.Region()]

    def param(self, dtype, name=""):
        v = ir.Value(T.Type((), dtype), name)
        self.params.append(v)
        return v

    def __call__(self, op_kind, /, *args, t=None, line=1, **attrs):
        res = [ir.Value(t)] if t is not None else []
        self.stack[-1].ops.append(ir.Op(op_kind, list(args), res, attrs, Span("file.nk", line, 5)))
        return res[0] if res else None

    def const(self, v, dt):
        return self("const", t=T.Type((), dt), value=v)

    def bin(self, kind, a, b, **kw):
        out = T.bool_ if kind in ir.COMPARISONS else a.type.dtype
        return self(kind, a, b, t=T.Type(a.type.shape, out), **kw)

    def splat(self, s, shape):
        return self("splat", s, t=T.Type(shape, s.type.dtype))

    def arange(self, n):
        return self("arange", t=T.Type((n,), T.i32), start=0, end=n)

    @contextlib.contextmanager
    def region(self, *param_types):
        r = ir.Region([ir.Value(t) for t in param_types])
        self.stack.append(r)
        yield r
        self.stack.pop()

    def kernel(self):
        k = ir.Kernel("k", self.params, self.stack[0], Spec())
        ir.verify(k)
        return k


def offsets_1d(b, block, line=1):
    """pid * BLOCK + arange(BLOCK) and the mask offs < n, the usual 1-D prologue."""
    pid = b("program_id", t=T.Type((), T.i32), axis=0)
    start = b.bin("mul", pid, b.const(block, T.i32))
    offs = b.bin("add", b.splat(start, (block,)), b.arange(block))
    return offs


def ptr_at(b, p, offs):
    return b("ptradd", b.splat(p, offs.type.shape), offs, t=T.Type(offs.type.shape, p.type.dtype))


def elementwise_kernel(kind, dtype, block=64, line=1, strided=False):
    """out[i*so] = kind(x[i*sx], y[i*sy]) for i < n, over a 1-D grid of programs."""
    b = B()
    x, y, out = (b.param(T.Ptr(dtype)) for _ in range(3))
    n = b.param(T.i32)
    offs = offsets_1d(b, block)
    mask = b.bin("lt", offs, b.splat(n, (block,)))
    strides = [b.splat(b.param(T.i32), (block,)) for _ in range(3)] if strided else None
    scaled = [b.bin("mul", offs, s) for s in strides] if strided else [offs] * 3
    xv = b("load", ptr_at(b, x, scaled[0]), mask, None, t=T.Type((block,), dtype))
    yv = b("load", ptr_at(b, y, scaled[1]), mask, None, t=T.Type((block,), dtype))
    offs = scaled[2]
    r = b.bin(kind, xv, yv, line=line)
    if kind in ir.COMPARISONS:  # stored as 0/1 in the operand dtype
        r = b("cast", r, t=T.Type((block,), dtype))
    b("store", ptr_at(b, out, offs), r, mask)
    return b.kernel()


def cdiv(a, b):
    return (a + b - 1) // b


def test_vector_add_masked_grid():
    n, block = 1000, 64
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n + 5,), float("nan"))
    interpret.run(elementwise_kernel("add", T.f32, block), (cdiv(n, block), 1, 1), [x, y, out, n])
    assert torch.equal(out[:n], x + y)
    assert out[n:].isnan().all()  # the masked tail is never written


def test_non_contiguous_views_write_through():
    n = 300
    big_x, big_y = torch.randn(2 * n), torch.randn(3 * n)
    x, y = big_x[::2], big_y[1::3]
    base = torch.full((n, 2), float("nan"))
    out = base[:, 1]
    interpret.run(elementwise_kernel("mul", T.f32, strided=True), (cdiv(n, 64), 1, 1), [x, y, out, n, 2, 3, 2])
    assert torch.equal(base[:, 1], x * y)
    assert base[:, 0].isnan().all()


def test_f16_and_bf16_math_rounds_each_op():
    n = 513
    for dt, tdt in ((T.f16, torch.float16), (T.bf16, torch.bfloat16)):
        x, y = torch.randn(n, dtype=tdt), torch.randn(n, dtype=tdt)
        for kind, ref in (("add", torch.add), ("div", torch.div), ("maximum", torch.fmax)):
            out = torch.full((n,), float("nan"), dtype=tdt)
            interpret.run(elementwise_kernel(kind, dt), (cdiv(n, 64), 1, 1), [x, y, out, n])
            assert torch.equal(out, ref(x.float(), y.float()).to(tdt)), (dt, kind)


def test_c_integer_division_and_wraparound():
    n = 256
    a = torch.randint(-(2 ** 31), 2 ** 31 - 1, (n,), dtype=torch.int32)
    d = torch.randint(-50, 50, (n,), dtype=torch.int32)
    d[d == 0] = 7
    a[:3], d[:3] = torch.tensor([-(2 ** 31), -7, 7], dtype=torch.int32), torch.tensor([-1, 2, -2], dtype=torch.int32)
    an, dn = a.numpy().astype(np.int64), d.numpy().astype(np.int64)
    expect = {"floordiv": np.trunc(an / dn), "mod": np.fmod(an, dn), "mul": an * dn, "add": an + dn, "sub": an - dn}
    for kind, ref in expect.items():
        out = torch.full((n,), -12345, dtype=torch.int32)
        interpret.run(elementwise_kernel(kind, T.i32), (cdiv(n, 64), 1, 1), [a, d, out, n])
        want = torch.from_numpy(np.asarray(ref, dtype=np.int64).astype(np.int32))  # C wraps to 32 bits
        assert torch.equal(out, want), kind


def test_float_floordiv_is_floor_and_mod_is_fmod():
    n = 200
    a, d = torch.randn(n) * 10, torch.randn(n)
    for kind, ref in (("floordiv", torch.floor(a / d)), ("mod", torch.fmod(a, d))):
        out = torch.full((n,), float("nan"))
        interpret.run(elementwise_kernel(kind, T.f32), (cdiv(n, 64), 1, 1), [a, d, out, n])
        assert torch.equal(out, ref), kind


def test_shifts_and_unsigned():
    n = 128
    a = torch.randint(-(2 ** 31), 2 ** 31 - 1, (n,), dtype=torch.int32)
    s = torch.randint(0, 31, (n,), dtype=torch.int32)
    out = torch.empty(n, dtype=torch.int32)
    interpret.run(elementwise_kernel("shr", T.i32), (2, 1, 1), [a, s, out, n])
    assert torch.equal(out, a >> s)  # arithmetic on signed
    au, su = a.numpy().view(np.uint32), s.numpy().view(np.uint32)
    for kind, ref in (("shr", au >> su), ("add", au + au), ("mul", au * au), ("floordiv", au // np.maximum(su, 1))):
        out = torch.empty(n, dtype=torch.int32)
        other = s.clamp(min=1) if kind == "floordiv" else (a if kind in ("add", "mul") else s)
        interpret.run(elementwise_kernel(kind, T.u32), (2, 1, 1), [a.view(torch.uint32), other.view(torch.uint32),
                                                                  out.view(torch.uint32), n])
        assert np.array_equal(out.numpy().view(np.uint32), ref), kind
    big = torch.tensor([-1, 5, -(2 ** 63), 7], dtype=torch.int64)  # u64 bits: 2**64-1, 5, 2**63, 7
    small = torch.tensor([3, -2, 1, 9], dtype=torch.int64)
    bu, sm = big.numpy().view(np.uint64), small.numpy().view(np.uint64)
    u64_cases = (("floordiv", bu // sm), ("lt", bu < sm), ("maximum", np.maximum(bu, sm)), ("shr", bu >> np.uint64(1)))
    for kind, ref in u64_cases:
        out = torch.zeros(4, dtype=torch.int64)
        y = torch.ones(4, dtype=torch.int64) if kind == "shr" else small
        interpret.run(elementwise_kernel(kind, T.u64, block=4), (1, 1, 1), [big, y, out, 4])
        assert np.array_equal(out.numpy().view(np.uint64), ref.astype(np.uint64)), kind


def tile_ptrs(b, p, rows, cols, stride):
    """p + arange(rows)[:, None] * stride + arange(cols)[None, :] as a [rows, cols] pointer block."""
    r = b("expand_dims", b.arange(rows), t=T.Type((rows, 1), T.i32), axis=1)
    r = b.bin("mul", r, b.splat(stride, (rows, 1)))
    c = b("expand_dims", b.arange(cols), t=T.Type((1, cols), T.i32), axis=0)
    full = T.Type((rows, cols), T.i32)
    off = b.bin("add", b("broadcast", r, t=full), b("broadcast", c, t=full))
    return ptr_at(b, p, off)


@pytest.mark.parametrize("kind", ["sum", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", [T.f32, T.f16, T.i32])
def test_reduce_2d(kind, dtype):
    rows, cols = 8, 32
    tdt = interpret._TORCH[dtype]
    x = torch.randn(rows, cols).mul(100).to(tdt)
    if dtype == T.i32:
        x[2, 5] = x[2, 9] = x[2].max()  # ties pick the smallest index
    for axis in (0, 1):
        for keep in (False, True):
            b = B()
            xp, op = b.param(T.Ptr(dtype)), b.param(T.Ptr(T.i32 if kind.startswith("arg") else dtype))
            v = b("load", tile_ptrs(b, xp, rows, cols, b.const(cols, T.i32)), None, None, t=T.Type((rows, cols), dtype))
            shape = (rows, cols)[:axis] + ((1,) if keep else ()) + (rows, cols)[axis + 1:]
            r = b("reduce", v, t=T.Type(shape, op.type.dtype.elem), kind=kind, axis=axis, keep_dims=keep)
            n = r.type.numel
            r = b("reshape", r, t=T.Type((n,), r.type.dtype))
            b("store", ptr_at(b, op, b.arange(n)), r, None)
            out = torch.full((n,), -7, dtype=interpret._TORCH[op.type.dtype.elem])
            interpret.run(b.kernel(), (1, 1, 1), [x, out])
            if kind == "sum":
                want = x.float().sum(axis).to(tdt) if dtype != T.i32 else x.sum(axis, dtype=torch.int32)
            else:
                want = getattr(torch, {"max": "amax", "min": "amin"}.get(kind, kind))(x, axis).to(out.dtype)
            assert torch.equal(out, want.reshape(-1)), (axis, keep)


def test_reduce_1d_to_scalar_and_fmax_nan():
    b = B()
    xp, op = b.param(T.Ptr(T.f32)), b.param(T.Ptr(T.f32))
    v = b("load", ptr_at(b, xp, b.arange(16)), None, None, t=T.Type((16,), T.f32))
    for i, kind in enumerate(("max", "min", "sum")):
        r = b("reduce", v, t=T.Type((), T.f32), kind=kind, axis=0, keep_dims=False)
        b("store", b("ptradd", op, b.const(i, T.i32), t=op.type), r, None)
    k = b.kernel()
    x = torch.randn(16)
    x[3] = float("nan")
    out = torch.full((3,), float("nan"))
    interpret.run(k, (1, 1, 1), [x, out])
    xs = x[~x.isnan()]
    assert out[0] == xs.max() and out[1] == xs.min() and out[2].isnan()  # max/min skip NaN like fmaxf; sum doesn't
    out = torch.zeros(3)
    interpret.run(k, (1, 1, 1), [torch.full((16,), float("nan")), out])
    assert out.isnan().all()


def test_for_loop_carries_block_and_pointer():
    """Row sums over a loop of column chunks: acc and the moving pointer are loop-carried."""
    rows, cols, block = 4, 200, 32
    b = B()
    xp, op, n = b.param(T.Ptr(T.f32)), b.param(T.Ptr(T.f32)), b.param(T.i32)
    row = b("program_id", t=T.Type((), T.i32), axis=0)
    p0 = b("ptradd", xp, b.bin("mul", row, n), t=xp.type)
    acc0 = b("splat", b.const(0.0, T.f32), t=T.Type((block,), T.f32))
    vt, pt = T.Type((block,), T.f32), xp.type
    with b.region(T.Type((), T.i32), vt, pt) as body:
        iv, acc, p = body.params
        cols_v = b.bin("add", b.splat(iv, (block,)), b.arange(block))
        mask = b.bin("lt", cols_v, b.splat(n, (block,)))
        v = b("load", ptr_at(b, p, b.arange(block)), mask, b.splat(b.const(0.0, T.f32), (block,)), t=vt)
        b("yield", b.bin("add", acc, v), b("ptradd", p, b.const(block, T.i32), t=pt))
    res = [ir.Value(vt), ir.Value(pt)]
    b.stack[-1].ops.append(ir.Op("for", [b.const(0, T.i32), n, b.const(block, T.i32), acc0, p0], res, {}, None, [body]))
    total = b("reduce", res[0], t=T.Type((), T.f32), kind="sum", axis=0, keep_dims=False)
    b("store", b("ptradd", op, row, t=op.type), total, None)
    x, out = torch.randn(rows, cols), torch.full((rows,), float("nan"))
    interpret.run(b.kernel(), (rows, 1, 1), [x, out, cols])
    torch.testing.assert_close(out, x.sum(1))


def test_for_negative_step_and_if():
    """Counting down with range semantics; an if picks its branch's yielded value."""
    b = B()
    op, lo = b.param(T.Ptr(T.i32)), b.param(T.i32)
    with b.region(T.Type((), T.i32), T.Type((), T.i32)) as body:
        iv, acc = body.params
        odd = b.bin("ne", b.bin("mod", iv, b.const(2, T.i32)), b.const(0, T.i32))
        with b.region() as then:
            b("yield", b.bin("add", acc, b.bin("mul", iv, b.const(100, T.i32))))
        with b.region() as other:
            b("yield", b.bin("sub", acc, iv))
        chosen = ir.Value(T.Type((), T.i32))
        b.stack[-1].ops.append(ir.Op("if", [odd], [chosen], {}, None, [then, other]))
        b("yield", chosen)
    res = ir.Value(T.Type((), T.i32))
    b.stack[-1].ops.append(ir.Op("for", [b.const(10, T.i32), lo, b.const(-3, T.i32), b.const(1, T.i32)], [res], {},
                                 None, [body]))
    b("store", op, res, None)
    out = torch.zeros(1, dtype=torch.int32)
    acc = 1
    for i in range(10, -5, -3):
        acc = acc + 100 * i if i % 2 else acc - i
    interpret.run(b.kernel(), (1, 1, 1), [out, -5])
    assert out.item() == acc


def test_out_of_bounds_load_and_store_raise_with_span():
    n = 100
    x, y = torch.randn(n), torch.randn(n)
    out = torch.full((n,), float("nan"))
    k = elementwise_kernel("add", T.f32, line=7)
    next(op for op in k.body.ops if op.kind == "load").span = Span("file.nk", 7, 9)
    with pytest.raises(NkError) as e:  # n claims 130 elements; the tensors hold 100
        interpret.run(k, (3, 1, 1), [x, y, out, 130])
    assert "file.nk:7:9" in str(e.value)
    assert "out-of-bounds load: offset 100 is outside the tensor's 100 elements" in str(e.value)
    assert out[:64].equal(x[:64] + y[:64]) and out[64:].isnan().all()  # program 1 failed before its store
    b = B()
    p = b.param(T.Ptr(T.f32))
    b("store", ptr_at(b, p, b.arange(8)), b.splat(b.const(1.0, T.f32), (8,)), None, line=3)
    small = torch.full((5,), 2.0)
    with pytest.raises(NkError, match=r"file.nk:3:5: error: out-of-bounds store: offset 5 is outside the tensor's 5"):
        interpret.run(b.kernel(), (1, 1, 1), [small])
    assert small.eq(2.0).all()  # nothing written


def test_masked_lanes_may_point_anywhere():
    b = B()
    p, o = b.param(T.Ptr(T.f32)), b.param(T.Ptr(T.f32))
    offs = b.bin("mul", b.arange(16), b.splat(b.const(1000, T.i32), (16,)))
    offs = b.bin("sub", offs, b.splat(b.const(3, T.i32), (16,)))
    ok = b.bin("eq", offs, b.splat(b.const(997, T.i32), (16,)))
    v = b("load", ptr_at(b, p, offs), ok, b.splat(b.const(-1.5, T.f32), (16,)), t=T.Type((16,), T.f32))
    b("store", ptr_at(b, o, b.arange(16)), v, None)
    x, out = torch.randn(998), torch.full((16,), float("nan"))
    interpret.run(b.kernel(), (1, 1, 1), [x, out])
    assert out[1] == x[997] and out[torch.arange(16) != 1].eq(-1.5).all()


def atomic_kernel(kind, dtype, block):
    """old[i] = atomic_kind(dst + idx[i], val[i] (, cmp[i]), mask = i < n)."""
    b = B()
    dst, idx, val, old = b.param(T.Ptr(dtype)), b.param(T.Ptr(T.i32)), b.param(T.Ptr(dtype)), b.param(T.Ptr(dtype))
    n = b.param(T.i32)
    ar = b.arange(block)
    mask = b.bin("lt", ar, b.splat(n, (block,)))
    bt = T.Type((block,), dtype)
    i = b("load", ptr_at(b, idx, ar), mask, None, t=T.Type((block,), T.i32))
    v = b("load", ptr_at(b, val, ar), mask, None, t=bt)
    vals = [b.splat(b.const(0, dtype), (block,)), v] if kind == "cas" else [v]
    r = b("atomic", ptr_at(b, dst, i), *vals, mask, t=bt, kind=kind)
    b("store", ptr_at(b, old, ar), r, None)
    return b.kernel()


@pytest.mark.parametrize("kind", ["add", "max", "min", "xchg", "cas"])
@pytest.mark.parametrize("dtype", [T.i32, T.f32])
def test_atomics_apply_lane_by_lane(kind, dtype):
    block, n, bins = 64, 60, 5
    tdt = interpret._TORCH[dtype]
    idx = torch.randint(0, bins, (block,), dtype=torch.int32)
    val = (torch.randn(block) * 10).to(tdt)
    dst = (torch.randn(bins) * 10).to(tdt)
    if kind == "cas":
        dst[::2] = 0
    want_dst, want_old = dst.clone(), torch.zeros(block, dtype=tdt)
    for lane in range(n):  # the oracle: lane by lane in row-major order
        cur = want_dst[idx[lane]].clone()
        want_old[lane] = cur
        new = {"add": cur + val[lane], "max": torch.maximum(cur, val[lane]), "min": torch.minimum(cur, val[lane]),
               "xchg": val[lane], "cas": val[lane] if cur == 0 else cur}[kind]
        want_dst[idx[lane]] = new
    old = torch.full((block,), 77, dtype=tdt)
    interpret.run(atomic_kernel(kind, dtype, block), (1, 1, 1), [dst, idx, val, old, n])
    assert torch.equal(dst, want_dst) and torch.equal(old, want_old)


def test_store_duplicates_last_lane_wins():
    b = B()
    p = b.param(T.Ptr(T.f32))
    offs = b.bin("floordiv", b.arange(64), b.splat(b.const(8, T.i32), (64,)))
    b("store", ptr_at(b, p, offs), b("cast", b.arange(64), t=T.Type((64,), T.f32)), None)
    out = torch.full((8,), float("nan"))
    interpret.run(b.kernel(), (1, 1, 1), [out])
    assert torch.equal(out, torch.arange(8) * 8 + 7.0)


def unary_kernel(kind, src, dst, n, **attrs):
    b = B()
    x, o = b.param(T.Ptr(src)), b.param(T.Ptr(dst))
    v = b("load", ptr_at(b, x, b.arange(n)), None, None, t=T.Type((n,), src))
    b("store", ptr_at(b, o, b.arange(n)), b(kind, v, t=T.Type((n,), dst), **attrs), None)
    return b.kernel()


def test_casts_truncate_wrap_and_saturate():
    x = torch.tensor([1.9, -1.9, 3e9, -3e9, float("nan"), float("inf"), 255.5, -0.5] * 2)
    ranges = ((T.i32, -(2 ** 31), 2 ** 31 - 1), (T.i8, -128, 127), (T.u8, 0, 255), (T.i64, -(2 ** 63), 2 ** 63 - 1))
    for dst, lo, hi in ranges:
        out = torch.zeros(16, dtype=interpret._TORCH[dst])
        interpret.run(unary_kernel("cast", T.f32, dst, 16), (1, 1, 1), [x, out])
        want = torch.nan_to_num(x.double(), nan=0.0).trunc().clamp(lo, hi)
        want = torch.where(want >= 2.0 ** 63, hi, want.to(torch.int64).clamp(lo, hi)) if dst == T.i64 else want
        assert torch.equal(out.to(torch.int64), want.to(torch.int64)), dst
    i = torch.randint(-(2 ** 31), 2 ** 31 - 1, (16,), dtype=torch.int32)
    for dst, want in ((T.u8, i.to(torch.uint8)), (T.i16, i.to(torch.int16)), (T.bool_, i != 0),
                      (T.f16, i.to(torch.float16))):
        out = torch.zeros(16, dtype=interpret._TORCH[dst])
        interpret.run(unary_kernel("cast", T.i32, dst, 16), (1, 1, 1), [i, out])
        assert torch.equal(out, want), dst
    out = torch.zeros(16)
    interpret.run(unary_kernel("cast", T.u32, T.f32, 16), (1, 1, 1), [i.view(torch.uint32), out])
    assert torch.equal(out, torch.from_numpy(i.numpy().view(np.uint32).astype(np.float32)))


def test_bitcast_and_math_builtins():
    x = torch.randn(32)
    out = torch.zeros(32, dtype=torch.int32)
    interpret.run(unary_kernel("bitcast", T.f32, T.i32, 32), (1, 1, 1), [x, out])
    assert torch.equal(out, x.view(torch.int32))
    h = torch.randn(32, dtype=torch.float16)
    for kind in ("exp", "sqrt", "sigmoid", "erf", "rsqrt", "tanh", "abs", "neg", "floor"):
        out = torch.full((32,), float("nan"), dtype=torch.float16)
        src = h.abs() if kind in ("sqrt", "rsqrt") else h
        interpret.run(unary_kernel(kind, T.f16, T.f16, 32), (1, 1, 1), [src, out])
        assert torch.equal(out, getattr(torch, kind)(src.float()).half()), kind
    b = torch.randint(0, 2, (32,), dtype=torch.bool)
    out = torch.zeros(32, dtype=torch.bool)
    interpret.run(unary_kernel("not", T.bool_, T.bool_, 32), (1, 1, 1), [b, out])
    assert torch.equal(out, ~b)


def test_minimum_maximum_like_fminf():
    n = 64
    x, y = torch.randn(n), torch.randn(n)
    x[::3], y[::5] = float("nan"), float("nan")
    for kind, ref in (("minimum", torch.fmin), ("maximum", torch.fmax)):
        out = torch.zeros(n)
        interpret.run(elementwise_kernel(kind, T.f32), (1, 1, 1), [x, y, out, n])
        assert torch.equal(out.nan_to_num(123.0), ref(x, y).nan_to_num(123.0))


@pytest.mark.parametrize("dtype", [T.f16, T.bf16, T.f32])
def test_dot_with_views(dtype):
    """out = acc + x @ trans(y) with y stored [N, K]."""
    m, n, k = 16, 32, 64
    tdt = interpret._TORCH[dtype]
    b = B()
    xp, yp, ap, op = b.param(T.Ptr(dtype)), b.param(T.Ptr(dtype)), b.param(T.Ptr(T.f32)), b.param(T.Ptr(T.f32))
    xa = b("load", tile_ptrs(b, xp, m, k, b.const(k, T.i32)), None, None, t=T.Type((m, k), dtype))
    yt = b("load", tile_ptrs(b, yp, n, k, b.const(k, T.i32)), None, None, t=T.Type((n, k), dtype))
    ya = b("trans", yt, t=T.Type((k, n), dtype), perm=(1, 0))
    acc = b("load", tile_ptrs(b, ap, m, n, b.const(n, T.i32)), None, None, t=T.Type((m, n), T.f32))
    r = b("dot", xa, ya, acc, t=T.Type((m, n), T.f32))
    b("store", tile_ptrs(b, op, m, n, b.const(n, T.i32)), r, None)
    x, y, a = torch.randn(m, k).to(tdt), torch.randn(n, k).to(tdt), torch.randn(m, n)
    out = torch.full((m, n), float("nan"))
    interpret.run(b.kernel(), (1, 1, 1), [x, y, a, out])
    torch.testing.assert_close(out, a + x.float() @ y.float().T)


def test_program_ids_over_a_3d_grid(capsys):
    b = B()
    p = b.param(T.Ptr(T.i32))
    ids = [b("program_id", t=T.Type((), T.i32), axis=a) for a in range(3)]
    nums = [b("num_programs", t=T.Type((), T.i32), axis=a) for a in range(3)]
    lin = b.bin("add", ids[0], b.bin("mul", nums[0], b.bin("add", ids[1], b.bin("mul", nums[1], ids[2]))))
    b("store", b("ptradd", p, lin, t=p.type), b.bin("add", b.bin("mul", lin, b.const(10, T.i32)), nums[2]), None)
    b("print", lin, prefix="lin")
    out = torch.full((24,), -1, dtype=torch.int32)
    interpret.run(b.kernel(), (2, 3, 4), [out])
    assert torch.equal(out, torch.arange(24, dtype=torch.int32) * 10 + 4)
    assert "pid (1, 2, 3) lin 23" in capsys.readouterr().out


# ---- through the checker: .nk source -> typed IR -> interpreter --------------------------------
def nk(src, name, sig, file="file.nk", **constexprs):
    from newtc import check, syntax

    sig = {k: T.parse_type(v) for k, v in sig.items()}
    return check.check(syntax.parse(src, file), name, Spec.of(sig, constexprs))


def test_stdlib_add():
    from newtc.paths import data_dir

    src = (data_dir("stdlib") / "add.nk").read_text()
    n = 1000
    for dt in (torch.float32, torch.float16, torch.int32):
        x, y = (torch.randn(n) * 100).to(dt), (torch.randn(n) * 100).to(dt)
        out = torch.full((n,), -3, dtype=dt)
        t = "*" + T.torch_dtype_name(dt)
        interpret.run(nk(src, "add", {"x": t, "y": t, "out": t, "n": "i32"}, BLOCK=256), (cdiv(n, 256), 1, 1),
                      [x, y, out, n])
        assert torch.equal(out, x + y)


SOFTMAX = """\
kernel softmax(x, out, n_cols, stride, BLOCK: constexpr):
    row = program_id(0)
    cols = arange(0, BLOCK)
    mask = cols < n_cols
    v = load(x + row * stride + cols, mask=mask, other=-inf)
    v = v - max(v, axis=0)
    num = exp(v)
    store(out + row * stride + cols, num / sum(num, axis=0), mask=mask)
"""


@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax_rows(dt):
    rows, cols = 7, 100
    x = torch.randn(rows, 128, dtype=dt)[:, :cols]  # row stride 128, odd width: masks matter
    out = torch.full((rows, 128), float("nan"), dtype=dt)
    t = "*" + T.torch_dtype_name(dt)
    k = nk(SOFTMAX, "softmax", {"x": t, "out": t, "n_cols": "i32", "stride": "i32"}, BLOCK=128)
    interpret.run(k, (rows, 1, 1), [x, out, cols, 128])
    tol = 1e-2 if dt != torch.float32 else 1e-6
    torch.testing.assert_close(out[:, :cols].float(), torch.softmax(x.float(), 1), atol=tol, rtol=0)
    assert out[:, cols:].isnan().all()


def test_nk_out_of_bounds_points_at_the_line():
    src = """\
kernel copy(x, out, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    v = load(x + offs)
    store(out + offs, v, mask=offs < n)
"""
    k = nk(src, "copy", {"x": "*f32", "out": "*f32", "n": "i32"}, BLOCK=64)
    x, out = torch.randn(100), torch.zeros(100)
    with pytest.raises(NkError) as e:
        interpret.run(k, (2, 1, 1), [x, out, 100])
    msg = str(e.value)
    assert "file.nk:3:" in msg and "out-of-bounds load: offset 100 is outside the tensor's 100 elements" in msg
    assert "v = load(x + offs)" in msg and "Traceback" not in msg


def test_nk_c_division_and_histogram():
    src = """\
kernel divmod(a, b, q, r, hist, n, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    x = load(a + offs, mask=mask, other=1)
    y = load(b + offs, mask=mask, other=1)
    store(q + offs, x // y, mask=mask)
    store(r + offs, x % y, mask=mask)
    atomic_add(hist + (x % y + 4), 1, mask=mask)
"""
    sig = {"a": "*i32", "b": "*i32", "q": "*i32", "r": "*i32", "hist": "*i32", "n": "i32"}
    k = nk(src, "divmod", sig, BLOCK=64)
    n = 300
    a = torch.randint(-1000, 1000, (n,), dtype=torch.int32)
    b = torch.randint(1, 5, (n,), dtype=torch.int32) * torch.where(torch.rand(n) < 0.5, -1, 1).int()
    q, r = torch.full((n,), 99, dtype=torch.int32), torch.full((n,), 99, dtype=torch.int32)
    hist = torch.zeros(9, dtype=torch.int32)
    interpret.run(k, (cdiv(n, 64), 1, 1), [a, b, q, r, hist, n])
    assert torch.equal(q, torch.div(a, b, rounding_mode="trunc")) and torch.equal(r, torch.fmod(a, b))
    assert torch.equal(hist, torch.bincount((torch.fmod(a, b) + 4).long(), minlength=9).int())


def test_nk_loop_if_and_where():
    """A runtime loop with a carried scalar and block, a runtime if, and where."""
    src = """\
kernel scan(x, out, n, BLOCK: constexpr):
    cols = arange(0, BLOCK)
    total = 0.0
    best = zeros([BLOCK], f32)
    for start in range(0, n, BLOCK):
        v = load(x + start + cols, mask=start + cols < n, other=0.0)
        total += sum(v, axis=0)
        best = where(v > best, v, best)
    if total > 0.0:
        total = total * 2.0
    else:
        total = -total
    store(out + cols, best + total)
"""
    k = nk(src, "scan", {"x": "*f32", "out": "*f32", "n": "i32"}, BLOCK=32)
    for _ in range(4):
        n = 200
        x, out = torch.randn(n), torch.full((32,), float("nan"))
        interpret.run(k, (1, 1, 1), [x, out, n])
        padded = torch.cat([x, torch.zeros(224 - n)]).reshape(-1, 32)
        total = torch.tensor(0.0)
        for chunk in padded:  # the same f32 accumulation order as the loop
            total = total + chunk.sum()
        total = total * 2 if total > 0 else -total
        torch.testing.assert_close(out, padded.amax(0).clamp(min=0) + total)


def test_bad_arguments():
    k = nk(SOFTMAX, "softmax", {"x": "*f32", "out": "*f32", "n_cols": "i32", "stride": "i32"}, BLOCK=16)
    with pytest.raises(NkError, match="takes 4 arguments, got 3"):
        interpret.run(k, (1, 1, 1), [torch.randn(16), torch.randn(16), 16])
    wrong = "argument 'out' of kernel softmax must be a CPU tensor of f32, got torch.float64"
    with pytest.raises(NkError, match=wrong):
        interpret.run(k, (1, 1, 1), [torch.randn(16), torch.randn(16, dtype=torch.float64), 16, 16])


def test_a_loaded_bool_mask_selects_lanes_by_value():
    """A masked load of a bool tensor stays bool: `keep`, `~keep` and `not keep` pick lanes by their value,
    and the lanes the load masked off read as False (issue 14, item 1)."""
    import newtc

    mod = newtc.compile("""\
kernel k(a, out, inv, neg, n, B: constexpr):
    o = arange(0, B)
    keep = load(a + o, mask=o < n)
    store(out + o, 1.0, mask=keep)
    store(inv + o, 2.0, mask=~keep)
    store(neg + o, 3.0, mask=not keep)
""", "boolmask.nk")
    a = torch.rand(16) < 0.5
    a[:3] = torch.tensor([True, False, True])
    n = 11
    outs = [torch.full((16,), float("nan")) for _ in range(3)]
    mod.k[(1,)](a, *outs, n, B=16)
    live = torch.arange(16) < n
    keep = a & live
    nan = torch.tensor(float("nan"))
    torch.testing.assert_close(outs[0], torch.where(keep, 1.0, nan), equal_nan=True)
    torch.testing.assert_close(outs[1], torch.where(~keep, 2.0, nan), equal_nan=True)
    torch.testing.assert_close(outs[2], torch.where(~keep, 3.0, nan), equal_nan=True)
