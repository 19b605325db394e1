"""Tensor descriptors (make_tensor_descriptor, desc.load/desc.store, load/store_tensor_descriptor) against torch.

A descriptor lowers onto a block pointer (every dimension boundary-checked, zero fill): a matmul written with
descriptors, odd sizes so that the fill matters, in f16 and f32; copies whose tiles hang over every edge, into a
poisoned buffer larger than the descriptor's tensor (nothing outside it is written); descriptors carried through
loops and runtime `if`s. Each runs in the interpreter (cpu) and on the GPU (cuda, marker gpu). The descriptor matmul
generates the same cp.async ring and tensor-core instructions as the block-pointer tutorial, for sm_80 and sm_90a.
"""
import collections
import math
import ctypes
import dataclasses
import re
import struct

import pytest
import torch

import newtc
from newtc import compiler, ir, jit, layout, nvrtc, ops, syntax
from newtc.passes import smem
from newtc.paths import data_dir
from newtc.types import Ptr, f16, i32
from test_block_ptr import (TUTORIAL, assert_same_pipeline, cdiv, check_padded_row_sums, devices, matmul_specs,
                            tensor_core_sass)
from test_codegen import loop_body

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
    check_padded_row_sums(KERNELS.row_sums, device, pad, lambda x: x.stride()[:1])


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


@pytest.mark.parametrize("arch, m, n, k", [("sm_80", 4096, 4096, 4096), ("sm_80", 1000, 1001, 100),
                                           ("sm_90a", 1000, 1001, 100)])  # rows of 100 and 1001: no TMA
def test_descriptor_matmul_has_the_block_pointer_pipeline(arch, m, n, k):
    spec = descriptor_spec(arch, m, n, k)
    assert_same_pipeline((TUTORIAL.read_text(), "matmul_kernel_with_block_pointers", spec),
                         (MATMUL, "matmul_kernel_with_descriptors", spec))


def test_descriptor_matmul_compiles_to_tensor_cores():
    tensor_core_sass(MATMUL, "matmul_kernel_with_descriptors", descriptor_spec("sm_80"), "sm_80")


# ---- TMA: on sm_90a a descriptor load feeding a pipelined dot is a bulk tensor copy, when the specialization shows
# that the descriptor's base, shape and row stride are parameters (or constants), 16-byte aligned ----------------------
def compiled(text: str, spec, until="cubin", kernel="matmul_kernel_with_descriptors"):
    return compiler.compile(syntax.parse(text, "tma.nk"), kernel, spec, until=until)


def sass_ops(out) -> collections.Counter:
    return collections.Counter(re.findall(r"\b(UTMALDG|UTMASTG|SYNCS|HGMMA|LDGSTS|LDL|STL)\b",
                                          nvrtc.disassemble(out.binary.cubin)))


def test_descriptor_matmul_loads_with_tma_on_sm_90a():
    """The same wgmma as the block-pointer tutorial, fed by TMA into the same swizzled ring: one map per operand
    (A's box its whole 128x64 tile, B's four 64x64 panels of its 64x256 tile), one expect_tx per slot; the output
    tile, staged in shared memory, goes out by TMA too (four 128x64 boxes)."""
    spec = descriptor_spec("sm_90a")
    ref = compiled(TUTORIAL.read_text(), spec, "cuda", "matmul_kernel_with_block_pointers").cuda.source
    out = compiled(MATMUL, spec)
    src = out.cuda.source[out.cuda.source.index('extern "C"'):]  # the kernel, without the prelude
    wgmma = re.compile(r"wgmma\.[\w.]+")
    assert collections.Counter(wgmma.findall(src)) == collections.Counter(wgmma.findall(ref))
    assert "nk_cp_async<" not in src and "cp.async.wait_group" not in src and src.count("const __grid_constant__") == 3
    names = [p.name for p in out.kernel.params]
    at = {n: ["arg", names.index(n)] for n in names}
    assert out.kernel.tmaps == [
        {"itemsize": 2, "base": 0, "dims": [at["K"], at["M"]], "strides": [at["stride_am"]], "box": [64, 128],
         "swizzle": 128},
        {"itemsize": 2, "base": 1, "dims": [at["N"], at["K"]], "strides": [at["stride_bk"]], "box": [64, 64],
         "swizzle": 128},
        {"itemsize": 2, "base": 2, "dims": [at["N"], at["M"]], "strides": [at["stride_cm"]], "box": [64, 128],
         "swizzle": 128}]
    assert src.rindex("mbarrier.init") < src.index("cp.async.bulk.tensor")  # made before the prologue's copies arm them
    # issued stages - 2 = 2 iterations ahead (one wgmma group stays in flight): twice in the prologue, once in the loop
    assert src.count("mbarrier.arrive.expect_tx") == 3 and src.count("(unsigned long long)&nk_map1") == 3 * 4
    assert src.count("(unsigned long long)&nk_map2") == 4
    ops = sass_ops(out)
    assert ops["UTMALDG"] and ops["UTMASTG"] and ops["SYNCS"] and ops["HGMMA"] and not ops["LDGSTS"] and \
        not ops["LDL"] + ops["STL"]


