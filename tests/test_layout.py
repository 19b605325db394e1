"""newtc/layout.py (linear layouts over register/lane/warp bits) and what codegen reads off them.

The first part tests the layout algebra directly. The second generates CUDA C++ for small kernels
(no GPU, no NVRTC) and checks that reductions and conversions take the path their bases imply:
shuffles for lanes along the axis, shared memory for warps along it or for data that must move
between threads, and nothing at all for a slice-layout broadcast.
"""
import itertools
import random
import re
import textwrap

import pytest

from newtc import codegen, ir, passes
from newtc.check import check
from newtc.compiler import Spec
from newtc.layout import (Layout, axis_mask, blocked, dim_bits, drop_axis, log2, pure, remap, rename, slice_layout,
                          to_coord, to_flat, xor_span)
from newtc.syntax import parse
from newtc.types import Ptr, f16, f32, i32


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def element(layout: Layout, r: int, lane: int, warp: int) -> int:
    """The flat index held by register r of lane `lane` in warp `warp`."""
    return layout.reg_flat(r) ^ xor_span(layout.lane, lane) ^ xor_span(layout.warp, warp)


def holders(layout: Layout):
    """Every (reg, lane, warp) of the CTA with the element it holds."""
    for r, lane, warp in itertools.product(range(layout.nregs), range(32), range(1 << len(layout.warp))):
        yield (r, lane, warp), element(layout, r, lane, warp)


# ---- flat indices ------------------------------------------------------------------------------------
def test_log2_and_dim_bits():
    assert [log2(n) for n in (1, 2, 4, 1024)] == [0, 1, 2, 10]
    assert dim_bits((4, 8, 2)) == ((4, 2), (1, 3), (0, 1))
    assert dim_bits((1, 16)) == ((4, 0), (0, 4))
    assert axis_mask((4, 8, 2), 1) == 0b0001110
    assert axis_mask((4, 8, 2), 0) == 0b0110000


def test_coordinates_are_row_major():
    assert to_coord((4, 8), 8 * 3 + 5) == (3, 5)
    assert to_flat((4, 8), (3, 5)) == 29
    assert to_coord((2, 2, 4), 0b1011) == (1, 0, 3)
    assert drop_axis((4, 8), 1, 29) == 3 and drop_axis((4, 8), 0, 29) == 5


# ---- the group-cyclic (blocked) layout ----------------------------------------------------------------
def test_blocked_matches_the_design_example():
    lay = blocked((1024,), 4, 4)
    assert lay.reg == (1, 2, 512)  # r0, r1 -> 1, 2; then r2 -> 512
    assert lay.lane == (4, 8, 16, 32, 64)
    assert lay.warp == (128, 256)
    assert lay.nregs == 8
    assert [lay.reg_flat(i) for i in range(8)] == [0, 1, 2, 3, 512, 513, 514, 515]
    assert lay.disjoint and pure(lay, axis_mask((1024,), 0))
    assert lay.replicated_lanes() == 0 and lay.replicated_warps() == 0
    assert lay.short() == "r[1, 2, 512] l[4, 8, 16, 32, 64] w[128, 256]"


def test_blocked_2d_uses_the_row_major_flattening():
    lay = blocked((4, 128), 4, 4)
    assert (lay.reg, lay.lane, lay.warp) == ((1, 2), (4, 8, 16, 32, 64), (128, 256))
    # lanes walk the columns, warps the rows
    assert {to_coord((4, 128), b)[0] for b in lay.lane} == {0}
    assert [to_coord((4, 128), b) for b in lay.warp] == [(1, 0), (2, 0)]

    lay = blocked((32, 32), 2, 8)
    assert (lay.reg, lay.lane, lay.warp) == ((1, 2, 4, 512), (8, 16, 32, 64, 128), (256,))

    lay = blocked((128, 4), 4, 4)  # one row per thread: the registers hold whole rows
    assert [to_coord((128, 4), b) for b in lay.reg] == [(0, 1), (0, 2)]
    assert all(to_coord((128, 4), b)[1] == 0 for b in lay.lane + lay.warp)


