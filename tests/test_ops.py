"""Every stdlib op against torch: in the interpreter on the CPU, and on the GPU (marker gpu).

Fresh random inputs each run, outputs poisoned first by the op's own allocation (torch.empty on the
GPU holds stale data; the interpreter writes through checked memory), odd shapes to exercise masks.
Every shape of launch the model can plan (whole rows, several rows per program, looped, split, rows off
16-byte boundaries) runs on small inputs by forcing the plan.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from newtc import ops
from newtc.ops import Gpu, Plan

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def close(out, ref, dtype, scale: float = 1e-12):
    """Relative (Frobenius) error under the dtype's tolerance; `scale` floors the reference's norm."""
    ref = ref.float()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    err = (out.float() - ref).norm() / ref.norm().clamp_min(scale)
    assert torch.isfinite(out.float()).all()
    assert err < TOL[dtype], f"relative error {err:.2e}"


def shapes(device):
    # the interpreter runs one program per row in Python: keep CPU shapes small
    big = [(3, 4097), (1, 20000), (2, 50257), (300, 64), (5000, 1000)] if device == "cuda" else [(2, 4097)]
    return [(37, 1000), (1, 1), (3, 64), (9, 37)] + big


def row_ops(x, w, b, t):
    """(name, newt result, float reference) of every row op on x ([rows, n]); references in f32."""
    n = x.shape[-1]
    xf = x.float()
    return [("softmax", ops.softmax(x), torch.softmax(xf, -1)),
            ("log_softmax", ops.log_softmax(x), torch.log_softmax(xf, -1)),
            ("layernorm", ops.layernorm(x, w, b), F.layer_norm(xf, (n,), w.float(), b.float(), 1e-5)),
            ("rmsnorm", ops.rmsnorm(x, w), F.rms_norm(xf, (n,), w.float(), 1e-6)),
            ("cross_entropy", ops.cross_entropy(x, t), F.cross_entropy(xf, t, reduction="none"))]


def check_row_ops(x, dtype):
    n = x.shape[-1]
    w, b = torch.randn(n, device=x.device).to(dtype), torch.randn(n, device=x.device).to(dtype)
    t = torch.randint(0, n, x.shape[:-1], device=x.device)
    for name, out, ref in row_ops(x, w, b, t):
        # log-space results are differences of logits, exact only to the logits' rounding: a one-column row's
        # log-softmax and loss are 0, which lg2.approx on the GPU leaves at about 2e-7 (logit 3.7, measured)
        scale = x.float().abs().max().item() if name in ("log_softmax", "cross_entropy") else 1e-12
        close(out, ref, torch.float32 if name == "cross_entropy" else dtype, scale)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_ops(device, dtype):
    for shape in shapes(device):
        check_row_ops((torch.randn(shape, device=device) * 3 + 1).to(dtype), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions(device, dtype):
    for rows, n in shapes(device):
        x = torch.randn(rows, n, device=device).to(dtype)
        # a row of random signs can sum to nearly 0 (an f32 run on the GPU failed at 2.7e-5 so): errors are
        # measured against the rows' norm, the size of a typical sum, and float64 sums
        scale = x.double().norm().item()
        close(ops.sum(x), x.double().sum(-1), dtype, scale)
        close(ops.mean(x), x.double().mean(-1), dtype, scale / n)
        close(ops.amax(x), x.float().amax(-1), dtype)


@pytest.mark.parametrize("device", devices())
def test_nan_and_inf_as_in_torch(device):
    """Rows holding a NaN or an infinity (anywhere in the row, past the first column block too) give NaN where torch
    does: the language's maximum returns the non-NaN operand (fmaxf), which amax and matmul's relu must not."""
    n = 5000 if device == "cuda" else 300
    x = torch.randn(6, n, device=device) * 3
    x[1, 7], x[2, n - 1], x[3, 0], x[4, n // 2] = float("nan"), float("nan"), float("inf"), -float("inf")
    w, b, t = torch.randn(n, device=device), torch.randn(n, device=device), torch.randint(0, n, (6,), device=device)
    a, m = torch.randn(6, 64, device=device), torch.randn(64, 32, device=device)
    a[1, 5], a[3, 0] = float("nan"), float("inf")
    cases = [(name, out, ref) for name, out, ref in row_ops(x, w, b, t)] + [
        ("sum", ops.sum(x), x.sum(-1)), ("mean", ops.mean(x), x.mean(-1)), ("amax", ops.amax(x), x.amax(-1)),
        ("add", ops.add(x, b), x + b), ("bias_gelu", ops.bias_gelu(x, b), F.gelu(x.double() + b.double())),  # f32 on the CPU: gelu(inf) NaN
        ("matmul relu", ops.matmul(a, m, activation="relu"), F.relu(a.double() @ m.double())),
        ("matmul gelu", ops.matmul(a, m, activation="gelu"), F.gelu(a.double() @ m.double()))]
    for name, out, ref in cases:
        assert torch.equal(out.isnan(), ref.isnan()), f"{name}: NaN at {out.isnan().nonzero().tolist()}, " \
                                                       f"torch's at {ref.isnan().nonzero().tolist()}"
        finite = ref.isfinite()
        assert torch.equal(out[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()].to(out.dtype)), name
        torch.testing.assert_close(out[finite].double(), ref[finite].double(), rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("device", devices())
def test_strided_and_batched_inputs(device):
    base = torch.randn(33, 1500, device=device)
    check_row_ops(base[:, 100:1100], torch.float32)  # rows 1500 apart, 1000 columns: output contiguous
    check_row_ops(base[:, 1:1000], torch.float32)  # rows and their start off 16-byte boundaries
    check_row_ops(base.t()[:40, :9], torch.float32)  # columns not contiguous: a copy
    x = torch.randn(2, 3, 70, device=device)
    close(ops.softmax(x), torch.softmax(x, -1), torch.float32)
    close(ops.layernorm(x, torch.ones(70, device=device), None), F.layer_norm(x, (70,)), torch.float32)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_and_transpose(device, dtype):
    x = torch.randn(37, 1001, device=device).to(dtype)
    y = torch.randn(37, 1001, device=device).to(dtype)
    close(ops.add(x, y), x.float() + y.float(), dtype)
    close(ops.add(x, y[0]), x.float() + y[0].float(), dtype)
    b = torch.randn(1001, device=device).to(dtype)
    close(ops.bias_gelu(x, b), F.gelu(x.float() + b.float()), dtype)
    with pytest.raises(ops.NkError, match=r"one value per column of x, \[1001\]; got \[1000\]"):
        ops.bias_gelu(x, b[:1000])  # it would be read past its end
    close(ops.transpose(x), x.float().t(), dtype)
    close(ops.transpose(x[:, 3:700]), x[:, 3:700].float().t(), dtype)
    y = torch.randn(64, 65, device=device).to(dtype)[:, :64]  # rows 65 apart: off 16-byte boundaries
    close(ops.transpose(y), y.float().t(), dtype)


@pytest.mark.parametrize("device", devices())
def test_empty_inputs(device):
    x = torch.randn(0, 7, device=device)
    assert ops.softmax(x).shape == (0, 7) and ops.layernorm(x, torch.ones(7, device=device), None).shape == (0, 7)
    assert ops.cross_entropy(x, torch.zeros(0, dtype=torch.int64, device=device)).shape == (0,)
    for y in (x, x.t()):  # no rows, and rows of nothing: torch's sums of nothing (0) and means (NaN)
        for op in ("sum", "mean"):
            torch.testing.assert_close(getattr(ops, op)(y), getattr(torch, op)(y, -1), equal_nan=True)


def test_bad_arguments_are_errors():
    with pytest.raises(ops.NkError, match="f32, f16 or bf16"):
        ops.softmax(torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(ops.NkError, match="one int64 or int32 target per row"):
        ops.cross_entropy(torch.randn(3, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ops.NkError, match="weight"):
        ops.layernorm(torch.randn(3, 4), torch.ones(5), None)


# ---- every kind of plan, forced ----------------------------------------------------------------------
def force_plan(monkeypatch, p: Plan) -> None:
    """Every op plans p from now on. The launches bound on the GPU for a key (by an earlier call, in this test
    or another) would run the plan they were bound with instead: they are dropped."""
    monkeypatch.setattr(ops, "plan", lambda *args: p)
    monkeypatch.setattr(ops, "_fast", {})


def forced_plans(n: int, itemsize: int, shift: bool, grouped: bool):
    """One plan of each kind for rows of n elements, with blocks small enough to loop over small rows.
    Several rows share a program only where the model allows it (`grouped`: rows on 16-byte boundaries, or
    off them at the same offsets in input and output)."""
    vec = 16 // itemsize
    lead = vec - 1 if shift else 0
    loop = 64 * vec  # one warp, two vectors per lane
    if grouped:
        yield Plan("rows", ops._pow2(n + lead), 1, rows=4)
    yield Plan("rows", ops._pow2(n + lead), 2)
    yield Plan("rows", 512, 1, tail=ops._pow2(n + lead - 512), rows=2 if grouped else 1)  # a block and a tail
    yield Plan("looped", loop, 1)
    for chunk in (2 * loop, 3 * loop):  # the last chunk whole or cut by the row's end
        yield Plan("split", loop, 1, parts=math.ceil((n + lead) / chunk), chunk=chunk)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_plan(device, dtype, monkeypatch):
    """Each plan on rows of 1000 (16-byte aligned for every dtype), of 1001 and 1023 (rows off 16-byte boundaries:
    SHIFT; a split's chunks cover the row's widest lead, 1023 + 16 bytes, so at 1023 the last chunk lies past the end
    of the rows that start nearest a boundary) and on a row-strided view whose output rows sit at other offsets (no
    SHIFT, checked accesses)."""
    base = (torch.randn(5, 1030, device=device) * 3 + 2).to(dtype)
    inputs = [base[:, :1000].contiguous(), base[:, :1001].contiguous(), base[:, :1023].contiguous(), base[:, :999]]
    for x in inputs:
        shift = ops._configure("softmax", x, x.shape[1])[1]["SHIFT"]
        assert shift == (x.stride(0) in (1001, 1023)) or x.stride(0) == 1030
        for p in forced_plans(x.shape[1], x.element_size(), shift, x.is_contiguous()):
            force_plan(monkeypatch, p)
            check_row_ops(x, dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_norm_chunks_count_each_column_once(device, dtype, monkeypatch):
    """The chunks of a split cover a row's widest lead: on rows of 1023 off 16-byte boundaries the last chunk starts
    past the end of the rows that start nearest a boundary. Each row's chunk counts must still sum to its width (a
    chunk past the end once counted -1, or 0 with a mean of 0 / 0: NaN rows)."""
    x = torch.randn(9, 1023, device=device).to(dtype) + 5
    loop = 64 * 16 // x.element_size()
    p = Plan("split", loop, 1, parts=math.ceil((1023 + 16 // x.element_size() - 1) / (2 * loop)), chunk=2 * loop)
    force_plan(monkeypatch, p)
    w = torch.randn(1023, device=device).to(dtype)
    steps, alloc = ops._norm_steps(x, False, False)
    values = (x, w, w, 1e-5) + alloc(x)
    kernel, grid, args, meta = steps[0]  # the partial moments
    kernel[grid](*(values[a.i] if isinstance(a, ops._In) else a for a in args), **meta)
    counts = values[-1].view(9, p.parts, 3)[..., 0]
    assert (counts >= 0).all() and torch.equal(counts.sum(1), torch.full((9,), 1023.0, device=device))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fill", [-1e9, 1e9, -3e38])
def test_rows_of_huge_logits_on_every_plan(device, fill, monkeypatch):
    """A row masked out with a huge constant (-1e9, f32's lowest) beside ordinary rows, on every plan: softmax is
    uniform there, log-softmax and the loss log(1/n). Computing v - (max + log(total)), or exp2(v * LOG2E - max *
    LOG2E) as one FMA on the GPU, rounds at the max's magnitude (64 at 1e9) and loses log(total) or the sum."""
    x = torch.randn(4, 1001, device=device) * 3
    x[1] = fill
    x[2, :500] = fill
    t = torch.randint(0, 1001, (4,), device=device)
    for p in forced_plans(1001, 4, True, True):
        force_plan(monkeypatch, p)
        for name, out, ref in [("softmax", ops.softmax(x), torch.softmax(x, -1)),
                               ("log_softmax", ops.log_softmax(x), torch.log_softmax(x, -1)),
                               ("cross_entropy", ops.cross_entropy(x, t), F.cross_entropy(x, t, reduction="none"))]:
            finite = ref.isfinite()
            assert torch.equal(out.isfinite(), finite), (name, p)
            assert torch.allclose(out[finite], ref[finite], rtol=1e-4, atol=1e-5), (name, p)


@pytest.mark.parametrize("device", devices())
def test_cross_entropy_targets_outside_the_row(device, monkeypatch):
    """On every plan: a target of -100 (torch's ignore_index, as padding tokens carry) gives a loss of 0, any other
    outside [0, n) NaN; neither reads the logits (the row before, or memory before the tensor, on row 0)."""
    x = torch.randn(5, 1001, device=device) * 3
    t = torch.tensor([-100, 0, 1000, 1001, -1], device=device)
    for p in forced_plans(1001, 4, True, True):
        force_plan(monkeypatch, p)
        out = ops.cross_entropy(x, t)
        ref = F.cross_entropy(x[1:3], t[1:3], reduction="none")
        assert out[0].item() == 0.0 and torch.allclose(out[1:3], ref, rtol=1e-4, atol=1e-5), p
        assert out[3:].isnan().all(), p


def test_bound_path_launches_what_the_general_path_launched(monkeypatch):
    """The launch path made for a key (on the GPU after a first call; forced here on the CPU with the
    driver call recorded instead) passes every kernel of every kind of plan the values the general path
    passed: the same inputs and constants, and the outputs it returns."""
    launched = []

    def bind(kernel, args, meta, device):
        first = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        return lambda stream, values, *grid: launched.append((kernel.name, values, grid, first))

    monkeypatch.setattr(ops, "_bind", bind)
    monkeypatch.setattr(ops, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(ops, "_bindable", lambda tensors: True)
    x, t = torch.randn(3, 1500), torch.randint(0, 1500, (3,))
    w, b = torch.randn(1500), torch.randn(1500)
    calls = [lambda: ops.softmax(x), lambda: ops.log_softmax(x), lambda: ops.cross_entropy(x, t),
             lambda: ops.layernorm(x, w, b, 1e-5), lambda: ops.layernorm(x, w, None), lambda: ops.rmsnorm(x, w)]
    inputs = {x.data_ptr(), t.data_ptr(), w.data_ptr(), b.data_ptr()}
    for p in forced_plans(1500, 4, False, True):
        force_plan(monkeypatch, p)
        for call in calls:
            call()  # the general path: the interpreter, then bound for this key
            launched.clear()
            out = call()  # the bound path
            assert launched and all(grid for _, _, grid, _ in launched)
            for name, values, grid, first in launched:
                assert len(values) == len(first), name
                for v, f in zip(values, first):  # outputs are new tensors: their pointers differ
                    assert v == f or (f not in inputs and isinstance(v, int) and v % 16 == 0), (name, values, first)
            assert any(out.data_ptr() in values for _, values, _, _ in launched)


def test_bound_path_leaves_tensors_of_another_device_to_the_general_path(monkeypatch):
    """A bound key holds its first input's device only: an op called with a second input elsewhere (a CPU tensor
    beside a GPU one) must not launch on that pointer, but take the general path, which names the mistake. Forced on
    the CPU: the launch recorded, the other device a tensor that says it is on device 1."""
    launched = []
    monkeypatch.setattr(ops, "_bind", lambda kernel, args, meta, device: lambda *a: launched.append(a))
    monkeypatch.setattr(ops, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(ops, "_bindable", lambda tensors: True)

    class Elsewhere(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl  # what torch makes of it is a plain CPU tensor

        def get_device(self):
            return 1
    x, y, w, m = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64), torch.randn(64, 64)
    for call in (lambda other: ops.add(x, other(y)), lambda other: ops.rmsnorm(x, other(w)),
                 lambda other: ops.matmul(x, other(m))):
        call(lambda t: t)  # binds the key
        launched.clear()
        call(lambda t: t)
        assert launched  # the bound path
        launched.clear()
        with pytest.raises(ops.NkError, match="different devices"):
            call(lambda t: t.as_subclass(Elsewhere))
        assert not launched


def test_bound_path_leaves_a_weight_of_another_size_to_the_general_path(monkeypatch):
    """A norm's key holds its weight's (and bias's) shape: called with a weight of another size after a bound call, an
    op must not launch the bound kernels on it (they read a row's width of it: past its end, or the wrong values) but
    take the general path, which names the mistake. Forced on the CPU, the launch recorded."""
    launched = []
    monkeypatch.setattr(ops, "_fast", {})  # keys bound by other tests launch into their own records
    monkeypatch.setattr(ops, "_bind", lambda kernel, args, meta, device: lambda *a: launched.append(a))
    monkeypatch.setattr(ops, "_raw_stream", lambda device: 0)
    monkeypatch.setattr(ops, "_bindable", lambda tensors: True)
    x, w, b = torch.randn(4, 64), torch.randn(64), torch.randn(64)
    for call, wrong in ((lambda w, b: ops.rmsnorm(x, w), [(torch.randn(32), b)]),
                        (lambda w, b: ops.layernorm(x, w, b), [(torch.randn(32), b), (w, torch.randn(128))])):
        call(w, b)  # binds the key
        launched.clear()
        call(w, b)
        assert launched  # the bound path
        launched.clear()
        for args in wrong:
            with pytest.raises(ops.NkError, match="takes a weight"):
                call(*args)
        assert not launched


# ---- the model ------------------------------------------------------------------------------------
WIDTHS = [1, 7, 64, 100, 768, 1000, 1024, 3000, 4096, 5120, 11008, 16384, 32768, 50257, 65536, 128256, 262144, 10**6]
ROWS = [1, 3, 8, 128, 1024, 4096, 32768]


@pytest.mark.parametrize("op", ["softmax", "cross_entropy", "norm", "rmsnorm"])
def test_plan_covers_every_shape(op):
    """Any shape gets a plan whose blocks cover its rows, within the register and chunk limits."""
    for n in WIDTHS:
        for rows in ROWS:
            for itemsize in (4, 2):
                for shift in (False, True):
                    p = ops.plan(op, rows, n, itemsize, shift)
                    lead = 16 // itemsize - 1 if shift else 0
                    assert p.warps in (1, 2, 4, 8, 16, 32) and p.seconds > 0
                    assert p.block & (p.block - 1) == 0 and p.rows & (p.rows - 1) == 0
                    if p.kind == "rows":
                        assert n + lead <= p.block + p.tail <= ops.MAX_ROW[op] and p.rows <= ops._pow2(rows)
                        assert p.tail & (p.tail - 1) == 0 and p.tail < p.block
                        assert p.rows * (p.block + p.tail) * itemsize <= 32 * p.warps * ops.THREAD_BYTES
                    else:  # rows off 16-byte boundaries mask every element: their loops step through fewer a thread
                        assert p.block == (ops.SHIFTED_ELEMS if shift else ops.LOOP_ELEMS) * 32 * p.warps
                    if p.kind == "rows" and p.regs:  # a cap on registers fits the launch in one wave
                        per_sm = ops.resident(Gpu(), p.warps, p.regs)
                        assert ops._cdiv(rows, p.rows) <= Gpu().sms * per_sm and p.regs < 255
                        assert p.rows * (p.block + p.tail) // (32 * p.warps) + 24 <= p.regs
                    if p.kind == "split":
                        assert 2 <= p.parts <= ops.MAX_PARTS and p.chunk % p.block == 0
                        assert (p.parts - 1) * p.chunk < n + lead <= p.parts * p.chunk


def test_plan_shapes_the_launch_to_the_input():
    g = Gpu()
    # a single long row spreads over the GPU; many of them keep one program per row
    one = ops.plan("softmax", 1, 262144, 4, False, g)
    assert one.kind == "split" and one.parts >= 64
    assert ops.plan("softmax", 4096, 65536, 2, False, g).kind == "looped"
    # nor does a lone block of 128 KB stay on one SM, even where the op only reads it
    assert {ops.plan(op, rows, 32768, 4, False, g).kind for op in ("softmax", "cross_entropy") for rows in (1, 8, 128)} \
        <= {"looped", "split"}
    # short rows are grouped; rows that fit in registers stay there
    assert ops.plan("norm", 32768, 64, 4, False, g).rows >= 8
    assert ops.plan("softmax", 8192, 4096, 4, False, g).kind == "rows"
    # 5120 halves: a block of 4096 and a tail of 1024, not 8192 lanes of which 3072 are masked
    wide = ops.plan("norm", 4096, 5120, 2, False, g)
    assert (wide.kind, wide.block, wide.tail) == ("rows", 4096, 1024)
    # rows of 11008 f32, many of them: 8192 + 4096, not 16384 lanes of which 5376 are masked
    assert ops.plan("norm", 32768, 11008, 4, False, g).tail == 4096
    # a launch of at most a program per SM: rows spread over the SMs, and a program's threads grow as the square
    # root of its block (512 bytes: a warp; 4 KB: 4; 32 and 64 KB: 16), so that neither the bytes each thread walks
    # through nor the warps a reduction crosses dominate its latency; a norm's, which load the weight and bias
    # after their reduction, take a vector a thread up to 16 warps (4 KB: 8 warps, 16 KB and beyond: 16)
    spread = ops.plan("softmax", 128, 128, 2, False, g)
    assert (spread.rows, ops.plan("softmax", 4096, 128, 2, False, g).rows) == (1, 8)
    assert [ops.plan("softmax", 1, n, 4, False, g).warps for n in (128, 1024, 5120, 16384)] == [1, 4, 16, 16]
    assert [ops.plan("norm", 1, n, 4, False, g).warps for n in (128, 1024, 4096, 5120, 16384)] == [1, 8, 16, 16, 16]
    # a launch of more than 3 waves streams its rows: 2 warps hold a tile of up to 6 KB (96 bytes a thread); one wave
    # keeps 4, and so does a tile of 8 KB
    assert [ops.plan("cross_entropy", rows, 1024, 2, False, g).warps for rows in (32768, 4096)] == [2, 4]
    assert [ops.plan(op, 32768, n, 2, False, g).warps for op, n in (("cross_entropy", 3000), ("softmax", 4096))] == [2, 4]
    assert (lambda p: (p.rows, p.warps))(ops.plan("softmax", 16384, 512, 2, False, g)) == (2, 2)
    # 1024 rows of 5120 halves fit one wave at 8 programs an SM: registers capped at 64 (NVRTC would take 65 for f16),
    # where more rows than a wave holds at 4 warps get no cap
    assert [ops.plan("rmsnorm", rows, 5120, 2, False, g).regs for rows in (1024, 2048)] == [64, 0]
    # softmax's aligned rows of 2 KB or more run a row a program, on the warps the model's group gave each row (4096
    # x 1024 halves: two rows on 4 warps -> one on 2); the norms' grouped rows share a load of the weight
    alone = [ops.plan("softmax", 4096, n, 2, False, g) for n in (1024, 1280)]
    assert [(p.rows, p.warps) for p in alone] == [(1, 2), (1, 1)] and ops.plan("norm", 4096, 1024, 2, False, g).rows == 2
    # rows off 16 bytes that the lead (7 halves) carries past a power of two: 2047 halves as 2048 and a tail grown to a
    # vector a thread, not 4096 lanes half masked
    off = ops.plan("softmax", 4096, 2047, 2, True, g)
    assert (off.block, off.tail, off.rows, off.warps) == (2048, 512, 1, 2)
    # fewer SMs: a smaller GPU needs fewer chunks to fill
    small = ops.plan("cross_entropy", 8, 128256, 2, False, Gpu(sms=16))
    assert small.parts < ops.plan("cross_entropy", 8, 128256, 2, False, g).parts


def test_loops_over_rows_off_16_byte_boundaries_step_through_fewer_elements():
    """Each element of a row off 16-byte boundaries loads under its own mask: there a loop holds 8 a thread, not 16."""
    g = Gpu()
    for op in ("softmax", "cross_entropy", "norm", "rmsnorm"):
        aligned, shifted = ops.plan(op, 4096, 65536, 2, False, g), ops.plan(op, 4096, 50257, 2, True, g)
        assert aligned.kind == shifted.kind == "looped" and aligned.warps == shifted.warps
        assert (aligned.block // (32 * aligned.warps), shifted.block // (32 * shifted.warps)) == (16, 8)


def test_f32_loops_of_softmax_and_rms_norm_run_two_programs_of_32_warps_an_sm():
    """Where their loops over f32 rows fit two 32-warp programs an SM (F32_LOOPS) they take them; layer norm's loop,
    RMS norm's over rows off 16 bytes and 16-bit rows keep the model's choice."""
    g = Gpu()
    for rows, n in ((300, 40000), (512, 100000), (4096, 65536), (2048, 131072)):
        for op, shift in ops.F32_LOOPS:
            p = ops.plan(op, rows, n + shift, 4, shift, g)
            elems = ops.SHIFTED_ELEMS if shift else ops.LOOP_ELEMS
            assert (p.kind, p.warps, p.block) == ("looped", 32, elems * 32 * 32)
        assert ops.plan("norm", rows, n, 4, False, g).warps < 32 and ops.plan("softmax", rows, n, 2, False, g).warps < 32
    assert ops.plan("rmsnorm", 4096, 50257, 4, True, g).warps < 32


def test_rms_norm_takes_more_warps_than_layer_norm():
    """RMS norm reduces once, layer norm twice (the mean, then the squares about it): the warps cost RMS norm less
    where many programs share the SMs. Lone programs of both take a vector a thread (8 KB: 16 warps); a block one
    warp holds at 32 bytes a thread stays on one warp, whose reduction needs no barrier."""
    g = Gpu()
    assert [ops.plan(op, 128, 4096, 2, False, g).warps for op in ("rmsnorm", "norm")] == [16, 16]
    assert [ops.plan(op, 1, 512, 2, False, g).warps for op in ("rmsnorm", "norm")] == [1, 1]
    # many rows: the fewest warps that hold at most RMS_BYTES a thread (16 KB: 8 warps, where layer norm takes 4) ...
    for rows, n, itemsize in ((1024, 8192, 2), (1024, 4096, 4)):
        rms, layer = (ops.plan(op, rows, n, itemsize, False, g) for op in ("rmsnorm", "norm"))
        assert rms.kind == layer.kind == "rows" and (rms.warps, layer.warps) == (8, 4)
    # ... where 16 warps can: a 64 KB row keeps 16 warps, as layer norm's does
    assert ops.plan("rmsnorm", 4096, 16384, 4, False, g).warps == ops.plan("norm", 4096, 16384, 4, False, g).warps == 16


def test_norms_pair_rows_where_one_warp_programs_would_crowd_the_block_slots():
    """A one-warp program per row is capped by the SMs' block slots (32 each), not by warps: where such programs would
    fill half of them, a norm takes two rows on two warps (a warp a row, the weight loaded once for both); with fewer
    rows, or for softmax (no weight), one warp a row stays."""
    g = Gpu()
    for op in ("norm", "rmsnorm"):
        for n in (512, 768):
            assert (lambda p: (p.rows, p.warps))(ops.plan(op, 4096, n, 2, False, g)) == (2, 2), (op, n)
        assert ops.plan(op, 1024, 768, 2, False, g).warps == 1
    assert ops.plan("softmax", 4096, 768, 2, False, g).warps == 1


@pytest.mark.parametrize("op", ["softmax", "cross_entropy", "norm", "rmsnorm"])
def test_split_only_where_rows_leave_sms_idle(op):
    """Cutting rows into chunks pays a second kernel and a round of partial statistics to fill SMs that whole rows
    would leave idle: a row per SM already fills the GPU (128 rows of 32768 or wider), and a row far wider
    than one SM can stream still spreads over many. A split never takes more than a wave of programs: then every
    SM is full already, and more chunks only add programs and partials."""
    g = Gpu()
    for itemsize in (4, 2):
        for n in (32768, 65536, 262144):
            assert ops.plan(op, g.sms, n, itemsize, False, g).kind != "split"
            assert ops.plan(op, 128, n, itemsize, False, g).kind != "split"
        for rows, n in ((1, 65536), (1, 262144), (8, 262144)):
            assert ops.plan(op, rows, n, itemsize, False, g).kind == "split"
        for rows in ROWS:
            for n in WIDTHS:
                p = ops.plan(op, rows, n, itemsize, False, g)
                assert p.kind != "split" or p.parts * rows <= g.sms * ops.resident(g, p.warps, ops.registers(
                    ops.LOOP_ELEMS))


def test_seconds_follows_littles_law():
    g = Gpu()
    full = ops.seconds(g, 132, 1, 64 * 1024, 1e9)
    assert full == pytest.approx(1e9 / (132 * ops.SM_BANDWIDTH))
    small = ops.seconds(g, 132, 1, 16 * 1024, 1e9)
    assert small == pytest.approx(full * ops.SM_BANDWIDTH * ops.LATENCY / (16 * 1024))  # too little in flight
    # half the SMs take up to twice their share while the others idle, if they have the bytes in flight
    assert ops.seconds(g, 66, 1, 96 * 1024, 1e9) == pytest.approx(full)
    assert ops.seconds(g, 66, 1, 16 * 1024, 1e9) == pytest.approx(2 * small)
    # no waves: a program starts where one ends, so more programs than fit move the same bytes at the same rate
    assert ops.seconds(g, 133, 1, 64 * 1024, 1e9) == pytest.approx(full)
    assert ops.seconds(g, 132, 1, 64 * 1024, 1e9) < ops.seconds(g, 64, 1, 64 * 1024, 1e9)
    # a lone program with nothing to store leaves memory idle through its reductions; a second one fills it,
    # unless both started at once (a launch of one wave): then they wait together, as one program would
    idle = 1 + ops.WAIT * ops.SM_BANDWIDTH / (64 * 1024)  # a wait after each step of 64 KB at the SM's share
    assert ops.seconds(g, 132, 1, 64 * 1024, 1e9, stores=False) == pytest.approx(full * idle)
    assert ops.seconds(g, 4 * 264, 2, 64 * 1024, 8e9, stores=False) == pytest.approx(8 * full)
    assert ops.seconds(g, 264, 2, 64 * 1024, 2e9, stores=False) == pytest.approx(2 * full * idle)


def test_a_wait_per_step_favors_bigger_steps_only_for_lone_programs():
    """A program waits about as long after each step of loads whatever the step moved, so a lone program per SM
    idles less with bigger steps (more warps), while two programs per SM cover each other's waits and keep more of
    the second pass in L2 than one program of twice the warps."""
    g = Gpu()
    ideal = [ops.seconds(g, 132, 1, step, 1e9) for step in (16384, 32768, 65536)]
    idle = [ops.seconds(g, 132, 1, step, 1e9, stores=False) / t for step, t in zip((16384, 32768, 65536), ideal)]
    assert idle[0] > idle[1] > idle[2] > 1
    for op in ("norm", "softmax", "cross_entropy"):
        assert ops.plan(op, 128, 65536, 4, False, g).warps == 32  # a row per SM
    assert ops.plan("norm", 128, 32768, 4, False, g).warps == 32
    for op, itemsize in (("norm", 4), ("norm", 2), ("softmax", 2)):  # (f32 softmax: F32_LOOPS)
        assert ops.plan(op, 4096, 50257, itemsize, False, g).warps == 16  # two programs per SM, many waves


# ---- the bound (cached) path on the GPU --------------------------------------------------------------
@pytest.mark.gpu
def test_repeated_calls_take_the_bound_path():
    x = torch.randn(300, 1000, device="cuda")
    w = torch.randn(1000, device="cuda")
    ref = F.layer_norm(x, (1000,), w, None)
    for _ in range(3):  # the first call binds, the next ones launch the bound kernels
        close(ops.layernorm(x, w, None), ref, torch.float32)
    assert any(key[:3] == ("layernorm", x.shape, x.stride()) for key in ops._fast)
    off = torch.randn(300 * 1000 + 1, device="cuda")[1:].view(300, 1000)  # 4 bytes off: the general path
    close(ops.layernorm(off, w, None), F.layer_norm(off, (1000,), w, None), torch.float32)
    for x in (torch.randn(2, 262144, device="cuda"), torch.randn(8, 50257, device="cuda", dtype=torch.bfloat16)):
        for _ in range(2):  # split plans: two kernels and a workspace, bound
            check_row_ops(x, x.dtype)


# ---- layer norm's moments on hard rows -------------------------------------------------------------
def hard_rows(n: int, head: int, dtype, device):
    """Rows whose mean is far from 0 next to their spread (where a plain sum of squares cancels), and rows
    whose first `head` columns (a loop's first block) sit 1000 away from the rest: (name, rows)."""
    z = torch.randn(4, n, device=device, dtype=torch.float64)
    rows = [("1000 + randn", z + 1000), ("-300 + 0.5 randn", 0.5 * z - 300)]
    if dtype == torch.float32:
        rows.append(("1e4 + 0.01 randn", 0.01 * z + 1e4))
    for sign in (1, -1):
        shifted = z.clone()
        shifted[:, :head] += sign * 1000
        rows.append((f"first block {sign * 1000:+}", shifted))
    return [(name, x.to(dtype)) for name, x in rows]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_moments_on_hard_rows(device, dtype, monkeypatch):
    """Every plan's layer norm against torch's in f64. With unit weight and no bias, an output row less its own
    mean depends on the variance alone; its mean is minus the error of the row's mean over the deviation, which
    f32 holds to a few 2^-24 of the mean's size. A mean (or a chunk's, for split plans) that far off inflates the
    variance of deviations taken from it by its square; the looped plan's shifted sums take deviations from a
    pivot in the input's dtype, exactly, and stay within the dtype's tolerance times their cancellation factor
    (a row whose first block sits 1000 away: about 12)."""
    n = 3001
    head = 64 * 16 // torch.empty(0, dtype=dtype).element_size()  # forced_plans' loop block
    for name, x in hard_rows(n, head, dtype, device):
        ref = F.layer_norm(x.double(), (n,))
        off = (2**-24 * x.double().mean(-1).abs() / x.double().std(-1)).max().item()  # a mean's rounding, in deviations
        # shifted sums lose 1 + (mean - pivot)^2 / variance of the sums' precision, the pivot being the first block's mean
        cancel = (1 + (x.double().mean(-1) - x[:, :head].double().mean(-1)) ** 2 / x.double().var(-1)).max().item()
        w = torch.ones(n, device=device, dtype=dtype)
        for p in forced_plans(n, x.element_size(), False, True):
            force_plan(monkeypatch, p)
            out = ops.layernorm(x, w, None).double()
            shift = out.mean(-1, keepdim=True)
            err = ((out - shift) - (ref - ref.mean(-1, keepdim=True))).norm() / ref.norm()
            assert err < TOL[dtype] * (cancel if p.kind == "looped" else 1) + (0 if p.kind == "looped" else 2 * (2 * off) ** 2), \
                (name, p, err)
            assert shift.abs().max() <= 4 * off + TOL[dtype], (name, p, shift.squeeze(-1))
