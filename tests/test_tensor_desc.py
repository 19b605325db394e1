"""Tensor descriptors (make_tensor_descriptor, desc.load/desc.store, load/store_tensor_descriptor) against torch.

A descriptor lowers onto a block pointer (every dimension boundary-checked, zero fill): a matmul written with
descriptors, odd sizes so that the fill matters, in f16 and f32; copies whose tiles hang over every edge, into a
poisoned buffer larger than the descriptor's tensor (nothing outside it is written); descriptors carried through
loops and runtime `if`s. Each runs in the interpreter (cpu) and on the GPU (cuda, marker gpu). The descriptor matmul
generates the same cp.async ring and tensor-core instructions as the block-pointer tutorial, for sm_80 and sm_90a.
"""
import pytest
import torch

import newtc
from test_block_ptr import TUTORIAL, assert_same_pipeline, cdiv, devices, matmul_specs, tensor_core_sass

MATMUL = """\
# examples/tutorials/03_matmul_block_pointer.nk with tensor descriptors: one per matrix, made once, moved by each access
kernel matmul_kernel_with_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                      stride_cm, stride_cn, BLOCK_SIZE_M: constexpr, BLOCK_SIZE_N: constexpr,
                                      BLOCK_SIZE_K: constexpr, GROUP_SIZE_M: constexpr):
    pid = program_id(axis=0)
    num_pid_m = cdiv(M, BLOCK_SIZE_M)
    num_pid_n = cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)
    offs_m = (first_pid_m + (pid % group_size_m)) * BLOCK_SIZE_M
    offs_n = ((pid % num_pid_in_group) // group_size_m) * BLOCK_SIZE_N

    a_desc = make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                    block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N])
    c_desc = make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_SIZE_M, BLOCK_SIZE_N])

    accumulator = zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=f32)
    for k in range(0, K, BLOCK_SIZE_K):
        a = a_desc.load([offs_m, k])
        b = load_tensor_descriptor(b_desc, [k, offs_n])
        accumulator = dot(a, b, accumulator)
    c_desc.store([offs_m, offs_n], accumulator.to(f16))
"""

KERNELS = newtc.compile(MATMUL.replace("accumulator.to(f16)", "accumulator") + """
kernel copy(x, out, M, N, sxm, som, BM: constexpr, BN: constexpr):
    at = [program_id(0) * BM - 3, program_id(1) * BN - 5]
    src = make_tensor_descriptor(x, [M, N], [sxm, 1], [BM, BN])
    store_tensor_descriptor(make_tensor_descriptor(out, [M, N], [som, 1], [BM, BN]), at, src.load(at) * 2)

kernel copy3d(x, out, B, M, N, sb, sm, BM: constexpr, BN: constexpr):
    at = [program_id(1) * 2 - 1, program_id(0) * BM, 0]
    d = make_tensor_descriptor(x, [B, M, N], [sb, sm, 1], [2, BM, BN])
    make_tensor_descriptor(out, [B, M, N], [M * N, N, 1], [2, BM, BN]).store(at, d.load(at) + 1)

kernel row_sums(x, out, M, N, sxm, BM: constexpr, BN: constexpr, PAD: constexpr):
    rows = make_tensor_descriptor(x, [M, N], [sxm, 1], [BM, BN], padding_option=PAD)
    sums = make_tensor_descriptor(out, [M], [1], [BM])
    sums.store([program_id(0) * BM], sum(rows.load([program_id(0) * BM, 0]).to(f32), axis=1))

kernel walk(x, y, out, n, steps, BLOCK: constexpr):
    d = make_tensor_descriptor(x, [n], [1], [BLOCK])
    acc = zeros([BLOCK], f32)
    for i in range(0, steps):
        acc += d.load([i * BLOCK // 2])
        if i % 3 == 2:
            d = make_tensor_descriptor(y, [n - i * 8], [1], [BLOCK])
        else:
            d = make_tensor_descriptor(x, [n], [1], [BLOCK])
    make_tensor_descriptor(out, [BLOCK], [1], [BLOCK]).store([0], acc)
""", "tensor_desc_tests.nk")