@pytest.mark.parametrize("change, maps, cp_async", [
    ("a_ptr unaligned", [1], True),  # A by cp.async, B by TMA, in one loop
    ("stride_bk unaligned", [0], True),
    ("computed shape", [1], True),
    ("M not above 0", [1], True),  # a map of 0 rows is no map: TMA would read row 0 where the descriptor reads none
    ("nan padding", [], False),  # NaN fill: plain loads, as before (the pipeline copies only zero-filled tiles)
])
def test_tma_only_where_the_specialization_proves_it(change, maps, cp_async):
    spec = descriptor_spec("sm_90a")
    text = MATMUL
    if change.endswith("unaligned"):
        spec = dataclasses.replace(spec, aligned=tuple(a for a in spec.aligned if a != change.split()[0]))
    elif change == "M not above 0":
        spec = dataclasses.replace(spec, positive=tuple(a for a in spec.positive if a != "M"))
    elif change == "computed shape":
        text = MATMUL.replace("(a_ptr, [M, K]", "(a_ptr, [minimum(M, 1 << 30), K]")
    else:
        text = MATMUL.replace("[BLOCK_SIZE_M, BLOCK_SIZE_K])", "[BLOCK_SIZE_M, BLOCK_SIZE_K], padding_option='nan')")
        text = text.replace("block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N])", "block_shape=[BLOCK_SIZE_K, BLOCK_SIZE_N], "
                                                                         "padding_option='nan')")
    assert text != MATMUL or change.endswith(("unaligned", "above 0"))
    out = compiled(text, spec)
    bases, stored = [m["base"] for m in out.kernel.tmaps], change != "M not above 0"  # C's sizes must be above 0 too
    assert [b for b in bases if b != 2] == maps and (2 in bases) == stored
    ops = sass_ops(out)
    assert bool(ops["UTMALDG"]) == bool(maps) and bool(ops["LDGSTS"]) == cp_async and ops["HGMMA"]
    assert bool(ops["UTMASTG"]) == stored


