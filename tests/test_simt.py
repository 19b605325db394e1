"""The stdlib's ops and kernels as the GPU runs them, on the CPU: each launch runs its generated CUDA (tests/simt.py:
a thread per CUDA thread, shuffles and barriers as on the GPU) instead of the interpreter, so that every layout the
passes choose, every reduction across lanes and warps and every conversion through shared memory is checked against
torch without a GPU. test_ops' own checks, on its CPU shapes and forced plans, plus several rows a program on several
warps; and the tensor-core kernels (matmul, attention, chained dots) as an H200 runs them (wgmma, TMA, mbarriers, a
producer warpgroup, clusters sharing copies) and as an A100 does (mma.sync, ldmatrix, cp.async); split-K and
stream-K, whose programs meet through atomics."""
import pytest
import torch

import simt
import test_attention as A
import test_chained_dots as C
import test_matmul as M
import test_ops as T
import test_tensor_desc as D
from newtc import jit, ops
from newtc.gpu import Gpu
from newtc.ops import Plan

pytestmark = [pytest.mark.skipif(simt.GXX is None, reason="needs g++ (C++20) to build the kernels for the CPU"),
              pytest.mark.usefixtures("poisoned_outputs", "generated_code")]


@pytest.fixture
def generated_code(monkeypatch):
    monkeypatch.setattr(jit.Kernel, "interpret", simt.run)


@pytest.mark.parametrize("dtype", T.DTYPES)
def test_ops_run_their_generated_code(dtype):
    T.test_row_ops("cpu", dtype)
    T.test_reductions("cpu", dtype)


def test_elementwise_and_transpose_run_their_generated_code():
    T.test_elementwise_and_transpose("cpu", torch.float32)  # 16-bit tiles transpose through ldmatrix: the GPU's


@pytest.mark.parametrize("dtype", T.DTYPES)
def test_every_plan_runs_its_generated_code(dtype, monkeypatch):
    T.test_every_plan("cpu", dtype, monkeypatch)


def test_huge_logits_and_outside_targets_on_every_plan_in_generated_code(monkeypatch):
    T.test_rows_of_huge_logits_on_every_plan("cpu", -1e9, monkeypatch)
    T.test_cross_entropy_targets_outside_the_row("cpu", monkeypatch)


@pytest.mark.parametrize("dtype", T.DTYPES)
@pytest.mark.parametrize("n,p", [(640, Plan("rows", 512, 4, rows=8, tail=128)),
                                 (640, Plan("rows", 512, 2, rows=4, tail=128)),
                                 (1024, Plan("rows", 1024, 4, rows=4)), (1024, Plan("rows", 1024, 4, rows=2)),
                                 (1280, Plan("rows", 1024, 8, rows=4, tail=256))])
def test_several_rows_on_several_warps(dtype, n, p, monkeypatch):
    """Rows that share a program and its warps, with a tail narrower than a warp's lanes or none."""
    T.force_plan(monkeypatch, p)
    T.check_row_ops((torch.randn(19, n) * 3 + 2).to(dtype), dtype)



@pytest.fixture(params=["sm_90a", "sm_80"])
def arch(request, monkeypatch):
    """The tensor-core kernels as an H200 runs them (wgmma, TMA, mbarriers) and as an A100 does (mma.sync, ldmatrix,
    cp.async)."""
    monkeypatch.setattr(jit.Kernel, "interpret",
                        lambda kernel, grid, args, meta: simt.run(kernel, grid, args, meta, (request.param,)))
    return request.param


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matmul_runs_its_generated_code(dtype, arch):
    M.test_matmul("cpu", dtype)
    M.test_matmul_views("cpu", "both_t", "small")


def test_matmul_epilogues_and_fp8_run_their_generated_code(arch):
    M.test_matmul_epilogue("cpu", "gelu", True)
    M.test_fp8_matmul("cpu", M.FP8[0], "n")
    M.test_fp8_matmul("cpu", M.FP8[1], "k")
    M.test_fp8_matmul_scales("cpu", "rows")


