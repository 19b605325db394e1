"""GPU timing shared by deuteron's autotuner and the benchmarks: CUDA events around each run, the L2 flushed
before it (so that a run reads its inputs from DRAM, as in a model's forward pass), the median of the runs."""
import statistics

import torch


def time_ms(fn, flush: torch.Tensor, runs: int) -> float:
    """The median GPU time of fn over runs, each after an L2 flush (writing `flush`, a buffer larger than L2)."""
    fn()
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(2)] for _ in range(runs)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)
