"""newtc.ops on shapes, layouts and options drawn at random, against torch in float64: in the interpreter on the CPU
(every size limit its square root there: it runs a program at a time in Python) and on the GPU (marker gpu).

The fixed shapes of test_ops and test_matmul pin each plan; these draw what a user might pass instead, so that a plan,
a copy or a specialization that only some shapes reach is met: sides log-uniform over 1-6000 (row widths a third of
the time a power of two give or take 8, where plans' blocks and chunks end), operands transposed,
sliced from wider rows or started off 16 bytes, fp8 with and without scales, bias and activations; row ops,
elementwise ops and reductions on views; attention forward and backward with GQA, causal masks of unequal lengths and
strided heads.
Each run draws fresh cases from a fresh seed, which a failure names (NEWT_RANDOM_SEED=... repeats the run;
NEWT_RANDOM_CASES=N draws N of each kind: by default 40, and 10 attentions). Outputs start as NaN.
"""
import math
import os
import random

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from newtc import ops

pytestmark = pytest.mark.usefixtures("poisoned_outputs")  # conftest.py
SEED = int(os.environ.get("NEWT_RANDOM_SEED", random.SystemRandom().randrange(2**32)))
CASES = os.environ.get("NEWT_RANDOM_CASES")  # else 40 of each kind, 10 attentions (each compiles three kernels)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# relative Frobenius error: tf32 and 16-bit outputs round (test_matmul.TOL); fp8 products are exact sums rounded once
TOL = {torch.float32: 3e-3, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
ROW_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # the other ops' (test_ops.TOL)


class Draw(random.Random):
    """The draws of one kind of case on one device."""

    def __init__(self, kind: str, device: str):
        super().__init__(f"{SEED}-{kind}")
        self.device = device

    def limit(self, n: int) -> int:
        return n if self.device == "cuda" else max(2, math.isqrt(n))

    def side(self, lo: int, hi: int) -> int:
        """Log-uniform from lo to hi (its limit on this device)."""
        return round(math.exp(self.uniform(math.log(lo), math.log(self.limit(hi)))))

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32, values: tuple = (1.0, 0.0)) -> torch.Tensor:
        """Normal values of the standard deviation and mean in `values`."""
        return (torch.randn(*shape, device=self.device) * values[0] + values[1]).to(dtype)

    def laid_out(self, rows: int, cols: int, dtype: torch.dtype, values: tuple = (1.0, 0.0)) -> tuple[Tensor, str]:
        """A [rows, cols] tensor of random values, in one of the layouts a caller might hand over."""
        how = self.choice(["rows", "rows", "columns", "wider", "shifted", "repeated"])
        if how == "repeated":  # one row seen rows times (a row stride of 0, as expand makes)
            return self.randn(1, cols, dtype=dtype, values=values).expand(rows, cols), how
        if how == "columns":
            return self.randn(cols, rows, dtype=dtype, values=values).t(), how
        if how == "wider":  # rows further apart than their length
            return self.randn(rows, cols + self.randint(1, 40), dtype=dtype, values=values)[:, :cols], how
        if how == "shifted":  # the first element off 16 bytes
            shift = self.randint(1, 7)
            return self.randn(rows * cols + shift, dtype=dtype, values=values)[shift:].view(rows, cols), how
        return self.randn(rows, cols, dtype=dtype, values=values), how

    def rows(self, widest: int, most: int, batched: bool = True, values: tuple = (1.0, 0.0)) -> tuple[Tensor, str]:
        """Rows (up to 5000 of up to `widest` elements, at most `most` in all) laid out at random; where `batched`,
        also as [b, rows / b, n] with the batch outermost or not (a view the ops see through or copy)."""
        dtype = self.choice([torch.float32, torch.float16, torch.bfloat16])
        rows, n = self.side(1, 5000), self.side(1, widest)
        if self.random() < 0.3:  # a power of two give or take a few: where blocks, loops and a split's chunks end
            n = max(1, min(self.limit(widest), 1 << round(math.log2(n))) + self.randint(-8, 8))
        while rows * n > self.limit(most):
            rows = max(1, rows // 2)
        if batched and self.random() < 0.25:
            b, inner = self.randint(2, 4), self.choice([False, True])
            x, how = self.laid_out(max(1, rows // b) * b, n, dtype, values)
            x = x.unflatten(0, (-1, b)).transpose(0, 1) if inner else x.unflatten(0, (b, -1))
            return x, f"{how} as [{b}, -1, n]{' batch inner' * inner}"
        return self.laid_out(rows, n, dtype, values)


def matmul_case(d: Draw) -> str:
    dtype = d.choice([torch.float16, torch.bfloat16, torch.float32, *FP8])
    while True:
        m, n, k = d.side(1, 6000), d.side(1, 6000), d.side(1, 6000)
        if m * n * k <= d.limit(2**32):
            break
    a, la = d.laid_out(m, k, dtype)
    b, lb = d.laid_out(k, n, dtype)
    fp8 = dtype in FP8
    out = d.choice([None, torch.float32])
    result = out or (torch.bfloat16 if fp8 else dtype)
    bias = d.choice([None, d.randn(n, dtype=result)])
    activation = d.choice([None, "relu", "gelu"])
    scales = d.choice([None, "one", "rows"]) if fp8 else None
    sa = sb = None
    if scales:
        sa, sb = (torch.rand(m if scales == "rows" else 1, device=d.device) + 0.5,
                  torch.rand(n if scales == "rows" else 1, device=d.device) + 0.5)
    what = (f"{m}x{n}x{k} {str(dtype)[6:]} a {la} b {lb} out {str(result)[6:]} bias {bias is not None} "
            f"{activation} scales {scales}")
    got = [ops.matmul(a, b, bias, activation, out_dtype=out, scale_a=sa, scale_b=sb) for _ in range(2)]
    ref = a.double() @ b.double()
    if sa is not None:
        ref = ref * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    if bias is not None:
        ref = ref + bias.double()
    floor = gelu_floor(ref) if activation == "gelu" else 1e-30
    if dtype == torch.float32:  # tf32 rounds each operand to 10 bits: a product's error scales with its terms, and
        # an output of one value (or a few) may have cancelled to far less (155x1x55 with a's rows repeated: 3.5e-3)
        floor = max(floor, 0.25 * (a.double().abs() @ b.double().abs()).norm().item())
    ref = {None: ref, "relu": torch.relu(ref), "gelu": F.gelu(ref)}[activation]
    assert got[0].dtype == result, f"{what}: {got[0].dtype}"
    return check(got, ref, TOL[result], what, floor)


def row_case(d: Draw) -> str:
    op = d.choice(["softmax", "log_softmax", "layernorm", "rmsnorm", "cross_entropy"])
    x, how = d.rows(140000, 2**26, batched=op != "cross_entropy", values=(3.0, 1.0))  # [rows, n] logits
    *rows, n = x.shape
    dtype = x.dtype
    w, bias = d.randn(n, dtype=dtype), d.choice([None, d.randn(n, dtype=dtype)])
    target = torch.randint(0, n, rows, device=d.device)
    xd = x.double()
    run = {
        "softmax": lambda: (ops.softmax(x), torch.softmax(xd, -1)),
        "log_softmax": lambda: (ops.log_softmax(x), torch.log_softmax(xd, -1)),
        "layernorm": lambda: (ops.layernorm(x, w, bias), F.layer_norm(xd, (n,), w.double(),
                                                                     None if bias is None else bias.double(), 1e-5)),
        "rmsnorm": lambda: (ops.rmsnorm(x, w), F.rms_norm(xd, (n,), w.double(), 1e-6)),
        "cross_entropy": lambda: (ops.cross_entropy(x, target), F.cross_entropy(xd, target, reduction="none")),
    }[op]
    (first, ref), (second, _) = run(), run()
    what = f"{op} {'x'.join(map(str, x.shape))} {str(dtype)[6:]} {how} bias {bias is not None}"
    # log-space results are differences of logits, exact only to the logits' rounding (test_ops.check_row_ops)
    floor = xd.abs().max().item() if op in ("log_softmax", "cross_entropy") else 1e-12
    return check([first, second], ref, ROW_TOL[torch.float32 if op == "cross_entropy" else dtype], what, floor)


def elementwise_case(d: Draw) -> str:
    op = d.choice(["add", "add row", "bias_gelu", "transpose", "sum", "mean", "amax"])
    x, how = d.rows(70000, 2**25, batched=op not in ("add", "transpose"))  # transpose takes 2-D tensors
    n, dtype = x.shape[-1], x.dtype
    y = d.laid_out(*x.shape, dtype)[0] if op == "add" else d.randn(n, dtype=dtype)
    xd, yd = x.double(), y.double()
    run = {
        "add": lambda: (ops.add(x, y), xd + yd), "add row": lambda: (ops.add(x, y), xd + yd),
        "bias_gelu": lambda: (ops.bias_gelu(x, y), F.gelu(xd + yd)), "transpose": lambda: (ops.transpose(x), xd.t()),
        "sum": lambda: (ops.sum(x), xd.sum(-1)), "mean": lambda: (ops.mean(x), xd.mean(-1)),
        "amax": lambda: (ops.amax(x), xd.amax(-1)),
    }[op]
    (first, ref), (second, _) = run(), run()
    what = f"{op} {'x'.join(map(str, x.shape))} {str(dtype)[6:]} {how}"
    # sums of random signs can nearly cancel: their errors are against the rows' norm (test_ops.test_reductions)
    floor = xd.norm().item() / (n if op == "mean" else 1) if op in ("sum", "mean") else 1e-12
    floor = gelu_floor(xd + yd) if op == "bias_gelu" else floor
    return check([first, second], ref, ROW_TOL[dtype], what, floor)


def attention_case(d: Draw) -> str:
    from test_attention import GRAD_TOL, sdpa_grads
    dtype = d.choice([torch.float16, torch.bfloat16])
    hk, group, dim = d.randint(1, 4), d.choice([1, 2, 4]), d.choice([64, 128, 256])
    b, lq, lk = d.randint(1, 3), d.side(1, 3000), d.side(1, 3000)
    while b * hk * group * lq * lk > d.limit(2**26):
        lq, lk = max(1, lq // 2), max(1, lk // 2)
    causal, scale = d.choice([False, True]), d.choice([None, d.uniform(0.02, 0.3)])
    heads_inner = d.choice([False, True])  # (B, L, H, D) in memory, seen as (B, H, L, D): strided heads

    def make(heads: int, length: int) -> torch.Tensor:
        if heads_inner:
            return d.randn(b, length, heads, dim, dtype=dtype).transpose(1, 2).requires_grad_()
        return d.randn(b, heads, length, dim, dtype=dtype).requires_grad_()
    q, k, v = make(hk * group, lq), make(hk, lk), make(hk, lk)
    what = f"attention b{b} h{hk * group}/{hk} {lq}x{lk} d{dim} {str(dtype)[6:]} causal {causal} scale {scale} " \
        f"heads inner {heads_inner}"
    o = ops.attention(q, k, v, causal, scale)
    g = torch.randn_like(o)
    o.backward(g)
    ref, grads = sdpa_grads(q, k, v, g, causal, scale)
    check([o], ref.double(), 5e-3 if dtype == torch.float16 else 2e-2, what)
    floors = (*(t / 2 for t in terms(q, k, v, g, causal, scale)), 1e-3 * grads[2].norm().item())
    for name, x, r, floor in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads, floors):
        check([x], r.double(), GRAD_TOL[dtype], f"{what} {name}", floor)
    return what


def terms(q, k, v, g, causal: bool, scale: float | None) -> tuple[float, float]:
    """The norms of dq and dk with their terms' magnitudes summed: scale * (P * |dP|) @ |k| and its transpose with |q|.
    dq and dk sum dS = P * (dP - D) over keys, D = rowsum(dO * O) with O rounded to the input dtype (as in every flash
    attention backward): where dP is near D for every key they cancel to little or nothing (0 where a row sees one
    key), and their rounding counts against the terms, not against what is left of them."""
    from test_attention import scores
    group, s = q.shape[1] // k.shape[1], scale or 1 / math.sqrt(q.shape[3])
    qd, kd, vd, gd = (t.detach().double() for t in (q, k, v, g))
    kd, vd = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    a = torch.softmax(scores(qd, kd, causal, s), -1).nan_to_num(0) * (gd @ vd.transpose(-1, -2)).abs()
    tk = (s * a.transpose(-1, -2) @ qd.abs()).unflatten(1, (-1, group)).sum(2)  # each K head's group of queries
    return (s * a @ kd.abs()).norm().item(), tk.norm().item()


def gelu_floor(x: torch.Tensor) -> float:
    """gelu in f32, as torch's, loses relative precision in its far negative tail, where 1 + erf cancels (gelu(-6) is
    0): there its errors count against the inputs' norm, so that a few outputs all in the tail do not fail."""
    return 1e-3 * x.norm().item()


def check(got: list, ref: torch.Tensor, tol: float, what: str, floor: float = 1e-30) -> str:
    """Each result of a case (the first call through the general path, a second one through the bound path that the
    first left for its key) against the reference."""
    for call, out in enumerate(got):
        where = f"{what} (call {call + 1})"
        assert out.shape == ref.shape, f"{where}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        assert torch.isfinite(out.float()).all(), f"{where}: unwritten (NaN) or overflowed elements"
        err = ((out.double() - ref).norm() / ref.norm().clamp_min(floor)).item()
        assert err < tol, f"{where}: relative error {err:.2e}"
    return what


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("kind", [matmul_case, row_case, elementwise_case, attention_case],
                         ids=["matmul", "rows", "elementwise", "attention"])
def test_random_cases(kind, device):
    draw = Draw(kind.__name__, device)
    torch.manual_seed(SEED)  # the values too: NEWT_RANDOM_SEED repeats a failing case exactly
    for i in range(int(CASES or (10 if kind is attention_case else 40))):
        try:
            kind(draw)
        except AssertionError as e:
            raise AssertionError(f"case {i} of NEWT_RANDOM_SEED={SEED} on {device}: {e}") from None
