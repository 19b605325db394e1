"""Shared memory: where each buffer lives (`plan_smem`) and where barriers go (`insert_barriers`).

Buffers whose lifetimes overlap get disjoint bytes, first fit in program order. A buffer also keeps
its bytes until the next buffer's first use: the next buffer is written elsewhere, so its writes need
no barrier against this one's last readers (two scratch uses in a row alternate, like two halves).

A barrier goes before any shared-memory access that conflicts (a write against a read or write of
overlapping bytes) with an access made since the last barrier; loops are followed around their back
edge until the set of pending accesses settles. Accesses of one ring buffer by a software-pipelined
loop are ordered by the pipeline's own wait-and-barrier, so they do not conflict with each other; its prologue's
copies are not ordered against the reads of an earlier run of the loop (inside a loop over tiles), so they do.
The tensor cores (wgmma) and TMA access shared memory through the async proxy: generic accesses of bytes
they also use get a `fence.proxy.async` before the barrier that orders them (the PTX memory model's rule).
A TMA store goes on reading its buffer after the issuing thread has passed it: a write of those bytes waits for
that read (`bulk_wait` by the issuing thread, which lets newer stores read on) and then a barrier. So a tile staged
in two alternating buffers is written into one while the other goes out, and a persistent kernel's last one goes
out while the next tile's loop runs; the kernel's end waits for the reads still in flight.
"""
from __future__ import annotations

from .. import ir
from ..errors import NkError

