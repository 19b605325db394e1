"""Feeding `dot`: a software pipeline of cp.async copies (`pipeline`) and K steps interleaved with the
shared-memory reads that feed them (`split_dots`).

pipeline: in a runtime `for` loop, a tile that is loaded and stored to shared memory (a conversion
passes.lower made for a dot operand) becomes an asynchronous copy into a ring of `num_stages` slots.
The prologue issues the first num_stages - 1 iterations' copies; iteration i waits for its own copy,
passes one barrier (everyone's copies have landed, and everyone is done reading the slot that the
next copy overwrites), issues the copy of iteration i + num_stages - 1 and computes on slot i. The
address of a later iteration is the same ops with the loop variable advanced, so the tile's address
and mask may depend on the loop variable and on values from outside the loop, nothing else.

split_dots: a dot whose operands are read from shared memory is cut into instruction-sized K steps,
each step's reads issued one step ahead of its math, so that the fragments in registers stay small
and the loads of step k + 1 overlap the tensor-core work of step k.
"""
from __future__ import annotations

from .. import ir
from ..layout import remap, restrict, tma_boxes
from ..types import Type, bool_, i32, u64
from .axisinfo import analyze_axes
from .dead import drop_dead
from .lower import alloc

PURE = ir.ELEMENTWISE | ir.VIEWS | {"arange", "const", "convert", "slot"}
UNBOUNDED = 2**31 - 1  # the size of an unmasked axis in a tensor map: no start below 2^31 reaches it
LOW = {"const", "program_id", "num_programs", "add", "sub", "mul", "floordiv", "mod", "minimum", "maximum", "where"}


