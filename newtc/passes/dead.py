"""Dead code: ops whose only effect is their results, dropped where nothing reads them (as Triton does), so that an
unused value costs no compile time (a tile's sort unrolls into thousands of lines of CUDA)."""
from __future__ import annotations

from .. import ir

# kinds with no effect but their results: a load too (of memory nobody reads), a scan with its combining region
FREE = ir.ELEMENTWISE | ir.VIEWS | {"arange", "const", "program_id", "num_programs", "load", "reduce", "dot", "scan",
                                   "exchange", "gather", "histogram", "join", "split", "convert", "slot", "local_load"}


def remove_dead(r: ir.Region, readers: dict) -> bool:
    """Drop the free ops of r (and of its regions) whose results nobody reads; whether any went."""
    changed = False
    for op in r.ops:
        for sub in op.regions:
            changed |= remove_dead(sub, readers)
    keep = [op for op in r.ops
            if not (op.kind in FREE and op.results and all(not readers.get(id(v)) for v in op.results))]
    changed |= len(keep) != len(r.ops)
    r.ops = keep
    return changed


def drop_dead(k: ir.Kernel) -> ir.Kernel:
    while remove_dead(k.body, ir.uses(k)):  # an op dropped may leave its operands unread
        pass
    return k
