"""Data that moves between threads goes through shared memory, as IR ops.

A `convert` whose layouts differ only in register order stays (codegen renames registers). Any other
becomes `alloc` + `local_store` + `local_load` through a buffer whose shared layout suits both sides:
a 2-D tile is swizzled (ldmatrix and transposed reads hit no bank twice), other shapes are stored in the
writer's order; a block read in several layouts is stored once. Reductions whose warps meet along the axis, and
scalar atomics (whose old value every thread needs), get a scratch buffer as their last operand.
passes.smem then places every buffer and puts the barriers where they are needed.
"""
from __future__ import annotations

from .. import ir
from ..layout import Layout, axis_mask, contiguous_dim, rename, row_major, swizzled
from ..types import Type, u8
from ..layout import axis_levels, dim_bits, xor_source


def alloc(shape: tuple, elem, layout: Layout | None, span, slots: int = 1) -> ir.Op:
    return ir.Op("alloc", [], [ir.Value(Type(tuple(shape), ir.Buffer(elem, slots)), "smem", layout)], {}, span)


def shared_layout(src: Layout, itemsize: int) -> Layout:
    """Stored along the writer's vector direction; a 2-D tile swizzled, so that a reader going across
    rows (a transpose, a tensor-core operand) finds every 16-byte chunk of 8 rows in another bank group."""
    inner = contiguous_dim(src)
    if len(src.shape) == 2:
        return swizzled(src.shape, (inner, 1 - inner), itemsize)
    order = (inner,) + tuple(d for d in reversed(range(len(src.shape))) if d != inner)
    return row_major(src.shape, order)


def scratch(op: ir.Op, nbytes: int, out: list) -> None:
    a = alloc((nbytes,), u8, None, op.span)
    out.append(a)
    op.args.append(a.result)


def reduce_scratch_bytes(op: ir.Op) -> int:
    """Room for each warp's partial result along the axis: 8 bytes a value (any accumulator) and 4 for an index."""
    x, res = op.args[0], op.result
    m = axis_mask(x.layout.shape, op.attrs["axis"])
    slots = 1 << sum(1 for b in x.layout.warp if b & m)
    per = 12 if op.attrs["kind"] in ("argmax", "argmin") else 8
    return slots * res.type.numel * per if slots > 1 else 0


def scan_scratch_bytes(op: ir.Op) -> int:
    """From the first level of the axis that warps hold: 8 bytes a block of 2^level elements, per scanned block."""
    levels = axis_levels(op.args[0].layout, op.attrs["axis"])
    first = next((p for p, (kind, _) in enumerate(levels) if kind == "w"), None)
    return 0 if first is None else (op.args[0].type.numel >> first) * 8 * len(op.results)


def exchange_scratch_bytes(op: ir.Op) -> int:
    x = op.args[0]
    _, _, warps = xor_source(x.layout, op.attrs["xor"] << dim_bits(x.type.shape)[op.attrs["axis"]][0])
    return x.type.numel * x.type.dtype.itemsize if warps else 0


# the other ops whose data crosses warps through a scratch buffer, and its size in bytes
SCRATCH = {"scan": scan_scratch_bytes, "exchange": exchange_scratch_bytes,
           "gather": lambda op: op.args[0].type.numel * op.args[0].type.dtype.itemsize,
           "histogram": lambda op: op.result.type.numel * 4}


def lower_shared(k: ir.Kernel) -> ir.Kernel:
    subst: dict = {}  # a conversion into shared memory -> the buffer it became
    stored: dict = {}  # (block, shared layout) -> its buffer: a block read in two layouts is stored once
    def region(r: ir.Region) -> None:
        out: list[ir.Op] = []
        for op in r.ops:
            op.args = [subst.get(id(a), a) if a is not None else None for a in op.args]
            for sub in op.regions:
                region(sub)
            if op.kind == "trans" and op.result.layout.shared:  # a transposed view of a buffer
                view = ir.Value(Type(op.result.type.shape, op.args[0].type.dtype), "smem", op.result.layout)
                subst[id(op.result)], op.results = view, [view]
            elif op.kind == "convert" and op.result.layout.shared:  # the tensor cores read the buffer itself
                src = op.args[0]
                a = alloc(src.type.shape, src.type.dtype, op.result.layout, op.span)
                out += [a, ir.Op("local_store", [a.result, src], [], {}, op.span)]
                subst[id(op.result)] = a.result
                continue
            if op.kind == "convert" and rename(op.args[0].layout, op.result.layout) is None:
                src, res = op.args[0], op.result
                lay = shared_layout(src.layout, src.type.dtype.itemsize)
                if (id(src), lay) not in stored:  # converts sit where their source is: the first dominates the rest
                    a = alloc(src.type.shape, src.type.dtype, lay, op.span)
                    out += [a, ir.Op("local_store", [a.result, src], [], {}, op.span)]
                    stored[id(src), lay] = a.result
                op = ir.Op("local_load", [stored[id(src), lay]], [res], {"start": (0,) * len(res.type.shape)}, op.span)
            elif op.kind == "reduce" and reduce_scratch_bytes(op):
                scratch(op, reduce_scratch_bytes(op), out)
            elif op.kind in SCRATCH and SCRATCH[op.kind](op):
                scratch(op, SCRATCH[op.kind](op), out)
            elif op.kind == "atomic" and not op.result.type.shape:
                scratch(op, 8, out)
            out.append(op)
        r.ops = out

    region(k.body)
    return k