@pytest.mark.parametrize("sms,m,n,k", [(1, 300, 520, 200), (4, 65, 384, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matmul_with_a_producer_warpgroup_runs_its_generated_code(sms, m, n, k, dtype, monkeypatch):
    """On a GPU of few SMs, small products take the plans of large ones on an H200: a program per SM walking the
    tiles (sms=1), or a wave of tiles, each with a producer warpgroup that feeds the consumers through mbarriers and
    a TMA store of the output."""
    monkeypatch.setattr(ops, "gpu", lambda device: Gpu(sms=sms))
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    assert ops._matmul_plan(a, b, sms, "sm_90a", 2)[0].get("WS")
    M.check(ops.matmul(a, b), M.reference(a, b), dtype)


def test_split_k_and_stream_k_run_their_generated_code(arch, monkeypatch):
    """Their programs meet through atomics: split-K's shares add by red (four f32 at once on sm_90a) and count
    themselves, stream-K's programs raise flags that a later one waits on; the kernels alone, and as ops plans them
    (on an H200 of 4 SMs, stream-K: 5 tiles of 128x256 over 4 programs)."""
    for m, n, k, splits in [(70, 50, 200, 3), (64, 64, 48, 5)]:
        M.test_split_k_runs(m, n, k, splits)
    for programs, sk_tiles, k in [(5, 6, 200), (13, 20, 33)]:
        M.test_stream_k_runs(programs, sk_tiles, k)
    M.test_stream_k_epilogue("cpu")
    M.test_split_k_epilogue("cpu")
    if arch != "sm_90a":  # (an H200's plan: its ring overflows an A100's shared memory)
        return
    monkeypatch.setattr(ops, "gpu", lambda device: Gpu(sms=4))
    a, b = torch.randn(570, 4096).half(), torch.randn(4096, 232).half()
    assert ops._matmul_plan(a, b, 4, "sm_90a", 2)[2] == 5
    M.check(ops.matmul(a, b), M.reference(a, b), torch.float16)


@pytest.mark.parametrize("arch", ["sm_90a"], indirect=True)  # (clusters need sm_90)
@pytest.mark.parametrize("name", ["matmul", "matmul_fused", "matmul_tma"])
def test_clusters_run_their_generated_code(name, arch):
    """In clusters of 2 CTAs, run at once: B's boxes multicast into both CTAs' slots (each completing on its own
    barrier), each consumer releasing a slot in both CTAs, the cluster's barriers at the start and the end."""
    for tile in [(128, 256, 64, 8, 4, True), (64, 64, 64, 4, 6, False)]:
        D.test_clusters_share_copies_and_match_torch("cpu", name, tile)


@pytest.mark.parametrize("dtype", C.DTYPES)
@pytest.mark.parametrize("warps", C.WARPS)
def test_chained_dots_run_their_generated_code(dtype, warps, arch):
    mod = C.newtc.compile(C.KERNELS, "chained.nk")
    for bm, bn in C.TILES:
        C.test_chained_dots(mod, "cpu", dtype, warps, bm, bn)
    C.test_dot_of_elementwise_on_a_loaded_tile(mod, "cpu", dtype, warps)
    C.test_dots_in_flight_land_before_a_branch(mod, "cpu", 1)


def test_attention_runs_its_generated_code(arch):
    A.test_attention_forward("cpu", torch.float16)
    A.test_attention_forward("cpu", torch.bfloat16)
    A.test_attention_backward("cpu", torch.float16)


DIVISION = """
kernel divide(x, y, q, r, BLOCK: constexpr):
    i = arange(0, BLOCK)
    a = load(x + i)
    b = load(y + i)
    store(q + i, a // b)
    store(r + i, a % b)
"""


@pytest.mark.parametrize("device", ["simt", "interpreter", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_integer_division_by_zero_and_minus_one(dtype, device):
    """x // 0 = x, x % 0 = 0, the most negative value // -1 itself (wrapping), % -1 = 0, else C's truncation, in the
    generated code (run by simt, or by the GPU) as in the interpreter: C leaves the first four undefined (a host
    traps on them)."""
    kernel = jit.compile(DIVISION, "divide.nk").divide
    low = torch.iinfo(dtype).min
    x = torch.tensor([7, -7, low, low, 5, 0, -9, 100, low, 3, 8, -8, 1, 2, 3, 4], dtype=dtype)
    y = torch.tensor([0, 0, -1, 0, -1, 0, 2, -7, 1, 0, 3, -3, -1, 1, 7, -1], dtype=dtype)
    q = torch.tensor([7, -7, low, low, -5, 0, -4, -14, low, 3, 2, 2, -1, 2, 0, -4], dtype=dtype)
    r = torch.tensor([0, 0, 0, 0, 0, 0, -1, 2, 0, 0, 2, -2, 0, 0, 3, 0], dtype=dtype)
    x, y = (t.to("cuda" if device == "cuda" else "cpu") for t in (x, y))
    got = [torch.full_like(x, 99) for _ in range(2)]
    if device == "cuda":
        kernel[(1,)](x, y, *got, BLOCK=16)
    else:
        (simt.run if device == "simt" else simt.INTERPRET)(kernel, (1,), [x, y, *got], {"BLOCK": 16})
    assert torch.equal(got[0].cpu(), q) and torch.equal(got[1].cpu(), r), got
