"""Shared memory: blocks stored to and loaded from a buffer through its shared layout, cp.async copies
from global memory, and ldmatrix where the two layouts line up.

The byte address of register i of a thread is base + itemsize * (T ^ O(i)): T is the thread's part
(the lane and warp bases sent through the inverse of the shared layout, a per-thread variable) and O(i)
the register's part, a constant. Registers whose offsets are consecutive move as one vector access.
"""
from __future__ import annotations

from .. import ir
from ..layout import Layout, inverse, log2, to_coord, to_flat, xor_span
from . import cexpr
from ..layout import vector
from .memory import proven, vector_condition


def shared_offsets(reg: Layout, shared: Layout, start: tuple) -> tuple:
    """The element offsets in a buffer of shared layout `shared` of a sub-tile at `start` held in register
    layout `reg`: (of each lane bit, of each warp bit, of each register). All linear: a thread's element
    at register i is at the XOR of its lane and warp bits' offsets and register i's."""
    inv = inverse(shared)

    def off(flat: int) -> int:  # the sub-tile's flat index -> its element offset in the buffer
        return xor_span(inv, to_flat(shared.shape, to_coord(reg.shape, flat)))
    origin = xor_span(inv, to_flat(shared.shape, start))
    return tuple(map(off, reg.lane)), tuple(map(off, reg.warp)), [off(reg.reg_flat(i)) ^ origin for i in range(reg.nregs)]


def buffer_base(cg, buf: ir.Value) -> str:
    """The byte offset of a buffer in shared memory: its alloc's, plus the slot's place in a ring."""
    op = cg.defs[id(buf)]
    if op.kind == "trans":  # the same bytes, read through the permuted layout
        return buffer_base(cg, op.args[0])
    if op.kind == "slot":
        ring, index = op.args
        return f"{buffer_base(cg, ring)} + {cg.scalar(index)} * {buf.type.numel * buf.type.dtype.elem.itemsize}"
    return str(op.attrs["offset"])


class Access:
    """Where each register of a block in register layout `reg` lives in the shared buffer `buf`."""

    def __init__(self, cg, reg: Layout, buf: ir.Value, start: tuple):
        self.lane, self.warp, self.regs = shared_offsets(reg, buf.layout, start)
        self.item = buf.type.dtype.elem.itemsize
        self.base = buffer_base(cg, buf)
        thread_bits = 0
        for b in self.lane + self.warp:
            thread_bits |= b
        self.thread = cg.thread_var(self.lane, self.warp, f"shared offsets of {reg.short()}")
        self.join = "+" if all(o & thread_bits == 0 for o in self.regs) else "^"  # disjoint bits: XOR is +

    def offset(self, o: int) -> str:
        """Element offset of the register whose constant part is o."""
        return f"({self.thread} {self.join} {o})"

    def ptr(self, ctype: str, o: int) -> str:
        return f"(({ctype}*)(nk_smem + {self.base}) + {self.offset(o)})"

    def addr(self, o: int) -> str:
        """The 32-bit shared-state-space address (ldmatrix, cp.async)."""
        return f"(nk_sbase + {self.base} + {self.offset(o)} * {self.item})"

    def group(self) -> int:
        """Registers per vector access: leading register bits that step one element in the buffer, up to
        16 bytes, with every other part of the offset a multiple of the group."""
        nb = log2(len(self.regs))
        rbase = [self.regs[1 << b] ^ self.regs[0] for b in range(nb)]
        g = 1
        while 2 * g * self.item <= 16 and log2(g) < nb and rbase[log2(g)] == g:
            g *= 2
        others = [*self.lane, *self.warp, *rbase[log2(g):], self.regs[0]]
        while g > 1 and any(o % g for o in others):
            g //= 2
        return g


