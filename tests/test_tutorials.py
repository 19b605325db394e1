"""examples/tutorials/: Triton's tutorials 01-09 ported to `.nk`, each against torch (float64 references); 06 has
the forward and the backward pass.

Device "cpu" runs the interpreter on small shapes and also compiles every kernel it launches with NVRTC for sm_80
and sm_90a (no GPU needed); "cuda" (marker gpu) runs the GPU on the tutorials' own shapes. Inputs are fresh random
tensors and outputs start as NaN.
"""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import newtc

TUTORIALS = Path(__file__).resolve().parents[1] / "examples" / "tutorials"
ARCHS = ("sm_80", "sm_90a")


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Tutorial:
    """A tutorial's module; on the CPU each launch is first compiled for ARCHS (once per kernel and constexprs)."""

    def __init__(self, name: str, device: str):
        self.module = newtc.load(TUTORIALS / f"{name}.nk")
        self.device = device
        self.compiled = set()

    def launch(self, kernel: str, grid, *args, **meta):
        k = getattr(self.module, kernel)
        key = (kernel, tuple(sorted(meta.items())))
        if self.device == "cpu" and key not in self.compiled:
            self.compiled.add(key)
            for arch in ARCHS:
                assert ".entry" in k.ptx(*args, arch=arch, **meta)
        k[grid](*args, **meta)


def nan(*shape, device, dtype=torch.float32):
    return torch.full(shape, float("nan"), device=device, dtype=dtype)


def close(out, ref, tol):
    """The Frobenius error of out (every element written) against the float64 reference, relative to its norm or
    (a reference near zero, such as dx of one-column rows) to 1."""
    assert torch.isfinite(out).all(), "unwritten (NaN) elements"
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1.0)).item()
    assert err < tol, f"relative error {err:.2e}"


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


