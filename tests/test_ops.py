"""Every stdlib op against torch: in the interpreter on the CPU, and on the GPU (marker gpu).

Fresh random inputs each run, outputs poisoned first by the op's own allocation (torch.empty on the
GPU holds stale data; the interpreter writes through checked memory), odd shapes to exercise masks.
"""
import pytest
import torch
import torch.nn.functional as F

from newtc import ops

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every tensor the ops allocate starts as NaN, so an element the kernel fails to write shows."""
    for name in ("empty", "empty_like", "empty_strided"):
        real = getattr(torch, name)

        def poisoned(*args, _real=real, **kwargs):
            t = _real(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t.fill_(-1)
        monkeypatch.setattr(ops.torch, name, poisoned)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def close(out, ref, dtype):
    ref = ref.float()
    err = (out.float() - ref).norm() / ref.norm().clamp_min(1e-12)
    assert torch.isfinite(out.float()).all()
    assert err < TOL[dtype], f"relative error {err:.2e}"


def shapes(device):
    # the interpreter runs one program per row in Python: keep CPU shapes small
    big = [(3, 4097), (1, 20000)] if device == "cuda" else [(2, 4097)]
    return [(37, 1000), (1, 1), (3, 64)] + big


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_family(device, dtype):
    for shape in shapes(device):
        x = torch.randn(shape, device=device).to(dtype)
        close(ops.softmax(x), torch.softmax(x.float(), -1), dtype)
        close(ops.log_softmax(x), torch.log_softmax(x.float(), -1), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms(device, dtype):
    for rows, n in shapes(device):
        x = torch.randn(rows, n, device=device).to(dtype)
        w, b = torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)
        close(ops.layernorm(x, w, b), F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5), dtype)
        close(ops.rmsnorm(x, w), F.rms_norm(x.float(), (n,), w.float(), 1e-6), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_and_reductions(device, dtype):
    for rows, n in shapes(device):
        x = torch.randn(rows, n, device=device).to(dtype)
        t = torch.randint(0, n, (rows,), device=device)
        close(ops.cross_entropy(x, t), F.cross_entropy(x.float(), t, reduction="none"), torch.float32)
        close(ops.sum(x), x.float().sum(-1), dtype)
        close(ops.mean(x), x.float().mean(-1), dtype)
        close(ops.amax(x), x.float().amax(-1), dtype)


@pytest.mark.parametrize("device", devices())
def test_row_strided_input(device):
    base = torch.randn(33, 1500, device=device)
    x = base[:, 100:1100]  # rows 1500 apart, 1000 columns
    close(ops.softmax(x), torch.softmax(x, -1), torch.float32)
    w, b = torch.randn(1000, device=device), torch.randn(1000, device=device)
    close(ops.layernorm(x, w, b), F.layer_norm(x, (1000,), w, b), torch.float32)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_and_transpose(device, dtype):
    x = torch.randn(37, 1001, device=device).to(dtype)
    y = torch.randn(37, 1001, device=device).to(dtype)
    close(ops.add(x, y), x.float() + y.float(), dtype)
    b = torch.randn(1001, device=device).to(dtype)
    close(ops.bias_gelu(x, b), F.gelu(x.float() + b.float()), dtype)
    close(ops.transpose(x), x.float().t(), dtype)
    close(ops.transpose(x[:, 3:700]), x[:, 3:700].float().t(), dtype)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_looped_kernels_with_small_blocks(device, dtype):
    """The looped variants serve rows too long for registers; small blocks exercise them on any row."""
    rows, n, block = 3, 1000, 128
    x = torch.randn(rows, n, device=device).to(dtype)
    sm, nm = ops._stdlib("softmax"), ops._stdlib("norm")
    for log, ref in ((False, torch.softmax(x.float(), -1)), (True, torch.log_softmax(x.float(), -1))):
        out = torch.empty_like(x)
        sm.softmax_looped[(rows,)](x, out, n, n, BLOCK=block, WARPS=1, VEC=4, LOG=log)
        close(out, ref, dtype)
    w, b = torch.randn(n, device=device).to(dtype), torch.randn(n, device=device).to(dtype)
    for rms, ref in ((False, F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)),
                     (True, F.rms_norm(x.float(), (n,), w.float(), 1e-5))):
        out = torch.empty_like(x)
        nm.norm_looped[(rows,)](x, w, b, out, n, n, n, 1e-5, BLOCK=block, RMS=rms)
        close(out, ref, dtype)
    t = torch.randint(0, n, (rows,), device=device)
    loss = torch.empty(rows, device=device)
    sm.cross_entropy[(rows,)](x, t, loss, n, n, BLOCK=block, WARPS=1, VEC=4)
    close(loss, F.cross_entropy(x.float(), t, reduction="none"), torch.float32)
