"""Tensor cores: the fragment layouts against the PTX ISA's tables, the swizzled shared tiles, and what
codegen reads off them (ldmatrix, emulated lane by lane; bank conflicts, counted)."""
import itertools

import pytest

from newtc.codegen.shared import ldmatrix_plan, shared_offsets
from newtc.layout import (inverse, mma_acc, mma_operand, mma_warps, rename, row_major, swizzled, to_coord, wgmma_a,
                          wgmma_acc, xor_span)


def element(layout, r, lane, warp):
    return layout.reg_flat(r) ^ xor_span(layout.lane, lane) ^ xor_span(layout.warp, warp)


def coords(layout, lane, warp=0):
    return [to_coord(layout.shape, element(layout, r, lane, warp)) for r in range(layout.nregs)]


# ---- fragments, one instruction (PTX ISA, "Matrix Fragments for mma.m16n8k*") ---------------------------
@pytest.mark.parametrize("kwidth", [1, 2, 4])  # tf32 m16n8k8, f16/bf16 m16n8k16, s8 m16n8k32
def test_fragments_match_the_ptx_tables(kwidth):
    k = 8 * kwidth
    acc = mma_acc((16, 8), (1, 1), 1)
    a = mma_operand(0, (16, k), (1, 1), 1, kwidth)
    b = mma_operand(1, (k, 8), (1, 1), 1, kwidth)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        assert coords(acc, lane) == [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
        # A: register j holds kwidth consecutive k from kwidth * t; j = 1 is row g + 8, j = 2 the upper half of k
        want_a = [(g + 8 * (j % 2), kwidth * t + 4 * kwidth * (j // 2) + e) for j in range(4) for e in range(kwidth)]
        assert coords(a, lane) == want_a
        want_b = [(kwidth * t + 4 * kwidth * j + e, g) for j in range(2) for e in range(kwidth)]
        assert coords(b, lane) == want_b


@pytest.mark.parametrize("m,n,k,warps", [(128, 256, 64, 8), (128, 128, 32, 4), (64, 64, 16, 4), (16, 16, 16, 1),
                                         (16, 16, 16, 4), (32, 128, 32, 2), (256, 64, 32, 8)])
def test_cta_fragments_cover_the_tile_once_per_warp_grid(m, n, k, warps):
    wm, wn = mma_warps(m, n, warps)
    assert wm * wn <= warps and m // wm >= 16 and n // wn >= 8
    acc = mma_acc((m, n), (wm, wn), warps)
    a = mma_operand(0, (m, k), (wm, wn), warps, 2)
    b = mma_operand(1, (k, n), (wm, wn), warps, 2)
    for lay, numel in ((acc, m * n), (a, m * k), (b, k * n)):
        held = [element(lay, r, lane, w) for r, lane, w in itertools.product(range(lay.nregs), range(32), range(warps))]
        assert set(held) == set(range(numel))
        for lane, w in itertools.product(range(32), range(warps)):  # no element twice in one thread
            mine = [element(lay, r, lane, w) for r in range(lay.nregs)]
            assert len(set(mine)) == len(mine)
    # a thread's accumulator rows are its rows of A; its 8-column tiles are those of its columns of B
    for lane, w in itertools.product(range(32), range(warps)):
        assert {c[0] for c in coords(acc, lane, w)} == {c[0] for c in coords(a, lane, w)}
        assert {c[1] // 8 for c in coords(acc, lane, w)} == {c[1] // 8 for c in coords(b, lane, w)}


# ---- wgmma: the accumulator and operand A from registers (PTX ISA, "Register Fragments" for wgmma .m64nNk16) ----
@pytest.mark.parametrize("n", [8, 64, 256])
def test_wgmma_fragments_match_the_ptx_tables(n):
    """D: warp w of the warpgroup holds rows 16w + g (+8), columns 8i + 2t (+1). A (f16/bf16, four 32-bit words of
    two halves): word j holds rows 16w + g + 8 (j % 2), k 2t + 8 (j // 2), then + 1."""
    acc, a = wgmma_acc((64, n), (1, 1)), wgmma_a((64, 16), (1, 1))
    for w, lane in itertools.product(range(4), range(32)):
        g, t = 16 * w + lane // 4, lane % 4
        want_d = [(g + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * t + i % 2) for i in range(n // 2)]
        assert coords(acc, lane, w) == want_d
        want_a = [(g + 8 * (j % 2), 2 * t + 8 * (j // 2) + e) for j in range(4) for e in range(2)]
        assert coords(a, lane, w) == want_a


@pytest.mark.parametrize("m,k,warps", [(64, 16, 4), (128, 64, 8), (64, 64, 8), (256, 128, 8), (128, 32, 4)])
def test_wgmma_register_a_is_the_accumulator_with_k_as_columns(m, k, warps):
    """A dot's result feeds the next dot's A with no data moving (rename: same threads, registers permuted) when
    warpgroups split M alike; warpgroups that split the next dot's N hold all of A, copies."""
    gm = min(warps // 4, m // 64)
    wg = (gm, warps // 4 // gm)
    a = wgmma_a((m, k), wg)
    held = {element(a, r, lane, w) for r, lane, w in itertools.product(range(a.nregs), range(32), range(warps))}
    assert held == set(range(m * k))
    for group in range(warps // 4):  # a warpgroup holds every k of its block of rows, and nothing else
        mine = {c for w in range(4 * group, 4 * group + 4) for lane in range(32) for c in coords(a, lane, w)}
        block = m // gm * (group % gm)
        assert mine == set(itertools.product(range(block, block + m // gm), range(k)))
    if wg[1] == 1:
        assert rename(wgmma_acc((m, k), wg), a) is not None  # attention's P: S's registers as they are
    if m == 64:  # an mma.sync accumulator of a chained dot (warps along M only) is the same fragment
        assert rename(mma_acc((m, k), (4, 1), warps), a) is not None


# ---- swizzled tiles ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(16, 16), (32, 32), (64, 64), (128, 64), (64, 128), (16, 128), (128, 16), (8, 8)])
@pytest.mark.parametrize("order", [(1, 0), (0, 1)])
def test_swizzle_is_a_bijection_that_keeps_16_byte_chunks(shape, order):
    lay = swizzled(shape, order, 2)
    inv = inverse(lay)
    n = shape[0] * shape[1]
    offsets = [xor_span(inv, f) for f in range(n)]
    assert sorted(offsets) == list(range(n))
    inner = order[0]
    for f in range(n):  # the 8 elements of a chunk along the contiguous dim stay consecutive and aligned
        c = to_coord(shape, f)
        if c[inner] % 8 == 0:
            base = offsets[f]
            assert base % 8 == 0
            for e in range(1, min(8, shape[inner])):
                c2 = list(c)
                c2[inner] += e
                g = c2[0] * shape[1] + c2[1]
                assert offsets[g] == base + e


# ---- ldmatrix, emulated --------------------------------------------------------------------------------
def emulate_ldmatrix(lane_offs, warp_offs, regs, plan, warps):
    """What each thread receives from the planned ldmatrix instructions, as element offsets; and the
    number of distinct 16-byte bank groups each 8-lane phase touches."""
    trans, matrices, address = plan
    got, phases = {}, []
    for w in range(warps):
        wpart = xor_span(warp_offs, w)
        for first in range(0, len(regs), 2 * matrices):
            row_addr = [xor_span(address, lane) ^ wpart ^ regs[first] for lane in range(32)]
            for j in range(matrices):
                rows = row_addr[8 * j:8 * j + 8]
                phases.append(len({(r * 2 // 16) % 8 for r in rows}))
                for t, e in itertools.product(range(32), range(2)):
                    if trans:
                        off = rows[2 * (t % 4) + e] + t // 4
                    else:
                        off = rows[t // 4] + 2 * (t % 4) + e
                    got[(w, t, first + 2 * j + e)] = off
    return got, phases


def expected_offsets(lane_offs, warp_offs, regs, warps):
    return {(w, t, i): xor_span(lane_offs, t) ^ xor_span(warp_offs, w) ^ o
            for w, t, (i, o) in itertools.product(range(warps), range(32), enumerate(regs))}


OPERANDS = [  # (operand, A/B shape, the contiguous dim in shared memory, expect .trans)
    (0, (128, 16), 1, False), (0, (64, 32), 1, False), (0, (128, 16), 0, True), (1, (16, 256), 1, True),
    (1, (32, 64), 1, True), (1, (16, 128), 0, False), (0, (16, 16), 1, False), (1, (16, 8), 1, True),
]


@pytest.mark.parametrize("idx,shape,inner,trans", OPERANDS)
@pytest.mark.parametrize("warps", [1, 4, 8])
def test_ldmatrix_loads_mma_operands_without_bank_conflicts(idx, shape, inner, trans, warps):
    m, n = (shape[0], 256) if idx == 0 else (128, shape[1])
    wmn = mma_warps(m, n, warps)
    reg = mma_operand(idx, shape, wmn, warps, 2)
    parent = (shape[0], 64) if idx == 0 else (64, shape[1])  # a sub-tile of a [.., 64] buffer along K
    start = (0, 16) if idx == 0 and parent[1] > shape[1] else (16, 0) if parent[0] > shape[0] else (0, 0)
    smem = swizzled(parent, (inner, 1 - inner), 2)
    lane_offs, warp_offs, regs = shared_offsets(reg, smem, start)
    plan = ldmatrix_plan(lane_offs, regs, warp_offs)
    assert plan is not None and (plan[0] == ".trans") == trans
    got, phases = emulate_ldmatrix(lane_offs, warp_offs, regs, plan, warps)
    assert got == expected_offsets(lane_offs, warp_offs, regs, warps)
    assert min(phases) == 8, "an ldmatrix phase hits a bank group twice"


def test_ldmatrix_is_refused_where_rows_are_not_16_byte_chunks():
    reg = mma_operand(0, (16, 16), (1, 1), 1, 2)
    lane_offs, warp_offs, regs = shared_offsets(reg, row_major((16, 16), (0, 1)), (0, 0))
    plan = ldmatrix_plan(lane_offs, regs, warp_offs)  # column-major A: .trans reads it
    assert plan is not None and plan[0] == ".trans"
    from newtc.layout import blocked
    reg = blocked((16, 16), 1, 1)  # one element per thread: nothing for ldmatrix
    lane_offs, warp_offs, regs = shared_offsets(reg, row_major((16, 16)), (0, 0))
    assert ldmatrix_plan(lane_offs, regs, warp_offs) is None