# ---- 01 vector add -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_01_vector_add(device, dtype):
    t = Tutorial("01_vector_add", device)
    for n in {"cpu": [1, 1000, 4099], "cuda": [98432, 2**24 + 3, 7]}[device]:
        x, y = (torch.rand(n, device=device).to(dtype) for _ in range(2))
        out = nan(n, device=device, dtype=dtype)
        t.launch("add_kernel", (-(-n // 1024),), x, y, out, n, BLOCK_SIZE=1024)
        assert torch.equal(out, x + y)


# ---- 02 fused softmax ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_02_fused_softmax(device, dtype):
    t = Tutorial("02_fused_softmax", device)
    for rows, cols, programs in {"cpu": [(37, 100, 8), (3, 1, 4), (5, 257, 5)],
                                 "cuda": [(1823, 781, 528), (4096, 4097, 264), (1, 3, 1), (10000, 128, 1056)]}[device]:
        x = torch.randn(rows, cols, device=device).to(dtype)
        y = nan(rows, cols, device=device, dtype=dtype)
        block = 1 << (cols - 1).bit_length()
        warps = 16 if block >= 4096 else 8 if block >= 2048 else 4  # as the tutorial picks them
        t.launch("softmax_kernel", (programs,), y, x, x.stride(0), y.stride(0), rows, cols, BLOCK_SIZE=block,
                 num_warps=warps)
        close(y, torch.softmax(x.double(), -1), TOL[dtype])


# ---- 03 matrix multiplication ----------------------------------------------------------------------------------
MATMUL_SHAPES = {"cpu": [(70, 50, 40), (1, 3, 8), (64, 64, 64)],
                 "cuda": [(512, 512, 512), (1000, 1001, 4097), (4096, 4096, 4096), (17, 3, 8)]}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ["", "leaky_relu"])
def test_03_matmul(device, dtype, activation):
    t = Tutorial("03_matmul", device)
    blocks = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=4) if device == "cpu" else \
        dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
    for m, n, k in MATMUL_SHAPES[device]:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        c = nan(m, n, device=device, dtype=torch.float16)
        grid = (-(-m // blocks["BLOCK_SIZE_M"]) * -(-n // blocks["BLOCK_SIZE_N"]),)
        t.launch("matmul_kernel", grid, a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), **blocks,
                 ACTIVATION=activation)
        ref = a.double() @ b.double()
        if activation:
            ref = torch.nn.functional.leaky_relu(ref, 0.01)
        close(c, ref, 2e-3 if dtype == torch.float16 else 1.5e-2)


# ---- 04 low-memory dropout -------------------------------------------------------------------------------------
def philox_rand(seed: int, offsets: np.ndarray, rounds: int = 10) -> np.ndarray:
    """Triton's tl.rand (Philox 4x32 on the counter (offset, 0, 0, 0), key = the seed's halves), in numpy."""
    m = np.uint64(0xFFFFFFFF)
    c = [offsets.astype(np.uint64) & m] + [np.zeros_like(offsets, dtype=np.uint64)] * 3
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    a, b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(rounds):
        pa, pb = a * c[0], b * c[2]
        c = [(pb >> np.uint64(32)) ^ c[1] ^ k0, pb & m, (pa >> np.uint64(32)) ^ c[3] ^ k1, pa & m]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
    x = c[0].astype(np.uint32).view(np.int32)
    x = np.where(x < 0, -x - 1, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)


@pytest.mark.parametrize("device", devices())
def test_04_dropout_with_a_mask_in_memory(device):
    t = Tutorial("04_low_memory_dropout", device)
    for n in {"cpu": [10, 1000], "cuda": [98432, 2**20 + 1]}[device]:
        x = torch.randn(n, device=device)
        keep = torch.rand(n, device=device) > 0.5
        out = nan(n, device=device)
        t.launch("_dropout", (-(-n // 1024),), x, keep, out, n, 0.5, BLOCK_SIZE=1024)
        assert torch.allclose(out, torch.where(keep, x / 0.5, 0.0))


@pytest.mark.parametrize("device", devices())
def test_04_seeded_dropout(device):
    t = Tutorial("04_low_memory_dropout", device)
    for n, p in {"cpu": [(10, 0.5), (3000, 0.3)], "cuda": [(98432, 0.5), (2**20 + 1, 0.1)]}[device]:
        x = torch.randn(n, device=device)
        seed = int(torch.randint(0, 2**31, ()).item()) * 3 + 2**33  # both halves of the key in use
        outs = []
        for s in (seed, seed, seed + 1):
            outs.append(nan(n, device=device))
            t.launch("_seeded_dropout", (-(-n // 1024),), x, outs[-1], n, p, s, BLOCK_SIZE=1024)
        keep = torch.from_numpy(philox_rand(seed, np.arange(n)) > np.float32(p)).to(device)
        assert torch.allclose(outs[0], torch.where(keep, x / (1 - p), 0.0))
        assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


# ---- 05 layer norm ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["two-stage", "locked"])
def test_05_layer_norm_forward_and_backward(device, dtype, form):
    """The backward's dx kernel in its two-stage form (05_layer_norm.nk, a partial dw/db row per row) or the locked
    one (05_layer_norm_locked.nk, GROUP_SIZE_M rows), then _layer_norm_bwd_dwdb sums the partial rows."""
    t = Tutorial("05_layer_norm", device)
    locked = Tutorial("05_layer_norm_locked", device) if form == "locked" else None
    eps = 1e-5
    for m, n in {"cpu": [(37, 300), (5, 1), (3, 1024)], "cuda": [(1151, 8192), (4096, 1000), (3, 16384)]}[device]:
        x = (torch.randn(m, n, device=device) * 2 + 0.5).to(dtype)
        w, b = (torch.rand(n, device=device).to(dtype) + 0.5 for _ in range(2))
        dy = torch.randn(m, n, device=device).to(dtype)
        y, dx = nan(m, n, device=device, dtype=dtype), nan(m, n, device=device, dtype=dtype)
        mean, rstd = nan(m, device=device), nan(m, device=device)
        block = min(65536 // x.element_size(), 1 << (n - 1).bit_length())
        assert n <= block, "the dx kernel holds a whole row (the tutorial's limit: rows under 64 KB)"
        warps = min(max(block // 256, 1), 8)
        t.launch("_layer_norm_fwd_fused", (m,), x, y, w, b, mean, rstd, x.stride(0), n, eps, BLOCK_SIZE=block,
                 num_warps=warps)
        rows = min(m, 4 if device == "cpu" else 64) if locked else m  # the tutorial's GROUP_SIZE_M is 64 for N 8192
        dw_rows, db_rows = nan(rows, n, device=device, dtype=dtype), nan(rows, n, device=device, dtype=dtype)
        if locked:  # the first program to take a row's lock overwrites the NaN, the others add to it
            lock = torch.zeros(2 * rows, device=device, dtype=torch.int32)
            locked.launch("_layer_norm_bwd_dx_fused", (m,), dx, dy, dw_rows, db_rows, x, w, mean, rstd, lock,
                          x.stride(0), n, GROUP_SIZE_M=rows, BLOCK_SIZE_N=block, num_warps=warps)
            assert torch.equal(lock, torch.tensor([0] * rows + [1] * rows, device=device, dtype=torch.int32))
        else:
            t.launch("_layer_norm_bwd_dx", (m,), dx, dy, dw_rows, db_rows, x, w, mean, rstd, x.stride(0), n,
                     BLOCK_SIZE_N=block, num_warps=warps)
        dw, db = nan(n, device=device, dtype=dtype), nan(n, device=device, dtype=dtype)
        t.launch("_layer_norm_bwd_dwdb", (-(-n // 128),), dw_rows, db_rows, dw, db, rows, n, BLOCK_SIZE_M=32,
                 BLOCK_SIZE_N=128)

        xr, wr, br = (v.double().requires_grad_() for v in (x, w, b))
        ref = torch.nn.functional.layer_norm(xr, (n,), wr, br, eps)
        ref.backward(dy.double())
        var, mu = torch.var_mean(x.double(), -1, unbiased=False)
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
        for out, r in ((y, ref.detach()), (mean, mu), (rstd, 1 / torch.sqrt(var + eps)), (dx, xr.grad),
                       (dw, wr.grad), (db, br.grad)):
            close(out, r, tol * (10 if out is dw else 1))  # dw sums M rows each rounded to dtype


# ---- 06 fused attention ----------------------------------------------------------------------------------------
ATTENTION = {  # (Z, H, N_CTX, HEAD_DIM, BLOCK_M, BLOCK_N, num_warps, num_stages)
    "cpu": [(1, 2, 100, 64, 32, 32, 4, 1), (2, 1, 64, 32, 32, 16, 4, 1), (1, 1, 17, 16, 16, 16, 4, 1)],
    "cuda": [(4, 32, 1024, 64, 128, 64, 8, 3), (2, 8, 1000, 128, 128, 64, 8, 3), (1, 4, 4096, 64, 128, 64, 4, 4),
             (2, 2, 1, 64, 64, 64, 4, 3)],
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_06_fused_attention_forward(device, dtype, causal):
    t = Tutorial("06_fused_attention", device)
    for z, h, n, d, bm, bn, warps, stages in ATTENTION[device]:
        q, k, v = (torch.randn(z, h, n, d, device=device).to(dtype) for _ in range(3))
        o, m = nan(z, h, n, d, device=device, dtype=dtype), nan(z, h, n, device=device)
        scale = 1 / math.sqrt(d)
        t.launch("_attn_fwd", (-(-n // bm), z * h), q, k, v, scale, m, o, *q.stride(), *k.stride(), *v.stride(),
                 *o.stride(), z, h, n, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGE=3 if causal else 1, num_warps=warps,
                 num_stages=stages)
        s = (q.double() @ k.double().transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=device).tril(), float("-inf"))
        close(o, torch.softmax(s, -1) @ v.double(), 5e-3 if dtype == torch.float16 else 2e-2)
        assert (m.double() - torch.logsumexp(s, -1) / math.log(2)).abs().max().item() < 1e-3  # base 2, as Triton


ATTENTION_BWD = {  # (Z, H, N_CTX, HEAD_DIM, BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages)
    "cpu": [(1, 2, 96, 32, 16, 32, 32, 16, 4, 1)],
    "cuda": [(1, 2, 1024, 64, 32, 128, 128, 32, 4, 5), (4, 16, 4096, 64, 32, 128, 128, 32, 4, 5),
             (2, 8, 1024, 128, 32, 128, 128, 32, 8, 3)],
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_06_fused_attention_backward(device, dtype, causal):
    """The tutorial's host side: the forward gives O and M, then preprocess (delta) and _attn_bwd with K scaled by
    sm_scale / ln 2; dQ, dK, dV against torch's autograd of the float64 math."""
    t = Tutorial("06_fused_attention", device)
    for z, h, n, d, bm1, bn1, bm2, bn2, warps, stages in ATTENTION_BWD[device]:
        q, k, v, do = (torch.randn(z, h, n, d, device=device).to(dtype) for _ in range(4))
        o, m = nan(z, h, n, d, device=device, dtype=dtype), nan(z, h, n, device=device)
        scale = 1 / math.sqrt(d)
        t.launch("_attn_fwd", (n // bn1, z * h), q, k, v, scale, m, o, *q.stride(), *k.stride(), *v.stride(),
                 *o.stride(), z, h, n, HEAD_DIM=d, BLOCK_M=bn1, BLOCK_N=bn1 // 2, STAGE=3 if causal else 1)
        delta = nan(z, h, n, device=device)
        t.launch("_attn_bwd_preprocess", (n // bn1, z * h), o, do, delta, z, h, n, BLOCK_M=bn1, HEAD_DIM=d)
        dq, dk, dv = (nan(z, h, n, d, device=device, dtype=dtype) for _ in range(3))
        t.launch("_attn_bwd", (n // bn1, 1, z * h), q, k * (scale / math.log(2)), v, scale, do, dq, dk, dv, m, delta,
                 *q.stride(), h, n, BLOCK_M1=bm1, BLOCK_N1=bn1, BLOCK_M2=bm2, BLOCK_N2=bn2, BLK_SLICE_FACTOR=2,
                 HEAD_DIM=d, CAUSAL=causal, num_warps=warps, num_stages=stages)
        # the float64 oracle a head at a time: all of 4x16x4096^2 scores and their gradients would take 34 GB
        refs = [torch.empty(z, h, n, d, device=device, dtype=torch.double) for _ in range(3)]
        keep = torch.ones(n, n, dtype=torch.bool, device=device).tril() if causal else None
        for i in range(z):
            for j in range(h):
                qr, kr, vr = (x[i, j].double().requires_grad_() for x in (q, k, v))
                s = (qr @ kr.T) * scale
                if causal:
                    s = s.masked_fill(~keep, float("-inf"))
                (torch.softmax(s, -1) @ vr).backward(do[i, j].double())
                for ref, x in zip(refs, (qr, kr, vr)):
                    ref[i, j] = x.grad
        for out, ref in zip((dq, dk, dv), refs):
            close(out, ref, 5e-3 if dtype == torch.float16 else 3e-2)


# ---- 07 extern functions ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_07_libdevice_asin(device, dtype):
    t = Tutorial("07_extern_functions", device)
    for n in {"cpu": [1, 1000], "cuda": [98432, 2**20 + 7]}[device]:
        x = (torch.rand(n, device=device, dtype=dtype) * 2 - 1)
        y = nan(n, device=device, dtype=dtype)
        t.launch("asin_kernel", (-(-n // 1024),), x, y, n, BLOCK_SIZE=1024)
        assert torch.allclose(y, torch.asin(x), rtol=1e-6 if dtype == torch.float32 else 1e-14, atol=0)


# ---- 08 grouped GEMM -------------------------------------------------------------------------------------------
def grouped_args(sizes, device):
    """The tutorial's host side: the group's matrices, and their addresses, sizes and leading dimensions."""
    a = [torch.randn(m, k, device=device).half() for m, n, k in sizes]
    b = [torch.randn(k, n, device=device).half() for m, n, k in sizes]
    c = [nan(m, n, device=device, dtype=torch.float16) for m, n, k in sizes]

    def addresses(ts):
        return torch.tensor([x.data_ptr() for x in ts], device=device, dtype=torch.int64)
    args = [addresses(a), addresses(b), addresses(c), torch.tensor(sizes, device=device, dtype=torch.int32),
            torch.tensor([[x.stride(0), y.stride(0), z.stride(0)] for x, y, z in zip(a, b, c)], device=device,
                         dtype=torch.int32), len(sizes)]
    return a, b, c, args


GROUPED = dict(NUM_SM=132, BLOCK_SIZE_M=128, BLOCK_SIZE_N=128, BLOCK_SIZE_K=32)


@pytest.mark.parametrize("arch", ARCHS)
def test_08_grouped_gemm_compiles(arch):
    _, _, _, args = grouped_args([(256, 128, 64), (128, 256, 128)], "cpu")
    module = newtc.load(TUTORIALS / "08_grouped_gemm.nk")
    assert ".entry" in module.grouped_matmul_kernel.ptx(*args, arch=arch, **GROUPED)


@pytest.mark.gpu
def test_08_grouped_gemm():
    """GPU only: the interpreter follows addresses inside the launch's tensors, and the matrices are not among them."""
    sizes = [(1024, 1024, 1024), (512, 512, 512), (256, 256, 256), (128, 128, 128), (256, 384, 640)]
    a, b, c, args = grouped_args(sizes, "cuda")
    newtc.load(TUTORIALS / "08_grouped_gemm.nk").grouped_matmul_kernel[(GROUPED["NUM_SM"],)](*args, **GROUPED)
    for x, y, z in zip(a, b, c):
        close(z, x.double() @ y.double(), 2e-3)


# ---- 09 persistent matmul --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_09_persistent_matmul(device, dtype):
    t = Tutorial("09_persistent_matmul", device)
    blocks = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=4, NUM_SMS=3) if device == "cpu" \
        else dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, NUM_SMS=132, num_warps=8,
                  num_stages=3)
    for m, n, k in MATMUL_SHAPES[device]:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        c = nan(m, n, device=device, dtype=torch.float16)
        tiles = -(-m // blocks["BLOCK_SIZE_M"]) * -(-n // blocks["BLOCK_SIZE_N"])
        t.launch("matmul_kernel_persistent", (min(blocks["NUM_SMS"], tiles),), a, b, c, m, n, k, *a.stride(),
                 *b.stride(), *c.stride(), **blocks)
        close(c, a.double() @ b.double(), 2e-3 if dtype == torch.float16 else 1.5e-2)
