"""Canonicalization before the analyses: an integer negation written `0 - x` or `x * -1` becomes `-x`, and
`x + dot(a, b)` becomes `dot(a, b, x)`.

Codegen writes an integer `-x` in a form ptxas cannot fold into a min or max (cexpr, `nk_ineg`): ptxas 12.6-13.3 drop
the sign of a negation folded into sm_90's three-way VIMNMX3. LLVM turns `0 - x` and `x * -1` into that negation too.

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


def canonical_negations(k: ir.Kernel) -> ir.Kernel:
    defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
    for op in ir.walk(k.body):
        if op.kind not in ("sub", "mul") or not op.result.type.dtype.is_int:
            continue
        pairs = [op.args] if op.kind == "sub" else [op.args, op.args[::-1]]
        for c, x in pairs:
            if ir.constant(c, defs) == (0 if op.kind == "sub" else -1) and x.type == op.result.type:
                op.kind, op.args = "neg", [x]
                break
    return k


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