def test_small_blocks_replicate_over_lanes_and_warps():
    lay = blocked((16,), 4, 4)
    assert lay.reg == (1, 2) and lay.lane == (4, 8, 0, 0, 0) and lay.warp == (0, 0)
    assert lay.replicated_lanes() == 0b11100 and lay.replicated_warps() == 0b11
    assert lay.thread_mask == 12


def test_vec_larger_than_the_block():
    lay = blocked((2,), 1, 8)
    assert lay.reg == (1,) and lay.lane == (0,) * 5 and lay.warp == ()


@pytest.mark.parametrize("seed", range(40))
def test_blocked_layout_covers_every_element(seed):
    rng = random.Random(seed)
    rank = rng.randint(1, 3)
    shape = tuple(1 << rng.randint(0, 5) for _ in range(rank))
    num_warps, vec = 1 << rng.randint(0, 3), 1 << rng.randint(0, 3)
    keep = frozenset(d for d in range(rank) if rng.random() < 0.5)  # a block reduced along some dims, or none
    lay = blocked(shape, num_warps, vec, keep=keep, spread=rng.randint(0, 5))
    n = numel(shape)
    assert len(lay.lane) == 5 and len(lay.warp) == log2(num_warps)
    assert lay.disjoint
    held = {e for _, e in holders(lay)}
    assert held == set(range(n))  # every element is held by some (reg, lane, warp), nothing outside
    nbits, first = log2(n), min(log2(vec), log2(n))
    assert lay.nregs == 1 << (first + max(0, nbits - first - 5 - log2(num_warps)))
    for f in range(n):
        assert to_flat(shape, to_coord(shape, f)) == f
    for c in itertools.product(*(range(d) for d in shape)):
        assert to_coord(shape, to_flat(shape, c)) == c
    # a thread's registers are distinct elements (replication only across threads)
    for lane, warp in itertools.product(range(32), range(num_warps)):
        mine = [element(lay, r, lane, warp) for r in range(lay.nregs)]
        assert len(set(mine)) == len(mine)


# ---- slice layouts (reduction results) ----------------------------------------------------------------
def test_slice_layout_of_a_row_reduction():
    lay = blocked((4, 128), 4, 4)
    rows = slice_layout(lay, 1)
    assert rows.shape == (4,)
    assert rows.reg == ()  # the register bits ran along the reduced axis
    assert rows.lane == (0, 0, 0, 0, 0)  # so did the lanes: all of them now hold copies
    assert rows.warp == (1, 2)  # warp w holds row w
    cols = slice_layout(lay, 0)
    assert cols.shape == (128,)
    assert (cols.reg, cols.lane, cols.warp) == ((1, 2), (4, 8, 16, 32, 64), (0, 0))


def test_slice_layout_of_a_full_1d_reduction():
    s = slice_layout(blocked((1024,), 4, 4), 0)
    assert s.shape == () and s.reg == () and s.lane == (0,) * 5 and s.warp == (0, 0)
    assert s.nregs == 1


@pytest.mark.parametrize("seed", range(25))
def test_slice_layout_holds_the_reduced_elements(seed):
    rng = random.Random(1000 + seed)
    shape = tuple(1 << rng.randint(0, 4) for _ in range(rng.randint(1, 3)))
    lay = blocked(shape, 1 << rng.randint(0, 3), 1 << rng.randint(0, 3))
    axis = rng.randrange(len(shape))
    m = axis_mask(shape, axis)
    s = slice_layout(lay, axis)
    assert s.shape == shape[:axis] + shape[axis + 1:]
    assert all(b == 0 for b, pb in zip(s.lane, lay.lane) if pb & m)
    assert all(b == 0 for b, pb in zip(s.warp, lay.warp) if pb & m)
    assert len(s.reg) == sum(1 for b in lay.reg if not b & m)
    # register j of the parent, with its axis bits dropped, is the slice register of the kept bits;
    # every thread's slice element is the parent's element with the axis coordinate removed
    keep = [k for k, b in enumerate(lay.reg) if not b & m]
    for j in range(lay.nregs):
        i = sum(((j >> b) & 1) << n for n, b in enumerate(keep))
        for lane, warp in [(0, 0), (31, 0), (5, (1 << len(lay.warp)) - 1), (17, 1 % (1 << len(lay.warp)))]:
            assert element(s, i, lane, warp) == drop_axis(shape, axis, element(lay, j, lane, warp))
    assert {e for _, e in holders(s)} == set(range(numel(s.shape)))