def test_proxy_fences_only_where_generic_accesses_meet_the_async_proxy():
    """TMA writes and wgmma reads are both the async proxy: the ring they share has no fence in the loop, where one
    that cp.async fills has one per iteration. A program that walks tiles stages each tile's output in bytes that the
    next tile's ring reuses: a fence before the barrier that precedes TMA's store of the staged tile, none before the
    next tile's first copy (the store has read the bytes by then, and both are the async proxy)."""
    spec = descriptor_spec("sm_90a")
    tma = compiled(MATMUL, spec, "cuda").cuda.source
    mixed = compiled(MATMUL, dataclasses.replace(spec, aligned=tuple(a for a in spec.aligned if a != "a_ptr")),
                     "cuda").cuda.source
    assert "fence.proxy.async" not in loop_body(tma, "k_") and loop_body(mixed, "k_").count("fence.proxy.async") == 1
    ints = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()
    sig = {**{p: Ptr(f16) for p in "abc"}, **{n: i32 for n in ints}}
    walk = compiler.Spec.of(sig, dict(BM=128, BN=256, BK=64, GROUP_M=8), num_warps=8, num_stages=4, arch="sm_90a",
                            aligned=["a", "b", "c", "M", "N", "K", "stride_am", "stride_bk", "stride_cm"],
                            ones=["stride_ak", "stride_bn", "stride_cn"], positive=ints)
    text = (data_dir("stdlib") / "matmul.nk").read_text()
    out = compiler.compile(syntax.parse(text, "matmul.nk"), "matmul", walk, until="cuda")
    tile = loop_body(out.cuda.source, "t_")
    copy, store = tile.index("cp.async.bulk.tensor"), tile.index(".global.shared::cta.bulk_group")
    assert "fence.proxy.async" not in loop_body(tile, "k_") and "fence.proxy.async" not in tile[:copy]
    assert "__syncthreads" in tile[tile.rindex("fence.proxy.async", 0, store):store]
    staged = [op for op in ir.walk(out.kernel.body) if op.kind == "alloc" and not op.attrs.get("ring")]
    assert staged and min(op.attrs["offset"] for op in staged) < 65536  # the staging does overlap the ring


@pytest.mark.parametrize("shape, itemsize", [((128, 64), 2), ((64, 256), 2), ((32, 32), 2), ((128, 32), 4),
                                             ((16, 64), 1), ((64, 16), 2), ((256, 128), 1), ((512, 64), 2)])
def test_tma_boxes_are_the_shared_layout_element_by_element(shape, itemsize):
    """What tma_boxes claims (box origins and offsets, TMA's swizzle inside each box) is where the layout puts every
    element; a column-major tile is nothing TMA writes."""
    lay = layout.swizzled(shape, (1, 0), itemsize)
    mode, (h, w), boxes = layout.tma_boxes(lay, itemsize)
    assert w * itemsize == mode and len(boxes) == shape[0] * shape[1] // (h * w)
    inv = layout.inverse(lay)
    for r, c, at in boxes:
        for i in range(h):
            for j in range(w):
                want = itemsize * layout.xor_span(inv, layout.to_flat(shape, (r + i, c + j)))
                assert layout._swizzle(at + (i * w + j) * itemsize, mode) == want
    assert layout.tma_boxes(layout.swizzled(shape, (0, 1), itemsize), itemsize) is None


POINTER_MATMUL = """\
kernel mm(a, b, c, M, N, K, sam, sak, sbk, sbn, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rn = program_id(1) * BN + arange(0, BN)
    rk = arange(0, BK)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        x = load(a + rm[:, None] * sam + (k + rk)[None, :] * sak, mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                 other=0)
        y = load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn, mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                 other=0)
        acc = dot(x, y, acc)
    store(c + rm[:, None] * N + rn[None, :], acc.to(f16), mask=(rm[:, None] < M) & (rn[None, :] < N))
"""


