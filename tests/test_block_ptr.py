"""Block pointers (make_block_ptr, advance, load/store with boundary_check and padding_option) against torch.

Triton's block pointer tutorial (examples/tutorials/03_matmul_block_pointer.nk) against torch's matmul; tile copies with
negative offsets, transposed sources and 1- to 3-dimensional blocks; padding; block pointers carried through loops
and runtime `if`s. Each runs in the interpreter (cpu) and on the GPU (cuda, marker gpu), outputs poisoned first.
The generated CUDA of the tutorial has the same cp.async ring and tensor-core instructions as stdlib/matmul.nk's,
and NVRTC compiles it for sm_80 and sm_90a; a block pointer copy moves 16 bytes per access.
"""
import collections
import re
from pathlib import Path

import pytest
import torch

import newtc
from newtc import compiler, nvrtc, syntax
from newtc.ops import _matmul_config
from newtc.types import Ptr, bf16, f16, i32

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "examples" / "tutorials" / "03_matmul_block_pointer.nk"

KERNELS = newtc.compile("""\
kernel copy2d(x, out, M, N, sxm, sxn, som, son, BM: constexpr, BN: constexpr, ORDER: constexpr):
    start = (program_id(0) * BM - 3, program_id(1) * BN - 5)
    src = make_block_ptr(x, (M, N), (sxm, sxn), (0, 0), (BM, BN), ORDER)
    src = advance(src, start)
    dst = make_block_ptr(base=out, shape=(M, N), strides=(som, son), offsets=start, block_shape=(BM, BN), order=(1, 0))
    store(dst, load(src, boundary_check=(0, 1)) * 2, boundary_check=(1, 0))

kernel tile(x, out, M, N, sxm, som, BM: constexpr, BN: constexpr):
    at = (program_id(0) * BM, program_id(1) * BN)
    src = make_block_ptr(x, (M, N), (sxm, 1), at, (BM, BN), (1, 0))
    store(make_block_ptr(out, (M, N), (som, 1), at, (BM, BN), (1, 0)), load(src, boundary_check=(0, 1)),
          boundary_check=(0, 1))

kernel copy3d(x, out, B, M, N, sb, sm, sn, BM: constexpr, BN: constexpr):
    at = (program_id(1) * 2, program_id(0) * BM, 0)
    src = make_block_ptr(x, (B, M, N), (sb, sm, sn), at, (2, BM, BN), (2, 1, 0))
    dst = make_block_ptr(out, (B, M, N), (M * N, N, 1), at, (2, BM, BN), (2, 1, 0))
    store(dst, load(src, boundary_check=(0, 1, 2), padding_option="zero") + 1, boundary_check=(0, 1, 2))

kernel row_sums(x, out, M, N, sxm, sxn, BM: constexpr, BN: constexpr, PAD: constexpr):
    rows = make_block_ptr(x, (M, N), (sxm, sxn), (program_id(0) * BM, 0), (BM, BN), (1, 0))
    sums = make_block_ptr(out, (M,), (1,), (program_id(0) * BM,), (BM,), (0,))
    store(sums, sum(load(rows, boundary_check=(0, 1), padding_option=PAD).to(f32), axis=1), boundary_check=0)

kernel walk(x, out, n, steps, BLOCK: constexpr):
    p = make_block_ptr(x, (n,), (1,), (0,), (BLOCK,), (0,))
    acc = zeros([BLOCK], f32)
    for i in range(0, steps):
        acc += load(p, boundary_check=(0,), padding_option="zero")
        if i % 3 == 2:
            p = advance(p, (-BLOCK // 2,))
        else:
            p = advance(p, (BLOCK,))
    store(make_block_ptr(out, (BLOCK,), (1,), (0,), (BLOCK,), (0,)), acc)
""", "block_ptr_tests.nk")


