"""`dot`: mma.sync on the tensor cores, or chains of fused multiply-adds on the CUDA cores.

Both read registers by coordinate: the passes gave the operands layouts whose thread parts agree
(a thread's rows of A are its accumulator's rows), so the register part of each layout says which
register holds which (row, k) of A, (k, col) of B and (row, col) of the accumulator.
"""
from __future__ import annotations

from .. import ir
from ..layout import Layout, inverse, to_coord, to_flat, wgmma_descriptor, xor_span
from ..types import FP8, f16
from . import cexpr
from .shared import buffer_base


def by_coord(layout: Layout, regs: list[str]) -> dict:
    return {to_coord(layout.shape, layout.reg_flat(i)): r for i, r in enumerate(regs)}


def dot(cg, op: ir.Op) -> None:
    (wgmma if "wgmma" in op.attrs else mma if "mma" in op.attrs else fma)(cg, op)


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
    32-bit registers of kwidth consecutive k each: k, then row 8 (A only), then k + 4 kwidth. fp8 runs as f16
    (every fp8 value is one): each element is converted as it is packed."""
    a, b, acc = op.args
    res = op.result
    ksize = int(op.attrs["mma"].rsplit("k", 1)[1])
    kwidth = ksize // 8
    A, B, C = by_coord(a.layout, cg.regs(a)), by_coord(b.layout, cg.regs(b)), by_coord(acc.layout, cg.regs(acc))
    name = cg.array(res)
    out = by_coord(res.layout, [f"{name}[{i}]" for i in range(res.layout.nregs)])
    pack = {1: "nk_bits32", 2: "nk_pack2", 4: "nk_pack4"}[kwidth]
    dt = a.type.dtype
    elem = (lambda x: cexpr.cast(x, dt, f16)) if dt in FP8 else (lambda x: x)

    def packed(cache: dict, frag: dict, key, coords: list) -> list[str]:
        if key not in cache:
            words = [f"{pack}({', '.join(elem(frag[c]) for c in coords[w * kwidth:(w + 1) * kwidth])})"
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


def wgmma(cg, op: ir.Op) -> None:
    """Hopper: each warpgroup issues one wgmma.m64nNk(32 bytes of K) per 64-row block and K step, B (and A unless it is
    in registers) read by the tensor cores from their swizzled shared tiles through matrix descriptors, then waits. A
    warpgroup's tiles start where its warp bits put it: a per-thread byte offset XOR-ed into each descriptor's address.
    A in registers is four 32-bit words of f16/bf16 pairs per step (rows g, g + 8 at k 2t, then at k 2t + 8), packed
    and pinned before the fence that orders their writes before the tensor cores read them."""
    a, b, acc = op.args
    res = op.result
    gm, gn = op.attrs["wgmma"]
    (m, k), n = a.type.shape, b.type.shape[1]
    mw, nw = m // gm, n // gn
    item = b.type.dtype.elem.itemsize
    ks = 32 // item  # K per instruction: 16 of f16/bf16, 32 of fp8
    trans = item == 2  # fp8 forms have no transpose flags (their tiles hold K contiguous)
    shared_a = isinstance(a.type.dtype, ir.Buffer)
    name = cg.array(res)
    # a zero accumulator is not copied in: the first K step ignores it (scale-d 0), and no register the tensor
    # cores write is a copy of one constant (ptxas would wait for an earlier group before reusing it); each
    # register is defined by an asm of its own instead, which leaves it as it was
    zero = ir.is_zero(acc, cg.defs)
    regs = [f'asm volatile("" : "=f"({name}[{i}]));' for i in range(res.layout.nregs)] if zero else \
        [f"{name}[{i}] = {c};" for i, c in enumerate(cg.regs(acc))]
    cg.emit_all(regs, per_line=4 if zero else 8)
    out = by_coord(res.layout, [f"{name}[{i}]" for i in range(res.layout.nregs)])
    origins = [to_coord(res.layout.shape, w) for w in res.layout.warp[2:]]  # the warpgroup bits' (row, col)

    def group_offset(buf: ir.Value, coords) -> str:
        inv = inverse(buf.layout)
        offs = tuple(item * xor_span(inv, to_flat(buf.layout.shape, c)) for c in coords)
        return cg.thread_var((0,) * 5, (0, 0) + offs, f"warpgroup offsets in {buf.layout.short()}")

    def desc(buf: ir.Value, wg: str, d: tuple) -> str:
        return f"nk_desc(nk_sbase + {buffer_base(cg, buf)} + ({wg} ^ {d[0]}), {d[1]}, {d[2]}, {d[3]})"
    wb = group_offset(b, [(0, c) for _, c in origins])
    if shared_a:
        wa = group_offset(a, [(r, 0) for r, _ in origins])
    else:  # each (row, even k) of the thread's registers starts a word of two k
        A = by_coord(a.layout, cg.regs(a))
        words = {(r, c): f"nk_pack2({A[(r, c)]}, {A[(r, c + 1)]})" for r, c in A if c % 2 == 0}
        fa = dict(zip(words, (cg.fresh("f") for _ in words)))
        cg.emit_all([f"unsigned {fa[x]} = {w};" for x, w in words.items()])
        cg.emit_all([f'asm volatile("" : "+r"({r}));' for r in fa.values()], per_line=4)
        cg.pinned[id(res)] = list(fa.values())  # read by the tensor cores until the wait
    ops = ", ".join(f"%{i}" for i in range(nw // 2))
    cg.emit('asm volatile("wgmma.fence.sync.aligned;" ::: "memory");')
    for blk in range(mw // 64):
        regs = [out[(64 * blk + 8 * (q // 2 % 2), 8 * (q // 4) + q % 2)] for q in range(nw // 2)]
        binds = ", ".join(f'"+f"({r})' for r in regs)
        for s in range(k // ks):
            db = wgmma_descriptor(b.layout, item, (ks * s, 0), (ks, nw), 0)
            scale_d = int(not (zero and s == 0))
            if shared_a:
                da = wgmma_descriptor(a.layout, item, (64 * blk, ks * s), (64, ks), 1)
                operand, args, flags = f"%{nw // 2}", [f'"l"({desc(a, wa, da)})'], f"{scale_d}, 1, 1" + \
                    f", {int(da[4])}" * trans
            else:  # a0..a3: the words at rows +0, +8, then at k +8
                operand = "{" + ", ".join(f"%{nw // 2 + j}" for j in range(4)) + "}"
                args = [f'"r"({fa[(64 * blk + 8 * (j % 2), 16 * s + 8 * (j // 2))]})' for j in range(4)]
                flags = f"{scale_d}, 1, 1"
            cg.emit(f'asm volatile("wgmma.mma_async.sync.aligned.m64n{nw}k{ks}.{op.attrs["types"]} {{{ops}}}, '
                    f'{operand}, %{nw // 2 + len(args)}, {flags}{f", {int(db[4])}" * trans};" : {binds} : '
                    f'{", ".join(args)}, "l"({desc(b, wb, db)}));')
    cg.emit('asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");')
    if not op.attrs.get("async"):  # else a dot_wait follows
        wait(cg, 0, list(out.values()))


def wait(cg, pending: int, regs: list[str], words: list[str] = ()) -> None:
    """wgmma.wait_group: the accumulators of the groups waited for are final; the tensor cores write them behind
    the compiler's back, so an empty asm that 'changes' each pins every read after the wait. A's words in registers
    are pinned too: the compiler must not reuse them while the tensor cores may still read them."""
    cg.emit(f'asm volatile("wgmma.wait_group.sync.aligned {pending};" ::: "memory");')
    cg.emit_all([f'asm volatile("" : "+f"({r}) :: "memory");' for r in regs] +
                [f'asm volatile("" : "+r"({r}));' for r in words], per_line=4)


def dot_wait(cg, op: ir.Op) -> None:
    """The pipeline's wait for its group k - 1 (pending 1, no "pin") pins nothing: group k, still in flight,
    writes the same accumulator."""
    accs = op.args[:len(op.results)]
    regs = [r for a in accs for r in cg.regs(a)] if op.attrs.get("pin", not op.attrs["pending"]) else []
    wait(cg, op.attrs["pending"], regs, [w for a in accs for w in cg.pinned.pop(id(a), [])])
    for a, res in zip(accs, op.results):
        cg.vals[id(res)] = cg.regs(a)
