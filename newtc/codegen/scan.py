"""Scans and data that moves along an axis, read off the layout's bases as reductions are (reduce.py).

A scan folds, within each thread, the registers that hold the lowest bits of the axis, in order; each
higher bit of the axis then joins pairs of blocks (a butterfly): every element keeps its prefix within
its block and the block's total, and takes the total of its partner block when that block comes first.
The partner is another register, a lane (a warp shuffle) or a warp (through the scratch buffer).
An exchange (a sorting network's partner, a flip) finds element i ^ m the same way; gather and
histogram go through shared memory; join and split only select registers.
"""
from __future__ import annotations

import math

from .. import ir
from ..layout import axis_levels, dim_bits, xor_source
from ..types import bool_
from . import cexpr


def combine_fn(cg, region: ir.Region) -> str:
    """The combine region as a C++ lambda (a..., b..., &out...), which NVRTC inlines at each call."""
    name, outs = cg.fresh("combine"), [cg.fresh("out") for _ in region.ops[-1].args]
    params = [f"{cexpr.ctype(p.type.dtype)} {cg.name_of(p)}" for p in region.params]
    params += [f"{cexpr.ctype(v.type.dtype)}& {o}" for v, o in zip(region.ops[-1].args, outs)]
    cg.emit(f"auto {name} = [&]({', '.join(params)}) {{")
    cg.depth += 1
    cg.region(region)
    cg.emit(" ".join(f"{o} = {cg.scalar(v)};" for v, o in zip(region.ops[-1].args, outs)))
    cg.depth -= 1
    cg.emit("};")
    return name


def scan(cg, op: ir.Op) -> None:
    n = len(op.results)
    xs, lay, axis, rev = op.args[:n], op.args[0].layout, op.attrs["axis"], op.attrs["reverse"]
    f = combine_fn(cg, op.regions[0])

    def call(a: list, b: list, out: list) -> str:
        return f"{f}({', '.join(a + b + out)});"
    levels = axis_levels(lay, axis)
    lead = []  # the lowest bits of the axis, in registers: folded in order within each thread
    for kind, k in levels:
        if kind != "r":
            break
        lead.append(k)
    done = sum(1 << k for k in lead)  # register bits whose blocks are joined: a block's registers share its total
    groups: dict = {}
    for j in range(lay.nregs):
        groups.setdefault(j & ~done, []).append(j)
    pre = [cg.declare(x.type.dtype, x.name or "scan", cg.regs(x)) for x in xs]
    stmts = []
    for js in groups.values():
        js.sort(key=lambda j: sum((j >> k & 1) << q for q, k in enumerate(lead)), reverse=rev)
        stmts += [call([p[a] for p in pre], [p[b] for p in pre], [p[b] for p in pre]) for a, b in zip(js, js[1:])]
    cg.emit_all(stmts, per_line=2)
    keys = sorted(groups)  # each group's registers take the combination of the earlier blocks' totals (`early`)
    lasts = [[p[groups[g][-1]] for g in keys] for p in pre]
    tot = dict(zip(keys, zip(*[cg.declare(x.type.dtype, "total", v) for x, v in zip(xs, lasts)])))
    early = dict(zip(keys, zip(*[cg.declare(x.type.dtype, "early", v) for x, v in zip(xs, lasts)])))
    has = dict(zip(keys, cg.declare(bool_, "has_early", ["false"] * len(keys))))

    def absorb(o, g: int) -> str:
        """A block before all those counted in group g's `early` so far."""
        first = " ".join(f"{e} = {v};" for e, v in zip(early[g], o))
        return f"if ({has[g]}) {call(list(o), list(early[g]), list(early[g]))} else {{ {first} }} {has[g]} = true;"
    first_warp = next((p for p, (kind, _) in enumerate(levels) if kind == "w"), None)
    for p, (kind, k) in list(enumerate(levels))[len(lead):]:
        stmts = []
        if kind == "r":  # the partner block is in this thread's other registers
            for lo in [g for g in tot if not g >> k & 1]:
                first, second = (lo | 1 << k, lo) if rev else (lo, lo | 1 << k)
                stmts += [absorb(tot[first], g) for g in keys if g & ~done == second]
                stmts.append(call(list(tot[first]), list(tot[second]), list(tot[lo])))
                del tot[lo | 1 << k]
            done |= 1 << k
        else:
            others = partner_totals(cg, op, xs, tot, p, kind, k, first_warp)
            up = cg.fresh("later")  # this thread's block comes after its partner's
            cg.emit(f"const bool {up} = ((({'nk_lane' if kind == 'l' else 'nk_warp'} >> {k}) & 1) != {int(rev)});")
            for g, t in tot.items():
                o, t = others[g], list(t)
                stmts += [f"if ({up}) {{ {absorb(o, g0)} }}" for g0 in keys if g0 & ~done == g]
                stmts.append(f"if ({up}) {call(o, t, t)} else {call(t, o, t)}")
        cg.emit_all(stmts, per_line=2)
    stmts = [f"if ({has[g]}) {call(list(early[g]), [p[j] for p in pre], [p[j] for p in pre])}" for g in keys
             for j in groups[g]]
    cg.emit_all(stmts, per_line=2)
    for r, p in zip(op.results, pre):
        cg.vals[id(r)] = p