def devices():
    return ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def cdiv(a, b):
    return -(-a // b)


# ---- the tutorial's matmul ------------------------------------------------------------------------------------------
CASES = {  # (M, N, K, dtype, BM, BN, BK, warps, stages)
    "cpu": [(70, 45, 100, torch.float16, 32, 32, 32, 4, 1), (33, 64, 48, torch.bfloat16, 32, 64, 16, 4, 3)],
    "cuda": [(1000, 1001, 100, torch.float16, 128, 128, 64, 8, 3), (4096, 4096, 4096, torch.float16, 128, 256, 64, 8, 4),
             (517, 300, 1030, torch.bfloat16, 64, 128, 32, 4, 4), (16, 4096, 4096, torch.bfloat16, 16, 128, 64, 4, 4),
             (129, 257, 63, torch.float16, 64, 64, 64, 4, 2)],
}


@pytest.mark.parametrize("device", devices())
def test_tutorial_matmul_matches_torch(device):
    mod = newtc.load(TUTORIAL)
    for m, n, k, dt, bm, bn, bk, warps, stages in CASES[device]:
        a, b = (torch.randn(r, c, device=device).to(dt) for r, c in ((m, k), (k, n)))
        c = torch.full((m, n), float("nan"), device=device, dtype=torch.float16)
        grid = (cdiv(m, bm) * cdiv(n, bn),)
        mod.matmul_kernel_with_block_pointers[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                                     BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
                                                     num_warps=warps, num_stages=stages)
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(c).all() and err < 2e-3, (m, n, k, dt, err)


@pytest.mark.parametrize("device", devices())
def test_pointer_increment_tutorial_is_pipelined_and_right(device):
    """examples/tutorials/03_matmul.nk advances blocks of pointers by `+=`: the pipeline advances them too."""
    mod = newtc.load(ROOT / "examples" / "tutorials" / "03_matmul.nk")
    m, n, k = (300, 200, 160) if device == "cpu" else (1000, 1000, 1000)
    a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
    c = torch.full((m, n), float("nan"), device=device, dtype=torch.float16)
    bm, bn, bk = (64, 64, 32)
    mod.matmul_kernel[(cdiv(m, bm) * cdiv(n, bn),)](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                                     BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
                                                     num_stages=3)
    ref = a.double() @ b.double()
    assert ((c.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert "async_copy" in mod.matmul_kernel.ir(a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                                                 BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
                                                 num_stages=3)


# ---- tiles, padding, loops ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float8_e4m3fn])
@pytest.mark.parametrize("transposed", [False, True])
def test_tile_copy_with_negative_offsets(device, dtype, transposed):
    m, n, bm, bn = 37, 70, 16, 32
    x = (torch.randn(n, m) * 8).to(dtype).t() if transposed else (torch.randn(m, n) * 8).to(dtype)
    x = x.to(device)
    out = torch.full((m, n), -7, dtype=dtype, device=device)
    KERNELS.copy2d[(cdiv(m + 3, bm), cdiv(n + 5, bn))](x, out, m, n, *x.stride(), *out.stride(), BM=bm, BN=bn,
                                                        ORDER=(0, 1) if transposed else (1, 0))
    want = (x.float() * 2).to(dtype)
    assert torch.equal(out.float().cpu(), want.float().cpu())


@pytest.mark.parametrize("device", devices())
def test_three_dimensional_blocks(device):
    b_, m, n = 5, 20, 24
    x = torch.randn(m, n, b_, device=device).permute(2, 0, 1)  # strides (1, n * b, b)
    out = torch.full((b_, m, n), float("nan"), device=device)
    KERNELS.copy3d[(cdiv(m, 16), cdiv(b_, 2))](x, out, b_, m, n, *x.stride(), BM=16, BN=32)
    assert torch.equal(out, x + 1)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("pad", ["zero", "nan"])
def test_padding_fills_what_is_outside(device, pad):
    check_padded_row_sums(KERNELS.row_sums, device, pad, lambda x: x.stride())


def check_padded_row_sums(row_sums, device, pad, strides):
    """row_sums(x, out, M, N, *strides(x), BM, BN, PAD) sums 64-column blocks of 50-column rows: each row's 14 padded
    columns add zeros, or make the sum NaN."""
    m, n = 45, 50
    x = torch.randn(m, n, device=device).half()
    out = torch.full((m,), 12345.0, device=device)
    row_sums[(cdiv(m, 16),)](x, out, m, n, *strides(x), BM=16, BN=64, PAD=pad)
    want = x.float().sum(1) if pad == "zero" else torch.full((m,), float("nan"), device=device)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("device", devices())
def test_block_pointers_carried_through_loops_and_ifs(device):
    n, block, steps = 1000, 128, 20
    x = torch.randn(n, device=device)
    out = torch.full((block,), float("nan"), device=device)
    KERNELS.walk[(1,)](x, out, n, steps, BLOCK=block)
    padded, want, at = torch.cat([x.cpu(), torch.zeros(steps * block)]), torch.zeros(block), 0
    for i in range(steps):
        want += padded[at:at + block]
        at += -block // 2 if i % 3 == 2 else block
    assert torch.allclose(out.cpu(), want, rtol=1e-5, atol=1e-5)


# ---- the generated code --------------------------------------------------------------------------------------------
TOKENS = re.compile(r"nk_cp_async<\d+>|cp\.async\.(?!bulk\.wait_group)[\w.:]+|mma\.sync[\w.]*|wgmma\.[\w.]+|ldmatrix[\w.]*|\} else \{")
NAMES = {"a": "a_ptr", "b": "b_ptr", "c": "c_ptr", "BM": "BLOCK_SIZE_M", "BN": "BLOCK_SIZE_N", "BK": "BLOCK_SIZE_K",
         "GROUP_M": "GROUP_SIZE_M"}
MATMUL_INTS = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()


def matmul_specs(m: int, n: int, k: int, arch: str) -> tuple:
    """The specialization newtc.ops.matmul launches stdlib/matmul.nk with on contiguous f16 tensors, and the same one
    for the tutorial's kernel (its parameters named as in Triton)."""
    cfg = _matmul_config(m, n, k, 2, arch)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    values = dict(M=m, N=n, K=k, stride_am=k, stride_ak=1, stride_bk=n, stride_bn=1, stride_cm=n, stride_cn=1)
    sig = {"a": Ptr(f16), "b": Ptr(f16), "c": Ptr(f16), **{x: i32 for x in MATMUL_INTS}}
    aligned = ["a", "b", "c"] + [x for x, v in values.items() if v % 16 == 0]
    ones = [x for x, v in values.items() if v == 1]
    out = []
    for rename, extra in ((lambda x: x, {"ACTIVATION": "none"}), (lambda x: NAMES.get(x, x), {})):
        out.append(compiler.Spec(tuple((rename(x), t) for x, t in sig.items()),
                                 tuple((rename(x), v) for x, v in {**cfg, "GROUP_M": 8, **extra}.items()), warps,
                                 stages, aligned=frozenset(map(rename, aligned)), ones=frozenset(map(rename, ones)),
                                 positive=frozenset(map(rename, values)), arch=arch))
    return tuple(out)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (1000, 1001, 100), (16, 4096, 4096)])
def test_tutorial_has_the_stdlib_matmul_pipeline(arch, m, n, k):
    stdlib, tutorial = matmul_specs(m, n, k, arch)
    assert_same_pipeline(((ROOT / "stdlib" / "matmul.nk").read_text(), "matmul", stdlib),
                         (TUTORIAL.read_text(), "matmul_kernel_with_block_pointers", tutorial))


def assert_same_pipeline(want, got):
    """Two (source, kernel, spec) compile to the same cp.async (or TMA), mma/wgmma and ldmatrix instructions, and the
    first has a pipeline of copies feeding the tensor cores."""
    def tokens(text, kernel, spec):
        src = compiler.compile(syntax.parse(text, f"{kernel}.nk"), kernel, spec, until="cuda").cuda.source
        return collections.Counter(TOKENS.findall(src[src.index('extern "C" __global__'):]))
    ref = tokens(*want)
    assert (ref["nk_cp_async<16>"] or any(t.startswith("cp.async.bulk.tensor") for t in ref)) and \
        any(t.startswith(("mma.sync", "wgmma.mma_async")) for t in ref)
    assert tokens(*got) == ref


def tensor_core_sass(text, kernel, spec, arch) -> str:
    """The kernel's SASS, checked to copy with cp.async (LDGSTS), or TMA on sm_90a, into the arch's tensor cores."""
    sass = nvrtc.disassemble(compiler.compile(syntax.parse(text, f"{kernel}.nk"), kernel, spec).binary.cubin)
    assert ("UTMALDG" if arch == "sm_90a" else "LDGSTS") in sass and ("HGMMA" if arch == "sm_90a" else "HMMA") in sass
    return sass


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_tutorial_compiles_to_tensor_cores(arch):
    sass = tensor_core_sass(TUTORIAL.read_text(), "matmul_kernel_with_block_pointers",
                            matmul_specs(4096, 4096, 4096, arch)[1], arch)
    assert not re.search(r"\b(LDL|STL)\b", sass)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e5m2])
def test_block_pointer_copies_move_16_bytes_per_access(arch, dtype):
    """Sizes and strides that are multiples of 16: the analysis proves every group contiguous, aligned and uniformly
    masked, so there is no run-time check, and each group is one 128-bit load and store."""
    x = torch.empty(64, 256, dtype=dtype)
    args = (x, x, 64, 256, 256, 256)
    src = KERNELS.tile.output(args, {"BM": 16, "BN": 64}, "cuda", arch).cuda.source
    assert "u.w = *" in src and ") = u.w;" in src and "} else {" not in src
    sass = KERNELS.tile.sass(*args, BM=16, BN=64, arch=arch)
    assert "LDG.E.128" in sass and "STG.E.128" in sass
