"""Layout assignment: every block value gets a layout, and every operand the layout its op reads.

Anchors decide: loads and atomics take the coalesced default, `dot` takes tensor-core fragments (or
the CUDA-core layout), reductions the slice of their operand, a reshape keeps its operand's
registers, and elementwise ops on anchored values follow their first anchored operand. Index values
(splat, arange and arithmetic on them) and views are *free*: each consumer gets its own copy computed
in the layout it wants, instead of moving data. Where an anchored value meets a consumer that wants
another layout, a `convert` is inserted; passes.lower turns those that move data between threads into
shared memory.

Two phases: `Plan` decides layouts (loops are traced until their carried layouts settle), then
`Materialize` rewrites the IR once: operands are replaced by their copies or conversions.
"""
from __future__ import annotations

from .. import ir
from ..ir import facts
from ..layout import (Layout, axis_levels, blocked, contiguous_dim, log2, mma_acc, mma_operand, mma_warps, narrowed,
                      pair, remap, rename, slice_layout, swizzled, vector, wgmma_a, wgmma_acc, wgmma_descriptor,
                      wgmma_warps)
from ..types import FP8, bf16, f16, f32, f8e4m3, f8e5m2, i8, i32, u8

FREE = {"splat", "arange", "broadcast", "expand_dims", "trans"}  # reshape and elementwise: free if their operands are


def memory_vec(k: ir.Kernel) -> dict:
    """Elements per 16-byte group for each block shape, from the narrowest element it is loaded or stored as."""
    vec: dict = {}
    for op in ir.walk(k.body):
        if op.kind in ("load", "store", "atomic"):
            p = op.args[0]
            if p.type.shape:
                n = 16 // p.type.dtype.elem.itemsize
                vec[p.type.shape] = max(vec.get(p.type.shape, 1), n)
    return vec


def view_source_layout(op: ir.Op, layout: Layout) -> Layout:
    """The layout of a view's operand that puts each element where the view's consumer reads it: the
    same registers, so a view costs nothing."""
    src = op.args[0].type.shape
    if op.kind == "expand_dims":
        a = op.attrs["axis"]
        return remap(layout, src, lambda c: c[:a] + c[a + 1:])
    if op.kind == "broadcast":
        return remap(layout, src, lambda c: tuple(0 if s == 1 else ci for ci, s in zip(c, src)))
    if op.kind == "reshape":
        return Layout(src, layout.reg, layout.lane, layout.warp)
    if op.kind == "trans":
        perm = op.attrs["perm"]
        inv = [perm.index(d) for d in range(len(perm))]
        return remap(layout, src, lambda c: tuple(c[inv[d]] for d in range(len(perm))))
    raise AssertionError(op.kind)


# the tensor-core instruction of a dot, by operand and accumulator dtype: (elements per 32-bit register, PTX types).
# mma.sync takes fp8 as f16 (exact: codegen.mma converts each pair as it packs it); wgmma takes it as it is
MMA = {(f16, f32): (2, "f32.f16.f16.f32"), (bf16, f32): (2, "f32.bf16.bf16.f32"), (f32, f32): (1, "f32.tf32.tf32.f32"),
       (i8, i32): (4, "s32.s8.s8.s32"), (u8, i32): (4, "s32.u8.u8.s32"),
       (f8e4m3, f32): (2, "f32.f16.f16.f32"), (f8e5m2, f32): (2, "f32.f16.f16.f32")}
WGMMA = {f16: "f16", bf16: "bf16", f8e4m3: "e4m3", f8e5m2: "e5m2"}  # the operand types of wgmma, in PTX


def mma_shape(op: ir.Op, arch: str) -> tuple | None:
    """(kwidth, PTX types) when this dot runs on mma.sync: sm_80 or later, a supported dtype pair, an
    accumulator of at least 16x8 and K of at least one instruction step; None for the CUDA cores."""
    a, b, acc = op.args
    key = (a.type.dtype, acc.type.dtype)
    if key not in MMA or b.type.dtype != a.type.dtype or int(arch[3:5]) < 80:
        return None
    if a.type.dtype == f32 and op.attrs.get("precision") == "ieee":
        return None
    kwidth = MMA[key][0]
    (m, k), n = a.type.shape, b.type.shape[1]
    return MMA[key] if m >= 16 and n >= 8 and k >= 8 * kwidth else None