# ---- remap: the layout a view's operand needs ----------------------------------------------------------
def check_remap(dst: Layout, src_shape: tuple, coord_map):
    src = remap(dst, src_shape, coord_map)
    assert src.shape == src_shape
    for where, e in holders(dst):
        want = to_flat(src_shape, coord_map(to_coord(dst.shape, e)))
        assert element(src, *where) == want
    return src


def test_remap_for_broadcast_replicates_the_broadcast_axis():
    dst = blocked((8, 16), 4, 4)
    src = check_remap(dst, (1, 16), lambda c: (0, c[1]))
    assert src.reg == (1, 2) and src.lane == (4, 8, 0, 0, 0) and src.warp == (0, 0)


def test_remap_for_expand_dims():
    dst = blocked((16, 1), 2, 4)
    src = check_remap(dst, (16,), lambda c: c[:1])
    assert (src.reg, src.lane, src.warp) == (dst.reg, dst.lane, dst.warp)
    dst = blocked((1, 64), 2, 4)
    src = check_remap(dst, (64,), lambda c: c[1:])
    assert (src.reg, src.lane, src.warp) == (dst.reg, dst.lane, dst.warp)


def test_remap_for_trans():
    dst = blocked((16, 8), 4, 4)  # the layout wanted for trans(x) where x is [8, 16]
    src = check_remap(dst, (8, 16), lambda c: (c[1], c[0]))
    # dst registers walk dst columns, which are rows of the source: stride 16 there
    assert src.reg[:2] == (16, 32)
    dst3 = blocked((2, 4, 8), 2, 2)
    perm = (2, 0, 1)  # result dim d is source dim perm[d]
    inv = [perm.index(d) for d in range(3)]
    check_remap(dst3, (4, 8, 2), lambda c: tuple(c[inv[d]] for d in range(3)))


# ---- rename: conversions that stay inside each thread --------------------------------------------------
def test_rename_is_identity_for_equal_layouts():
    lay = blocked((1024,), 4, 4)
    assert rename(lay, lay) == list(range(8))


def test_rename_permutes_registers_when_thread_bases_match():
    src = blocked((1024,), 4, 4)
    dst = Layout(src.shape, (512, 1, 2), src.lane, src.warp)
    perm = rename(src, dst)
    assert perm is not None and sorted(perm) == list(range(8))
    for i, j in enumerate(perm):
        assert dst.reg_flat(i) == src.reg_flat(j)
    assert perm == [0, 4, 1, 5, 2, 6, 3, 7]


def test_rename_refuses_when_data_must_move():
    src = blocked((1024,), 4, 4)
    assert rename(src, blocked((1024,), 4, 2)) is None  # lane bases differ
    assert rename(src, blocked((1024,), 2, 4)) is None  # warp bases differ
    assert rename(src, Layout((32, 32), src.reg, src.lane, src.warp)) is None  # shapes differ
    partial = Layout(src.shape, (1, 0, 512), src.lane, src.warp)  # holds copies, never element 2
    assert rename(partial, src) is None
    assert rename(src, partial) == [0, 1, 0, 1, 4, 5, 4, 5]  # the other way is a renaming