def partner_totals(cg, op: ir.Op, xs: list, tot: dict, p: int, kind: str, k: int, first_warp: int) -> dict:
    """The totals of the partner blocks along bit p of the axis, held by lane or warp bit k."""
    if kind == "l":
        fetch = {g: [f"nk_shfl_xor({v}, {1 << k})" for v in t] for g, t in tot.items()}
    else:  # slots are the blocks of 2^p, numbered by the element index without the axis bits below p
        lay, offset = xs[0].layout, cg.defs[id(op.args[len(xs)])].attrs["offset"]
        s, slots = dim_bits(lay.shape)[op.attrs["axis"]][0], xs[0].type.numel >> first_warp

        def at(c: int, slot: str) -> str:
            return f"(({cexpr.ctype(xs[c].type.dtype)}*)(nk_smem + {offset + 8 * c * slots}))[{slot}]"

        def slot(g: int) -> str:
            flat = cg.flat(lay, g)
            return f"((({flat} >> {s + p}) << {s}) | ({flat} & {(1 << s) - 1}))"
        if p > first_warp:
            cg.emit(cg.sync)  # the previous level's reads are done
        cg.emit_all([f"{at(c, slot(g))} = {v};" for g, t in tot.items() for c, v in enumerate(t)])
        cg.emit(cg.sync)
        fetch = {g: [at(c, f"{slot(g)} ^ {1 << s}") for c in range(len(t))] for g, t in tot.items()}
    out, stmts = {}, []
    for g, exprs in fetch.items():
        out[g] = [cg.fresh("other") for _ in exprs]
        stmts += [f"{cexpr.ctype(x.type.dtype)} const {o} = {e};" for x, o, e in zip(xs, out[g], exprs)]
    cg.emit_all(stmts, per_line=2)
    return out


def exchange(cg, op: ir.Op) -> None:
    x, res = op.args[0], op.result
    lay, vals = x.layout, cg.regs(x)
    mask = op.attrs["xor"] << dim_bits(lay.shape)[op.attrs["axis"]][0]
    reg, lane, warp = xor_source(lay, mask)
    if warp:  # another warp holds it: through the scratch buffer
        buf = f"(({cexpr.ctype(x.type.dtype)}*)(nk_smem + {cg.defs[id(op.args[1])].attrs['offset']}))"
        cg.emit_all([f"{buf}[{cg.flat(lay, i)}] = {v};" for i, v in enumerate(vals)])
        cg.emit(cg.sync)
        cg.define(res, [f"{buf}[{cg.flat(lay, i)} ^ {mask}]" for i in range(lay.nregs)])
    else:
        cg.define(res, [f"nk_shfl_xor({vals[i ^ reg]}, {lane})" if lane else vals[i ^ reg] for i in range(lay.nregs)])


def gather(cg, op: ir.Op) -> None:
    """The source goes to shared memory in row-major order; each element reads its index's (wrapped into range)."""
    src, index, buf = op.args
    res, axis, shape = op.result, op.attrs["axis"], src.type.shape
    base = f"(({cexpr.ctype(src.type.dtype)}*)(nk_smem + {cg.defs[id(buf)].attrs['offset']}))"
    cg.emit_all([f"{base}[{cg.flat(src.layout, i)}] = {v};" for i, v in enumerate(cg.regs(src))])
    cg.emit(cg.sync)
    idx = cg.regs(index)

    def at(i: int) -> str:
        terms = [f"{cg.coord(res.layout, i, d)} * {math.prod(shape[d + 1:])}" for d in range(len(shape)) if d != axis]
        return " + ".join(terms + [f"((int)({idx[i]}) & {shape[axis] - 1}) * {math.prod(shape[axis + 1:])}"])
    cg.define(res, [f"{base}[{at(i)}]" for i in range(res.layout.nregs)])


def histogram(cg, op: ir.Op) -> None:
    """Counts in shared memory, one atomic add per element (its owner thread's), values out of range skipped."""
    x, mask, buf = op.args
    res, bins = op.result, op.result.type.shape[0]
    base = f"((int*)(nk_smem + {cg.defs[id(buf)].attrs['offset']}))"
    cg.emit(f"for (int nk_b = nk_tid; nk_b < {bins}; nk_b += {32 * cg.k.spec.num_warps}) {base}[nk_b] = 0;")
    cg.emit(cg.sync)
    masks, owner = cg.regs(mask) if mask is not None else None, cg.owner(x.layout)
    stmts = []
    for i, v in enumerate(cg.regs(x)):
        conds = [owner, masks[i] if masks else "", f"(unsigned long long)(long long)({v}) < {bins}ull"]
        stmts.append(f"if ({' && '.join(c for c in conds if c)}) atomicAdd({base} + (int)({v}), 1);")
    cg.emit_all(stmts, per_line=2)
    cg.emit(cg.sync)
    cg.define(res, [f"{base}[{cg.flat(res.layout, i)}]" for i in range(res.layout.nregs)])


def join(cg, op: ir.Op) -> None:
    cg.vals[id(op.result)] = [r for pair in zip(*(cg.regs(v) for v in op.args)) for r in pair]


def split(cg, op: ir.Op) -> None:
    x = op.args[0]
    k = x.layout.reg.index(1)
    for half, res in enumerate(op.results):
        cg.vals[id(res)] = [r for j, r in enumerate(cg.regs(x)) if (j >> k & 1) == half]


RULES = {"scan": scan, "exchange": exchange, "gather": gather, "histogram": histogram, "join": join, "split": split}