def wgmma_layouts(op: ir.Op, spec, a_inner: int, b_inner: int) -> tuple | None:
    """On sm_90a, f16/bf16/fp8 dots whose tiles fit the warpgroup MMA: both operands in swizzled shared tiles
    (stored along the way they were loaded; Plan.dot may read 16-bit A from registers instead), the accumulator in
    registers; None where wgmma cannot run it (then mma.sync does). A K step is 32 bytes of K; fp8 tiles must hold
    K contiguous (wgmma transposes 16-bit tiles only)."""
    a, b, acc = op.args
    (m, k), n = a.type.shape, b.type.shape[1]
    dt = a.type.dtype
    item = dt.itemsize if dt in WGMMA else 0
    warps = wgmma_warps((m, n), spec.num_warps)
    if (spec.arch != "sm_90a" or not item or b.type.dtype != dt or acc.type.dtype != f32 or k % (32 // item)
            or warps is None or (warps[1] > 1 and (n // warps[1]) % 64) or (m * k * item) % 1024
            or (k * n * item) % 1024 or (dt in FP8 and (a_inner, b_inner) != (1, 0))):
        return None
    sa, sb = swizzled((m, k), (a_inner, 1 - a_inner), item), swizzled((k, n), (b_inner, 1 - b_inner), item)
    if wgmma_descriptor(sa, item, (0, 0), (64, 32 // item), 1) is None or \
            wgmma_descriptor(sb, item, (0, 0), (32 // item, n // warps[1]), 0) is None:
        return None
    return sa, sb, wgmma_acc((m, n), warps), warps


def upstream(v: ir.Value, defs: dict):
    """The ops a value is computed from through elementwise ops, views and reductions (and the op that stops each
    path: a load, a dot, ...)."""
    stack, seen = [v], set()
    while stack:
        v = stack.pop()
        d = defs.get(id(v))
        if d is None or id(v) in seen:
            continue
        seen.add(id(v))
        yield d
        if d.kind in ir.ELEMENTWISE | ir.VIEWS | {"reduce"}:
            stack += [a for a in d.args if a is not None and a.type.shape]


def chained_dots(k: ir.Kernel, defs: dict) -> set:
    """The dots whose first operand is computed (through elementwise ops, views and reductions) from another
    dot's result, and those other dots."""
    out = set()
    for op in ir.walk(k.body):
        if op.kind == "dot":
            out |= {x for d in upstream(op.args[0], defs) if d.kind == "dot" for x in (id(op), id(d))}
    return out


def fma_acc(shape: tuple, num_warps: int, vec: int) -> Layout:
    """The CUDA-core accumulator: vec consecutive columns per thread, lanes 8 wide and 4 tall, warps down the
    rows, then registers alternating rows and columns, so that each thread's tile (the A rows and B columns
    it reads per k) stays square."""
    m, n = shape
    rows, cols = [1 << (log2(n) + b) for b in range(log2(m))], [1 << b for b in range(log2(n))]

    def take(first: list, second: list, count: int) -> list:
        return [(first or second or [0]).pop(0) if first or second else 0 for _ in range(count)]
    reg = take(cols, [], min(log2(vec), len(cols)))
    lane = take(cols, rows, 3) + take(rows, cols, 2)
    warp = take(rows, cols, log2(num_warps))
    while rows or cols:
        reg += take(rows if len(rows) >= len(cols) else cols, [], 1)
    return Layout(tuple(shape), tuple(reg), tuple(lane), tuple(warp))


def fma_layouts(k: ir.Kernel, op: ir.Op, vec: int) -> tuple:
    """CUDA-core dot: each thread's rows of A and columns of B with all of K in registers, so that every
    accumulator register is a chain of fused multiply-adds."""
    (m, kk), n = op.args[0].type.shape, op.args[1].type.shape[1]
    acc = fma_acc((m, n), k.spec.num_warps, vec)

    def lift(b: int) -> int:  # a flat index of [M, N] in the [M, K, N] block, at k = 0
        return ((b >> log2(n)) << (log2(kk) + log2(n))) | (b & (n - 1))
    l3 = Layout((m, kk, n), tuple(map(lift, acc.reg)) + tuple(1 << (log2(n) + j) for j in range(log2(kk))),
                tuple(map(lift, acc.lane)), tuple(map(lift, acc.warp)))
    a = remap(l3, (m, kk), lambda c: (c[0], c[1]))
    b = remap(l3, (kk, n), lambda c: (c[1], c[2]))
    a, b = (Layout(x.shape, tuple(r for r in x.reg if r), x.lane, x.warp) for x in (a, b))  # no copies in a thread
    return a, b, slice_layout(l3, 1)


class Plan:
    """Phase 1: the layout of every anchored block value, and of every block operand (`want`)."""

    def __init__(self, k: ir.Kernel):
        self.k = k
        self.vec = memory_vec(k)
        self.defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
        self.keep: dict = {}  # block shape -> the axes blocks of that shape are reduced along (`blocked`'s keep)
        reduced: dict = {}  # block shape -> the type of a block of it reduced
        for op in ir.walk(k.body):  # not a dot's results: those keep the dot's layout
            x = op.args[0] if op.kind == "reduce" else None
            if x is not None and x.type.shape and all(d.kind != "dot" for d in upstream(x, self.defs)):
                self.keep[x.type.shape] = self.keep.get(x.type.shape, frozenset()) | {op.attrs["axis"]}
                reduced[x.type.shape] = x.type
        # blocks reduced alike whose other dims agree (a row block and its tail) spread their lanes as the narrowest
        family = lambda s: (self.keep[s], tuple(n for d, n in enumerate(s) if d not in self.keep[s]))  # noqa: E731
        room = {s: sum(log2(s[d]) for d in self.keep[s]) - log2(self.vec_of(t)) for s, t in reduced.items()}
        self.spread = {s: min(room[t] for t in room if family(t) == family(s)) for s in room}
        self.want: dict[int, list] = {}  # id(op) -> the layout of each operand (None: scalar or absent)
        self.free_ids: dict[int, bool] = {}
        self.heavy: set = set()  # dot accumulator layouts: where two layouts meet, data stays in these
        self.made: dict = {}  # block shape -> the layout a reduction (of a kept shape) gave the first of that shape
        self.chained = chained_dots(k, self.defs)

    def default(self, t, order: tuple | None = None) -> Layout:
        """Blocks of a shape a reduction made before take its layout (a row op's loads of one value a row meet the
        rows' statistics where they are); else `blocked`."""
        if t.shape in self.made:
            return self.made[t.shape]
        return blocked(t.shape, self.k.spec.num_warps, self.vec_of(t), order, self.keep.get(t.shape, frozenset()),
                       self.spread.get(t.shape, 5))

    def vec_of(self, t) -> int:
        """Elements per thread group of a block: as it is loaded or stored, else 16 bytes of its own dtype."""
        return self.vec.get(t.shape) or 16 // max(1, t.dtype.itemsize)

    def coalesced(self, ptr: ir.Value) -> Layout:
        """The default layout of a memory access, its threads running along the pointer's most contiguous dim."""
        shape, f = ptr.type.shape, facts(ptr)
        order = sorted(range(len(shape)), key=lambda d: (-min(f.contig[d], shape[d]), -d))
        return self.default(ptr.type.with_dtype(ptr.type.dtype.elem), tuple(order))

    @staticmethod
    def proven(lay: Layout, ptr: ir.Value) -> Layout:
        """`lay`, an access's layout, with each thread's group no wider than the analysis proves contiguous and
        aligned (`narrowed`)."""
        f, item = facts(ptr), ptr.type.dtype.elem.itemsize
        d, g = vector(lay, item)
        group, width = log2(g), log2(min(f.contig[d], max(1, f.div[d] // item)))
        return narrowed(lay, d, group, width) if width < group else lay

    def free(self, v: ir.Value) -> bool:
        """Recomputed in each consumer's layout: index values and views."""
        if not v.type.shape:
            return False
        if id(v) not in self.free_ids:
            op = self.defs.get(id(v))
            kind = op.kind if op is not None else None
            self.free_ids[id(v)] = op is not None and (
                kind in FREE or (kind in ir.ELEMENTWISE | {"reshape"}
                                 and all(self.free(a) for a in op.args if a is not None and a.type.shape)))
        return self.free_ids[id(v)]

    def of(self, v: ir.Value) -> Layout:
        """The layout a block is read in: its own, or the default for a free value (or one not traced yet)."""
        return (None if self.free(v) else v.layout) or self.default(v.type)

    def viewed(self, x: ir.Value) -> Layout:
        """The layout a block is read in where a transpose of an anchored block costs nothing: its operand's
        registers, permuted (else `of`)."""
        d = self.defs.get(id(x))
        if self.free(x) and d.kind == "trans" and not self.free(d.args[0]):
            perm = d.attrs["perm"]
            return remap(self.of(d.args[0]), x.type.shape, lambda c: tuple(c[p] for p in perm))
        return self.of(x)

    def inner(self, x: ir.Value) -> int:
        """The dim along which x is consecutive where it is held: a transpose's from its operand's, so that one
        shared tile of the operand serves both the block and its transpose."""
        d = self.defs.get(id(x))
        if self.free(x) and d.kind == "trans" and not self.free(d.args[0]):
            return d.attrs["perm"].index(contiguous_dim(self.of(d.args[0])))
        return contiguous_dim(self.of(x))

    def region(self, r: ir.Region) -> None:
        for op in r.ops:
            self.op(op)

    def op(self, op: ir.Op) -> None:
        kind = op.kind
        if kind in ("for", "while"):
            return self.loop(op)
        if kind == "if":
            return self.branch(op)
        res = op.results[0] if op.results else None
        if kind == "reduce" and not res.type.shape:  # a full reduction reads a free operand in some layout too
            self.want[id(op)] = [self.of(op.args[0])]
        if kind == "store":
            ptr, val, _ = op.args
            if ptr.type.shape:
                lay = self.coalesced(ptr)
                if not self.free(val) and self.of(val) != lay:
                    # stored where it is, unless a large block would go out in narrow stores (a tensor-core
                    # accumulator's pairs): then it goes through shared memory to the coalesced layout, in groups
                    # no wider than proven aligned (a lane's group stored element by element spreads each of a
                    # warp's stores over 16 sectors, where lanes on consecutive elements fill 2)
                    item = val.type.dtype.itemsize
                    own = vector(self.of(val), item)[1] * item
                    large = val.type.numel * item >= 16 * 32 * self.k.spec.num_warps
                    narrow = large and own < min(8, vector(lay, item)[1] * item)
                    lay = self.proven(lay, ptr) if narrow else self.of(val)
                self.want[id(op)] = [lay] * 3
            return
        if kind == "assert":  # checked where its condition is
            self.want[id(op)] = [self.of(op.args[0]) if a is not None and a.type.shape else None for a in op.args]
            return
        if res is None or not res.type.shape or self.free(res):
            return
        if kind in ("load", "atomic"):
            res.layout = self.coalesced(op.args[0])
            self.want[id(op)] = [res.layout] * len(op.args)
        elif kind == "reduce":
            src = self.of(op.args[0])
            lay = slice_layout(src, op.attrs["axis"])
            res.layout = Layout(res.type.shape, lay.reg, lay.lane, lay.warp)  # keep_dims: a size-1 dim, no bits
            self.want[id(op)] = [src]
            if op.args[0].type.shape in self.keep:
                self.made.setdefault(res.type.shape, res.layout)
        elif kind == "reshape":  # of an anchored value: row-major flat indices are unchanged, so are the registers
            src = op.args[0].layout
            res.layout = Layout(res.type.shape, src.reg, src.lane, src.warp)
            self.want[id(op)] = [src]
        elif kind == "dot":
            self.dot(op)
        elif kind in MOVES:
            MOVES[kind](self, op)
        elif kind in ir.ELEMENTWISE or kind == "asm":  # asm is never free: it runs once, where it is written
            mine = [a.layout for a in op.args if a is not None and a.type.shape and not self.free(a) and a.layout]
            res.layout = next((x for x in mine if x in self.heavy), mine[0] if mine else self.default(res.type))
            self.want[id(op)] = [res.layout if a is not None and a.type.shape else None for a in op.args]

    def dot(self, op: ir.Op) -> None:
        (m, _), n = op.args[0].type.shape, op.args[1].type.shape[1]
        mma = mma_shape(op, self.k.spec.arch)
        nw = self.k.spec.num_warps
        inner = [self.inner(x) for x in op.args[:2]]
        wg = wgmma_layouts(op, self.k.spec, *inner) if mma is not None else None
        if wg is not None:
            a, b, acc, warps = wg
            # A from registers where its registers already are the fragment (a dot's result, elementwise on it): no
            # store, fence and barrier. Else the tensor cores read a shared tile (a loaded A goes there anyway)
            ra, dt = wgmma_a(op.args[0].type.shape, warps), op.args[0].type.dtype
            if dt.itemsize == 2 and not self.free(op.args[0]) and rename(self.of(op.args[0]), ra) is not None:
                a = ra
            op.attrs.update(wgmma=warps, types=f"f32.{WGMMA[dt]}.{WGMMA[dt]}")
        elif mma is not None:
            kwidth, types = mma
            # a dot feeding another (attention's S = Q K^T, then P V) splits rows only: P's registers then are
            # the next dot's operand as they are, and row statistics stay inside each warp
            warps = (min(nw, m // 16), 1) if id(op) in self.chained else mma_warps(m, n, nw)
            a = mma_operand(0, op.args[0].type.shape, warps, nw, kwidth)
            b = mma_operand(1, op.args[1].type.shape, warps, nw, kwidth)
            acc = mma_acc((m, n), warps, nw)
            op.attrs.update(mma=f"m16n8k{8 * kwidth}", types=types)
        else:
            a, b, acc = fma_layouts(self.k, op, self.vec.get((m, n)) or 4)
        op.result.layout = acc
        self.heavy.add(acc)
        self.want[id(op)] = [a, b, acc]

    def loop(self, op: ir.Op) -> None:
        body = op.regions[0]
        inits, carried = ir.carried(op)
        for p, init in zip(carried, inits):
            if p.type.shape:
                p.layout = None if self.free(init) else init.layout  # a free start takes the body's layout
        for _ in range(3):  # trace until every carried value has the layout its body gives it
            self.region(body)
            changed = False
            for p, y in zip(carried, body.ops[-1].args):
                if p.type.shape:
                    lay = (None if self.free(y) else y.layout) or p.layout or self.default(p.type)
                    if lay != p.layout:
                        p.layout, changed = lay, True
            if not changed:
                break
        for p, r in zip(carried, op.results):
            r.layout = p.layout
        self.want[id(op)] = [None] * (len(op.args) - len(inits)) + [p.layout for p in carried]
        self.want[id(body.ops[-1])] = [p.layout for p in carried]

    def branch(self, op: ir.Op) -> None:
        for sub in op.regions:
            self.region(sub)
        for i, v in enumerate(op.results):
            if v.type.shape:
                ys = [sub.ops[-1].args[i] for sub in op.regions]
                v.layout = next((y.layout for y in ys if not self.free(y)), None) or self.default(v.type)
        for sub in op.regions:
            self.want[id(sub.ops[-1])] = [v.layout for v in op.results]


# ---- scans and data movement: the result's layout, and the layout each operand is read in ----------------
def plan_scan(plan: Plan, op: ir.Op) -> None:
    """In the operand's layout when each bit along the axis is one register, lane or warp bit."""
    lay = plan.of(op.args[0])
    lay = lay if axis_levels(lay, op.attrs["axis"]) is not None else plan.default(op.args[0].type)
    for r in op.results:
        r.layout = lay
    plan.want[id(op)] = [lay] * len(op.args)


def plan_split(plan: Plan, op: ir.Op) -> None:
    """Read with the minor dim of 2 in a register, so that each half is a selection of registers."""
    lay, last = plan.viewed(op.args[0]), len(op.args[0].type.shape) - 1
    lay = lay if 1 in lay.reg else pair(slice_layout(lay, last))
    for r in op.results:
        r.layout = slice_layout(lay, last)
    plan.want[id(op)] = [lay]


def plan_join(plan: Plan, op: ir.Op) -> None:
    a, b = op.args
    lay = plan.of(b if plan.free(a) and not plan.free(b) else a)
    op.result.layout = pair(lay)
    plan.want[id(op)] = [lay, lay]


def plan_exchange(plan: Plan, op: ir.Op) -> None:
    op.result.layout = plan.of(op.args[0])
    plan.want[id(op)] = [op.result.layout]


def plan_gather(plan: Plan, op: ir.Op) -> None:
    """Where the index is; the source anywhere (it goes through shared memory)."""
    op.result.layout = plan.of(op.args[1])
    plan.want[id(op)] = [plan.of(op.args[0]), op.result.layout]


def plan_histogram(plan: Plan, op: ir.Op) -> None:
    lay = plan.of(op.args[0])
    op.result.layout = plan.default(op.result.type)
    plan.want[id(op)] = [lay, lay]


MOVES = {"scan": plan_scan, "split": plan_split, "join": plan_join, "exchange": plan_exchange, "gather": plan_gather,
         "histogram": plan_histogram}


class Materialize:
    """Phase 2: replace each block operand by a value in the layout its op wants: a copy of a free value,
    computed just before its first consumer in each scope, or a `convert`, placed where the value is defined
    (a conversion of a value from outside a loop happens once, not every iteration)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.frames: list[list] = []  # per open region: [cache of (value, layout) -> value, its ops so far]
        self.home: dict[int, int] = {}  # id(value) -> the frame it is defined in

    def region(self, r: ir.Region) -> None:
        out: list[ir.Op] = []
        self.frames.append([{}, out])
        depth = len(self.frames) - 1
        self.home.update((id(p), depth) for p in r.params)
        for op in r.ops:
            if op.results and self.plan.free(op.results[0]):
                continue  # each consumer computes its own copy
            for i, lay in enumerate(self.plan.want.get(id(op), ())):
                if lay is not None and op.args[i] is not None:
                    op.args[i] = self.get(op.args[i], lay, op.span)
            out.append(op)
            self.home.update((id(v), depth) for v in op.results)
            for sub in op.regions:
                self.region(sub)
        self.frames.pop()
        r.ops = out

    def get(self, v: ir.Value, lay: Layout, span) -> ir.Value:
        key = (id(v), lay)
        for cache, _ in reversed(self.frames):
            if key in cache:
                return cache[key]
        if self.plan.free(v) and not lay.shared:
            d = self.plan.defs[id(v)]
            args = [self.get(a, view_source_layout(d, lay) if d.kind in ir.VIEWS else lay, d.span)
                    if a is not None and a.type.shape else a for a in d.args]
            res = ir.Value(v.type, v.name, lay, v.facts)
            return self.place(ir.Op(d.kind, args, [res], dict(d.attrs), d.span), key, len(self.frames) - 1)
        d = self.plan.defs.get(id(v))
        if lay.shared and self.plan.free(v) and d.kind == "trans":  # a view of its operand's tile, not another
            src = self.get(d.args[0], view_source_layout(d, lay), span)
            return self.place(ir.Op("trans", [src], [ir.Value(v.type, v.name, lay)], dict(d.attrs), d.span), key,
                              self.home.get(id(src), 0))
        # stored to shared memory from the registers it is computed in, or moved to other registers
        src = self.get(v, self.plan.of(v), span) if lay.shared else v
        if src.layout == lay:
            return src
        return self.place(ir.Op("convert", [src], [ir.Value(v.type, v.name, lay)], {}, span), key,
                          self.home.get(id(src), 0))

    def place(self, op: ir.Op, key, depth: int) -> ir.Value:
        """Put op at the end of frame `depth`'s ops so far (before the loop or branch now open there)."""
        cache, out = self.frames[depth]
        out.insert(len(out) - (depth < len(self.frames) - 1), op)
        self.home[id(op.result)] = depth
        cache[key] = op.result
        return op.result


def assign_layouts(k: ir.Kernel) -> ir.Kernel:
    plan = Plan(k)
    plan.region(k.body)
    Materialize(plan).region(k.body)
    return k