# ---- what codegen reads off the bases ------------------------------------------------------------------
def cuda(body: str, sig: dict, constexprs: dict | None = None, num_warps: int = 4) -> codegen.Generated:
    text = f"kernel k({', '.join(sig)}):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    k = check(parse(text, "t.nk"), "k", Spec.of(sig, constexprs, num_warps=num_warps))
    k = passes.run_passes(k)
    ir.verify(k)
    return codegen.generate(k, "t.nk")


def body_of(src: str) -> str:
    """The kernel's statements, without the prelude and the `extern __shared__` declaration."""
    code = src[src.index('extern "C" __global__'):]
    return "\n".join(ln for ln in code.splitlines() if "extern __shared__" not in ln)


def shuffles(src: str) -> set[int]:
    return {int(m) for m in re.findall(r"__shfl_xor_sync\(0xffffffffu, [^,]+, (\d+)\)", src)}


ROWS = """\
r = arange(0, R)
c = arange(0, C)
v = load(x + r[:, None] * C + c[None, :])
"""


def test_row_reduction_with_warps_along_rows_is_shuffles_only():
    text = ROWS.replace("R", "4").replace("C", "128")
    g = cuda(text + "store(out + r, sum(v, axis=1))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert shuffles(code) == {1, 2, 4, 8, 16}  # the five lane bits all run along the row
    assert "nk_smem" not in code and "__syncthreads" not in code
    assert g.smem_bytes == 0


def test_column_reduction_with_warps_along_the_axis_meets_in_shared_memory():
    text = ROWS.replace("R", "4").replace("C", "128")
    g = cuda(text + "store(out + c, max(v, axis=0))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert "__shfl_xor_sync" not in code  # lanes run along the kept axis
    assert "nk_smem" in code and "__syncthreads" in code
    assert g.smem_bytes >= 4 * 128 * 4  # one partial row per warp


def test_reduction_along_registers_only_is_local():
    text = ROWS.replace("R", "128").replace("C", "4")
    g = cuda(text + "store(out + r, sum(v, axis=1))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert "__shfl_xor_sync" not in code and "nk_smem" not in code and g.smem_bytes == 0


def test_full_1d_reduction_with_4_warps_uses_shared_memory():
    g = cuda("v = load(x + arange(0, 1024))\nstore(out, sum(v, axis=0))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert shuffles(code) == {1, 2, 4, 8, 16}
    assert "nk_smem" in code and "__syncthreads" in code
    assert g.smem_bytes >= 4 * 4


def test_full_1d_reduction_with_1_warp_needs_no_shared_memory():
    g = cuda("v = load(x + arange(0, 128))\nstore(out, sum(v, axis=0))\n", {"x": Ptr(f32), "out": Ptr(f32)},
             num_warps=1)
    code = body_of(g.source)
    assert shuffles(code) == {1, 2, 4, 8, 16}
    assert "nk_smem" not in code and g.smem_bytes == 0


def test_argmax_shuffles_values_and_indices():
    text = ROWS.replace("R", "4").replace("C", "128")
    g = cuda(text + "store(out + r, argmax(v, axis=1))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert code.count("__shfl_xor_sync") == 2 * 5
    assert "nk_smem" not in code


def test_slice_layout_broadcast_is_free():
    text = ROWS.replace("R", "4").replace("C", "128")
    g = cuda(text + "store(x + r[:, None] * 128 + c[None, :], v - max(v, axis=1)[:, None])\n",
             {"x": Ptr(f32)})
    code = body_of(g.source)
    assert "__syncthreads" not in code and "nk_smem" not in code and g.smem_bytes == 0
    assert shuffles(code) == {1, 2, 4, 8, 16}


def test_softmax_rows_stay_in_registers():
    text = ROWS.replace("R", "4").replace("C", "256")
    g = cuda(text + textwrap.dedent("""\
        e = exp(v - max(v, axis=1)[:, None])
        store(x + r[:, None] * 256 + c[None, :], e / sum(e, axis=1)[:, None])
    """), {"x": Ptr(f16)})
    code = body_of(g.source)
    assert "__syncthreads" not in code and g.smem_bytes == 0


def test_elementwise_load_store_needs_no_conversion():
    g = cuda("offs = arange(0, 1024)\nstore(y + offs, load(x + offs) * 2.0)\n", {"x": Ptr(f32), "y": Ptr(f32)})
    code = body_of(g.source)
    assert "nk_smem" not in code and "__syncthreads" not in code


def test_trans_of_a_loaded_tile_goes_through_shared_memory():
    text = ROWS.replace("R", "32").replace("C", "32")
    g = cuda(text + "store(out + r[:, None] * 32 + c[None, :], trans(v))\n", {"x": Ptr(f32), "out": Ptr(f32)})
    code = body_of(g.source)
    assert "nk_smem" in code and "__syncthreads" in code
    assert g.smem_bytes >= 32 * 32 * 4


def test_layouts_are_printed_in_the_ir():
    text = "kernel k(x, out):\n" + textwrap.indent(ROWS.replace("R", "4").replace("C", "128"), "    ") + \
        "    store(out + r, sum(v, axis=1))\n"
    k = passes.run_passes(check(parse(text, "t.nk"), "k", Spec.of({"x": Ptr(f32), "out": Ptr(f32)})))
    out = ir.print_kernel(k)
    assert "f32[4, 128] #r[1, 2] l[4, 8, 16, 32, 64] w[128, 256]" in out
    assert "f32[4] #r[] l[0, 0, 0, 0, 0] w[1, 2]" in out


def test_reshape_of_a_loaded_block_keeps_its_registers():
    """[512] f16 loaded as 16-byte vectors, viewed as [R, W, 32, 8]: the axis-3 and axis-0 reductions stay
    in each thread, with no shuffle and no shared memory."""
    g = cuda("""\
    v = reshape(load(x + arange(0, 1024)).to(f32), [2, 2, 32, 8])
    store(out + arange(0, 64), reshape(max(max(v, axis=3), axis=0), [64]))
    """, {"x": Ptr(f16), "out": Ptr(f32)}, num_warps=2)
    code = body_of(g.source)
    assert "__shfl" not in code and "__syncthreads" not in code and "nk_smem" not in code


def test_loop_state_from_a_free_start_takes_the_body_layout():
    """m starts as full([..]) (free) and is carried through a loop in a reduction's slice layout: the loop
    body converts nothing; without the rule the start's default layout would force a conversion per trip."""
    g = cuda("""\
    m = full([2, 32], -1e38, f32)
    for start in range(0, n, 1024):
        v = reshape(load(x + start + arange(0, 1024)).to(f32), [2, 2, 32, 8])
        m = maximum(m, max(max(v, axis=3), axis=0))
    store(out + arange(0, 64), reshape(m, [64]))
    """, {"x": Ptr(f16), "out": Ptr(f32), "n": i32}, num_warps=2)
    code = body_of(g.source)
    start = code.index("for (")
    loop = code[start:code.index("\n  }", start)]  # up to the loop's closing brace, at the body's indent
    assert "__syncthreads" not in loop and "nk_smem" not in loop and "__shfl" not in loop


def test_blocks_reduced_along_a_dim_keep_it_inside_each_warp():
    # 8 rows of 512 halves reduced along the rows, 4 warps: lanes along a row, then a row (or two) a warp
    lay = blocked((8, 512), 4, 8, keep=frozenset({1}))
    assert {to_coord((8, 512), b)[1] for b in lay.warp} == {0}
    assert blocked((8, 512), 4, 8).warp == (256, 512)  # not reduced: warps go on along the row
    # a tail of 128 halves holds 16 lanes of a row: the block spreads its lanes alike, so both reduce into one layout
    main, tail = blocked((8, 512), 4, 8, keep=frozenset({1}), spread=4), blocked((8, 128), 4, 8, keep=frozenset({1}))
    assert slice_layout(main, 1) == slice_layout(tail, 1)
    assert [to_coord((8, 512), b) for b in main.lane] == [(0, 8), (0, 16), (0, 32), (0, 64), (1, 0)]
