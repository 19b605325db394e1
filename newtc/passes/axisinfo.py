"""What is known about the values of integer, pointer and mask blocks, dimension by dimension.

Facts(contig, div, const, value): along dim d the block splits into aligned runs of contig[d]
elements whose values step by one; the first value of each run is a multiple of div[d] (bytes, for
pointers); the block also splits into runs of const[d] equal values; `value`, when known, is the one
value of every element. A scalar has one dimension of size one. With 16-divisible integer arguments,
16-byte aligned pointers and arguments equal to 1 (the specialization, as in Triton), this proves that
a 16-byte group of a load or store is contiguous, aligned and uniformly masked, so codegen emits one
vector access with no run-time check, and tells layout assignment which dim a pointer block runs along.
"""
from __future__ import annotations

from .. import ir
from ..ir import Facts, facts
from ..types import Ptr

TOP = 1 << 20  # "divisible by anything" (the value 0), capped


def pow2_divisor(n: int) -> int:
    return TOP if n == 0 else min(TOP, n & -n)


def unknown(rank: int) -> Facts:
    return Facts((1,) * rank, (1,) * rank, (1,) * rank)


def elem_bytes(v: ir.Value) -> int:
    dt = v.type.dtype
    return dt.elem.itemsize if isinstance(dt, Ptr) else 1


def _widens(src, dst) -> bool:
    """An integer cast that keeps every value: to as many bits or more, signed only from signed or from fewer bits."""
    return src.is_int and dst.is_int and (dst.bits > src.bits if src.kind != dst.kind else dst.bits >= src.bits) \
        and not (src.kind == "i" and dst.kind == "u")


def _zip(f, a: Facts, b: Facts) -> tuple:
    return tuple(f(*t) for t in zip(a.contig, a.div, a.const, b.contig, b.div, b.const))


def _add(op: ir.Op, a: Facts, b: Facts) -> Facts:
    if op.kind == "ptradd":  # the offset counts elements, the pointer's divisibility bytes
        n = elem_bytes(op.args[0])
        b = Facts(b.contig, tuple(min(TOP, d * n) for d in b.div), b.const)
    contig = _zip(lambda ac, ad, ak, bc, bd, bk: max(min(ac, bk), min(bc, ak)), a, b)
    value = a.value + b.value if a.value is not None and b.value is not None and op.kind == "add" else None
    return Facts(contig, _zip(lambda ac, ad, ak, bc, bd, bk: min(ad, bd), a, b),
                 _zip(lambda ac, ad, ak, bc, bd, bk: min(ak, bk), a, b), value)


def _sub(op: ir.Op, a: Facts, b: Facts) -> Facts:
    return Facts(_zip(lambda ac, ad, ak, bc, bd, bk: min(ac, bk), a, b),
                 _zip(lambda ac, ad, ak, bc, bd, bk: min(ad, bd), a, b),
                 _zip(lambda ac, ad, ak, bc, bd, bk: min(ak, bk), a, b))


def _mul(op: ir.Op, a: Facts, b: Facts) -> Facts:
    if a.value == 1 or b.value == 1:  # times one: the other operand, unchanged
        return b if a.value == 1 else a
    value = a.value * b.value if a.value is not None and b.value is not None else None

    def div(ac, ad, ak, bc, bd, bk):  # products are not consecutive: each element is its own run, and inside a run
        return min(TOP, (ad if ac == 1 else 1) * (bd if bc == 1 else 1))  # of consecutive values only 1 divides all
    return Facts((1,) * len(a.contig), _zip(div, a, b), _zip(lambda ac, ad, ak, bc, bd, bk: min(ak, bk), a, b), value)


def _compare(op: ir.Op, a: Facts, b: Facts) -> Facts:
    # a run of consecutive values starting at a multiple of k stays on one side of a multiple of k
    def const(ac, ad, ak, bc, bd, bk):
        return max(min(ak, bk), min(ac, ad, bk, bd), min(bc, bd, ak, ad))
    n = len(a.contig)
    return Facts((1,) * n, (1,) * n, _zip(const, a, b))


def _logic(op: ir.Op, a: Facts, b: Facts) -> Facts:
    n = len(a.contig)
    return Facts((1,) * n, (1,) * n, _zip(lambda ac, ad, ak, bc, bd, bk: min(ak, bk), a, b))


def _mod(op: ir.Op, a: Facts, b: Facts) -> Facts:
    """x % c for a positive constant c: every multiple of c where x wraps is a multiple of d = the largest power of two
    dividing c and x's run starts, so runs of up to d consecutive values stay consecutive and start at multiples of d."""
    if not isinstance(b.value, int) or b.value <= 0:
        return Facts((1,) * len(a.contig), (1,) * len(a.contig), a.const)
    div = tuple(min(d, pow2_divisor(b.value)) for d in a.div)
    return Facts(tuple(map(min, a.contig, div)), div, a.const)