def local_store(cg, op: ir.Op) -> None:
    buf, val = op.args
    acc = Access(cg, val.layout, buf, (0,) * len(val.type.shape))
    t = cexpr.ctype(val.type.dtype)
    vals = cg.regs(val)
    g = acc.group()
    stmts = []
    for i in range(0, len(vals), g):
        if g == 1:
            stmts.append(f"*{acc.ptr(t, acc.regs[i])} = {vals[i]};")
        else:
            fill = " ".join(f"u.e[{j}] = {vals[i + j]};" for j in range(g))
            stmts.append(f"{{ nk_pack<{t}, {g}> u; {fill} *(decltype(u.w)*){acc.ptr(t, acc.regs[i])} = u.w; }}")
    cg.emit_all(once(cg, val.layout, stmts), per_line=4)


def local_load(cg, op: ir.Op) -> None:
    buf, = op.args
    res = op.result
    acc = Access(cg, res.layout, buf, op.attrs["start"])
    name = cg.array(res)
    t = cexpr.ctype(res.type.dtype)
    if acc.item == 2 and ldmatrix(cg, acc, name, t):
        return
    g = acc.group()
    stmts = []
    for i in range(0, res.layout.nregs, g):
        if g == 1:
            stmts.append(f"{name}[{i}] = *{acc.ptr(t, acc.regs[i])};")
        else:
            unpack = " ".join(f"{name}[{i + j}] = u.e[{j}];" for j in range(g))
            stmts.append(f"{{ nk_pack<{t}, {g}> u; u.w = *(const decltype(u.w)*){acc.ptr(t, acc.regs[i])}; {unpack} }}")
    cg.emit_all(stmts, per_line=4)


