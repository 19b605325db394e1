"""IR -> IR passes, applied in this order to every specialization."""
from __future__ import annotations

from .. import ir
from .axisinfo import analyze_axes
from .layouts import assign_layouts

PASSES = [analyze_axes, assign_layouts]


def run_passes(k: ir.Kernel) -> ir.Kernel:
    for p in PASSES:
        k = p(k)
        ir.maybe_verify(k)
    return k
