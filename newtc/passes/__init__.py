"""IR -> IR passes, applied in this order to every specialization."""
from __future__ import annotations

from .. import ir
from .axisinfo import analyze_axes
from .dead import drop_dead
from .fold import fold_accumulators
from .layouts import assign_layouts
from .lower import lower_shared
from .overlap import overlap
from .pipeline import pipeline, split_dots
from .smem import insert_barriers, plan_smem

PASSES = [drop_dead, fold_accumulators, analyze_axes, assign_layouts, lower_shared, pipeline, split_dots, overlap,
          plan_smem, insert_barriers]


def run_passes(k: ir.Kernel) -> ir.Kernel:
    for p in PASSES:
        k = p(k)
        ir.maybe_verify(k)
    return k