RULES = {"add": _add, "ptradd": _add, "sub": _sub, "mul": _mul, "mod": _mod, "lt": _compare, "le": _compare,
         "gt": _compare, "ge": _compare, "and": _logic, "or": _logic}


def infer(op: ir.Op) -> Facts:
    kind, res = op.kind, op.result
    shape = res.type.shape
    rank = max(1, len(shape))
    if kind == "const":
        v = op.attrs["value"]
        return Facts((1,), (pow2_divisor(v) if isinstance(v, int) else 1,), (1,), v if isinstance(v, int) else None)
    if kind == "arange":
        return Facts((shape[0],), (pow2_divisor(op.attrs["start"]),), (1,))
    if kind == "splat":
        f = facts(op.args[0])
        return Facts((1,) * rank, (f.div[0],) * rank, tuple(shape), f.value)
    if kind == "broadcast":
        f, src = facts(op.args[0]), op.args[0].type.shape
        wide = [s == 1 and n > 1 for s, n in zip(src, shape)]
        return Facts(tuple(1 if w else c for w, c in zip(wide, f.contig)), f.div,
                     tuple(n if w else k for w, n, k in zip(wide, shape, f.const)), f.value)
    if kind == "expand_dims":
        f, a = facts(op.args[0]), op.attrs["axis"]
        lone = min(f.div) if all(c == 1 for c in f.contig) else 1  # the divisibility of every single element
        if not op.args[0].type.shape:
            return Facts((1, 1), (lone, lone), (1, 1), f.value)
        return Facts(f.contig[:a] + (1,) + f.contig[a:], f.div[:a] + (lone,) + f.div[a:],
                     f.const[:a] + (1,) + f.const[a:], f.value)
    if kind == "trans":
        f, perm = facts(op.args[0]), op.attrs["perm"]
        return Facts(tuple(f.contig[p] for p in perm), tuple(f.div[p] for p in perm), tuple(f.const[p] for p in perm),
                     f.value)
    if kind in ("cast", "not") and op.args[0].type.dtype.kind != "f" and res.type.dtype.kind != "f":
        f, src, dst = facts(op.args[0]), op.args[0].type.dtype, res.type.dtype
        if kind == "cast" and _widens(src, dst):  # the same values (i32 offsets as i64 on tensors of 2 GiB and up)
            return f
        return Facts((1,) * rank, (1,) * rank, f.const)
    if kind in RULES:
        return RULES[kind](op, facts(op.args[0]), facts(op.args[1]))
    if kind == "hint":  # the user's promise, added to what is proven
        f, div, contig = facts(op.args[0]), op.attrs.get("multiple_of"), op.attrs.get("max_contiguous")
        return Facts(tuple(map(max, f.contig, contig or f.contig)),
                     tuple(max(d, pow2_divisor(n)) for d, n in zip(f.div, div or f.div)), f.const, f.value)
    return unknown(rank)


def meet(a: Facts, b: Facts) -> Facts:
    """What holds of a value that is one of two (a loop-carried value: its start or a later iteration's)."""
    return Facts(tuple(map(min, a.contig, b.contig)), tuple(map(min, a.div, b.div)), tuple(map(min, a.const, b.const)),
                 a.value if a.value == b.value else None)


def loop(op: ir.Op) -> None:
    """A carried value's facts are those of its start met with its next value's, iterated until they settle (facts
    only shrink); a loop that does not settle soon knows nothing of its carried values."""
    body = op.regions[0]
    body.params[0].facts = Facts((1,), (min(facts(op.args[0]).div[0], facts(op.args[2]).div[0]),), (1,))
    carried = list(zip(body.params[1:], op.args[3:], body.ops[-1].args))
    for p, init, _ in carried:
        p.facts = facts(init)
    for _ in range(8):
        region(body)
        new = [meet(facts(init), facts(nxt)) for p, init, nxt in carried]
        if all(p.facts == f for (p, _, _), f in zip(carried, new)):
            return
        for (p, _, _), f in zip(carried, new):
            p.facts = f
    for p, _, _ in carried:
        p.facts = None
    region(body)


def region(r: ir.Region) -> None:
    for op in r.ops:
        if op.kind == "for":
            loop(op)
        for sub in op.regions[op.kind == "for":]:
            region(sub)
        if len(op.results) == 1 and op.kind not in ("for", "while", "if"):
            op.result.facts = infer(op)


def analyze_axes(k: ir.Kernel) -> ir.Kernel:
    for p in k.params:
        if p.name in k.spec.ones:
            p.facts = Facts((1,), (1,), (1,), 1)
        elif p.name in k.spec.aligned:
            p.facts = Facts((1,), (16,), (1,))
        elif p.name in k.spec.eights:
            p.facts = Facts((1,), (8,), (1,))
    region(k.body)
    return k