@pytest.mark.parametrize("change, maps, checks", [
    ("", [0, 1], 0),
    ("no K bound on A", [0, 1], 0),  # unmasked along K: A's map is as long as a start can reach
    ("a mask on other values", [1], 0),  # not bounds: the mask is not what TMA checks
    ("A transposed", [1], 0),  # its unit stride is along M
    ("K start shifted", [1], 0),  # the loop computes (k - 1), which may be below 0: no run-time check can cover it
    ("sizes not known positive", [], 0),
    ("rows from a difference", [0, 1], 2),  # a start not proven at or above 0: checked once, before the loop (and
    # before the store of C)
    ("rows from a difference, bounded below", [0, 1], 0),  # `rm >= 0` in the masks: what TMA checks too
])
def test_pointer_tiles_load_with_tma_where_they_read_as_descriptors(change, maps, checks):
    """On sm_90a a pointer load base + rows * stride + columns, masked by its bounds (or unmasked) on each axis, is the
    tile of a descriptor (its maps as the descriptor kernel's), when the sizes and row stride are specialized above 0
    and its starts are known to be at or above 0 (else checked at run time where the loop does not compute them).
    So is the store of C (map 2), from the tile it stages in shared memory."""
    text = POINTER_MATMUL
    a_mask = "mask=(rm[:, None] < M) & ((k + rk)[None, :] < K)"
    rows = ("rm = program_id(0) * BM", "rm = (program_id(0) - 1) * BM + BM")
    edits = {"no K bound on A": [(a_mask, "mask=rm[:, None] < M")],
             "a mask on other values": [(a_mask, a_mask + " & (rm[:, None] != (k + rk)[None, :])")],
             "K start shifted": [("sam + (k + rk)", "sam + (k - 1 + rk)"),
                                 (a_mask, a_mask.replace("k + rk", "k - 1 + rk"))],
             "rows from a difference": [rows],
             "rows from a difference, bounded below": [rows, ("mask=(rm[:, None] < M) &",
                                                              "mask=(rm[:, None] >= 0) & (rm[:, None] < M) &")]}
    for old, new in edits.get(change, []):
        assert old in text
        text = text.replace(old, new)
    ints = ["M", "N", "K", "sam", "sak", "sbk", "sbn"]
    sig = {"a": Ptr(f16), "b": Ptr(f16), "c": Ptr(f16), **{x: i32 for x in ints}}
    spec = compiler.Spec.of(sig, dict(BM=128, BN=128, BK=64), num_warps=8, num_stages=3, arch="sm_90a",
                            aligned=["a", "b", "c", "M", "N", "K", "sam", "sbk"],
                            ones=["sbn"] + ([] if change == "A transposed" else ["sak"]),
                            positive=[] if change == "sizes not known positive" else ints)
    out = compiled(text, spec, kernel="mm")
    bases, stored = [m["base"] for m in out.kernel.tmaps], change != "sizes not known positive"
    assert [b for b in bases if b != 2] == maps and (2 in bases) == stored
    assert sum(op.kind == "assert" for op in ir.walk(out.kernel.body)) == checks
    if change == "no K bound on A":
        assert out.kernel.tmaps[0]["dims"] == [["const", 2**31 - 1], ["arg", 3]]
    ops = sass_ops(out)
    assert bool(ops["UTMALDG"]) == bool(maps) and bool(ops["LDGSTS"]) == (len(maps) < 2) and ops["HGMMA"]
    assert bool(ops["UTMASTG"]) == stored
    sass = nvrtc.disassemble(out.binary.cubin)  # the check traps: a call (an assert's) would serialize the wgmmas
    assert "CALL" not in sass and sass.count("WARPGROUP.ARRIVE") < ops["HGMMA"] and ("TRAP" in sass) == bool(checks)
    if not change:  # the descriptor kernel's maps: the same tiles of the same tensors
        desc = compiled(MATMUL, descriptor_spec("sm_90a", 4096, 4096, 4096)).kernel.tmaps
        assert [{**m, "base": 0} for m in out.kernel.tmaps[:1]] == [{**desc[0], "base": 0}]