# shared memory a CTA may have, by architecture (the opt-in maximum; unknown ones get the common 48 KB)
LIMIT = {"sm_80": 166912, "sm_87": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": 232448, "sm_90a": 232448}
ASYNC = ("ra", "wa", "rt")  # accesses through the async proxy
NEWER = 2  # bulk groups counted after a pending TMA store's: a wait lets at most this many newer ones go on reading
ALIGN = 1024  # a swizzle atom (8 rows of 128 bytes): 2-D tiles start on that boundary, other buffers on 128 bytes


def _positions(k: ir.Kernel):
    """Program-order position of every op, the position after each compound op, and each op's parent."""
    pos, end, parent = {}, {}, {}
    counter = 0

    def walk(r: ir.Region, up):
        nonlocal counter
        for op in r.ops:
            pos[id(op)], parent[id(op)] = counter, up
            counter += 1
            for sub in op.regions:
                walk(sub, op)
            end[id(op)] = counter

    walk(k.body, None)
    return pos, end, parent


def place(allocs: list, pos: dict, last: dict, spare_barriers: bool) -> int:
    """First fit in program order over lifetimes; returns the bytes used."""
    placed: list[tuple[int, int, int, int]] = []  # (lo, hi, start, stop)
    for i, a in enumerate(allocs):
        start, stop = pos[id(a)], last[id(a.result)]
        if spare_barriers and i + 1 < len(allocs):
            stop = max(stop, pos[id(allocs[i + 1])])
        align = ALIGN if a.result.layout is not None and len(a.result.type.shape) == 2 else 128
        size = -(-ir.buffer_bytes(a.result) // align) * align
        offset = 0
        for lo, hi in sorted((lo, hi) for lo, hi, s, e in placed if s <= stop and start <= e):
            if offset + size <= lo:
                break
            offset = -(-max(offset, hi) // align) * align
        a.attrs["offset"] = offset
        placed.append((offset, offset + size, start, stop))
    return max(hi for _, hi, _, _ in placed)


def plan_smem(k: ir.Kernel) -> ir.Kernel:
    pos, end, parent = _positions(k)
    allocs = [op for op in ir.walk(k.body) if op.kind == "alloc"]
    if not allocs:
        k.smem_bytes = 0
        return k
    last = {id(a.result): pos[id(a)] for a in allocs}
    defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
    for op in ir.walk(k.body):
        for v in op.args:
            if v is not None and isinstance(v.type.dtype, ir.Buffer):
                a = ir.root_buffer(v, defs)  # a slot's use is its ring's
                home = parent[id(a)]
                u = op
                while parent[id(u)] is not home:  # a use inside a loop keeps the buffer for the whole loop
                    u = parent[id(u)]
                last[id(a.result)] = max(last[id(a.result)], end[id(u)] - 1)
    allocs.sort(key=lambda a: pos[id(a)])
    limit = LIMIT.get(k.spec.arch, 48 * 1024)
    # first with each buffer kept until the next one's first use (no barrier between them), then, if that does
    # not fit, with plain lifetimes (a barrier costs less than shared memory a program cannot have)
    for spare_barriers in (True, False):
        k.smem_bytes = place(allocs, pos, last, spare_barriers)
        if k.smem_bytes <= limit:
            break
    if k.smem_bytes > limit:
        raise NkError(f"kernel '{k.name}' needs {k.smem_bytes // 1024} KB of shared memory; a program on "
                      f"{k.spec.arch} can have {limit // 1024} KB", k.span,
                      "use fewer num_stages (each keeps a copy of the tiles a loop feeds to dot) or smaller blocks")
    return k


def effects(op: ir.Op) -> list:
    """The shared-memory accesses of an op, in order: ('r' | 'w', buffer), 'ra' | 'wa' through the async proxy (the
    tensor cores, TMA; 'rt' a TMA store's read, pending until a bulk_wait), 'rb' | 'wb' of mbarriers (ordered by CTA
    barriers like any access, but by the mbarrier's own semantics across proxies: never fenced), ('sync',) for a
    barrier, ('fence',) for a proxy fence. A copy into a ring also says whether its pipelined loop orders it (False for
    the prologue's copies)."""
    kind = op.kind
    if kind == "local_store":
        return [("w", op.args[0])]
    if kind == "async_copy":  # a pipeline's prologue copy is not ordered by its loop against an earlier run's reads
        return [("w", op.args[0], not op.attrs.get("prologue"))]
    if kind == "local_load":
        return [("r", op.args[0])]
    if kind == "tma_load":  # the copy writes its slot through the async proxy
        return [("wa", op.args[0], not op.attrs.get("prologue"))]
    if kind == "tma_store":  # and this one reads its buffer until a bulk_wait
        return [("rt", op.args[0])]
    if kind == "mbar_expect":  # the arrival writes the slot's barrier
        return [("wb", op.args[0])]
    if kind == "mbar_wait":
        return [("rb", op.args[0])]
    if kind == "mbar_init":  # then a barrier inside the op
        return [("wb", op.args[0]), ("sync",)]
    if kind == "mbar_inval":  # after a barrier inside the op
        return [("sync",), ("wb", op.args[0])]
    if kind in ("barrier", "cluster_sync"):
        return [("sync",)]
    if kind == "fence_async":
        return [("fence",)]
    if kind == "trans":  # a view of a buffer: its readers access it
        return []
    if kind == "dot" and "wgmma" in op.attrs:  # the tensor cores read B, and A unless it is in registers
        return [("ra", x) for x in op.args[:2] if isinstance(x.type.dtype, ir.Buffer)]
    if kind == "dot_wait":  # the reads of the dots it waits for end here (passes.overlap)
        return [("ra", x) for x in op.args if isinstance(x.type.dtype, ir.Buffer)]
    if op.args and op.args[-1] is not None and isinstance(op.args[-1].type.dtype, ir.Buffer):
        s = op.args[-1]  # a scratch buffer: written, then a barrier inside the op, then read back
        return [("w", s), ("sync",), ("r", s)]
    return []


def _access(defs: dict, kind: str, buf: ir.Value, piped: bool = True) -> tuple:
    """(first byte, end, a write, (its ring, whether in the pipelined loop rather than its prologue) or None)."""
    op = ir.root_buffer(buf, defs)  # a slot counts as its whole ring
    lo = op.attrs["offset"]
    return lo, lo + ir.buffer_bytes(op.result), kind[0] == "w", (id(op), piped) if op.attrs.get("ring") else None


def _conflict(a: tuple, b: tuple) -> bool:
    if a[3] is not None and a[3] == b[3]:
        return False  # one ring's accesses are ordered by the pipeline, and its prologue's copies fill other slots
    return a[0] < b[1] and b[0] < a[1] and (a[2] or b[2])


def insert_barriers(k: ir.Kernel) -> ir.Kernel:
    defs = {id(r): op for op in ir.walk(k.body) for r in op.results}
    # every access through the async proxy: generic accesses of the same bytes are fenced at the next barrier
    asynchronous = {_access(defs, *e) for op in ir.walk(k.body) for e in effects(op) if e[0] in ASYNC}

    def fenced(pending: frozenset, before: frozenset, out: list, span) -> frozenset:
        """At a barrier: a proxy fence first, by every thread, where generic accesses pending since `before` meet
        bytes the async proxy accesses (so that one barrier orders them for both proxies)."""
        due = {p for p in pending & before if p[0] == "fence" and any(_conflict(a, p[1]) for a in asynchronous)}
        if due:
            out.append(ir.Op("fence_async", [], [], {}, span))
        return pending - {p for p in pending & before if p[0] == "fence"} if due else pending

    def region(r: ir.Region, pending: frozenset, insert: bool) -> frozenset:
        """pending holds ("sync", access) since the last barrier and ("fence", access) for generic accesses since the
        last proxy fence. A barrier after generic accesses of bytes the async proxy uses gets the fence before it
        (an epilogue's staging, then the next tile's TMA copies into the same bytes; a tile stored before a loop that
        wgmma reads in it). An async access that still conflicts with one gets a fence and a barrier of its own."""
        out = []
        for op in r.ops:
            if op.kind in ("for", "while"):
                body, entry = op.regions[0], pending
                for _ in range(4):  # until the pending set at the loop's head stops growing
                    grown = pending | region(body, entry, False)
                    if grown == entry:
                        break
                    entry = grown
                pending = pending | region(body, entry, insert)  # zero or more iterations
            elif op.kind == "if":
                pending = frozenset().union(*(region(sub, pending, insert) for sub in op.regions))
            else:
                before = pending  # a barrier inside the op comes after the op's own earlier accesses
                for eff in effects(op):
                    if eff[0] == "sync":
                        pending = fenced(pending, before, out, op.span)
                        pending = frozenset(p for p in pending if p[0] != "sync")
                        continue
                    if eff[0] == "fence":
                        pending = frozenset(p for p in pending if p[0] != "fence")
                        continue
                    acc, proxy = _access(defs, *eff), eff[0] in ASYNC
                    reading = [p[2] for p in pending if p[0] == "bulk" and _conflict(acc, p[1])]
                    if reading:  # TMA stores still read these bytes: wait for them, not for the newer ones
                        allow = min(reading)
                        out.append(ir.Op("bulk_wait", [], [], {"allow": allow}, op.span))
                        pending = frozenset(("sync", p[1]) if p[0] == "bulk" and p[2] >= allow else p for p in pending)
                    conflicts = {p[0] for p in pending if (proxy or p[0] == "sync") and _conflict(acc, p[1])}
                    if proxy and conflicts:  # generic accesses, ordered before the async proxy's
                        out.append(ir.Op("fence_async", [], [], {}, op.span))
                        pending = frozenset(p for p in pending if p[0] in ("sync", "bulk"))
                    elif conflicts:
                        pending = fenced(pending, pending, out, op.span)
                    if conflicts:
                        out.append(ir.Op("barrier", [], [], {}, op.span))
                        pending = frozenset(p for p in pending if p[0] in ("fence", "bulk"))
                    if eff[0] == "rt":  # a bulk group: the groups before it count one more after them
                        pending = frozenset(("bulk", p[1], min(p[2] + 1, NEWER)) if p[0] == "bulk" else p
                                            for p in pending) | {("bulk", acc, 0)}
                    pending = pending | {("sync", acc)} | ({("fence", acc)} if eff[0] in ("r", "w") else frozenset())
            out.append(op)
        if insert:
            r.ops = out
        return pending

    if any(p[0] == "bulk" for p in region(k.body, frozenset(), True)):
        k.body.ops.append(ir.Op("bulk_wait", [], [], {"allow": 0}, k.span))
    return k
