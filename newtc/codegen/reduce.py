"""Reductions read off the layout's bases: registers along the axis combine in place, lanes along it
with a butterfly of warp shuffles, warps along it through shared memory (the scratch buffer that
passes.lower gave the op)."""
from __future__ import annotations

from .. import ir
from ..errors import NkError
from ..layout import Layout, axis_mask, pure, slice_layout
from . import cexpr


def better(kind: str, a: str, b: str) -> str:
    """`b` replaces `a` in a max/min reduction (for arg* the index breaks ties)."""
    return f"{b} > {a}" if kind in ("max", "argmax") else f"{b} < {a}"


COMBINE = {"sum": "add", "max": "maximum", "min": "minimum"}  # the elementwise op each reduction folds with


def step(kind: str, acc: str, idx: str | None, b: str, bi: str | None, dt) -> str:
    """One statement folding value b (index bi) into acc (index idx); dt is the accumulator dtype."""
    if idx is None:
        return f"{acc} = {cexpr.elementwise(COMBINE[kind], [dt, dt], dt, [acc, b])};"
    return f"if ({better(kind, acc, b)} || ({b} == {acc} && {bi} < {idx})) {{ {acc} = {b}; {idx} = {bi}; }}"


def reduce_regs(cg, kind: str, dt, xs: list[str], layout: Layout, axis: int, span,
                scratch: int | None) -> tuple[list[str], list[str] | None]:
    """Reduce one value held in `layout` along `axis` (warps meet at byte `scratch` of shared memory);
    returns the accumulator (and index) registers of the result in slice_layout(layout, axis),
    identical in every thread that holds them."""
    m = axis_mask(layout.shape, axis)
    if not pure(layout, m):
        raise NkError("internal: reduction over a layout that mixes the axis with other dims", span)
    adt = cexpr.accumulator(dt)
    t = cexpr.ctype(adt)
    arg = kind in ("argmax", "argmin")
    keep = [b for b, base in enumerate(layout.reg) if not base & m]
    groups: dict[int, list[int]] = {}
    for j in range(layout.nregs):
        groups.setdefault(sum(((j >> b) & 1) << n for n, b in enumerate(keep)), []).append(j)
    acc, idx = cg.fresh("acc"), cg.fresh("idx") if arg else None
    n = len(groups)
    cg.emit(f"{t} {acc}[{n}];" + (f" int {idx}[{n}];" if arg else ""))
    stmts = []
    for i, js in sorted(groups.items()):
        # (an arg* step's select is a min or max to LLVM too: its values go in as min and max take theirs)
        level = [(cexpr.opaque(cexpr.widen(xs[j], dt), adt) if arg else cexpr.widen(xs[j], dt),
                  cg.coord(layout, j, axis) if arg else None) for j in js]
        while len(level) > 1:  # pairwise, as a tree: log2(n) dependent steps instead of a chain of n
            pairs, level = level, []
            for (a, ai), (b, bi) in zip(pairs[::2], pairs[1::2]):
                r, ri = cg.fresh("r"), cg.fresh("ri") if arg else None
                stmts.append(f"{t} {r} = {a};" + (f" int {ri} = {ai};" if arg else ""))
                stmts.append(step(kind, r, ri, b, bi, adt))
                level.append((r, ri))
            level += pairs[len(pairs) - len(pairs) % 2:]
        stmts.append(f"{acc}[{i}] = {level[0][0]};" + (f" {idx}[{i}] = {level[0][1]};" if arg else ""))
    cg.emit_all(stmts, per_line=2)
    for k, base in enumerate(layout.lane):
        if base & m:
            for i in range(n):
                o = f"__shfl_xor_sync(0xffffffffu, {acc}[{i}], {1 << k})"
                oi = f"__shfl_xor_sync(0xffffffffu, {idx}[{i}], {1 << k})" if arg else None
                cg.emit(f"{{ {t} o = {o};" + (f" int oi = {oi};" if arg else "") + " "
                        + step(kind, f"{acc}[{i}]", f"{idx}[{i}]" if arg else None, "o", "oi" if arg else None, adt) + " }")
    wbits = [k for k, base in enumerate(layout.warp) if base & m]
    if wbits:
        out = slice_layout(layout, axis)
        numel = 1
        for d in out.shape:
            numel *= d
        slots = 1 << len(wbits)
        vbytes = slots * numel * 8  # passes.lower allots 8 bytes a value, then 4 an index
        base = f"(nk_smem + {scratch})"
        wa = " | ".join(f"(((nk_warp >> {k}) & 1) << {n_})" for n_, k in enumerate(wbits))
        buf, ibuf = f"(({t}*){base})", f"((int*)({base} + {vbytes}))"
        for i in range(n):
            f = cg.flat(out, i) if out.shape else "0"
            cg.emit(f"{buf}[({wa}) * {numel} + {f}] = {acc}[{i}];" + (f" {ibuf}[({wa}) * {numel} + {f}] = {idx}[{i}];" if arg else ""))
        cg.emit(cg.sync)
        for i in range(n):
            f = cg.flat(out, i) if out.shape else "0"
            stmts = [f"{acc}[{i}] = {buf}[{f}];" + (f" {idx}[{i}] = {ibuf}[{f}];" if arg else "")]
            for s in range(1, slots):
                stmts.append(step(kind, f"{acc}[{i}]", f"{idx}[{i}]" if arg else None, f"{buf}[{s * numel} + {f}]",
                                  f"{ibuf}[{s * numel} + {f}]" if arg else None, adt))
            cg.emit_all(stmts, per_line=2)
    return [f"{acc}[{i}]" for i in range(n)], ([f"{idx}[{i}]" for i in range(n)] if arg else None)


def reduce_op(cg, op: ir.Op) -> None:
    x, res = op.args[0], op.result
    scratch = cg.defs[id(op.args[1])].attrs["offset"] if len(op.args) > 1 else None
    accs, idxs = reduce_regs(cg, op.attrs["kind"], x.type.dtype, cg.regs(x), x.layout, op.attrs["axis"], op.span,
                             scratch)
    if idxs is not None:
        cg.define(res, idxs)
    else:
        cg.define(res, [cexpr.narrow(a, res.type.dtype) for a in accs])