def padded(rows: int, cols: int, dtype, device, skew: int = 0) -> torch.Tensor:
    """A [rows, cols] view of random values inside a NaN-filled buffer with spare rows and columns (rows of a multiple
    of 16 elements unless skew): whatever a copy reads past the view's edge poisons the result."""
    buf = torch.full((rows + 7, -(-(cols + 1) // 16) * 16 + skew), float("nan"), device=device, dtype=dtype)
    view = buf[:rows, skew:skew + cols]
    view.copy_(torch.randn(rows, cols, device=device).to(dtype))
    return view


TMA_CASES = {  # (M, N, K, BM, BN, BK, warps, stages)
    "cpu": [(37, 45, 70, 32, 32, 32, 4, 2)],
    "cuda": [(1000, 1001, 100, 128, 128, 64, 8, 3), (517, 300, 1031, 128, 256, 64, 8, 4),
             (129, 257, 63, 64, 64, 64, 4, 2), (4096, 4096, 4096, 128, 256, 64, 8, 4)],
}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("skew", [0, 1])
def test_tma_matmul_zero_fills_ragged_edges(device, dtype, skew):
    """Ragged M, N and K with NaN just past every edge: TMA's out-of-bounds boxes must load zeros (skew 0, both operands
    by TMA on sm_90a), and views that are not 16-byte aligned take the cp.async path and are as right (skew 1). C is
    stored by TMA where its rows are 16-byte aligned and end on a 16-byte chunk (TMA stores whole chunks)."""
    for m, n, k, bm, bn, bk, warps, stages in TMA_CASES[device]:
        a, b = padded(m, k, dtype, device, skew), padded(k, n, dtype, device, skew)
        c = torch.full((m, n), float("nan"), device=device, dtype=dtype)
        args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
        meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=warps,
                    num_stages=stages)
        kernel = KERNELS.matmul_kernel_with_descriptors
        maps = [t["base"] for t in kernel.output(args, meta, "ir", "sm_90a").kernel.tmaps]
        assert maps == [0, 1][:0 if skew else 2] + [2] * (n % 8 == 0)  # C's rows end on TMA's 16-byte chunks
        kernel[(cdiv(m, bm) * cdiv(n, bn),)](*args, **meta)
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(c).all() and err < 1e-2, (m, n, k, dtype, skew, err)


def test_rows_of_an_odd_multiple_of_8_halves_take_tma():
    """Sizes and strides that are odd multiples of 8 (`Spec.eights`) make rows of 16-bit elements 16-byte aligned: a
    1000 x 1000 x 1000 product copies A and B, and stores C, by TMA on sm_90a; odd ones (1001) keep cp.async."""
    kernel = ops._stdlib("matmul").matmul
    for n, maps in ((1000, [0, 1, 2]), (1001, []), (1008, [0, 1, 2])):
        a, b, c = (torch.empty(n, n, dtype=torch.float16) for _ in range(3))
        cfg = ops._matmul_config(n, n, n, 2, "sm_90a")
        out = kernel.output((a, b, c, n, n, n, *a.stride(), *b.stride(), *c.stride()), dict(GROUP_M=8, **cfg), "ir",
                            "sm_90a")
        assert [t["base"] for t in out.kernel.tmaps] == maps, n
        assert out.kernel.spec.eights == (("K", "M", "N", "stride_am", "stride_bk", "stride_cm") if n == 1000 else ())


def test_the_launcher_encodes_each_tensor_map_from_the_arguments(monkeypatch):
    """No GPU: the driver replaced. Each launch's maps are encoded from its argument values (dims innermost first,
    strides in bytes, into a 64-byte aligned CUtensorMap), once per distinct arguments, and their 128 bytes travel
    after the arguments' 8-byte slots."""
    encoded, launches = [], []

    class Driver:
        def cuTensorMapEncodeTiled(self, out, dtype, rank, base, dims, strides, box, steps, interleave, swizzle, l2,
                                   fill):
            encoded.append((out % 64, dtype, rank, base, list(dims), list(strides)[:rank - 1], list(box), list(steps),
                            interleave, swizzle, fill))
            ctypes.memmove(out, bytes([len(encoded)]) * 128, 128)
            return 0

    def launch(buf, func, params, extra):
        launches.append([ctypes.string_at(params[i], 8) for i in range(12)] +
                        [ctypes.string_at(params[i], 128) for i in (12, 13, 14)])
        return 0
    monkeypatch.setattr(jit.driver, "_cuda", Driver)
    monkeypatch.setattr(jit.driver, "load_module", lambda cubin: 1)
    monkeypatch.setattr(jit.driver, "get_function", lambda module, name: 1)
    monkeypatch.setattr(jit.driver, "fast_launch_function", lambda: launch)
    out = compiled(MATMUL, descriptor_spec("sm_90a"), "ir")
    binary = jit.Binary("nk", b"", 256, 0, [p.type.dtype for p in out.kernel.params], out.kernel.tmaps)
    assert jit.Binary.unpack(binary.pack()) == binary
    run = jit.Launcher(binary, 0).function()
    a, b, c, m, n, k = 0x10000, 0x20000, 0x30000, 1000, 1008, 4096
    for rows in (m, m, m + 24):
        run(0, [a, b, c, rows, n, k, k + 16, 1, n, 1, n, 1], 9)
    assert encoded == [(0, 1, 2, a, [k, m], [2 * (k + 16)], [64, 128], [1, 1], 0, 3, 0),
                       (0, 1, 2, b, [n, k], [2 * n], [64, 64], [1, 1], 0, 3, 0),
                       (0, 1, 2, c, [n, m], [2 * n], [64, 128], [1, 1], 0, 3, 0),
                       (0, 1, 2, a, [k, m + 24], [2 * (k + 16)], [64, 128], [1, 1], 0, 3, 0),
                       (0, 1, 2, b, [n, k], [2 * n], [64, 64], [1, 1], 0, 3, 0),
                       (0, 1, 2, c, [n, m + 24], [2 * n], [64, 128], [1, 1], 0, 3, 0)]
    assert [struct.unpack("<Q", x[0])[0] for x in launches] == [a] * 3
    assert [struct.unpack("<i", x[3][:4])[0] for x in launches] == [m, m, m + 24]
    assert [(x[12][0], x[13][0], x[14][0]) for x in launches] == [(1, 2, 3), (1, 2, 3), (4, 5, 6)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("tile", [(256, 128, 64, 16, 3), (128, 256, 64, 8, 3), (64, 64, 64, 4, 6),
                                  (128, 256, 64, 8, 4, True)], ids=str)
def test_warp_specialized_matmul_on_every_trip_count(device, tile):
    """The warp-specialized pointer matmul (16, 8 and 4 consumer warps: the consumers grow, grow less, keep their
    registers) against torch, NaN past every edge, on K of 0 (no loop), 40 and 100 (fewer iterations than slots),
    stages * BK (exactly the ring), 1000 (the producer laps the ring) and ragged M and N; with a program per tile and
    with 2 programs walking all the tiles (the ring's slots and phases go on from tile to tile). The 4-slot
    128x256 ring fits beside the output only when the tile is stored in column halves (HALVES)."""
    bm, bn, bk, warps, stages, *halves = tile
    shapes = [(40, 72, 56), (130, 72, 56)] if device == "cpu" else \
        [(m, n, k) for m, n in ((300, 264), (bm, bn)) for k in (0, 40, 100, stages * bk, 1000)]
    kernel = ops._stdlib("matmul").matmul
    for m, n, k in shapes:
        for grid in (cdiv(m, bm) * cdiv(n, bn), 2):
            a, b = padded(m, k, torch.float16, device), padded(k, n, torch.float16, device)
            c = padded(m, n, torch.float16, device).fill_(math.nan)
            args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
            meta = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, WS=True, HALVES=bool(halves), num_warps=warps,
                        num_stages=stages)
            kernel[(grid,)](*args, **meta)
            ref = a.double() @ b.double()
            err = ((c.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            assert torch.isfinite(c).all() and err < 1e-2, (m, n, k, grid, tile, err)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", ["matmul", "matmul_fused", "matmul_tma"])
@pytest.mark.parametrize("tile", [(128, 256, 64, 8, 4, True), (64, 64, 64, 4, 6, False)], ids=str)
def test_clusters_share_copies_and_match_torch(device, name, tile):
    """Launched in clusters of 2 (num_ctas=2, CTAS=2), the warp-specialized stdlib kernels take tiles two rows at a
    time and multicast B's boxes: against torch, NaN past every edge, on M of an odd number of tiles (the second CTA
    of the last cluster has no rows), K of 0, 40 (fewer iterations than slots) and 1000 (the producer laps the
    ring); with a program per tile and persistent clusters (2 and 4 programs)."""
    bm, bn, bk, warps, stages, halves = tile
    shapes = [(40, 72, 56)] if device == "cpu" else \
        [(m, n, k) for m, n in ((300, 264), (bm, bn)) for k in (0, 40, 1000)]
    kernel = getattr(ops._stdlib("matmul"), name)
    for m, n, k in shapes:
        for grid in (cdiv(cdiv(m, bm), 2) * 2 * cdiv(n, bn), 2, 4):
            a, b = padded(m, k, torch.float16, device), padded(k, n, torch.float16, device)
            c = padded(m, n, torch.float16, device).fill_(math.nan)
            bias = torch.randn(n, dtype=torch.float16, device=device)
            args = (a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
            meta = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, WS=True, CTAS=2, num_warps=warps, num_stages=stages, num_ctas=2)
            if name == "matmul_tma":  # no halves: its tile's staging takes a slot's room
                args = (a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0))
                meta["num_stages"] -= halves
            else:
                meta["HALVES"] = halves
            if name == "matmul_fused":
                args = (a, b, c, bias, a, a, *args[3:], 0, 0)
            kernel[(grid,)](*args, **meta)
            ref = a.double() @ b.double() + (bias.double() if name == "matmul_fused" else 0)
            err = ((c.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            assert torch.isfinite(c).all() and err < 1e-2, (m, n, k, grid, tile, err)
            past = torch.ones_like(c._base, dtype=torch.bool)
            past[:m, :n] = False
            assert c._base[past].isnan().all(), "a store wrote past C's edges"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["matmul_tma", "matmul"])
@pytest.mark.parametrize("ws", [False, True])
def test_stdlib_matmul_tma_matches_torch(device, dtype, name, ws):
    """stdlib/matmul.nk's descriptor kernel, and its pointer kernel (ops.matmul's), with ops' tile table, ragged shapes,
    NaN past every edge; on sm_90a their A and B tiles are TMA copies (checked by compiling for sm_90a from the same
    arguments). With `ws`, warp-specialized where the tile takes asynchronous wgmma (a producer warpgroup gives up its
    registers: USETMAXREG); K of 100 leaves the producer's loop no copies of its own."""
    shapes = [(40, 72, 56)] if device == "cpu" else [(1000, 1001, 100), (4096, 4096, 4096), (16, 4096, 4096),
                                                     (333, 200, 1000)]
    kernel = getattr(ops._stdlib("matmul"), name)
    for m, n, k in shapes:
        a, b, c = padded(m, k, dtype, device), padded(k, n, dtype, device), padded(m, n, dtype, device).fill_(math.nan)
        cfg = ops._matmul_config(m, n, k, 2, "sm_90a", ws=2 * ws)  # the ring beside half a tile: ops' persistent launch
        strides = (a.stride(0), b.stride(0), c.stride(0)) if name == "matmul_tma" else (*a.stride(), *b.stride(),
                                                                                        *c.stride())
        args, meta = (a, b, c, m, n, k, *strides), dict(GROUP_M=8, WS=ws, **cfg)
        if ws and name == "matmul":
            meta["HALVES"] = True
        elif ws:  # the descriptor kernel stages its whole tile: the ring's slots that fit beside it
            slot, tile = (cfg["BM"] + cfg["BN"]) * cfg["BK"] * 2, cfg["BM"] * cfg["BN"] * 2
            meta["num_stages"] = min(cfg["num_stages"], (smem.LIMIT["sm_90a"] - tile) // slot)
        out = kernel.output(args, meta, "cubin", "sm_90a")
        # wgmma's tile reaches C through a staging buffer, which TMA copies out where C's rows end on its 16-byte chunks
        staged = cfg["BM"] >= 64 and n % 8 == 0
        assert [t["base"] for t in out.kernel.tmaps] == [0, 1, 2][:2 + staged]  # A and B loaded, C stored
        sass = nvrtc.disassemble(out.binary.cubin)
        assert "UTMALDG" in sass and ("UTMASTG" in sass) == staged, cfg
        assert ("USETMAXREG" in sass) == (ws and cfg["BM"] >= 64), cfg
        kernel[(cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"]),)](*args, **meta)
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(c).all() and err < 1e-2, (m, n, k, dtype, err)
        past = torch.ones_like(c._base, dtype=torch.bool)
        past[:m, :n] = False
        assert c._base[past].isnan().all(), "a store wrote past C's edges"
