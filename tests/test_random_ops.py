"""newtc.ops on shapes, layouts and options drawn at random, against torch in float64 (marker gpu).

The fixed shapes of test_ops and test_matmul pin each plan; these draw what a user might pass instead, so that a plan,
a copy or a specialization that only some shapes reach is met: sides log-uniform over 1-6000, operands transposed,
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

from newtc import ops

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_outputs")]  # conftest.py
SEED = int(os.environ.get("NEWT_RANDOM_SEED", random.SystemRandom().randrange(2**32)))
CASES = os.environ.get("NEWT_RANDOM_CASES")  # else 40 of each kind, 10 attentions (each compiles three kernels)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# relative Frobenius error: tf32 and 16-bit outputs round (test_matmul.TOL); fp8 products are exact sums rounded once
TOL = {torch.float32: 3e-3, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
ROW_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}  # the other ops' (test_ops.TOL)


def side(rng: random.Random, lo: int = 1, hi: int = 6000) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def laid_out(rng: random.Random, rows: int, cols: int, dtype: torch.dtype) -> tuple[torch.Tensor, str]:
    """A [rows, cols] tensor of random values, in one of the layouts a caller might hand over."""
    how = rng.choice(["rows", "rows", "columns", "wider", "shifted"])
    make = lambda *shape: torch.randn(*shape, device="cuda").to(dtype)  # noqa: E731
    if how == "columns":
        return make(cols, rows).t(), how
    if how == "wider":  # rows further apart than their length
        return make(rows, cols + rng.randint(1, 40))[:, :cols], how
    if how == "shifted":  # the first element off 16 bytes
        shift = rng.randint(1, 7)
        return make(rows * cols + shift)[shift:].view(rows, cols), how
    return make(rows, cols), how


def matmul_case(rng: random.Random) -> str:
    dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32, *FP8])
    while True:
        m, n, k = side(rng), side(rng), side(rng)
        if m * n * k <= 2**32:
            break
    a, la = laid_out(rng, m, k, dtype)
    b, lb = laid_out(rng, k, n, dtype)
    fp8 = dtype in FP8
    out = rng.choice([None, torch.float32])
    result = out or (torch.bfloat16 if fp8 else dtype)
    bias = rng.choice([None, torch.randn(n, device="cuda").to(result)])
    activation = rng.choice([None, "relu", "gelu"])
    scales = rng.choice([None, "one", "rows"]) if fp8 else None
    sa = sb = None
    if scales:
        sa, sb = (torch.rand(m if scales == "rows" else 1, device="cuda") + 0.5,
                  torch.rand(n if scales == "rows" else 1, device="cuda") + 0.5)
    what = (f"{m}x{n}x{k} {str(dtype)[6:]} a {la} b {lb} out {str(result)[6:]} bias {bias is not None} "
            f"{activation} scales {scales}")
    got = [ops.matmul(a, b, bias, activation, out_dtype=out, scale_a=sa, scale_b=sb) for _ in range(2)]
    ref = a.double() @ b.double()
    if sa is not None:
        ref = ref * sa.double().reshape(-1, 1) * sb.double().reshape(1, -1)
    if bias is not None:
        ref = ref + bias.double()
    ref = {None: ref, "relu": torch.relu(ref), "gelu": F.gelu(ref)}[activation]
    assert got[0].dtype == result, f"{what}: {got[0].dtype}"
    return check(got, ref, TOL[result], what)


def rows_of(rng: random.Random, widest: int, most: int) -> tuple[torch.Tensor, str]:
    """Rows (up to 5000 of up to `widest` elements, at most `most` in all) laid out at random."""
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    rows, n = side(rng, 1, 5000), side(rng, 1, widest)
    while rows * n > most:
        rows = max(1, rows // 2)
    return laid_out(rng, rows, n, dtype)


def row_case(rng: random.Random) -> str:
    x, how = rows_of(rng, 140000, 2**26)
    (rows, n), dtype = x.shape, x.dtype
    x.mul_(3).add_(1)  # in place: the layout stays
    op = rng.choice(["softmax", "log_softmax", "layernorm", "rmsnorm", "cross_entropy"])
    w, bias = torch.randn(n, device="cuda").to(dtype), rng.choice([None, torch.randn(n, device="cuda").to(dtype)])
    target = torch.randint(0, n, (rows,), device="cuda")
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
    what = f"{op} {rows}x{n} {str(dtype)[6:]} {how} bias {bias is not None}"
    # log-space results are differences of logits, exact only to the logits' rounding (test_ops.check_row_ops)
    floor = xd.abs().max().item() if op in ("log_softmax", "cross_entropy") else 1e-12
    return check([first, second], ref, ROW_TOL[torch.float32 if op == "cross_entropy" else dtype], what, floor)


def elementwise_case(rng: random.Random) -> str:
    x, how = rows_of(rng, 70000, 2**25)
    (rows, n), dtype = x.shape, x.dtype
    op = rng.choice(["add", "add row", "bias_gelu", "transpose", "sum", "mean", "amax"])
    y = laid_out(rng, rows, n, dtype)[0] if op == "add" else torch.randn(n, device="cuda").to(dtype)
    xd, yd = x.double(), y.double()
    run = {
        "add": lambda: (ops.add(x, y), xd + yd), "add row": lambda: (ops.add(x, y), xd + yd),
        "bias_gelu": lambda: (ops.bias_gelu(x, y), F.gelu(xd + yd)), "transpose": lambda: (ops.transpose(x), xd.t()),
        "sum": lambda: (ops.sum(x), xd.sum(-1)), "mean": lambda: (ops.mean(x), xd.mean(-1)),
        "amax": lambda: (ops.amax(x), xd.amax(-1)),
    }[op]
    (first, ref), (second, _) = run(), run()
    what = f"{op} {rows}x{n} {str(dtype)[6:]} {how}"
    # sums of random signs can nearly cancel: their errors are against the rows' norm (test_ops.test_reductions)
    floor = xd.norm().item() / (n if op == "mean" else 1) if op in ("sum", "mean") else 1e-12
    return check([first, second], ref, ROW_TOL[dtype], what, floor)


def attention_case(rng: random.Random) -> str:
    from test_attention import GRAD_TOL, sdpa_grads
    dtype = rng.choice([torch.float16, torch.bfloat16])
    hk, group, d = rng.randint(1, 4), rng.choice([1, 2, 4]), rng.choice([64, 128, 256])
    b, lq, lk = rng.randint(1, 3), side(rng, 1, 3000), side(rng, 1, 3000)
    while b * hk * group * lq * lk > 2**26:
        lq, lk = max(1, lq // 2), max(1, lk // 2)
    causal, scale = rng.choice([False, True]), rng.choice([None, rng.uniform(0.02, 0.3)])
    heads_inner = rng.choice([False, True])  # (B, L, H, D) in memory, seen as (B, H, L, D): strided heads

    def make(heads: int, length: int) -> torch.Tensor:
        if heads_inner:
            return torch.randn(b, length, heads, d, device="cuda").to(dtype).transpose(1, 2).requires_grad_()
        return torch.randn(b, heads, length, d, device="cuda").to(dtype).requires_grad_()
    q, k, v = make(hk * group, lq), make(hk, lk), make(hk, lk)
    what = f"attention b{b} h{hk * group}/{hk} {lq}x{lk} d{d} {str(dtype)[6:]} causal {causal} scale {scale} " \
        f"heads inner {heads_inner}"
    o = ops.attention(q, k, v, causal, scale)
    g = torch.randn_like(o)
    o.backward(g)
    ref, grads = sdpa_grads(q, k, v, g, causal, scale)
    check([o], ref.double(), 5e-3 if dtype == torch.float16 else 2e-2, what)
    floor = 1e-3 * grads[2].norm().item()  # dq and dk are 0 where each row sees one key: rounding is all they hold
    for name, x, r in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads):
        check([x], r.double(), GRAD_TOL[dtype], f"{what} {name}", floor)
    return what


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


@pytest.mark.parametrize("kind", [matmul_case, row_case, elementwise_case, attention_case],
                         ids=["matmul", "rows", "elementwise", "attention"])
def test_random_cases(kind):
    rng = random.Random(f"{SEED}-{kind.__name__}")
    for i in range(int(CASES or (10 if kind is attention_case else 40))):
        try:
            kind(rng)
        except AssertionError as e:
            raise AssertionError(f"case {i} of NEWT_RANDOM_SEED={SEED}: {e}") from None