class Pipeliner:
    def __init__(self, k: ir.Kernel):
        self.k = k
        self.stages = k.spec.num_stages
        self.defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
        self.loops = {id(op.regions[0].params[0]): op for op in ir.walk(k.body) if op.kind == "for"}

    def depends_only_on(self, v: ir.Value, free: set, inside: set) -> bool:
        """v is computed by pure ops from values in `free` (the loop variable, inductions) and values from outside
        the loop (`inside` holds the loop's own values, its carried values included)."""
        if v is None or id(v) in free or id(v) not in inside:
            return True
        op = self.defs.get(id(v))
        return op is not None and op.kind in PURE and all(self.depends_only_on(a, free, inside) for a in op.args)

    @staticmethod
    def inside(body: ir.Region) -> set:
        return {id(v) for op in body.ops for v in op.results} | {id(p) for p in body.params}

    def clone(self, v, memo: dict, inside: set, out: list):
        """v with the loop's values replaced as `memo` says (the loop variable and inductions of a later iteration):
        the ops between them copied into `out`."""
        if v is None or (id(v) not in memo and id(v) not in inside):
            return v
        if id(v) not in memo:
            op = self.defs[id(v)]
            args = [self.clone(a, memo, inside, out) for a in op.args]
            res = ir.Value(v.type, v.name, v.layout, v.facts)
            out.append(ir.Op(op.kind, args, [res], dict(op.attrs), op.span))
            memo[id(v)] = res
        return memo[id(v)]

    def scalar(self, out: list, kind: str, args: list, dtype, span, **attrs) -> ir.Value:
        res = ir.Value(Type((), dtype))
        out.append(ir.Op(kind, args, [res], attrs, span))
        return res

    def const(self, out: list, value, dtype, span) -> ir.Value:
        return self.scalar(out, "const", [], dtype, span, value=value)

    def inductions(self, loop: ir.Op, inside: set) -> list:
        """Carried values that step by the same amount every iteration (p = p + d, d computed from values outside the
        loop, as advance() and `ptrs += BK * stride` do): (param, start, kind, d)."""
        body = loop.regions[0]
        found = []
        for p, start, nxt in zip(body.params[1:], loop.args[3:], body.ops[-1].args):
            op = self.defs.get(id(nxt))
            if op is not None and op.kind in ("add", "ptradd") and p in op.args:
                d = op.args[1] if op.args[0] is p else op.args[0]
                if d is not p and (op.kind == "add" or op.args[0] is p) and self.depends_only_on(d, set(), inside):
                    found.append((p, start, op.kind, d))
        return found

    def later(self, out: list, memo: dict, inside: set, inductions: list, bases: list, times: int, span) -> None:
        """Each induction `times` iterations on from its base (base + times * d), into memo."""
        for (p, _, kind, d), base in zip(inductions, bases):
            if times == 0:
                memo[id(p)] = base
                continue
            d = self.clone(d, memo, inside, out)
            k = self.const(out, times, d.type.dtype, span)
            if d.type.shape:  # a block of steps: the constant in its layout
                k = self.value(out, "splat", [k], d.type, d.layout, span)
            memo[id(p)] = self.value(out, kind, [base, self.value(out, "mul", [k, d], d.type, d.layout, span)],
                                     p.type, p.layout, span)

    def value(self, out: list, kind: str, args: list, t: Type, layout, span) -> ir.Value:
        res = ir.Value(t, "", layout)
        out.append(ir.Op(kind, args, [res], {}, span))
        return res

    def region(self, r: ir.Region) -> None:
        for op in list(r.ops):
            for sub in op.regions:
                self.region(sub)
            if op.kind == "for":
                self.loop(r, op)

    def ref(self, v) -> tuple | None:
        """A kernel parameter as ("arg", its index), a constant as ("const", its value); None for a computed value."""
        at = next((i for i, p in enumerate(self.k.params) if p is v), None)
        op = self.defs.get(id(v))
        return ("const", v) if type(v) is int else ("arg", at) if at is not None else \
            ("const", op.attrs["value"]) if op is not None and op.kind == "const" else None

    def tma(self, store: ir.Op, load: ir.Op, inside: set, checks: list, runs: ir.Value) -> dict | None:
        """The attrs of a TMA copy for a descriptor load, or a pointer load that reads as one (`tile`): sm_90, 2-D,
        zero padding; its base, shape and row stride parameters or constants, the sizes and stride above 0 and the base
        and every row 16-byte aligned by the specialization, the ring's layout one that TMA writes. Its tensor map is
        added to the kernel's, and to `checks` the run-time checks of starts not proven at or above 0, for a loop that
        `runs` (a start the loop computes must be proven); None keeps the cp.async copy."""
        desc, unproven = (load.attrs["desc"], []) if "desc" in load.attrs else \
            self.tile(load.args[0], load.args[1], load.result.type.shape) or (None, [])
        if desc is None or any(not isinstance(v, ir.Value) or id(v) in inside for v in unproven):
            return None
        plan = self.tensor_map(desc, store.args[0].layout, store.args[0].type.dtype.elem.itemsize)
        if plan is None:
            return None
        load.attrs["desc"] = desc  # the copies of later iterations read its starts
        self.check_starts(checks, unproven, runs, "reads", load.span)
        return plan

    def check_starts(self, out: list, starts: list, runs: ir.Value | None, what: str, span) -> None:
        """Traps where a start TMA takes is below 0 (where its bounds check and the mask would disagree), unless
        `runs` is false (a loop that does not run)."""
        for v in starts:
            ok = self.scalar(out, "ge", [v, self.const(out, 0, v.type.dtype, span)], bool_, span)
            if runs is not None:
                ok = self.scalar(out, "or", [ok, self.scalar(out, "not", [runs], bool_, span)], bool_, span)
            msg = f"a tile that TMA {what} starts below 0: add `index >= 0` to the mask"
            out.append(ir.Op("assert", [ok, None], [], {"msg": msg, "trap": True}, span))

    def tensor_map(self, desc: tuple, lay, item: int) -> dict | None:
        """The tensor map through which TMA copies a descriptor's tile between global memory and a shared tile of
        layout `lay`, added to the kernel's, and the boxes of the copy; None where TMA cannot: before sm_90, where
        the base, shape and row stride are not parameters or constants, the sizes and stride above 0 and the base
        and every row 16-byte aligned by the specialization, or where no swizzle mode matches the layout."""
        base, shape, strides, _, outer, flipped = desc
        if flipped:  # TMA writes memory's rows: the tile's columns
            lay = remap(lay, lay.shape[::-1], lambda c: c[::-1])
        boxes = tma_boxes(lay, item) if len(shape) == 2 and self.k.spec.arch.startswith("sm_90") else None
        refs = [self.ref(v) for v in (base, *shape, strides[0], *(st for _, st in outer))]

        def positive(r: tuple) -> bool:
            return self.k.params[r[1]].name in self.k.spec.positive if r[0] == "arg" else r[1] > 0
        if boxes is None or None in refs or refs[0][0] != "arg" or not self.aligned(refs[0], 1) \
                or not all(self.aligned(r, item) for r in refs[3:]) or not all(map(positive, refs[1:])):
            return None
        mode, (height, width), at = boxes
        tmap = {"itemsize": item, "base": refs[0][1],  # innermost first, as JSON reads it
                "dims": [list(refs[2]), list(refs[1])] + [["const", UNBOUNDED]] * len(outer),
                "strides": [list(r) for r in refs[3:]], "box": [width, height] + [1] * len(outer), "swizzle": mode}
        if tmap not in self.k.tmaps:  # loops over the same tensor (a masked and an unmasked one) share its map
            self.k.tmaps.append(tmap)
        return {"map": self.k.tmaps.index(tmap), "boxes": at}

    def aligned(self, r: tuple, unit: int) -> bool:
        """A parameter or constant proven a multiple of 16 bytes, counted in units of `unit` bytes."""
        if r[0] == "const":
            return r[1] * unit % 16 == 0
        name = self.k.params[r[1]].name
        return name in self.k.spec.aligned or name in self.k.spec.eights and 8 * unit % 16 == 0

    def stores(self, r: ir.Region) -> bool:
        """On sm_90, a store of an epilogue's staged tile (`staged`) becomes a TMA store of that buffer (`tma_store`):
        thread 0 copies its boxes out and waits until they have read shared memory; the writes to global memory go on
        behind. The read-back and the masked stores go. Starts not proven at or above 0 are checked at run time
        (`check_starts`). Whether any store changed."""
        changed = False
        out: list[ir.Op] = []
        for op in r.ops:
            for sub in op.regions:
                changed |= self.stores(sub)
            found = self.staged(op)
            plan = self.tensor_map(found[1], found[0].layout, found[0].type.dtype.elem.itemsize) if found else None
            if plan is None:
                out.append(op)
                continue
            buf, (_, _, _, starts, outer, _), unproven = found
            self.check_starts(out, unproven, None, "writes", op.span)
            at = [v if isinstance(v, ir.Value) else self.const(out, v, i32, op.span)
                  for v in (*starts, *(i for i, _ in outer))]
            out.append(ir.Op("tma_store", [buf, *at], [], plan, op.span))
            changed = True
        r.ops = out
        return changed

    def staged(self, op: ir.Op) -> tuple | None:
        """A global store of a tile read back whole from a conversion's buffer (not a ring) of its dtype, whose
        pointers and mask read as a descriptor's (`tile`) and whose rows TMA may store (`whole_chunks`): (the buffer,
        the descriptor, the starts to check), or None."""
        src = self.defs.get(id(op.args[1])) if op.kind == "store" and op.args[1].type.shape else None
        if src is None or src.kind != "local_load" or any(src.attrs["start"]):
            return None
        buf = src.args[0]
        root = self.defs.get(id(buf))
        if root is None or root.kind != "alloc" or root.attrs.get("ring") or src.result.type.shape != buf.type.shape \
                or buf.type.dtype.elem != op.args[0].type.dtype.elem:
            return None
        found = self.tile(op.args[0], op.args[2], buf.type.shape)
        if found is None or not all(isinstance(v, ir.Value) for v in found[1]) or not self.whole_chunks(found[0], buf):
            return None
        return buf, *found

    def whole_chunks(self, desc: tuple, buf: ir.Value) -> bool:
        """TMA stores whole 16-byte chunks of a row, past the map's inner size up to the next chunk's end (Triton
        #11583): a masked row's extent must be proven a multiple of 16 bytes, or the store would write past it."""
        inner = desc[1][1]
        ref = self.ref(inner)
        return isinstance(inner, int) and inner == UNBOUNDED or \
            ref is not None and self.aligned(ref, buf.type.dtype.elem.itemsize)

    def uniform(self, v) -> bool:
        """v is the same in every CTA of a cluster (clusters span grid x, num_ctas apart): parameters, constants,
        the grid's size, program ids but along x, program_id(0) // c for c a multiple of num_ctas, loop variables of
        loops whose bounds are so, and pure arithmetic on such values."""
        if v is None or type(v) is int or v in self.k.params:
            return True
        if id(v) in self.loops:
            return all(map(self.uniform, self.loops[id(v)].args[:3]))
        op = self.defs.get(id(v))
        if op is None or op.kind not in PURE | {"program_id", "num_programs"} or v.type.shape:
            return False
        if op.kind == "program_id":
            return op.attrs["axis"] != 0 or self.k.spec.num_ctas == 1
        if op.kind == "floordiv":
            pid, c = (self.defs.get(id(a)) for a in op.args)
            if pid is not None and pid.kind == "program_id" and c is not None and c.kind == "const" \
                    and c.attrs["value"] % self.k.spec.num_ctas == 0:
                return True
        return all(map(self.uniform, op.args))

    def low(self, v) -> int | None:
        """A lower bound of an integer scalar (parameters are above 0 where the specialization says so, a loop variable
        starts at its first value when the step is positive), or None."""
        if type(v) is int or v is None:
            return v
        if v in self.k.params:
            return 1 if v.name in self.k.spec.positive else None
        if id(v) in self.loops:
            lo, _, step = self.loops[id(v)].args[:3]
            return self.low(lo) if (self.low(step) or 0) > 0 else None
        op = self.defs.get(id(v))
        if op is None or op.kind not in LOW:
            return None
        if op.kind == "const":
            return op.attrs["value"]
        if op.kind in ("program_id", "num_programs"):
            return 0 if op.kind == "program_id" else 1
        if op.kind == "where":  # either value
            a, b = (self.low(x) for x in op.args[1:])
            return None if a is None or b is None else min(a, b)
        a, b = (self.low(x) for x in (op.args + [None])[:2])
        if op.kind == "sub":  # less a constant
            c = self.defs.get(id(op.args[1]))
            return a - c.attrs["value"] if a is not None and c is not None and c.kind == "const" else None
        if op.kind == "maximum":
            return max(x for x in (a, b) if x is not None) if (a, b) != (None, None) else None
        if a is None or (b is None and op.kind != "mod") or a < 0:
            return None
        c = self.defs.get(id(op.args[1]))  # a constant divisor gives a bound above 0
        return {"add": lambda: a + b, "mul": lambda: a * b if b >= 0 else None, "minimum": lambda: min(a, b),
                "mod": lambda: 0,  # C's %: the sign of the dividend
                "floordiv": lambda: (a // c.attrs["value"] if c is not None and c.kind == "const" else 0) if b > 0
                else None}[op.kind]()

    def tile(self, ptr: ir.Value, mask: ir.Value | None, shape: tuple) -> tuple | None:
        """A 2-D pointer load (or store) of `shape` read as a descriptor, (base, shape, strides, starts, outer,
        flipped), and the starts to check at run time: pointers base + (r0 + arange) * s + (c0 + arange) (s a parameter
        or constant, the column step 1), masked by `r < M` and `c < N` (M, N parameters or constants) or not at all on
        an axis (a size TMA never reaches), are what TMA's bounds check reads, given starts at or above 0: proven
        (`low`), or bounded by `r >= 0` in the mask too, or else to be checked. The unit step may be along the tile's
        rows (`flipped`: memory's rows are the tile's columns, a transposed operand). A base of parameter + index *
        stride terms (a program's batch and head) gives the map `outer` dimensions, (index, stride) each, that no mask
        bounds. None if the load is not such a tile."""
        found = self.pointer(ptr) if len(shape) == 2 else None
        bounds = ([] if mask is None else self.bounds(mask)) if found else None
        root = self.root(found[0]) if bounds is not None else None
        if root is None:
            return None
        axes = [[t for t in found[1] if t[0] == d] for d in range(2)]
        if [len(a) for a in axes] != [1, 1]:
            return None
        ats = (axes[0][0][1], axes[1][0][1])
        flipped = self.unit(axes[0][0][2]) and not self.unit(axes[1][0][2])
        (_, rows, s), (_, cols, unit) = (axes[1][0], axes[0][0]) if flipped else (axes[0][0], axes[1][0])
        if not self.unit(unit) or any(x != ats[axis] for _, axis, _, x in bounds) or \
                len({(kind, axis) for kind, axis, *_ in bounds}) != len(bounds) or (ats[0][1], ats[1][1]) != shape:
            return None
        # an unmasked axis reaches no further than its tile: as far as that when the tile starts at a constant
        dims = [next((b for kind, axis, b, _ in bounds if kind == "lt" and axis == d),
                     at[0] + at[1] if type(at[0]) is int else UNBOUNDED) for d, at in enumerate(ats)]
        unproven = [at[0] for d, at in enumerate(ats) if ("ge", d) not in {(kind, axis) for kind, axis, *_ in bounds}
                    and (self.low(at[0]) is None or self.low(at[0]) < 0)]
        unproven += [i for i, _ in root[1] if self.low(i) is None or self.low(i) < 0]
        return (root[0], dims[::-1] if flipped else dims, (1 if s is None else s, 1), (rows[0], cols[0]), root[1],
                flipped), unproven

    def unit(self, v) -> bool:
        """A step of 1: none (a bare arange), or a value known to be 1."""
        return v is None or (v.facts is not None and v.facts.value == 1) or self.ref(v) == ("const", 1)

    def root(self, v) -> tuple | None:
        """A scalar pointer as a parameter plus index * stride terms: (the parameter, [(index, stride)])."""
        op = self.defs.get(id(v))
        if op is None or op.kind != "ptradd":
            return v, []
        inner, terms = self.root(op.args[0]), self.products(op.args[1])
        return (inner[0], inner[1] + terms) if inner is not None and terms is not None else None

    def products(self, v) -> list | None:
        """A scalar offset as a sum of index * stride (the stride a parameter or constant), or None."""
        op = self.defs.get(id(v))
        if op is not None and op.kind == "add":
            a, b = (self.products(x) for x in op.args)
            return a + b if a is not None and b is not None else None
        if op is not None and op.kind == "mul":
            x, y = op.args
            return [(x, y)] if self.ref(y) is not None else [(y, x)] if self.ref(x) is not None else None
        return None

    def pointer(self, v) -> tuple | None:
        """base + offsets, as (the base scalar, [(axis, (start, length), stride or None)])."""
        op = self.defs.get(id(v))
        if op is None:
            return None
        if op.kind == "splat" and not op.args[0].type.shape:
            return op.args[0], []
        if op.kind == "broadcast":
            return self.pointer(op.args[0])
        if op.kind == "ptradd":
            inner, terms = self.pointer(op.args[0]), self.terms(op.args[1])
            return (inner[0], inner[1] + terms) if inner and terms is not None else None
        return None

    def terms(self, v) -> list | None:
        """An offset block as a sum of (axis, (start, length), stride or None): index vectors start + arange along
        one axis, each times a scalar."""
        op = self.defs.get(id(v))
        if op is None:
            return None
        if op.kind == "broadcast":
            return self.terms(op.args[0])
        if op.kind == "add":
            a, b = self.terms(op.args[0]), self.terms(op.args[1])
            return a + b if a is not None and b is not None else None
        if op.kind == "mul":
            for x, y in (op.args, op.args[::-1]):
                sc = self.defs.get(id(y))
                t = self.terms(x)
                if sc is not None and sc.kind == "splat" and t is not None and len(t) == 1 and t[0][2] is None:
                    return [(*t[0][:2], sc.args[0])]
            return None
        if op.kind == "expand_dims" and len(op.args[0].type.shape) == 1 and len(op.result.type.shape) == 2:
            at = self.index(op.args[0])
            return [(1 - op.attrs["axis"], at, None)] if at else None
        return None

    def index(self, v) -> tuple | None:
        """(start, length) of start + arange(0, length), start a scalar value or an int."""
        op = self.defs.get(id(v))
        if op is not None and op.kind == "arange":
            return op.attrs["start"], op.attrs["end"] - op.attrs["start"]
        if op is not None and op.kind == "add":
            for x, y in (op.args, op.args[::-1]):
                sc, ar = self.defs.get(id(x)), self.defs.get(id(y))
                if sc is not None and sc.kind == "splat" and ar is not None and ar.kind == "arange" \
                        and ar.attrs["start"] == 0:
                    return sc.args[0], ar.attrs["end"]
        return None

    def bounds(self, m) -> list | None:
        """A mask as a conjunction of ("lt", axis, bound, (start, length)) and ("ge", axis, 0, ...) terms."""
        op = self.defs.get(id(m))
        if op is None:
            return None
        if op.kind in ("and", "broadcast"):
            parts = [self.bounds(a) for a in op.args]
            return sum(parts, []) if None not in parts else None
        if op.kind in ("lt", "ge"):
            t, lim = self.terms(op.args[0]), self.defs.get(id(op.args[1]))
            if t is None or len(t) != 1 or t[0][2] is not None or lim is None or lim.kind != "splat":
                return None
            bound = lim.args[0]
            if op.kind == "ge" and self.ref(bound) != ("const", 0):
                return None
            return [(op.kind, t[0][0], bound, t[0][1])]
        return None

    def candidates(self, body: ir.Region, free: set) -> list:
        inside = self.inside(body)
        readers = {}
        for op in ir.walk(body):
            for a in op.args:
                if a is not None:
                    readers.setdefault(id(a), []).append(op)
        found = []
        for op in body.ops:
            if op.kind != "local_store":
                continue
            buf, val = op.args[0], op.args[1]
            load = self.defs.get(id(val))
            if (load is None or load.kind != "load" or id(val) not in inside or len(readers[id(val)]) != 1
                    or not (load.args[2] is None or ir.is_zero(load.args[2], self.defs)) or id(buf) not in inside):
                continue
            reads = [u for u in readers[id(buf)] if u is not op]

            def direct(u: ir.Op) -> bool:  # read by ldmatrix or the tensor cores, or a transposed view so read
                return u.kind == "local_load" or "wgmma" in u.attrs or \
                    (u.kind == "trans" and all(map(direct, readers.get(id(u.result), []))))
            if not all(map(direct, reads)):
                continue
            if all(self.depends_only_on(a, free, inside) for a in load.args[:2]):
                found.append((op, load, reads))
        return found

    def loop(self, parent: ir.Region, loop: ir.Op) -> None:
        body = loop.regions[0]
        iv = body.params[0]
        s_count = loop.attrs.get("num_stages", self.stages)  # range(..., num_stages=) overrides the kernel's
        inside = self.inside(body)
        inductions = self.inductions(loop, inside)
        found = self.candidates(body, {id(iv)} | {id(p) for p, *_ in inductions}) if s_count >= 2 else []
        if not found:
            return
        lo, hi, step = loop.args[:3]
        span = loop.span
        step_op = self.defs.get(id(step))
        down = step_op is not None and step_op.kind == "const" and step_op.attrs["value"] < 0
        *_, yield_op = body.ops
        # a wgmma that only accumulates into a carried value may run on while the next iteration starts (one group
        # in flight): the slot it reads is then overwritten two iterations later, so copies run stages - 2 ahead. Not
        # with A in registers: the next iteration would rewrite them while the tensor cores still read them
        # in the loop's order, each once: a dot reads two rings
        lagging = list({id(u): u for *_, reads in found for u in reads if u.kind == "dot" and u.args[2] in body.params
                        and isinstance(u.args[0].type.dtype, ir.Buffer)
                        and len(readers_of(body, u.result)) == 1 and yield_op.args.index(u.result) + 1
                        == body.params.index(u.args[2])}.values()) if s_count >= 3 else []
        before: list[ir.Op] = []
        runs = self.scalar(before, "gt" if down else "lt", [lo, hi], bool_, span)  # (unread unless a start is checked)
        plans = [self.tma(store, load, inside, before, runs) for store, load, _ in found]  # TMA where it applies
        cp_async = not all(plans)
        # warp specialization: a producer warpgroup issues every copy, gated per slot by an `empty` barrier that the
        # consumers' warps arrive on once the wgmma reading the slot has landed. No CTA barrier in the loop. For TMA
        # tiles read only by asynchronous wgmma, in a loop that ws_anchor places (the producer's threads leave after)
        regs = producer_registers(self.k.spec.num_warps)
        anchor = self.ws_anchor(parent, loop) if loop.attrs.get("warp_specialize", False) else None
        ws = (anchor is not None and not cp_async and not inductions and regs is not None
              and self.k.spec.arch == "sm_90a" and all(u in lagging for *_, reads in found for u in reads))
        anchor = anchor if ws else loop
        nested = anchor is not loop
        scope = inside | self.inside(anchor.regions[0]) if nested else inside  # what the producer recomputes
        ahead_by = 0 if ws else s_count - 1 - (1 if lagging else 0)
        # a cluster whose CTAs run the same iterations (and tiles): a copy from the same place in every one of them is
        # issued in shares, each CTA's to all (multicast), and a slot is free once every CTA's consumers released it
        ctas = self.k.spec.num_ctas if ws and self.uniform(iv) and self.uniform(anchor.regions[0].params[0]) else 1
        for (_, load, _), plan in zip(found, plans):
            desc = load.attrs["desc"] if plan and ctas > 1 else None  # its starts, then its outer indices
            if desc and all(map(self.uniform, (*desc[3], *(i for i, _ in desc[4])))):
                plan["cast"] = ctas
        sharing = ctas if any(plan and "cast" in plan for plan in plans) else 1  # CTAs whose slots each copy fills
        setup: list[ir.Op] = []  # the rings and barriers: before the anchor, for all of its iterations

        def barriers(count: int) -> ir.Value:
            """A barrier per slot, expecting `count` arrivals a phase."""
            b = alloc((s_count,), u64, None, span)
            b.attrs["ring"] = True  # its uses are ordered by the pipeline, as the rings' are
            setup.extend([b, ir.Op("mbar_init", [b.result], [], {"count": count}, span)])
            return b.result
        bars = barriers(1) if any(plans) else None  # full: the bytes of all the slot's TMA copies, armed by the issuer
        empty = barriers(self.k.spec.num_warps * sharing) if ws else None  # empty: each consumer warp (of each CTA
        # sharing copies), done reading the slot
        tma_bytes = sum(ir.buffer_bytes(store.args[0]) for (store, *_), plan in zip(found, plans) if plan)

        def copies(out: list, new_iv: ir.Value, bases: list, times: int, slot: ir.Value, rings: list,
                   free: ir.Value | None = None, outer: dict | None = None) -> None:
            """The copies of iteration new_iv into `slot`; with `free` (the producer's parity of the slot's empty
            barrier), once the consumers have released the slot; `outer` maps the anchor's values to the producer's."""
            memo: dict = {**(outer or {}), id(iv): new_iv}
            valid = self.scalar(out, "gt" if down else "lt", [new_iv, self.clone(hi, memo, scope, out)], bool_, span)
            if free is not None:
                out.append(ir.Op("mbar_wait", [empty, slot, free, valid], [], {}, span))
            self.later(out, memo, inside, inductions, bases, times, span)
            if bars is not None:
                out.append(ir.Op("mbar_expect", [bars, slot, valid], [], {"bytes": tma_bytes}, span))
            for (store, load, _), ring, plan in zip(found, rings, plans):
                view = ir.Value(ring.type.with_dtype(ir.Buffer(ring.type.dtype.elem)), "smem", ring.layout)
                out.append(ir.Op("slot", [ring, slot], [view], {}, load.span))
                if plan:  # the descriptor's offsets at that iteration, then its outer indices; TMA checks the bounds
                    _, _, _, starts, outer, _ = load.attrs["desc"]
                    at = [self.clone(o, memo, scope, out) if isinstance(o, ir.Value) else self.const(out, o, i32, span)
                          for o in (*starts, *(i for i, _ in outer))]
                    out.append(ir.Op("tma_load", [view, bars, slot, valid, *at], [], dict(plan), load.span))
                    continue
                ptr = self.clone(load.args[0], memo, scope, out)
                ok = ir.Value(Type(ptr.type.shape, bool_), "", ptr.layout)
                out.append(ir.Op("splat", [valid], [ok], {}, span))
                mask = load.args[1]
                if mask is not None:
                    both = ir.Value(ok.type, "", ptr.layout)
                    out.append(ir.Op("and", [self.clone(mask, memo, scope, out), ok], [both], {}, span))
                    ok = both
                out.append(ir.Op("async_copy", [view, ptr, ok], [], {}, load.span))
            if cp_async:
                out.append(ir.Op("async_commit", [], [], {}, span))

        # the rings, and the prologue: iterations 0 .. stages - 2
        rings = []
        for store, load, _ in found:
            a = alloc(store.args[0].type.shape, store.args[0].type.dtype.elem, store.args[0].layout, store.span, s_count)
            a.attrs["ring"] = True
            setup.append(a)
            rings.append(a.result)
        for s in range(ahead_by):
            it = self.advance(before, lo, s, step, iv, span)
            copies(before, it, [start for _, start, *_ in inductions], s, self.const(before, s, i32, span), rings)
        for op in before:  # ordered against the loop's reads by its head barrier, but not against an earlier run's
            if op.kind in ("async_copy", "tma_load"):  # (a loop over tiles around this one): passes.smem decides
                op.attrs["prologue"] = True

        # the loop: read slot r, write slot w, both carried, and with TMA the phase of slot r's barrier
        r_slot, w_slot = ir.Value(Type((), i32), "slot_r"), ir.Value(Type((), i32), "slot_w")
        phase = ir.Value(Type((), i32), "phase")
        carried = [(r_slot, 0)] + ([] if ws else [(w_slot, ahead_by)]) + ([(phase, 0)] if bars is not None else [])
        body.params += [v for v, _ in carried]
        if nested:  # the ring goes on from tile to tile: its slot and phase are carried by the anchor too
            outer_body = anchor.regions[0]
            starts = [ir.Value(Type((), i32), v.name) for v, _ in carried]
            outer_body.params += starts
            anchor.args += [self.const(setup, start, i32, span) for _, start in carried]
            anchor.results += [ir.Value(Type((), i32)) for _ in carried]
        else:
            starts = [self.const(before, start, i32, span) for _, start in carried]
        loop.args += starts
        loop.results += [ir.Value(Type((), i32)) for _ in carried]
        if nested:
            outer_body.ops[-1].args = list(outer_body.ops[-1].args) + loop.results[-len(carried):]
        head: list[ir.Op] = [ir.Op("async_wait", [], [], {"pending": ahead_by - 1}, span)] if cp_async else []
        if bars is not None:
            head.append(ir.Op("mbar_wait", [bars, r_slot, phase], [], {}, span))
        # cp.async writes through the generic proxy, the tensor cores read through the async one: a proxy fence.
        # TMA writes through the async proxy, ordered for wgmma by the mbarrier alone (CUTLASS's mainloop has none)
        if any(not plan and u.kind in ("dot", "trans") for (*_, reads), plan in zip(found, plans) for u in reads):
            head.append(ir.Op("fence_async", [], [], {}, span))
        if not ws:
            head.append(ir.Op("barrier", [], [], {}, span))
        issue: list[ir.Op] = []
        if ws:  # the producer: the same iterations (in the anchor's, the same tiles), each issuing its copies
            p_oiv, p_outer, outer = None, [], {}
            if nested:
                o_iv = anchor.regions[0].params[0]
                p_oiv = ir.Value(o_iv.type, o_iv.name, o_iv.layout, o_iv.facts)
                outer = {id(o_iv): p_oiv}
            bounds = [self.clone(v, outer, scope, p_outer) for v in (lo, hi, step)]
            p_iv, free = ir.Value(iv.type, iv.name, iv.layout, iv.facts), ir.Value(Type((), i32), "free")
            producer: list[ir.Op] = []
            copies(producer, p_iv, [], 0, w_slot, rings, free, outer)
            producer.append(ir.Op("yield", self.wrap(producer, w_slot, free, s_count, span), [], {}, span))
            # the first lap waits on the parity before the empty barriers' first phase: it has completed
            w0, f0 = (ir.Value(Type((), i32), "slot_w"), ir.Value(Type((), i32), "free")) if nested else \
                (self.const(setup, 0, i32, span), self.const(setup, 1, i32, span))
            p_loop = ir.Op("for", bounds + [w0, f0], [ir.Value(Type((), i32)), ir.Value(Type((), i32))], {}, span,
                           [ir.Region([p_iv, w_slot, free], producer)])
            if nested:
                p_outer += [p_loop, ir.Op("yield", list(p_loop.results), [], {}, span)]
                p_loop = ir.Op("for", list(anchor.args[:3]) + [self.const(setup, 0, i32, span),
                                                               self.const(setup, 1, i32, span)],
                               [ir.Value(Type((), i32)), ir.Value(Type((), i32))], {}, span,
                               [ir.Region([p_oiv, w0, f0], p_outer)])
            roles = ir.Op("roles", [], [], {"consumers": 32 * self.k.spec.num_warps, "registers": regs}, span,
                          [ir.Region([], [p_loop])])
        else:
            ahead = self.advance(issue, iv, ahead_by, step, iv, span)
            copies(issue, ahead, [p for p, *_ in inductions], ahead_by, w_slot, rings)
        dead = set()
        for (store, load, reads), ring in zip(found, rings):
            dead |= {id(store), id(load), id(self.defs[id(store.args[0])])}
            view = ir.Value(ring.type.with_dtype(ir.Buffer(ring.type.dtype.elem)), "smem", ring.layout)
            head.append(ir.Op("slot", [ring, r_slot], [view], {}, span))
            for u in reads:
                u.args = [view if a is store.args[0] else a for a in u.args]
        *rest, _ = [op for op in body.ops if id(op) not in dead]
        tail: list[ir.Op] = []
        r_next = self.wrap(tail, r_slot, phase if bars is not None else None, s_count, span)  # slot r, and its phase
        w_next = [] if ws else self.wrap(tail, w_slot, None, s_count, span)
        yield_op.args = list(yield_op.args) + r_next[:1] + w_next + r_next[1:]
        # the later copies go out first, except with asynchronous wgmma: its tensor-core work starts first, the copies
        # are issued while it runs, then one group is waited for (the one that read the slot two iterations back)
        for dot in lagging:
            landed = ir.Value(dot.result.type, dot.result.name, dot.result.layout)
            issue.append(ir.Op("dot_wait", [dot.result], [landed], {"pending": 1}, span))
            yield_op.args = [landed if a is dot.result else a for a in yield_op.args]

        def release(out: list, slot: ir.Value, cond: ir.Value) -> None:
            """Where `cond` holds, the consumers' warps release the slot before `slot` to the producer."""
            back = self.scalar(out, "add", [slot, self.const(out, s_count - 1, i32, span)], i32, span)
            prev = self.scalar(out, "mod", [back, self.const(out, s_count, i32, span)], i32, span)
            out.append(ir.Op("mbar_arrive", [empty, prev, cond], [], {"ctas": sharing} if sharing > 1 else {}, span))
        if ws:  # the group waited for read the previous iteration's slot
            release(issue, r_slot, self.scalar(issue, "ne", [iv, lo], bool_, span))
        body.ops = head + (rest + issue if lagging else issue + rest) + tail + [yield_op]
        after = [ir.Op("async_wait", [], [], {"pending": 0}, span)] if cp_async else []
        for dot in lagging:  # the accumulator is read after the loop once its last group has landed
            dot.attrs["async"] = True
            result = loop.results[body.params.index(dot.args[2]) - 1]
            landed = ir.Value(result.type, result.name, result.layout)
            after.append(ir.Op("dot_wait", [result], [landed], {"pending": 0}, span))
            at = parent.ops.index(loop)
            for op in parent.ops[at + 1:]:
                replace_uses(op, result, landed)
        if ws:  # the last iteration's slot, once its group has landed: the producer may fill it for the next tile
            release(after, loop.results[-len(carried)], runs)
        # once every thread is done waiting: the bytes may be reused, or the loop run again
        teardown = [ir.Op("mbar_inval", [b], [], {}, span) for b in (bars, empty) if b is not None]
        producers = [roles] if ws else []
        if sharing > 1:  # the barriers are set in every CTA before any copy or arrival reaches them, and no CTA leaves (or
            # invalidates them) while another may still arrive on them
            setup.append(ir.Op("cluster_sync", [], [], {}, span))
            teardown.insert(0, ir.Op("cluster_sync", [], [], {}, span))
        at = parent.ops.index(loop)
        if nested:  # the ring and the producer serve every tile: they go around the loop over tiles
            parent.ops[at:at + 1] = before + [loop] + after
            at = self.k.body.ops.index(anchor)
            self.k.body.ops[at:at + 1] = setup + producers + [anchor] + teardown
        else:
            parent.ops[at:at + 1] = setup + producers + before + [loop] + after + teardown

    def advance(self, out: list, base: ir.Value, times: int, step: ir.Value, iv: ir.Value, span) -> ir.Value:
        """base + times * step: an iteration's loop variable, with the dtype and facts of `iv`."""
        t = iv.type.dtype
        res = self.scalar(out, "add", [base, self.scalar(out, "mul", [self.const(out, times, t, span), step], t, span)],
                          t, span)
        res.facts = iv.facts
        return res

    def wrap(self, out: list, slot: ir.Value, phase: ir.Value | None, count: int, span) -> list:
        """The next slot of a ring of `count`, and with `phase`, the barrier parity, which flips when the slot wraps."""
        one = self.scalar(out, "add", [slot, self.const(out, 1, i32, span)], i32, span)
        stay = self.scalar(out, "lt", [one, self.const(out, count, i32, span)], bool_, span)
        nexts = [self.scalar(out, "where", [stay, one, self.const(out, 0, i32, span)], i32, span)]
        if phase is not None:
            flip = self.scalar(out, "sub", [self.const(out, 1, i32, span), phase], i32, span)
            nexts.append(self.scalar(out, "where", [stay, phase, flip], i32, span))
        return nexts

    def ws_anchor(self, parent: ir.Region, loop: ir.Op) -> ir.Op | None:
        """Where a warp-specialized loop's producer starts: at the loop itself in the kernel's body, or at the
        kernel-level `for` (carrying nothing) whose body holds the loop (a persistent kernel's loop over tiles), with
        only arithmetic before either: what the producer's threads run before they leave. None where neither."""
        ops = self.k.body.ops
        anchor = loop if loop in ops else next((op for op in ops if op.kind == "for" and op.regions[0] is parent
                                                and len(parent.params) == 1), None)

        def arithmetic(seq: list) -> bool:
            return all(op.kind in PURE | {"program_id", "num_programs", "assert", "alloc", "mbar_init"}
                       and not op.regions for op in seq)
        return anchor if anchor is not None and arithmetic(ops[:ops.index(anchor)]) \
            and arithmetic(parent.ops[:parent.ops.index(loop)]) else None


REGISTERS = 65536  # 32-bit registers per SM (sm_90)
PRODUCER_REGS = 40  # a producer warpgroup's registers per thread: it only counts slots and issues copies


def producer_registers(num_warps: int) -> tuple | None:
    """(producer, consumer) registers per thread after setmaxnreg (consumer None: they keep theirs), for num_warps
    consumer warps and a producer warpgroup; None where the launch would pass 1024 threads. A program's pool is
    what its launch got: every thread at the launch bounds' count (65536 / threads, in steps of 8, at most 256),
    so the consumers grow only by what the producer gives back (at 8 warps: 168 each at launch, 40 and 232 after;
    at 16: 96, then 40 and 104)."""
    threads = 32 * num_warps + 128
    if num_warps % 4 or threads > 1024:
        return None
    start = min(256, REGISTERS // threads // 8 * 8)
    grown = min(256, (threads * start - 128 * PRODUCER_REGS) // (32 * num_warps) // 8 * 8)
    return PRODUCER_REGS, grown if grown > start else None


def readers_of(r: ir.Region, v: ir.Value) -> list:
    return [op for op in ir.walk(r) if any(a is v for a in op.args)]


def replace_uses(op: ir.Op, old: ir.Value, new: ir.Value) -> None:
    op.args = [new if a is old else a for a in op.args]
    for r in op.regions:
        for inner in r.ops:
            replace_uses(inner, old, new)


def pipeline(k: ir.Kernel) -> ir.Kernel:
    loops = any(op.attrs.get("num_stages", k.spec.num_stages) >= 2 for op in ir.walk(k.body) if op.kind == "for")
    if loops:
        Pipeliner(k).region(k.body)
    if Pipeliner(k).stores(k.body) or loops:
        drop_dead(k)  # the address ops of a load the pipeline replaced, the read-back of a tile TMA stores
        analyze_axes(k)  # facts for the masks and addresses of later iterations
    return k


def split_dots(k: ir.Kernel) -> ir.Kernel:
    defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
    readers = ir.uses(k)

    def region(r: ir.Region) -> None:
        out: list[ir.Op] = []
        moved: set = set()
        for op in r.ops:
            for sub in op.regions:
                region(sub)
            if op.kind == "dot":
                parts = split(op)
                if parts:
                    moved |= {id(defs[id(a)]) for a in op.args[:2]}
                    out += parts
                    continue
            out.append(op)
        r.ops = [op for op in out if id(op) not in moved]

    def split(op: ir.Op) -> list | None:
        a, b, acc = op.args
        la, lb = defs.get(id(a)), defs.get(id(b))
        if not (la and lb and la.kind == lb.kind == "local_load" and len(readers[id(a)]) == len(readers[id(b)]) == 1):
            return None
        (m, kk), n = a.type.shape, b.type.shape[1]
        if "mma" in op.attrs:
            step = int(op.attrs["mma"].rsplit("k", 1)[1])
        else:  # CUDA cores: about 64 operand registers a step (a thread's rows of A and columns of B, per k)
            per_k = a.layout.nregs // kk + b.layout.nregs // kk
            step = max(1, min(kk, 1 << (max(1, 64 // per_k).bit_length() - 1)))
        if kk <= step:
            return None
        reads, dots = [], []
        for j in range(kk // step):
            pa = ir.Value(Type((m, step), a.type.dtype), a.name, restrict(a.layout, (m, step)))
            pb = ir.Value(Type((step, n), b.type.dtype), b.name, restrict(b.layout, (step, n)))
            sa, sb = la.attrs["start"], lb.attrs["start"]
            reads.append([ir.Op("local_load", list(la.args), [pa], {"start": (sa[0], sa[1] + j * step)}, la.span),
                          ir.Op("local_load", list(lb.args), [pb], {"start": (sb[0] + j * step, sb[1])}, lb.span)])
            last = j == kk // step - 1
            res = op.result if last else ir.Value(op.result.type, op.result.name, op.result.layout)
            dots.append(ir.Op("dot", [pa, pb, acc], [res], dict(op.attrs), op.span))
            acc = res
        out = reads[0]
        for j, d in enumerate(dots):  # step j + 1's reads go before step j's math
            out += (reads[j + 1] if j + 1 < len(reads) else []) + [d]
        return out

    region(k.body)
    return k
