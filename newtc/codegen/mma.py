"""`dot`: mma.sync on the tensor cores, or chains of fused multiply-adds on the CUDA cores.

Both read registers by coordinate: the passes gave the operands layouts whose thread parts agree
(a thread's rows of A are its accumulator's rows), so the register part of each layout says which
register holds which (row, k) of A, (k, col) of B and (row, col) of the accumulator.
"""
from __future__ import annotations

from .. import ir
from ..layout import Layout, to_coord
from . import cexpr


def by_coord(layout: Layout, regs: list[str]) -> dict:
    return {to_coord(layout.shape, layout.reg_flat(i)): r for i, r in enumerate(regs)}


def dot(cg, op: ir.Op) -> None:
    (mma if "mma" in op.attrs else fma)(cg, op)


def fma(cg, op: ir.Op) -> None:
    """Each accumulator register is a chain of K multiply-adds in the accumulator's compute type."""
    a, b, acc = op.args
    res = op.result
    A, B = by_coord(a.layout, cg.regs(a)), by_coord(b.layout, cg.regs(b))
    out, dt = res.type.dtype, a.type.dtype
    adt = cexpr.accumulator(out)
    t = cexpr.ctype(adt)
    name = cg.array(res)
    for i, c in enumerate(cg.regs(acc)):
        m, n = to_coord(res.layout.shape, res.layout.reg_flat(i))
        s = cg.fresh("s")
        stmts = [f"{t} {s} = {cexpr.cast(c, out, adt)};"]
        for k in range(a.type.shape[1]):
            x, y = (cexpr.cast(A[(m, k)], dt, adt), cexpr.cast(B[(k, n)], dt, adt))
            stmts.append(f"{s} = {cexpr.elementwise('fma', [adt] * 3, adt, [x, y, s])};" if adt.is_float
                         else f"{s} += {x} * {y};")
        stmts.append(f"{name}[{i}] = {cexpr.cast(s, adt, out)};")
        cg.emit_all(stmts)


def mma(cg, op: ir.Op) -> None:
    """One mma.sync.m16n8k(8 kwidth) per 16x8 accumulator tile and k step. A fragment is 4 (A) or 2 (B)
    32-bit registers of kwidth consecutive k each: k, then row 8 (A only), then k + 4 kwidth."""
    a, b, acc = op.args
    res = op.result
    ksize = int(op.attrs["mma"].rsplit("k", 1)[1])
    kwidth = ksize // 8
    A, B, C = by_coord(a.layout, cg.regs(a)), by_coord(b.layout, cg.regs(b)), by_coord(acc.layout, cg.regs(acc))
    name = cg.array(res)
    out = by_coord(res.layout, [f"{name}[{i}]" for i in range(res.layout.nregs)])
    pack = {1: "nk_bits32", 2: "nk_pack2", 4: "nk_pack4"}[kwidth]

    def packed(cache: dict, frag: dict, key, coords: list) -> list[str]:
        if key not in cache:
            words = [f"{pack}({', '.join(frag[c] for c in coords[w * kwidth:(w + 1) * kwidth])})"
                     for w in range(len(coords) // kwidth)]
            names = [cg.fresh("f") for _ in words]
            cg.emit(" ".join(f"unsigned {n} = {w};" for n, w in zip(names, words)))
            cache[key] = names
        return cache[key]

    fa, fb = {}, {}
    int_acc = res.type.dtype.is_int
    reg, c = ("r", "r") if int_acc else ("f", "f")
    for k0 in range(0, a.type.shape[1], ksize):
        for (m0, n0) in sorted({(m - m % 16, n - n % 8) for m, n in C}):
            ra = packed(fa, A, (m0, k0), [(m0 + 8 * (j // kwidth % 2), k0 + j % kwidth + 4 * kwidth * (j // (2 * kwidth)))
                                          for j in range(4 * kwidth)])
            rb = packed(fb, B, (k0, n0), [(k0 + j % kwidth + 4 * kwidth * (j // kwidth), n0) for j in range(2 * kwidth)])
            tile = [(m0, n0), (m0, n0 + 1), (m0 + 8, n0), (m0 + 8, n0 + 1)]
            src = [C[x] for x in tile] if k0 == 0 else [out[x] for x in tile]
            dst = [out[x] for x in tile]
            ops = ", ".join(f"%{i}" for i in range(4))
            ins = ", ".join(f"%{i}" for i in range(4, 8))
            bs = ", ".join(f"%{i}" for i in range(8, 10))
            cs = ", ".join(f"%{i}" for i in range(10, 14))
            binds = ", ".join(f'"={reg}"({d})' for d in dst)
            args = ", ".join([*(f'"r"({x})' for x in ra), *(f'"r"({x})' for x in rb), *(f'"{c}"({x})' for x in src)])
            cg.emit(f'asm("mma.sync.aligned.m16n8k{ksize}.row.col.{op.attrs["types"]} {{{ops}}}, {{{ins}}}, {{{bs}}}, '
                    f'{{{cs}}};" : {binds} : {args});')
