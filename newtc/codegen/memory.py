"""Loads, stores and atomics: one 128-bit access per contiguous, aligned, unmasked 16-byte group.

Whether a group is contiguous and aligned is checked at run time with a few integer compares
(the compiler folds the contiguity compares when the offsets are affine in arange); the scalar
path, with per-element masks, is the fallback.
"""
from __future__ import annotations

from .. import ir
from ..errors import NkError
from ..ir import facts
from ..layout import Layout, vector
from . import cexpr


def proven(ptr: ir.Value, mask: ir.Value | None, layout: Layout, dim: int, g: int, nbytes: int) -> bool:
    """The analysis shows every group contiguous, aligned and uniformly masked: no run-time check."""
    f = facts(ptr)
    return (layout.disjoint and f.contig[dim] >= g and f.div[dim] % nbytes == 0
            and (mask is None or facts(mask).const[dim] >= g))


def vector_condition(ptrs: list[str], masks: list[str] | None, nbytes: int, aligned: bool = False) -> str:
    """The run-time check of a group: its lanes all in and, unless the analysis showed it (`aligned`), its
    addresses contiguous and aligned."""
    conds = [] if aligned else [f"((unsigned long long)({ptrs[0]}) & {nbytes - 1}) == 0",
                                *(f"{p} == {ptrs[0]} + {j}" for j, p in enumerate(ptrs) if j)]
    return " && ".join(conds + (masks or []))


def branch(cond: str, vector: list[str], scalar: list[str]) -> str:
    """One source line per group, so `#line` maps every instruction of it to the `.nk` line."""
    return f"if ({cond}) {{ {' '.join(vector)} }} else {{ {' '.join(scalar)} }}"


def load(cg, op: ir.Op) -> None:
    res = op.result
    t = cexpr.ctype(res.type.dtype)
    if not res.type.shape:
        cg.emit(f"{t} const {cg.name_of(res)} = {scalar_load(cg, op)};")
        return
    layout = res.layout
    n = layout.nregs
    name = cg.array(res)
    ptrs = cg.regs(op.args[0])
    masks = cg.regs(op.args[1]) if op.args[1] is not None else None
    others = cg.regs(op.args[2]) if op.args[2] is not None else [f"nk_zero<{t}>()"] * n
    dim, g = vector(layout, res.type.dtype.itemsize)
    static = proven(op.args[0], op.args[1], layout, dim, g, g * res.type.dtype.itemsize)
    # groups proven contiguous and aligned but masked unevenly (a row's ends) load as a whole where any lane is in,
    # their masked lanes then replaced: no fault, as the 16 aligned bytes of a lane that is in are all mapped
    aligned = static or proven(op.args[0], None, layout, dim, g, g * res.type.dtype.itemsize)
    for base in range(0, n, g):
        p, m = ptrs[base:base + g], masks[base:base + g] if masks else None
        scalar = [f"{name}[{base + j}] = {m[j]} ? *{p[j]} : {others[base + j]};" if m else
                  f"{name}[{base + j}] = *{p[j]};" for j in range(g)]
        if g == 1:
            cg.emit_all(scalar)
            continue
        word = f"u.w = *(const decltype(u.w)*)({p[0]});"
        unpack = [f"{name}[{base + j}] = u.e[{j}];" for j in range(g)]
        wide = [f"nk_pack<{t}, {g}> u;", word, *unpack]
        if aligned and m:  # `other` fills the registers a predicated load then overwrites (a uniform mask: all)
            fill = [f"u.e[{j}] = {others[base + j]};" for j in range(g)]
            keep = unpack if static else [f"{name}[{base + j}] = {m[j]} ? u.e[{j}] : {others[base + j]};"
                                          for j in range(g)]
            any_in = m[0] if static else " || ".join(f"({x})" for x in m)
            cg.emit(" ".join(["{", wide[0], *fill, f"if ({any_in}) {word}", *keep, "}"]))
        elif aligned:
            cg.emit(" ".join(["{", *wide, "}"]))
        else:
            cg.emit(branch(vector_condition(p, m, g * res.type.dtype.itemsize), wide, scalar))


def scalar_load(cg, op: ir.Op) -> str:
    p = cg.scalar(op.args[0])
    if op.args[1] is None:
        return f"*{p}"
    other = cg.scalar(op.args[2]) if op.args[2] is not None else f"nk_zero<{cexpr.ctype(op.result.type.dtype)}>()"
    return f"({cg.scalar(op.args[1])} ? *{p} : {other})"


