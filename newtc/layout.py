"""Layouts: where each element of a block lives, in registers or in shared memory (design section 5).

A block of shape (d0, ..., dk), every dim a power of two, has a row-major flat index whose bits
are the concatenated bits of the coordinates. A register layout gives, for each bit of the register
index (r), the lane (l) and the warp (w), a basis: a flat index. The element held at (r, l, w) is the
XOR of the bases of the set bits; a zero basis means replication. A shared layout gives a basis for
each bit of the element offset (o) in a shared-memory buffer, so a swizzle is just another linear map
(over GF(2)), and the offset of an element is its flat index through the inverse map (`inverse`).

Shape operations (expand_dims, broadcast, reshape, trans) are linear maps on flat bits, so they map
layouts exactly (`remap`); reductions drop the reduced axis (`slice_layout`); a conversion is free
when the thread bases match (`rename`). Tensor-core fragments (`mma_acc`, `mma_operand`) and the
swizzled tiles they are read from (`swizzled`, with `ldmatrix` reading the bases) are layouts too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import reduce

import numpy as np


def log2(n: int) -> int:
    return n.bit_length() - 1


@functools.lru_cache(maxsize=4096)
def dim_bits(shape: tuple) -> tuple[tuple[int, int], ...]:
    """(shift, width) of each dim inside the flat index (cached: every coordinate conversion asks)."""
    out, shift = [], 0
    for d in reversed(shape):
        out.append((shift, log2(d)))
        shift += log2(d)
    return tuple(out[::-1])


def to_coord(shape: tuple, flat: int) -> tuple:
    return tuple((flat >> s) & ((1 << w) - 1) for s, w in dim_bits(shape))


def to_flat(shape: tuple, coord) -> int:
    return reduce(lambda acc, sc: acc | (sc[1] << sc[0][0]), zip(dim_bits(shape), coord), 0)


def xor_span(bases, index: int) -> int:
    """XOR of the bases selected by the set bits of index."""
    out = 0
    for k, b in enumerate(bases):
        if index >> k & 1:
            out ^= b
    return out


@dataclass(frozen=True)
class Layout:
    shape: tuple
    reg: tuple  # flat-index basis of each register-index bit
    lane: tuple = ()  # of each of the 5 lane bits
    warp: tuple = ()  # of each warp bit
    offset: tuple = ()  # shared memory: of each bit of the element offset (register layouts have none)

    @property
    def nregs(self) -> int:
        return 1 << len(self.reg)

    def reg_flat(self, i: int) -> int:
        return xor_span(self.reg, i)

    @property
    def shared(self) -> bool:
        return bool(self.offset)

    def short(self) -> str:
        if self.shared:
            return f"o{list(self.offset)}"
        return f"r{list(self.reg)} l{list(self.lane)} w{list(self.warp)}"

    @property
    def thread_mask(self) -> int:
        return reduce(lambda a, b: a | b, self.lane + self.warp, 0)

    @property
    def disjoint(self) -> bool:
        """Register and thread parts use separate flat bits, so XOR is addition (indices fold)."""
        bases = [b for b in self.reg + self.lane + self.warp if b]
        if any(b & (b - 1) for b in bases):
            return False
        reg_mask = reduce(lambda a, b: a | b, self.reg, 0)
        return reg_mask & self.thread_mask == 0

    def replicated_lanes(self) -> int:
        """Mask of lane bits whose basis is zero (those lanes hold copies)."""
        return sum(1 << k for k, b in enumerate(self.lane) if b == 0)

    def replicated_warps(self) -> int:
        return sum(1 << k for k, b in enumerate(self.warp) if b == 0)


def blocked(shape: tuple, num_warps: int, vec: int, order: tuple | None = None, keep: frozenset = frozenset(),
            spread: int = 5) -> Layout:
    """The group-cyclic layout: `vec` consecutive elements per thread, then lanes, warps, more registers.
    Elements are consecutive along the dims in `order`, fastest first (default: the last dim first). For a block
    reduced along the dims in `keep`: its lanes take at most `spread` bits of them, then the other dims', and its warps
    take the dims in `keep` last, so that it reduces inside each warp with no barrier (ROWS rows of a row op: a row a
    warp, not each row across all the warps), and blocks of the same other dims that spread alike (a row's block and
    its tail) hold their reductions in one layout."""
    order = order if order is not None else tuple(reversed(range(len(shape))))
    free = [(d, s + b) for d in order for s, w in [dim_bits(shape)[d]] for b in range(w)]

    def take(n: int, bits: list) -> list[int]:
        got = bits[:n]
        for x in got:
            free.remove(x)
        return [1 << b for _, b in got] + [0] * (n - len(got))

    reg = take(min(log2(vec), len(free)), free)
    kept = [x for x in free if x[0] in keep]
    lane = take(5, kept[:spread] + [x for x in free if x[0] not in keep] + kept[spread:])
    warp = take(log2(num_warps), sorted(free, key=lambda x: x[0] in keep))
    reg += [1 << b for _, b in free]
    return Layout(tuple(shape), tuple(reg), tuple(lane), tuple(warp))


def narrowed(layout: Layout, dim: int, group: int, width: int) -> Layout:
    """The layout whose threads hold groups of 2^width consecutive elements along `dim` where `layout`'s leading
    `group` register bits held 2^group: the lanes along dim take the lower bits of those held by the group and the
    lanes (a warp's access then covers consecutive elements), the registers the upper ones, so each thread keeps its
    coordinates along the other dims (and its count of row pointers)."""
    fast = axis_mask(layout.shape, dim)
    lanes = [i for i, b in enumerate(layout.lane) if b & fast]
    bits = sorted(layout.reg[:group] + tuple(layout.lane[i] for i in lanes))
    lane = list(layout.lane)
    for i, b in zip(lanes, bits[width:width + len(lanes)]):
        lane[i] = b
    reg = bits[:width] + bits[width + len(lanes):] + list(layout.reg[group:])
    return Layout(layout.shape, tuple(reg), tuple(lane), layout.warp)


def remap(layout: Layout, shape: tuple, coord_map) -> Layout:
    """The layout, on a source block of `shape`, that feeds a view: coord_map takes a coordinate of
    the layout's block to the coordinate of the source element it reads (a linear map on bits). A shared
    layout's offsets map too: a transposed view of a buffer is the same bytes."""
    def f(b):
        return to_flat(shape, coord_map(to_coord(layout.shape, b)))
    return Layout(tuple(shape), tuple(map(f, layout.reg)), tuple(map(f, layout.lane)), tuple(map(f, layout.warp)),
                  tuple(map(f, layout.offset)))


def axis_mask(shape: tuple, axis: int) -> int:
    s, w = dim_bits(shape)[axis]
    return ((1 << w) - 1) << s


def drop_axis(shape: tuple, axis: int, flat: int) -> int:
    c = to_coord(shape, flat)
    return to_flat(shape[:axis] + shape[axis + 1:], c[:axis] + c[axis + 1:])


def slice_layout(layout: Layout, axis: int) -> Layout:
    """The layout of a reduction's result along `axis`: register bits along it disappear,
    lane and warp bits along it become replication."""
    m = axis_mask(layout.shape, axis)
    shape = layout.shape[:axis] + layout.shape[axis + 1:]
    reg = tuple(drop_axis(layout.shape, axis, b) for b in layout.reg if not b & m)
    lane = tuple(0 if b & m else drop_axis(layout.shape, axis, b) for b in layout.lane)
    warp = tuple(0 if b & m else drop_axis(layout.shape, axis, b) for b in layout.warp)
    return Layout(shape, reg, lane, warp)


def rename(src: Layout, dst: Layout) -> list[int] | None:
    """For each register of dst, the register of src holding the same element, when every thread
    already holds what it needs (equal thread bases); None means data must move between threads."""
    if src.shape != dst.shape or src.lane != dst.lane or src.warp != dst.warp:
        return None
    where = {}
    for j in range(src.nregs):
        where.setdefault(src.reg_flat(j), j)
    out = []
    for i in range(dst.nregs):
        j = where.get(dst.reg_flat(i))
        if j is None:
            return None
        out.append(j)
    return out


def pure(layout: Layout, mask: int) -> bool:
    """Every basis lies entirely inside or entirely outside the bit mask (reductions need this)."""
    return all(b & mask in (0, b) for b in layout.reg + layout.lane + layout.warp)


def contiguous_dim(layout: Layout) -> int:
    """The dim along which a thread's first registers are consecutive (its vector direction)."""
    first = next((b for b in layout.reg if b), 0)
    for d, (s, w) in enumerate(dim_bits(layout.shape)):
        if w and first >> s & ((1 << w) - 1) and first & ~(((1 << w) - 1) << s) == 0:
            return d
    return len(layout.shape) - 1


def vector(layout: Layout, itemsize: int) -> tuple[int, int]:
    """(dim, g): each thread's leading g registers are consecutive elements along dim (at most 16 bytes)."""
    first = layout.reg[0] if layout.reg else 0
    for dim, (s, w) in enumerate(dim_bits(layout.shape)):
        if first == 1 << s and w:
            g = 1
            while log2(g) < min(w, len(layout.reg)) and layout.reg[log2(g)] == 1 << (s + log2(g)) \
                    and 2 * g * itemsize <= 16:
                g *= 2
            return dim, g
    return len(layout.shape) - 1, 1


# ---- data that moves along an axis (scans, exchanges, joins) --------------------------------------------
def axis_levels(layout: Layout, axis: int) -> list | None:
    """The register, lane or warp bit ("r" | "l" | "w", k) that holds each bit of the coordinate along
    axis, lowest first: a scan's stages. None when a basis mixes bits (the scan then converts first)."""
    s, w = dim_bits(layout.shape)[axis]
    held: dict = {}
    for kind, bases in (("r", layout.reg), ("l", layout.lane), ("w", layout.warp)):
        for k, b in enumerate(bases):
            if b & (b - 1) or b in held:
                return None
            if b >> s and log2(b) < s + w:
                held[b] = (kind, k)
    return [held[1 << (s + p)] for p in range(w)]


def xor_source(layout: Layout, mask: int) -> tuple[int, int, int]:
    """The register, lane and warp index XORs at which each thread finds element flat ^ mask."""
    x = solve(layout.reg + layout.lane + layout.warp, mask)
    nr, nl = len(layout.reg), len(layout.lane)
    return x & ((1 << nr) - 1), (x >> nr) & ((1 << nl) - 1), x >> (nr + nl)


def pair(layout: Layout) -> Layout:
    """The layout of join(a, b) for a and b in `layout`: the new minor dim of 2 is register bit 0."""
    def up(bases):
        return tuple(b << 1 for b in bases)
    return Layout(layout.shape + (2,), (1,) + up(layout.reg), up(layout.lane), up(layout.warp))


# ---- shared memory ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _echelon(bases: tuple) -> tuple:
    """The bases eliminated to (image, preimage) rows with distinct leading bits, highest first (`solve`'s work
    for every target, done once per bases: a layout's are solved for each of its bits)."""
    rows: list[tuple[int, int]] = []
    for k, b in enumerate(bases):
        img, pre = b, 1 << k
        for r_img, r_pre in rows:
            if img & (1 << (r_img.bit_length() - 1)):
                img, pre = img ^ r_img, pre ^ r_pre
        if img:
            rows.append((img, pre))
            rows.sort(reverse=True)
    return tuple(rows)


def solve(bases, target: int) -> int | None:
    """The index x whose XOR of selected bases (xor_span(bases, x)) is target, or None if none is."""
    x = 0
    for r_img, r_pre in _echelon(tuple(bases)):
        if target & (1 << (r_img.bit_length() - 1)):
            target, x = target ^ r_img, x ^ r_pre
    return x if target == 0 else None


def inverse(layout: Layout) -> tuple:
    """For a shared layout, the element offset of each flat-index bit (a bijection, so the inverse is linear)."""
    nbits = sum(log2(d) for d in layout.shape)
    out = tuple(solve(layout.offset, 1 << j) for j in range(nbits))
    if None in out:
        raise ValueError(f"shared layout {layout.short()} does not cover {layout.shape}")
    return out


def row_major(shape: tuple, order: tuple | None = None) -> Layout:
    """The plain shared layout: elements stored consecutively along `order` (fastest first), no swizzle."""
    order = order if order is not None else tuple(reversed(range(len(shape))))
    bits = [s + b for s, w in (dim_bits(shape)[d] for d in order) for b in range(w)]
    return Layout(tuple(shape), (), offset=tuple(1 << b for b in bits))


def swizzled(shape: tuple, order: tuple, itemsize: int) -> Layout:
    """A 2-D tile stored along order[0] in rows of at most 128 bytes (wider tiles are cut into 128-byte
    panels, stored one after the other), each row's 16-byte chunks XOR-ed with the row index modulo the
    rows of a 1024-byte atom: what the tensor cores' 128/64/32-byte swizzle modes read (the address bits
    4-6 XOR-ed with bits 7-9), and what keeps 8 rows' chunks in 8 distinct bank groups for ldmatrix and
    16-byte stores."""
    inner, outer = order
    vec = 16 // itemsize
    (cs, cw), (rs, rw) = dim_bits(shape)[inner], dim_bits(shape)[outer]
    pw = min(cw, log2(128 // itemsize))  # column bits inside a panel row (at most 128 bytes)
    per_phase = max(1, 128 // ((1 << pw) * itemsize))  # rows sharing one 128-byte line share a phase
    phases = min(max(0, pw - log2(vec)), 3, max(0, rw - log2(per_phase)))
    offset = [1 << (cs + b) for b in range(pw)]
    for b in range(rw):
        base = 1 << (rs + b)
        p = b - log2(per_phase)
        if 0 <= p < phases:  # this row bit flips a chunk bit: storing row r at chunk c ^ phase(r)
            base |= 1 << (cs + log2(vec) + p)
        offset.append(base)
    offset += [1 << (cs + b) for b in range(pw, cw)]  # then the panels
    return Layout(tuple(shape), (), offset=tuple(offset))


# ---- tensor cores (mma.sync m16n8k*) ---------------------------------------------------------------
def mma_warps(m: int, n: int, num_warps: int) -> tuple[int, int]:
    """Warps along M and N for an [m, n] accumulator: split the longer side (in 16x8 tiles) first, as
    Triton does; warps beyond the tiles replicate."""
    wm, wn = 1, 1
    while wm * wn < num_warps:
        if m // 16 // wm >= n // 16 // wn and wm < m // 16:
            wm *= 2
        elif wn < n // 8:
            wn *= 2
        elif wm < m // 16:
            wm *= 2
        else:
            break
    return wm, wn


def _bits(shape: tuple, dim: int) -> list[int]:
    s, w = dim_bits(shape)[dim]
    return [1 << (s + b) for b in range(w)]


def mma_acc(shape: tuple, warps: tuple, num_warps: int) -> Layout:
    """The accumulator of mma.m16n8: c0,c1 at (g, 2t..2t+1), c2,c3 at row g+8 for lane 4g+t. Each warp
    owns a contiguous [M/wm, N/wn] tile of 16x8 instruction tiles; the tiles repeat in registers."""
    rows, cols = _bits(shape, 0), _bits(shape, 1)
    wm, wn = warps
    mw, nw = log2(shape[0] // wm), log2(shape[1] // wn)  # bits of the per-warp tile
    reg = [cols[0], rows[3], *cols[3:nw], *rows[4:mw]]
    lane = [cols[1], cols[2], rows[0], rows[1], rows[2]]
    warp = rows[mw:] + cols[nw:]
    warp += [0] * (log2(num_warps) - len(warp))
    return Layout(tuple(shape), tuple(reg), tuple(lane), tuple(warp))


def mma_operand(idx: int, shape: tuple, warps: tuple, num_warps: int, kwidth: int) -> Layout:
    """Operand A ([M, K], idx 0) or B ([K, N], idx 1) of mma.m16n8k(8 * kwidth), kwidth elements per 32-bit
    register: each register holds kwidth consecutive k; lanes t = lane % 4 hold the next k groups, lanes
    g = lane / 4 the rows of A (columns of B); one more register bit is row 8 (A), the last is the upper
    half of k. Warps follow the accumulator's along M (A) or N (B) and replicate along the other."""
    kdim, odim = (1, 0) if idx == 0 else (0, 1)
    ks, other = _bits(shape, kdim), _bits(shape, odim)
    wm, wn = warps
    w_other = wm if idx == 0 else wn
    ob = log2(shape[odim] // w_other)  # bits of the per-warp extent along M (A) or N (B)
    kw = log2(kwidth)
    frag = ks[:kw] + ([other[3]] if idx == 0 else []) + [ks[kw + 2]]
    repeat = (other[4:ob] if idx == 0 else other[3:ob]) + ks[kw + 3:]
    lane = [ks[kw], ks[kw + 1], other[0], other[1], other[2]]
    mine = other[ob:]
    warp = (mine + [0] * log2(wn)) if idx == 0 else ([0] * log2(wm) + mine)
    warp += [0] * (log2(num_warps) - len(warp))
    return Layout(tuple(shape), tuple(frag + repeat), tuple(lane), tuple(warp))


def restrict(layout: Layout, shape: tuple) -> Layout:
    """The layout of the sub-tile [0, shape) of a block: register bits that step outside it select other
    sub-tiles and are dropped; lanes and warps must stay inside (each thread keeps its own slice)."""
    def sub(b: int, reg: bool) -> int | None:
        c = to_coord(layout.shape, b)
        if any(ci >= d for ci, d in zip(c, shape)):
            if not reg:
                raise ValueError(f"{layout.short()} spreads threads beyond the sub-tile {shape}")
            return None
        return to_flat(shape, c)
    reg = tuple(r for r in (sub(b, True) for b in layout.reg) if r is not None)
    return Layout(tuple(shape), reg, tuple(sub(b, False) for b in layout.lane), tuple(sub(b, False) for b in layout.warp))


# ---- Hopper warpgroup MMA (wgmma) ---------------------------------------------------------------------
def wgmma_warps(shape: tuple, num_warps: int) -> tuple[int, int] | None:
    """Warpgroups along M and N for a wgmma accumulator: each owns 64-row blocks and at most 256 columns."""
    m, n = shape
    groups = num_warps // 4
    if num_warps % 4 or m % 64:
        return None
    gm = min(groups, m // 64)
    gn = groups // gm
    return (gm, gn) if n % (8 * gn) == 0 and n // gn <= 256 else None


def wgmma_acc(shape: tuple, warpgroups: tuple) -> Layout:
    """The accumulator of wgmma.m64nNk16: within a warpgroup, warp w holds rows 16w..16w+15 of each 64-row
    block in mma.m16n8's C fragment, repeated over the N / 8 column tiles; a warpgroup's further 64-row
    blocks are registers; warpgroups split M, then N."""
    rows, cols = _bits(shape, 0), _bits(shape, 1)
    gm, gn = warpgroups
    mw, nw = log2(shape[0] // gm), log2(shape[1] // gn)
    reg = [cols[0], rows[3], *cols[3:nw], *rows[6:mw]]
    lane = [cols[1], cols[2], rows[0], rows[1], rows[2]]
    warp = [rows[4], rows[5], *rows[mw:], *cols[nw:]]
    return Layout(tuple(shape), tuple(reg), tuple(lane), tuple(warp))


def wgmma_a(shape: tuple, warpgroups: tuple) -> Layout:
    """Operand A [M, K] of wgmma read from registers: per 16-wide K step, warp w holds rows 16w..16w+15 of each
    64-row block as mma.m16n8k16's A fragment (a0..a3: rows g and g + 8 at k 2t, 2t + 1, then the same at k + 8),
    which is the accumulator's C fragment of the two n8 tiles at k and k + 8, so this is `wgmma_acc` with K as
    columns: a dot's result reaches the next dot's A without moving (attention's P). Warpgroups split M as the
    accumulator does; those that split N all hold every K, replicated."""
    gm, gn = warpgroups
    acc = wgmma_acc(shape, (gm, 1))
    return Layout(acc.shape, acc.reg, acc.lane, acc.warp + (0,) * log2(gn))


def _swizzle(addr: int, mode_bytes: int) -> int:
    """The tensor cores' swizzle of a shared-memory byte address: bits 4.. XOR-ed with bits 7.. (one bit per
    doubling of the mode past 16 bytes)."""
    bits = log2(mode_bytes) - 4
    return addr ^ (((addr >> 7) & ((1 << bits) - 1)) << 4)


def tma_boxes(shared: Layout, itemsize: int) -> tuple | None:
    """How TMA writes a 2-D shared tile (columns contiguous in global memory) in this layout: (swizzle bytes, box
    (rows, columns), the (row, column, byte offset) of each box), or None when no swizzle mode writes it so. TMA puts
    box element (i, j) at _swizzle(start + (i * width + j) * itemsize) with rows of width * itemsize = mode bytes. Both
    sides are linear in the coordinate bits when boxes start on multiples of their size, so each bit is checked."""
    if len(shared.shape) != 2:
        return None
    rows, cols = shared.shape
    inv = inverse(shared)

    def byte(i: int, j: int) -> int:
        return itemsize * xor_span(inv, to_flat(shared.shape, (i, j)))
    for mode in (128, 64, 32):
        width, height = mode // itemsize, min(rows, 256)
        size = width * height * itemsize
        if width > cols or size % (8 * mode):  # a box spans whole swizzle atoms (8 rows), so its start keeps the phase
            continue
        bits = [(1 << b, 0) for b in range(log2(rows))] + [(0, 1 << b) for b in range(log2(cols))]
        if all(byte(i, j) == _swizzle((i * width + j) * itemsize, mode) if i < height and j < width
               else byte(i, j) % size == 0 for i, j in bits):
            return mode, (height, width), [(r, c, byte(r, c)) for r in range(0, rows, height)
                                           for c in range(0, cols, width)]
    return None


def wgmma_descriptor(shared: Layout, itemsize: int, start: tuple, sub: tuple, kdim: int) -> tuple | None:
    """How a wgmma operand sub-tile (shape `sub` at `start`, K along `kdim`) is described to the tensor cores:
    (start byte, leading byte offset, stride byte offset, swizzle bytes, transposed), read off the layout
    and checked element by element against the hardware's canonical form; None when no form matches.

    K-major (K contiguous): rows of `mode` bytes, 8-row groups `SBO` apart. MN-major (M or N contiguous,
    passed transposed): 8 rows of `mode` bytes per K group, K groups `SBO` apart, further `mode`-byte
    column panels `LBO` apart. Addresses assume a buffer aligned to 1024 bytes (one swizzle atom)."""
    inv = inverse(shared)
    mn, kk = sub[1 - kdim], sub[kdim]
    # every element of the sub-tile at once: i along M or N, j along K (numpy arrays of the coordinates)
    i, j = (a.ravel() for a in np.meshgrid(np.arange(mn), np.arange(kk), indexing="ij"))
    coord = [None, None]
    coord[kdim], coord[1 - kdim] = start[kdim] + j, start[1 - kdim] + i
    flat = to_flat(shared.shape, coord)
    byte = itemsize * reduce(lambda acc, kb: acc ^ ((flat >> kb[0]) & 1) * kb[1], enumerate(inv), 0 * flat)  # xor_span
    origin = int(byte[0])

    def at(i: int, j: int) -> int:  # the byte offset of element (i, j) of the sub-tile, from the origin
        return int(byte[i * kk + j]) - origin
    major_k = shared.offset[0] >> dim_bits(shared.shape)[kdim][0] == 1 and dim_bits(shared.shape)[kdim][1] > 0
    for mode in (128, 64, 32):
        width = mode // itemsize  # elements in one row of the swizzle atom
        if major_k:
            sbo, lbo = at(8, 0) if mn > 8 else 0, 16
            canon = ((i % 8) * width + j) * itemsize + (i // 8) * sbo
        else:
            sbo, lbo = at(0, 8) if kk > 8 else 0, at(width, 0) if mn > width else 0
            canon = ((i % width) + (j % 8) * width) * itemsize + (i // width) * lbo + (j // 8) * sbo
        if (byte == _swizzle(origin + canon, mode)).all():
            return origin, lbo, sbo, mode, not major_k
    return None