CASES = {  # (M, N, K, dtype, BM, BN, BK, warps, stages)
    "cpu": [(70, 45, 100, torch.float16, 32, 32, 32, 4, 1), (33, 65, 47, torch.float32, 32, 64, 16, 4, 3)],
    "cuda": [(1000, 1001, 100, torch.float16, 128, 128, 64, 8, 3),
             (4096, 4096, 4096, torch.float16, 128, 256, 64, 8, 4),
             (517, 300, 1031, torch.float32, 64, 128, 32, 4, 3), (129, 257, 63, torch.float16, 64, 64, 64, 4, 2)],
}


@pytest.mark.parametrize("device", devices())
def test_descriptor_matmul_matches_torch(device):
    for m, n, k, dt, bm, bn, bk, warps, stages in CASES[device]:
        a, b = (torch.randn(r, c, device=device).to(dt) for r, c in ((m, k), (k, n)))
        c = torch.full((m, n), float("nan"), device=device, dtype=dt)
        KERNELS.matmul_kernel_with_descriptors[(cdiv(m, bm) * cdiv(n, bn),)](
            a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn,
            BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=warps, num_stages=stages)
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(c).all() and err < 2e-3, (m, n, k, dt, err)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float8_e4m3fn])
def test_ragged_tiles_load_zero_and_store_only_inside(device, dtype):
    """Tiles start 3 rows above and 5 columns left of the matrix and run past its end: what lies outside loads as
    zero and is not stored; `out` is the top-left corner of a larger poisoned buffer, whose rest stays poisoned."""
    m, n, bm, bn = 37, 70, 16, 32
    x = (torch.randn(m, n) * 8).to(dtype).to(device)
    big = torch.full((m + 9, n + 40), -7, dtype=dtype, device=device)
    out = big[:m, :n]
    KERNELS.copy[(cdiv(m + 3, bm), cdiv(n + 5, bn))](x, out, m, n, x.stride(0), out.stride(0), BM=bm, BN=bn)
    want = torch.full_like(big, -7).float()
    want[:m, :n] = (x.float() * 2).to(dtype).float()
    assert torch.equal(big.float().cpu(), want.cpu())


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pad", ["zero", "nan"])
def test_padding_option_fills_what_is_outside(device, pad):
    m, n = 45, 50  # 64 columns read: 14 padded in every row
    x = torch.randn(m, n, device=device).half()
    out = torch.full((m,), 12345.0, device=device)
    KERNELS.row_sums[(cdiv(m, 16),)](x, out, m, n, x.stride(0), BM=16, BN=64, PAD=pad)
    want = x.float().sum(1) if pad == "zero" else torch.full((m,), float("nan"), device=device)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("device", devices())
def test_three_dimensional_descriptors(device):
    b_, m, n = 5, 20, 24
    x = torch.randn(b_, m, 40, device=device)[:, :, :n]  # rows of 40, 24 of them used
    out = torch.full((b_, m, n), float("nan"), device=device)
    KERNELS.copy3d[(cdiv(m, 16), cdiv(b_ + 1, 2))](x, out, b_, m, n, *x.stride()[:2], BM=16, BN=32)
    assert torch.equal(out, x + 1)


@pytest.mark.parametrize("device", devices())
def test_descriptors_carried_through_loops_and_ifs(device):
    n, block, steps = 1000, 128, 20
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    out = torch.full((block,), float("nan"), device=device)
    KERNELS.walk[(1,)](x, y, out, n, steps, BLOCK=block)
    src, size, want = x.cpu(), n, torch.zeros(block)
    for i in range(steps):
        at = i * block // 2
        want += torch.cat([src[:size], torch.zeros(steps * block)])[at:at + block]
        src, size = (y.cpu(), n - i * 8) if i % 3 == 2 else (x.cpu(), n)
    assert torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-5)


# ---- the generated code --------------------------------------------------------------------------------------------
def descriptor_spec(arch: str, m=4096, n=4096, k=4096):
    return matmul_specs(m, n, k, arch)[1]  # the block-pointer tutorial's specialization: the same parameters


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1000, 1001, 100)])
def test_descriptor_matmul_has_the_block_pointer_pipeline(arch, m, n, k):
    spec = descriptor_spec(arch, m, n, k)
    assert_same_pipeline((TUTORIAL.read_text(), "matmul_kernel_with_block_pointers", spec),
                         (MATMUL, "matmul_kernel_with_descriptors", spec))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_descriptor_matmul_compiles_to_tensor_cores(arch):
    tensor_core_sass(MATMUL, "matmul_kernel_with_descriptors", descriptor_spec(arch), arch)
