"""Layout assignment: memory ops anchor coalesced layouts, the rest follow their operands.

Values left with layout None (constants, arange, program-id arithmetic, views) are index values:
codegen recomputes them in whatever layout their consumer wants instead of moving data.
"""
from __future__ import annotations

from .. import ir
from ..layout import Layout, blocked, log2, slice_layout


def memory_vec(k: ir.Kernel) -> dict:
    """Elements per 16-byte group for each block shape, from the narrowest element it is loaded or stored as."""
    vec: dict = {}
    for op in ir.walk(k.body):
        if op.kind in ("load", "store", "atomic"):
            p = op.args[0]
            if p.type.shape:
                n = 16 // p.type.dtype.elem.itemsize
                vec[p.type.shape] = max(vec.get(p.type.shape, 1), n)
    return vec


class LayoutPlan:
    def __init__(self, k: ir.Kernel):
        self.k = k
        self.vec = memory_vec(k)

    def default(self, t) -> Layout:
        shape = t.shape
        vec = self.vec.get(shape) or 16 // max(1, t.dtype.itemsize)
        return blocked(shape, self.k.spec.num_warps, vec)

    def of(self, v: ir.Value) -> Layout:
        """The layout a block value is computed in (anchored, or the default when free)."""
        return v.layout if v.layout is not None else self.default(v.type)

    def dot_layout(self, op: ir.Op) -> Layout:
        """3-D [M, K, N] layout for the CUDA-core dot: K entirely in registers, so the sum stays local."""
        (m, kk), (_, n) = op.args[0].type.shape, op.args[1].type.shape
        nk, nn, nm = log2(kk), log2(n), log2(m)
        bits = [1 << (b + nn) for b in range(nk)]  # K bits sit above N's in the [M, K, N] flat index
        rest = [1 << b for b in range(nn)] + [1 << (b + nn + nk) for b in range(nm)]
        lane = [rest.pop(0) if rest else 0 for _ in range(5)]
        warp = [rest.pop(0) if rest else 0 for _ in range(log2(self.k.spec.num_warps))]
        return Layout((m, kk, n), tuple(bits + rest), tuple(lane), tuple(warp))

    def region(self, r: ir.Region) -> None:
        for op in r.ops:
            self.op(op)

    def op(self, op: ir.Op) -> None:
        res = op.results[0] if op.results else None
        if op.kind == "for":
            self.loop(op)
        elif op.kind == "if":
            for sub in op.regions:
                self.region(sub)
            for i, v in enumerate(op.results):
                if v.type.shape:
                    ys = [sub.ops[-1].args[i] for sub in op.regions]
                    v.layout = next((y.layout for y in ys if y.layout is not None), None) or self.default(v.type)
        elif res is None or not res.type.shape:
            return
        elif op.kind in ("load", "atomic"):
            res.layout = self.default(res.type)
        elif op.kind == "reduce":
            lay = slice_layout(self.of(op.args[0]), op.attrs["axis"])
            if op.attrs["keep_dims"]:
                lay = Layout(res.type.shape, lay.reg, lay.lane, lay.warp)
            res.layout = lay
        elif op.kind == "reshape" and op.args[0].layout is not None:
            src = op.args[0].layout  # row-major flat indices are unchanged: the same registers, no data moves
            res.layout = Layout(res.type.shape, src.reg, src.lane, src.warp)
        elif op.kind == "dot":
            res.layout = slice_layout(self.dot_layout(op), 1)
        elif op.kind in ir.ELEMENTWISE:
            res.layout = next((a.layout for a in op.args if a is not None and a.layout is not None
                               and a.type.shape == res.type.shape), None)

    def loop(self, op: ir.Op) -> None:
        body = op.regions[0]
        carried = body.params[1:]
        for p, init in zip(carried, op.args[3:]):
            if p.type.shape:
                p.layout = init.layout  # a free start (zeros, full) takes the layout the body gives it
        for _ in range(3):  # trace until every carried value has the layout its body gives it
            self.region(body)
            changed = False
            for p, y in zip(carried, body.ops[-1].args):
                if p.type.shape:
                    lay = y.layout or p.layout or self.default(p.type)
                    if lay != p.layout:
                        p.layout, changed = lay, True
            if not changed:
                break
        for p, r in zip(carried, op.results):
            r.layout = p.layout


def assign_layouts(k: ir.Kernel) -> ir.Kernel:
    plan = LayoutPlan(k)
    plan.region(k.body)
    return k
