"""Distributed layouts: where each element of a block lives (design section 5).

A block of shape (d0, ..., dk), every dim a power of two, has a row-major flat index whose bits
are the concatenated bits of the coordinates. A layout gives, for each bit of the register index
(r), the lane (l) and the warp (w), a basis: a flat index. The element held at (r, l, w) is the XOR
of the bases of the set bits; a zero basis means replication. Shape operations (expand_dims,
broadcast, reshape, trans) are linear maps on flat bits, so they map layouts exactly (`remap`);
reductions drop the reduced axis (`slice_layout`); a conversion is free when the thread bases match.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce


def log2(n: int) -> int:
    return n.bit_length() - 1


def dim_bits(shape: tuple) -> list[tuple[int, int]]:
    """(shift, width) of each dim inside the flat index."""
    out, shift = [], 0
    for d in reversed(shape):
        out.append((shift, log2(d)))
        shift += log2(d)
    return out[::-1]


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
    lane: tuple  # of each of the 5 lane bits
    warp: tuple  # of each warp bit

    @property
    def nregs(self) -> int:
        return 1 << len(self.reg)

    def reg_flat(self, i: int) -> int:
        return xor_span(self.reg, i)

    def short(self) -> str:
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


def blocked(shape: tuple, num_warps: int, vec: int) -> Layout:
    """The group-cyclic layout: `vec` consecutive elements per thread, then lanes, warps, more registers."""
    nbits = sum(log2(d) for d in shape)
    free = list(range(nbits))

    def take(n: int) -> list[int]:
        got = [1 << free.pop(0) if free else 0 for _ in range(n)]
        return got

    reg = take(min(log2(vec), nbits))
    lane = take(5)
    warp = take(log2(num_warps))
    reg += [1 << b for b in free]
    return Layout(tuple(shape), tuple(reg), tuple(lane), tuple(warp))


def remap(layout: Layout, shape: tuple, coord_map) -> Layout:
    """The layout, on a source block of `shape`, that feeds a view: coord_map takes a coordinate of
    the layout's block to the coordinate of the source element it reads (a linear map on bits)."""
    def f(b):
        return to_flat(shape, coord_map(to_coord(layout.shape, b)))
    return Layout(tuple(shape), tuple(map(f, layout.reg)), tuple(map(f, layout.lane)), tuple(map(f, layout.warp)))


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
