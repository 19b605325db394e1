"""What is known about the values of integer, pointer and mask blocks along their last dimension.

Facts(contig, div, const), each a power of two: the block splits into aligned chunks of `contig`
elements holding consecutive values; the first value of each chunk is a multiple of `div` (bytes,
for pointers); the block also splits into aligned chunks of `const` equal values. With 16-divisible
integer arguments and 16-byte aligned pointers (the specialization, as in Triton), this proves that a
16-byte group of a load or store is contiguous, aligned and uniformly masked, so codegen emits one
vector access with no run-time check.
"""
from __future__ import annotations

from .. import ir
from ..ir import UNKNOWN, Facts
from ..types import Ptr

TOP = 1 << 20  # "divisible by anything" (the value 0), capped


def pow2_divisor(n: int) -> int:
    return TOP if n == 0 else min(TOP, n & -n)


def last(v: ir.Value) -> int:
    return v.type.shape[-1] if v.type.shape else 1


def facts(v) -> Facts:
    return v.facts if v is not None and v.facts is not None else UNKNOWN


def elem_bytes(v: ir.Value) -> int:
    dt = v.type.dtype
    return dt.elem.itemsize if isinstance(dt, Ptr) else 1


def _add(op: ir.Op, a: Facts, b: Facts) -> Facts:
    contig = max(min(a.contig, b.const), min(b.contig, a.const))
    if op.kind == "ptradd":  # the offset counts elements, the pointer's divisibility bytes
        b = Facts(b.contig, min(TOP, b.div * elem_bytes(op.args[0])), b.const)
    return Facts(contig, min(a.div, b.div), min(a.const, b.const))


def _mul(op: ir.Op, a: Facts, b: Facts) -> Facts:
    return Facts(1, min(TOP, a.div * b.div), min(a.const, b.const))


def _compare(op: ir.Op, a: Facts, b: Facts) -> Facts:
    # a run of consecutive values starting at a multiple of k stays on one side of a multiple of k
    const = min(a.const, b.const)
    for x, y in ((a, b), (b, a)):
        const = max(const, min(x.contig, x.div, y.const, y.div))
    return Facts(1, 1, const)


def _logic(op: ir.Op, a: Facts, b: Facts) -> Facts:
    return Facts(1, 1, min(a.const, b.const))


RULES = {"add": _add, "ptradd": _add, "mul": _mul, "lt": _compare, "le": _compare, "gt": _compare,
         "ge": _compare, "and": _logic, "or": _logic}


def infer(op: ir.Op) -> Facts:
    kind, res = op.kind, op.result
    if kind == "const":
        v = op.attrs["value"]
        return Facts(1, pow2_divisor(v) if isinstance(v, int) else 1, 1)
    if kind == "arange":
        return Facts(last(res), pow2_divisor(op.attrs["start"]), 1)
    if kind == "splat":
        return Facts(1, facts(op.args[0]).div, last(res))
    if kind == "broadcast":
        f = facts(op.args[0])
        return Facts(1, f.div, last(res)) if last(op.args[0]) == 1 else f
    if kind == "expand_dims":
        f = facts(op.args[0])
        return Facts(1, f.div, 1) if op.attrs["axis"] == len(res.type.shape) - 1 else f
    if kind in ("cast", "not") and op.args[0].type.dtype.kind != "f" and res.type.dtype.kind != "f":
        return Facts(1, 1, facts(op.args[0]).const)
    if kind in RULES:
        return RULES[kind](op, facts(op.args[0]), facts(op.args[1]))
    return UNKNOWN


def region(r: ir.Region) -> None:
    for op in r.ops:
        if op.kind == "for":
            iv = op.regions[0].params[0]
            iv.facts = Facts(1, min(facts(op.args[0]).div, facts(op.args[2]).div), 1)
        for sub in op.regions:
            region(sub)
        if len(op.results) == 1 and op.kind not in ("for", "if"):
            op.result.facts = infer(op)


def analyze_axes(k: ir.Kernel) -> ir.Kernel:
    for p in k.params:
        if p.name in k.spec.aligned:
            p.facts = Facts(1, 16, 1)
    region(k.body)
    return k
