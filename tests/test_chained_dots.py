"""A dot whose first operand is computed in registers (attention's P = f(Q K^T) in P V): against torch in the
interpreter and (marker gpu) on the GPU, and on sm_90a, what the layout pass makes of it: wgmma reading A from
the registers the first dot left it in (no shared-memory round trip), or from shared memory where A is a loaded
tile. Outputs start as NaN."""
import re

import pytest
import torch

import newtc
from newtc import ir

KERNELS = """\
# O = exp(A B_j) C_j summed over the BN-column blocks j of B (rows of C): the first dot's result, through
# elementwise math, is the second dot's A, as attention's P is.
kernel chained(a, b, c, o, M, N, BM: constexpr, BN: constexpr, K: constexpr, D: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rk = arange(0, K)
    rd = arange(0, D)
    x = load(a + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0)
    acc = zeros([BM, D], f32)
    for start in range(0, N, BN):
        rn = start + arange(0, BN)
        y = load(b + rk[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0)
        z = load(c + rn[:, None] * D + rd[None, :], mask=rn[:, None] < N, other=0)
        acc = dot(exp(dot(x, y)).to(z.dtype), z, acc)
    store(o + rm[:, None] * D + rd[None, :], acc, mask=rm[:, None] < M)

# O = (2 A) B with a K loop: A is elementwise math on a loaded tile.
kernel scaled(a, b, o, M, K, BM: constexpr, BK: constexpr, D: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rd = arange(0, D)
    acc = zeros([BM, D], f32)
    for start in range(0, K, BK):
        rk = start + arange(0, BK)
        x = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0)
        y = load(b + rk[:, None] * D + rd[None, :], mask=rk[:, None] < K, other=0)
        acc = dot(x * 2, y, acc)
    store(o + rm[:, None] * D + rd[None, :], acc, mask=rm[:, None] < M)

# O = A B + (A B^2 where flag > 0): on sm_90a both dots are in flight together and land before the branch.
kernel branch(a, b, o, M, flag, BM: constexpr, K: constexpr, D: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rk = arange(0, K)
    rd = arange(0, D)
    x = load(a + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0)
    y = load(b + rk[:, None] * D + rd[None, :])
    s = dot(x, y)
    t = dot(x, y * y)
    if flag > 0:
        s = s + t
    store(o + rm[:, None] * D + rd[None, :], s, mask=rm[:, None] < M)
"""

TILES = [(64, 64), (128, 128)]  # (BM, BN)
WARPS = [4, 8]
DTYPES = [torch.float16, torch.bfloat16]
TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2}  # relative (Frobenius): P rounds to the input dtype
K, D = 64, 128


@pytest.fixture(scope="module")
def mod():
    return newtc.compile(KERNELS, "chained.nk")


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def chained_inputs(m, n, dtype, device):
    a = (torch.randn(m, K, device=device) / 8).to(dtype)  # A B_j near unit scale: exp stays in f16's range
    b = torch.randn(K, n, device=device).to(dtype)
    c = torch.randn(n, D, device=device).to(dtype)
    return a, b, c