def store(cg, op: ir.Op) -> None:
    ptr, val, mask = op.args
    if not ptr.type.shape:
        cond = "nk_tid == 0" + (f" && {cg.scalar(mask)}" if mask is not None else "")
        cg.emit(f"if ({cond}) *{cg.scalar(ptr)} = {cg.scalar(val)};")
        return
    layout = val.layout
    ptrs, vals = cg.regs(ptr), cg.regs(val)
    masks = cg.regs(mask) if mask is not None else None
    t = cexpr.ctype(val.type.dtype)
    dim, g = vector(layout, val.type.dtype.itemsize)
    static = proven(ptr, mask, layout, dim, g, g * val.type.dtype.itemsize)
    aligned = not static and proven(ptr, None, layout, dim, g, g * val.type.dtype.itemsize)
    owner = cg.owner(layout)
    if cg.predicated:
        return predicated_store(cg, ptrs, vals, masks, t, g, static, aligned, owner, g * val.type.dtype.itemsize)
    if owner:
        cg.emit(f"if ({owner}) {{")
    for base in range(0, layout.nregs, g):
        p, m = ptrs[base:base + g], masks[base:base + g] if masks else None
        scalar = [f"if ({m[j]}) *{p[j]} = {vals[base + j]};" if m else f"*{p[j]} = {vals[base + j]};" for j in range(g)]
        if g == 1:
            cg.emit_all(scalar)
            continue
        wide = [f"nk_pack<{t}, {g}> u;"] + [f"u.e[{j}] = {vals[base + j]};" for j in range(g)]
        wide += [f"*(decltype(u.w)*)({p[0]}) = u.w;"]
        if static:
            cg.emit(f"if ({m[0]}) {{ {' '.join(wide)} }}" if m else " ".join(["{"] + wide + ["}"]))
        else:
            cg.emit(branch(vector_condition(p, m, g * val.type.dtype.itemsize, aligned), wide, scalar))
    if owner:
        cg.emit("}")


def predicated_store(cg, ptrs, vals, masks, t, g, static, aligned, owner, nbytes) -> None:
    """The stores of a kernel whose wgmma accumulators are read after an asynchronous pipeline: every condition
    (mask, owner, the run-time vector check) a predicate on the store itself, no branch around it."""
    def cond(*parts) -> str:
        return " && ".join(f"({c})" for c in parts if c) or "true"
    stmts = []
    for base in range(0, len(vals), g):
        p, m = ptrs[base:base + g], masks[base:base + g] if masks else [""] * g
        if g == 1:
            stmts.append(f"nk_store_if({p[0]}, {vals[base]}, {cond(m[0], owner)});")
            continue
        check = "" if static else vector_condition(p, [x for x in m if x] or None, nbytes, aligned)  # all or none
        fill = " ".join(f"u.e[{j}] = {vals[base + j]};" for j in range(g))
        line = f"{{ nk_pack<{t}, {g}> u; {fill} nk_store_if((decltype(u.w)*)({p[0]}), u.w, " \
               f"{cond(m[0] if static else '', owner, check)});"
        if not static:  # a group that is not contiguous and aligned after all: element by element
            line += " " + " ".join(f"nk_store_if({p[j]}, {vals[base + j]}, {cond(m[j], owner, f'!({check})')});"
                                   for j in range(g))
        stmts.append(line + " }")
    cg.emit_all(stmts, per_line=2)


NATIVE = {"add": {"i32", "u32", "u64", "f32", "f64", "i64"}, "max": {"i32", "u32", "i64", "u64"},
          "min": {"i32", "u32", "i64", "u64"}, "xchg": {"i32", "u32", "u64", "f32", "i64", "f64"},
          "cas": {"i32", "u32", "u64", "i64", "u16"}, **dict.fromkeys(("or", "and", "xor"), {"i32", "u32", "i64", "u64"})}
FUNCS = {"add": "atomicAdd", "max": "atomicMax", "min": "atomicMin", "xchg": "atomicExch", "cas": "atomicCAS",
         "or": "atomicOr", "and": "atomicAnd", "xor": "atomicXor"}
SCOPE = {"gpu": "", "cta": "_block", "sys": "_system"}  # CUDA's scoped atomics (relaxed, as PTX atom without .sem)


def atomic_expr(op: ir.Op, ptr: str, *vals: str) -> str:
    kind = op.attrs["kind"]
    dt = op.args[0].type.dtype.elem
    t = cexpr.ctype(dt)
    scope = op.attrs.get("scope", "gpu")
    if dt.name in ("f32", "f64") and kind in ("max", "min"):
        bits = "unsigned" if dt.name == "f32" else "unsigned long long"
        return f"nk_atomic_minmax<{t}, {bits}, {list(SCOPE).index(scope)}>({ptr}, {vals[0]}, {'true' if kind == 'max' else 'false'})"
    if dt.name not in NATIVE[kind]:
        raise NkError(f"atomic_{kind} on {dt} is not supported on the GPU", op.span)
    fn = FUNCS[kind] + SCOPE[scope]
    if dt.name == "i64" and kind not in ("max", "min") or dt.name == "f64" and kind == "xchg":
        u = "unsigned long long"
        args = ", ".join(f"nk_bitcast<{u}>({v})" for v in vals)
        return f"nk_bitcast<{t}>({fn}(({u}*)({ptr}), {args}))"
    return f"{fn}({ptr}, {', '.join(vals)})"


