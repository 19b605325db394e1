"""wgmma runs asynchronously: `overlap` lets a dot's tensor-core work go on beside the ops that do not need it.

A wgmma dot that no later pass made asynchronous (the pipeline's loop-carried accumulators already are) is
waited for right before the first op that reads its result, not right after its issue. Until then the warps
run what follows: the softmax's exponentials while dP = dO V^T is computed, dS while dV += P^T dO is. Groups
complete in the order they were committed, so a wait for one dot leaves pending only the dots issued after it
(`wgmma.wait_group n`); the earlier ones have landed too and are waited for by the same op. A dot's shared
operands are read until its wait: the wait names them, so that their bytes stay theirs (passes.smem) and a
write of them after it is ordered by a barrier. Everything in flight lands before a compound op (a loop, a
branch) and before the end of its block, so that no value crosses a region boundary unwaited, and before any
op that writes a buffer a dot in flight reads.
"""
from __future__ import annotations

from .. import ir
from .pipeline import replace_uses
from .smem import effects


def overlap(k: ir.Kernel) -> ir.Kernel:
    if k.spec.arch == "sm_90a":
        block(k.body, {id(r): op for op in ir.walk(k.body) for r in op.results})
    return k


def block(r: ir.Region, defs: dict) -> None:
    out: list[ir.Op] = []
    flight: list[ir.Op] = []  # dots issued and not waited for, in issue order
    ops = list(r.ops)
    for i, op in enumerate(ops):
        for sub in op.regions:
            block(sub, defs)
        if flight:
            read = {id(a) for inner in ir.walk(ir.Region([], [op])) for a in inner.args if a is not None}
            need = [j for j, d in enumerate(flight) if id(d.result) in read or writes(op, d, defs)]
            last = len(flight) - 1 if op.regions or op.kind == "yield" else max(need, default=-1)
            if last >= 0:
                out.append(land(flight[:last + 1], len(flight) - last - 1, ops[i:]))
                flight = flight[last + 1:]
        out.append(op)
        if op.kind == "dot" and "wgmma" in op.attrs and not op.attrs.get("async"):
            op.attrs["async"] = True
            flight.append(op)
    if flight:
        out.append(land(flight, 0, []))
    r.ops = out


def land(dots: list, pending: int, later: list) -> ir.Op:
    """The wait for `dots` (and the dots before them) with `pending` groups left, its results read from here on."""
    landed = [ir.Value(d.result.type, d.result.name, d.result.layout) for d in dots]
    for d, new in zip(dots, landed):
        for op in later:
            replace_uses(op, d.result, new)
    shared = [x for d in dots for x in d.args[:2] if isinstance(x.type.dtype, ir.Buffer)]
    return ir.Op("dot_wait", [d.result for d in dots] + shared, landed, {"pending": pending, "pin": True},
                 dots[-1].span)


def writes(op: ir.Op, dot: ir.Op, defs: dict) -> bool:
    """Whether op writes a buffer the dot reads (a store into it, a copy into its ring)."""
    reads = {id(ir.root_buffer(x, defs)) for x in dot.args[:2] if isinstance(x.type.dtype, ir.Buffer)}
    return any(e[0][0] == "w" and id(ir.root_buffer(e[1], defs)) in reads for e in effects(op))