def run_chained(mod, a, b, c, bm, bn, warps, stages):
    (m, _), n = a.shape, b.shape[1]
    o = torch.full((m, D), float("nan"), device=a.device)
    mod.chained[(-(-m // bm),)](a, b, c, o, m, n, BM=bm, BN=bn, K=K, D=D, num_warps=warps, num_stages=stages)
    return o


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("warps", WARPS)
@pytest.mark.parametrize("bm,bn", TILES)
def test_chained_dots(mod, device, dtype, warps, bm, bn):
    m, n = (100, 200) if device == "cpu" else (1000, 1000)  # rows and columns past the last full block
    a, b, c = chained_inputs(m, n, dtype, device)
    o = run_chained(mod, a, b, c, bm, bn, warps, 3)
    p = torch.exp(a.double() @ b.double()).to(dtype)  # the kernel's P, in its dtype
    ref = p.double() @ c.double()
    err = ((o.double() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(o).all() and err < TOL[dtype], err


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("warps", WARPS)
def test_dot_of_elementwise_on_a_loaded_tile(mod, device, dtype, warps):
    m, k = (100, 200) if device == "cpu" else (1000, 1000)
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, D, device=device).to(dtype)
    o = torch.full((m, D), float("nan"), device=device)
    mod.scaled[(-(-m // 64),)](a, b, o, m, k, BM=64, BK=64, D=D, num_warps=warps, num_stages=3)
    ref = (2 * a.double()) @ b.double()
    err = ((o.double() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(o).all() and err < 1e-5, err


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("flag", [0, 1])
def test_dots_in_flight_land_before_a_branch(mod, device, flag):
    m = 100 if device == "cpu" else 1000
    a, b = torch.randn(m, K, device=device).half(), (torch.randn(K, D, device=device) / 2).half()
    o = torch.full((m, D), float("nan"), device=device)
    mod.branch[(-(-m // 64),)](a, b, o, m, flag, BM=64, K=K, D=D, num_warps=4)
    ref = a.double() @ b.double() + flag * (a.double() @ (b * b).double())
    err = ((o.double() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(o).all() and err < 1e-3, err


def test_branch_waits_for_both_dots_on_sm90a(mod):
    """passes.overlap: the two dots are issued back to back and one wait (nothing left pending) precedes the `if`
    that reads the second; the generated source compiles."""
    a, b = torch.randn(64, K).half(), torch.randn(K, D).half()
    args, meta = (a, b, torch.empty(64, D), 64, 1), dict(BM=64, K=K, D=D, num_warps=4)
    ops = mod.branch.output(args, meta, "ir", "sm_90a").kernel.body.ops
    dots_ = [i for i, op in enumerate(ops) if op.kind == "dot"]
    branch = next(i for i, op in enumerate(ops) if op.kind == "if")
    wait = ops[branch - 1]
    assert len(dots_) == 2 and all(ops[i].attrs.get("async") for i in dots_)
    assert wait.kind == "dot_wait" and wait.attrs["pending"] == 0 and len(wait.results) == 2
    assert "HGMMA" in mod.branch.sass(*args, arch="sm_90a", **meta)


# ---- what the compiler makes of them (no GPU needed) -----------------------------------------------------------
def dots(kernel, args, meta, arch):
    return [op for op in ir.walk(kernel.output(args, meta, "ir", arch).kernel.body) if op.kind == "dot"]


def shared(v: ir.Value) -> bool:
    return isinstance(v.type.dtype, ir.Buffer)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("warps", WARPS)
@pytest.mark.parametrize("bm,bn", TILES)
def test_chained_a_stays_in_registers_on_sm90a(mod, dtype, warps, bm, bn):
    """sm_90a: the second dot is wgmma with A from registers (the first dot's, as they are: no conversion through
    shared memory, so only the async copies write shared memory in the loop) and B from shared memory; it lands within
    its iteration (its A registers are rewritten in the next). sm_80: mma.sync."""
    a, b, c = chained_inputs(bm, bn, dtype, "cpu")
    args = (a, b, c, torch.empty(bm, D), bm, bn)
    meta = dict(BM=bm, BN=bn, K=K, D=D, num_warps=warps, num_stages=3)
    kernel = mod.chained.output(args, meta, "ir", "sm_90a").kernel
    *_, pv = [op for op in ir.walk(kernel.body) if op.kind == "dot"]
    assert "wgmma" in pv.attrs and not shared(pv.args[0]) and shared(pv.args[1])
    body = next(op for op in ir.walk(kernel.body) if op.kind == "for")
    ops = body.regions[0].ops
    assert not [op for op in ir.walk(body.regions[0]) if op.kind == "local_store"]
    landed = [i for i, op in enumerate(ops) if op.kind == "dot_wait" and any(a is pv.result for a in op.args)]
    assert landed and landed[0] < len(ops) - 1 and ops[-1].kind == "yield"
    sass = mod.chained.sass(*args, arch="sm_90a", **meta)
    assert re.search(r"HGMMA\.64x\d+x16\.F32\S* R\d+, R\d+, gdesc", sass)  # A from registers, B a descriptor
    assert all("mma" in op.attrs for op in dots(mod.chained, args, meta, "sm_80"))
    assert "HMMA" in mod.chained.sass(*args, arch="sm_80", **meta)


def test_loaded_a_is_read_from_shared_memory_on_sm90a(mod):
    """A loaded tile, even through elementwise math, goes to shared memory once either way: wgmma reads it there
    (registers would need a second trip, shared memory to the fragment)."""
    a, b = torch.randn(64, 64).half(), torch.randn(64, D).half()
    (op,) = dots(mod.scaled, (a, b, torch.empty(64, D), 64, 64), dict(BM=64, BK=64, D=D), "sm_90a")
    assert "wgmma" in op.attrs and shared(op.args[0]) and shared(op.args[1])