def fence(cg, op: ir.Op, sems: tuple) -> None:
    """sem= as the PTX memory model's release and acquire patterns: a fence before, after, or both, at the scope."""
    if op.attrs.get("sem", "relaxed") in sems + ("acq_rel",):
        cg.emit(f'asm volatile("fence.acq_rel.{op.attrs["scope"]};" ::: "memory");')


def atomic(cg, op: ir.Op) -> None:
    fence(cg, op, ("release",))
    atomic_body(cg, op)
    fence(cg, op, ("acquire",))


# PTX red: an atomic whose old value no one reads. NVRTC makes ATOMG of an unused atomicAdd, which waits for the old
# value; RED does not, and sm_90 adds four f32 at once (split-K's sums)
RED = {"add": {"f32": "f32", "f64": "f64", "i32": "s32", "u32": "u32", "i64": "u64", "u64": "u64"},
       **{k: {"i32": "s32", "u32": "u32", "i64": "s64", "u64": "u64"} for k in ("max", "min")},
       **{k: {"i32": "b32", "u32": "b32", "i64": "b64", "u64": "b64"} for k in ("or", "and", "xor")}}
CONSTRAINT = {"f32": "f", "f64": "d", "s32": "r", "u32": "r", "b32": "r", "s64": "l", "u64": "l", "b64": "l"}


def red(op: ir.Op, ptr: str, vals: list[str], cond: str) -> str:
    """One red of len(vals) consecutive elements (one, or 2 or 4 f32 from `ptr` aligned to their size), under `cond`."""
    ptype = RED[op.attrs["kind"]][op.args[0].type.dtype.elem.name]
    vec = f".v{len(vals)}" if len(vals) > 1 else ""
    operands = ", ".join(f"%{j + 1}" for j in range(len(vals)))
    ins = ", ".join(f'"{CONSTRAINT[ptype]}"({v})' for v in vals)
    asm = (f'asm volatile("red.relaxed.{op.attrs["scope"]}.global.{op.attrs["kind"]}{vec}.{ptype} [%0], '
           f'{"{" + operands + "}" if vec else operands};" :: "l"(__cvta_generic_to_global({ptr})), {ins} : "memory");')
    return f"if ({cond}) {asm}" if cond else asm


def reduction(cg, op: ir.Op) -> None:
    """A tensor atomic whose result is unread: red, on sm_90 up to four f32 at once where the analysis proves each
    group contiguous, aligned and uniformly masked."""
    ptr, val, mask = op.args
    layout = val.layout
    ptrs, vals = cg.regs(ptr), cg.regs(val)
    masks = cg.regs(mask) if mask is not None else None
    owner = cg.owner(layout)
    dim, g = vector(layout, 4)
    g = g if val.type.dtype.name == "f32" and op.attrs["kind"] == "add" and int(cg.k.spec.arch[3:5]) >= 90 and \
        proven(ptr, mask, layout, dim, g, 4 * g) else 1
    stmts = [red(op, ptrs[i], vals[i:i + g], " && ".join(c for c in (owner, masks[i] if masks else "") if c))
             for i in range(0, layout.nregs, g)]
    cg.emit_all(stmts, per_line=2)


def atomic_body(cg, op: ir.Op) -> None:
    res = op.result
    t = cexpr.ctype(res.type.dtype)
    if res.type.shape and id(res) not in cg.readers and res.type.dtype.name in RED.get(op.attrs["kind"], {}):
        return reduction(cg, op)
    if not res.type.shape:  # one thread performs it; the old value reaches every thread through shared memory
        *args, mask, buf = op.args
        base = f"(({t}*)(nk_smem + {cg.defs[id(buf)].attrs['offset']}))"
        e = atomic_expr(op, *[cg.scalar(a) for a in args])
        cg.emit(f"if (nk_tid == 0) {base}[0] = {f'{cg.scalar(mask)} ? {e} : nk_zero<{t}>()' if mask else e};")
        cg.emit(cg.sync)
        cg.emit(f"{t} const {cg.name_of(res)} = {base}[0];")
        cg.emit(cg.sync)  # read by all before thread 0 writes again (a spin loop) or the slot is reused
        return
    layout = res.layout
    name = cg.array(res)
    cols = [cg.regs(a) for a in op.args[:-1]]
    mask = cg.regs(op.args[-1]) if op.args[-1] is not None else None
    owner = cg.owner(layout)
    for i in range(layout.nregs):
        e = atomic_expr(op, *[c[i] for c in cols])
        conds = [c for c in (owner, mask[i] if mask else "") if c]
        cg.emit(f"{name}[{i}] = {' && '.join(conds)} ? {e} : nk_zero<{t}>();" if conds else f"{name}[{i}] = {e};")
