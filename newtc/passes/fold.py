"""Canonicalization before the analyses: `x + dot(a, b)` becomes `dot(a, b, x)`.

A dot from zeros whose only reader adds it to x accumulates into x instead: the tensor cores add in their own
accumulator registers, so the sum needs no second tile of f32 registers and no elementwise pass (the backward
of attention, `dv + dot(p, g)`, spilled for that second tile). The dot moves to the add's place, where x is
defined; its operands are defined before its old place, so they still dominate it. Dots of fp8 stay apart: Hopper's
tensor cores keep a running sum of fp8 products at reduced precision, so `x + dot(a, b)` is how a kernel asks for
each partial product to be added in f32.
"""
from __future__ import annotations

from .. import ir
from ..types import FP8


def fold_accumulators(k: ir.Kernel) -> ir.Kernel:
    defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
    readers = ir.uses(k)

    def foldable(d: ir.Value, x: ir.Value, r: ir.Region) -> ir.Op | None:
        dot = defs.get(id(d))
        ok = dot is not None and dot.kind == "dot" and dot in r.ops and ir.is_zero(dot.args[2], defs) and \
            len(readers[id(d)]) == 1 and x.type == d.type and dot.args[0].type.dtype not in FP8
        return dot if ok else None

    def region(r: ir.Region) -> None:
        for op in r.ops:
            for sub in op.regions:
                region(sub)
        gone = set()
        for i, op in enumerate(r.ops):
            if op.kind != "add":
                continue
            for d, x in (op.args, op.args[::-1]):
                if (dot := foldable(d, x, r)) is not None and x is not d:
                    r.ops[i] = ir.Op("dot", [*dot.args[:2], x], op.results, dict(dot.attrs), dot.span)
                    gone.add(id(dot))
                    break
        r.ops = [op for op in r.ops if id(op) not in gone]

    region(k.body)
    return k