def ldmatrix_plan(lane: tuple, regs: list[int], warp: tuple) -> tuple | None:
    """How ldmatrix can load registers at element offsets `regs` (constant parts) and lane/warp bases, or None.

    An 8x8 matrix of 16-bit elements is 8 rows of 16 bytes; lane L supplies the address of row L % 8 of
    matrix L / 8, and thread t receives (row t / 4, elements 2 (t % 4) + {0, 1}) of each matrix, or with
    .trans (rows 2 (t % 4) + {0, 1}, element t / 4). Returns (modifier, matrices per instruction, the
    offset basis of each bit of the address-supplying lane)."""
    nbits = log2(len(regs))
    if len(lane) != 5 or nbits < 1:
        return None
    rbase = [regs[1 << b] ^ regs[0] for b in range(nbits)]
    low = [b & 7 for b in [*rbase[1:], *warp, regs[0]]]
    if rbase[0] == 1 and lane[:2] == (2, 4) and not any(b & 7 for b in lane[2:]) and not any(low):
        trans, rows = "", list(lane[2:])  # a row's 8 elements are consecutive: plain ldmatrix
    elif lane[2:] == (1, 2, 4) and not any(b & 7 for b in (rbase[0], *lane[:2])) and not any(low):
        trans, rows = ".trans", [rbase[0], *lane[:2]]  # a thread's pair runs down a column
    else:
        return None
    matrices = min(4, len(regs) // 2)
    mbits = log2(matrices)
    return trans, matrices, tuple(rows + rbase[1:1 + mbits] + [0] * (2 - mbits))


def ldmatrix(cg, acc: Access, name: str, t: str) -> bool:
    """Emit ldmatrix for a local_load of 16-bit values (C type t) when ldmatrix_plan allows it; returns False (nothing
    emitted) otherwise."""
    plan = ldmatrix_plan(acc.lane, acc.regs, acc.warp)
    if plan is None:
        return False
    trans, matrices, address = plan
    count = {1: "x1", 2: "x2", 4: "x4"}[matrices]
    per_lane = cg.thread_var(address, acc.warp, f"ldmatrix{trans} row addresses")
    outs = ", ".join(f"%{j}" for j in range(matrices))
    for first in range(0, len(acc.regs), 2 * matrices):
        addr = f"(nk_sbase + {acc.base} + (({per_lane}) ^ {acc.regs[first]}) * 2)"
        d = [cg.fresh("m") for _ in range(matrices)]
        binds = ", ".join(f'"=r"({x})' for x in d)
        unpack = " ".join(f"{name}[{first + 2 * j + h}] = nk_bitcast<{t}>((unsigned short)({x}{shift}));"
                          for j, x in enumerate(d) for h, shift in enumerate(("", " >> 16")))
        cg.emit(f"{{ unsigned {', '.join(d)}; asm volatile(\"ldmatrix.sync.aligned.m8n8.{count}{trans}.shared.b16 "
                f"{{{outs}}}, [%{matrices}];\" : {binds} : \"r\"({addr})); {unpack} }}")
    return True


FALLBACK = 24  # elements a thread loads into registers at once where a group falls back to plain loads


def async_copy(cg, op: ir.Op) -> None:
    """cp.async of a pointer block into a buffer slot: one copy per group that is contiguous in both memories
    (16 bytes through L2 only, smaller ones through L1); masked-off groups are filled with zeros. A group
    the analysis cannot prove contiguous and aligned checks at run time and falls back to plain loads: those of
    several groups (FALLBACK elements) are issued before any of their stores, so that their latencies overlap
    (group by group, each waited for its 8 loads before the next group's: 12 waits a k-step at 64x128)."""
    buf, ptr, mask = op.args
    lay = ptr.layout
    acc = Access(cg, lay, buf, (0,) * len(ptr.type.shape))
    t = cexpr.ctype(ptr.type.dtype.elem)
    ptrs = cg.regs(ptr)
    masks = cg.regs(mask) if mask is not None else ["true"] * lay.nregs
    dim, g = vector(lay, acc.item)
    g = min(g, acc.group())
    nbytes = g * acc.item
    static = proven(ptr, mask, lay, dim, g, nbytes)
    groups = list(range(0, lay.nregs, g))
    copy = {i: f"nk_cp_async<{nbytes}>({acc.addr(acc.regs[i])}, {ptrs[i]}, {masks[i]});" for i in groups}
    if nbytes >= 4 and static:
        cg.emit_all(once(cg, lay, list(copy.values())), per_line=2)
        return
    owner = cg.owner(lay)
    both = lambda *conds: " && ".join(c for c in conds if c)  # noqa: E731
    per_batch = max(1, FALLBACK // g)
    for first in range(0, len(groups), per_batch):
        batch, stores = groups[first:first + per_batch], []
        for i in batch:
            vec, vals = cg.fresh("vec"), cg.fresh("ld")
            cond = vector_condition(ptrs[i:i + g], masks[i:i + g] if mask is not None else None, nbytes) \
                if nbytes >= 4 else "false"  # cp.async copies 4, 8 or 16 bytes
            fast = f"if ({both(owner, vec)}) {{ {copy[i]} }} " if nbytes >= 4 else ""
            loads = [f"{vals}[{j}] = ({both(owner, '!' + vec, masks[i + j])}) ? *{ptrs[i + j]} : nk_zero<{t}>();"
                     for j in range(g)]
            cg.emit(f"bool const {vec} = {cond}; {fast}{t} {vals}[{g}]; " + " ".join(loads))
            stores.append(f"if ({both(owner, '!' + vec)}) {{ "
                          + " ".join(f"*{acc.ptr(t, acc.regs[i + j])} = {vals}[{j}];" for j in range(g)) + " }")
        cg.emit_all(stores, per_line=2)


def once(cg, layout, stmts: list[str]) -> list[str]:
    """Writes of replicated data by one thread of those holding it: the others would write the same bytes to the
    same place, a race (benign, but compute-sanitizer's racecheck reports it) and wasted copies."""
    owner = cg.owner(layout)
    return [f"if ({owner}) {{ {s} }}" for s in stmts] if owner else stmts


def async_commit(cg, op: ir.Op) -> None:
    cg.emit('asm volatile("cp.async.commit_group;");')


def async_wait(cg, op: ir.Op) -> None:
    cg.emit(f'asm volatile("cp.async.wait_group {op.attrs["pending"]};" ::: "memory");')


# ---- TMA: bulk tensor copies into ring slots, each slot's copies counted by its mbarrier (passes.pipeline) ----------
def mbarrier(cg, bars: ir.Value, slot: ir.Value) -> str:
    return f"(nk_sbase + {buffer_base(cg, bars)} + {cg.scalar(slot)} * 8)"


def per_slot(cg, bars: ir.Value, ptx: str) -> str:
    """The PTX (with [%0] the barrier) once for each slot's barrier."""
    base = f"nk_sbase + {buffer_base(cg, bars)}"
    return " ".join(f'asm volatile("{ptx}" :: "r"({base} + {8 * s}));' for s in range(bars.type.numel))


def mbar_init(cg, op: ir.Op) -> None:
    """Thread 0 sets each slot's barrier to expect `count` arrivals (a full barrier: the thread that issues the
    copies; an empty one: each consumer warp); the fence shows them to the TMA unit, the CTA barrier to every thread."""
    init = per_slot(cg, op.args[0], f"mbarrier.init.shared::cta.b64 [%0], {op.attrs['count']};")
    cg.emit(f'if ({cg.issuer}) {{ {init} asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }}')
    cg.emit(cg.sync)


def mbar_inval(cg, op: ir.Op) -> None:
    """After the loop, once every thread has passed its last wait: the barriers are invalidated, so that their bytes
    may hold other data, or barriers made again (a loop inside another)."""
    cg.emit(cg.sync)
    cg.emit(f'if ({cg.issuer}) {{ {per_slot(cg, op.args[0], "mbarrier.inval.shared::cta.b64 [%0];")} }}')


def mbar_expect(cg, op: ir.Op) -> None:
    """The one arrival of a slot's phase, by the thread that issues its copies: the phase completes once they
    have written `bytes` (boxes out of bounds count in full, as zeros)."""
    bars, slot, valid = op.args
    cg.emit(f'if ({cg.issuer} && {cg.scalar(valid)}) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, '
            f'[%0], %1;" :: "r"({mbarrier(cg, bars, slot)}), "r"({op.attrs["bytes"]}) : "memory");')


def tensor_copies(cg, op: ir.Op, buf: ir.Value, row: ir.Value, col: ir.Value, outer: list, text: str,
                  extra: tuple = ()) -> list:
    """One cp.async.bulk.tensor per box of the tile. Its asm operands: %0 the map, %1 the box in shared memory, %2...
    its coordinates (the tile's (row, column) plus the box's, then the map's outer indices, innermost first), then
    the operands `extra`; `text` is the instruction, {rank}, {coords}, {next} (the operand after the coordinates) and
    {after} (the one after that) filled in."""
    rank, base = 2 + len(outer), f"nk_sbase + {buffer_base(cg, buf)}"
    text = text.format(rank=rank, coords=", ".join(f"%{k}" for k in range(2, 2 + rank)), next=2 + rank,
                       after=3 + rank)
    copies = []
    for r, c, a in op.attrs["boxes"]:
        coords = [f"{cg.scalar(col)} + {c}", f"{cg.scalar(row)} + {r}", *(cg.scalar(v) for v in outer)]
        operands = [f'"l"((unsigned long long)&nk_map{op.attrs["map"]})', f'"r"({base} + {a})',
                    *(f'"r"((int)({x}))' for x in coords), *extra]
        copies.append(f'asm volatile("{text}" :: {", ".join(operands)} : "memory");')
    return copies


def tma_load(cg, op: ir.Op) -> None:
    """The tile's boxes copied into its slot, completing on the slot's barrier; what lies out of bounds is written as
    zeros. Shared by a cluster (`cast`): box j is copied by the CTA of rank j % cast into the same slot of every CTA,
    completing on each one's barrier there."""
    view, bars, slot, valid, row, col, *outer = op.args
    cast = op.attrs.get("cast", 1)
    shared = cast > 1  # multicast: each box into every CTA's slot, under a mask of the CTAs
    text = ("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
            + ".multicast::cluster" * shared + " [%1], [%0, {{{coords}}}], [%{next}]" + ", %{after}" * shared + ";")
    extra = (f'"r"({mbarrier(cg, bars, slot)})',) + (f'"h"((unsigned short){(1 << cast) - 1})',) * shared
    copies = tensor_copies(cg, op, view, row, col, outer, text, extra)
    if shared:
        copies = ['unsigned nk_rank; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(nk_rank));',
                  *(f"if (nk_rank == {j % cast}) {c}" for j, c in enumerate(copies))]
    cg.emit(f"if ({cg.issuer} && {cg.scalar(valid)}) {{ {' '.join(copies)} }}")


def tma_store(cg, op: ir.Op) -> None:
    """Thread 0 copies the buffer's boxes out (TMA drops what lies out of bounds) and commits them as a bulk group,
    which reads shared memory until a `bulk_wait` (passes.smem places one before the bytes are written again)."""
    buf, row, col, *outer = op.args
    copies = tensor_copies(cg, op, buf, row, col, outer,
                           "cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group [%0, {{{coords}}}], [%1];")
    cg.emit(f'if ({cg.issuer}) {{ {" ".join(copies)} asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }}')


def bulk_wait(cg, op: ir.Op) -> None:
    """The issuing thread waits until its TMA stores but the `allow` newest have read shared memory (their global
    writes go on)."""
    cg.emit(f'if ({cg.issuer}) asm volatile("cp.async.bulk.wait_group.read {op.attrs["allow"]};" ::: "memory");')


def mbar_wait(cg, op: ir.Op) -> None:
    """Every thread (with a fourth operand, where it is true) waits until the slot's barrier completes the phase of
    this parity: its copies have landed, or (an empty barrier) its readers have released it."""
    bars, slot, phase, *valid = op.args
    wait = (f'asm volatile("{{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }}" '
            f':: "r"({mbarrier(cg, bars, slot)}), "r"({cg.scalar(phase)}) : "memory");')
    cg.emit(f"if ({cg.scalar(valid[0])}) {wait}" if valid else wait)


def mbar_arrive(cg, op: ir.Op) -> None:
    """Each warp's arrival on the slot's empty barrier, where the condition holds: its wgmma reading the slot has
    landed (a warpgroup-wide wait before this), so the producer may overwrite it; with `ctas`, on that barrier in
    every CTA of the cluster (their producers copy into this CTA's slot too). A release at CTA scope, as CUTLASS's
    cluster barriers arrive: at cluster scope it fenced the warp's every access (H200, the stdlib matmul in clusters
    of 2 at 4096^3: 443 TFLOP/s against 700)."""
    bars, slot, cond = op.args
    if "ctas" in op.attrs:
        arrive = " ".join(f'asm volatile("{{ .reg .b32 ra; mapa.shared::cluster.u32 ra, %0, {r}; mbarrier.arrive.'
                          f'shared::cluster.b64 _, [ra]; }}" :: "r"({mbarrier(cg, bars, slot)}) : "memory");'
                          for r in range(op.attrs["ctas"]))
    else:
        arrive = f'asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"({mbarrier(cg, bars, slot)}) ' \
            ': "memory");'
    cg.emit(f"__syncwarp(); if (nk_lane == 0 && {cg.scalar(cond)}) {{ {arrive} }}")


def cluster_sync(cg, op: ir.Op) -> None:
    """Every thread of the cluster that has not left waits for all the others; what each wrote before (barriers set,
    arrivals) is visible to all after."""
    cg.emit('asm volatile("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;" '
            '::: "memory");')
