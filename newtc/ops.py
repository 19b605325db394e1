"""Ops on torch tensors backed by the stdlib `.nk` kernels: allocate outputs, pick the launch.

CPU tensors run through the interpreter, CUDA tensors on the GPU. The file reads in four parts:
- the launch model: one configuration per shape (`plan`), for the row ops (softmax, log-softmax,
  cross-entropy, layer norm, RMS norm);
- launching: the general path, and the cached one a repeated call of the same shape takes;
- the ops;
- the same ops registered as torch custom ops (`torch.ops.newt.*`), so that torch.compile traces them and
  autograd differentiates them (with torch's own gradients).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from . import driver, jit
from .gpu import Gpu, gpu
from .passes import smem
from .errors import NkError
from .jit import load
from .paths import data_dir

_modules: dict = {}


def _stdlib(name: str):
    """The stdlib module, parsed once: ops sit on the launch path, so no file system calls here."""
    mod = _modules.get(name)
    if mod is None:
        mod = _modules[name] = load(data_dir("stdlib") / f"{name}.nk")
    return mod


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---- the launch model: one configuration per shape --------------------------------------------------
#
# A row op moves bytes; its time is the bytes over the bandwidth the launch reaches. By Little's law an SM
# with b bytes of loads in flight moves b / LATENCY bytes per second, up to its share of DRAM bandwidth,
# so a configuration is judged by what it keeps in flight per SM: the programs resident on an SM
# (occupancy, from warps and registers) times the bytes each has in flight (a whole row block, or one
# block of a loop), less the time its programs all wait at once (WAIT). Three shapes of program cover
# every shape of input:
# - whole rows: ROWS rows of up to BLOCK columns in registers; one read, one write. BLOCK is a power of
#   two, so a row of 5120 holds 8192 lanes: the masked lanes cost registers (occupancy) but no bytes;
# - looped: one program per row, a pass for the statistics, a pass to write. The second pass reads from
#   L2 what the rows in flight fit into it, and from DRAM the rest;
# - split: few long rows cut into chunks, at most a wave of programs, and a second kernel (LAUNCH) that
#   merges each row's partial statistics and writes; its reads hit L2 as far as the input fits there.
# Every candidate of the three is timed by the model and the preferred one within TOLERANCE of the
# fastest wins. The constants are an H200's; only their ratios matter between candidates.

LATENCY = 0.9e-6  # seconds: DRAM latency under load
SM_BANDWIDTH = 36e9  # bytes/s: an SM's share of DRAM bandwidth (4.8 TB/s over 132 SMs)
SM_PEAK = 100e9  # bytes/s: what one SM can take while most are idle (64 bytes per clock from L2)
L2_SPEEDUP = 2.0  # a read that hits L2 costs half of one from DRAM (L2 bandwidth is 2-3x DRAM's)
L2_SHARE = 0.5  # the part of L2 that a second pass over recently read rows can count on (writes take the rest)
LAUNCH = 1.2e-6  # seconds: what a dependent second kernel adds (launch gap, ramp up and down): in graphs of launches
# on an H200 a whole launch of one short program takes 1.0-1.5 us (softmax 1x64: 1.04 us, f16 1x1024: 1.45); at 2 us,
# lone cross-entropy rows of 32768 f32 stayed looped, 1.15-1.40x slower than split
THREAD_BYTES = 128  # the most of a row block one thread holds: 8 16-byte vectors (32 f32 or 64 f16 values);
# measured on an H200 the best up to rows of 16 KB (f32 softmax at 4096 and 16384, f16 layer norm at 8192)
RMS_BYTES = 64  # ... that RMS norm prefers, where 16 warps can: its one reduction crosses the warps once, layer
# norm's two (the mean, then the squares about it) twice, so more warps cost it less (H200, 1024 rows of 16 KB: 8 warps
# 0.98-1.00 of the best other against 4 warps' 0.94-0.96, where layer norm runs up to 14% faster on 4)
VECTOR = 16  # bytes a thread loads at once
NORMS = {"norm", "rmsnorm"}
NORM_LONE = 16  # bytes per thread of a lone norm program (a vector), up to 16 warps (`_whole_rows`): their weight step
# after the reductions is a second dependent step that more threads shorten (H200, in graphs of launches: RMS norm 1 and
# 128 16-bit rows of 4096, 16 warps 1.10-1.15 of the best other, 8 warps 0.94-1.04; layer norm f32 rows of 768-1024 at
# 1-128 rows, the sweeps' timings: 8 warps 1.04-1.17x faster than the 4 of 32 bytes a thread, 16-bit rows of 3000-4096
# at 128 rows 16 warps 1.12x faster than 8, within 3% at 1-8 rows); a block of up to 32 bytes a lane stays on one warp,
# whose reductions need no barrier (RMS norm, 1-128 16-bit rows of 512: 1 warp 1.15-1.20, 2 warps 1.09-1.11)
MIN_WARPS = 4  # whole-row programs: fewer warps only for blocks too small to give 4 warps a vector each, or streaming:
STREAM_WAVES = 3  # a launch of more programs than this many waves streams rows through its SMs, where 2 warps that hold
STREAM_BYTES = 96  # up to this many bytes a thread move a tile as fast as 4 and fit twice the rows per SM (H200, in
# graphs of launches, 32768 rows of 512-1024: cross-entropy 0.89-0.98 -> 1.00-1.02 of the best other, 16-bit rows of 512
# 1.00-1.05 -> 1.06-1.67; from 4 waves and 64 bytes to these, the sweeps' timings of both plans replayed over rows of
# 256-3000 at 4096-32768 rows: geomean 1.045x over 52 points, softmax 16-bit 16384x512 and 32768x256 1.28-1.31x,
# cross-entropy 16-bit rows of 2560-3000 1.06-1.11x, two 0.92x at 1.14 and 1.89 of the best other; at 128 bytes, rows
# of 4096 halves 5-8% slower for the norms and cross-entropy)
CROWDED = 0.5  # norms, not lone: where one-warp programs of a row each would fill this part of the SMs' block
# slots (32 a SM: the cap, not warps or registers, limits them), no one-warp programs: two rows share a two-warp
# program instead (a warp a row, one load of the weight for both; H200, in graphs of launches, 16-bit rows of 512-768
# at 4096 rows: RMS norm 0.93-1.17 -> 1.11-1.27 of the best other, layer norm 0.98-1.12 -> 1.09-1.20; at 32768 rows of
# 768 within 6%, of 64-128 layer norm 2.9-4.4 -> 3.2-5.3)
PROGRAM_BYTES = 2048  # short rows are grouped until a program moves this much (f16 rows of 1024 by two)
ALONE = {"softmax"}  # ops whose rows of PROGRAM_BYTES or more never share a program: where the model groups them,
# they run as programs of their own, each on the warps its row had (H200, in graphs of launches, 36 points of aligned
# 16-bit rows of 1024-2560 and f32 rows of 640 at 512-32768 rows: 0.99-1.28x, geomean 1.11; rows off 16 bytes too, in
# their grown tails: `_whole_rows`), where the norms' grouped rows share one load of the weight (layer norm 16-bit
# 1024x1024: 0.82x alone) and cross-entropy's went both ways (0.91-1.35x)
LONE_THREADS = 2  # threads of a lone whole-row program per sqrt(byte) of its block (measured on an H200: 16 KB blocks
# of softmax and cross-entropy 0.3-0.8 us faster at 8 warps than at 32, a 64 KB one at 16, 512 bytes at 1; norms differ)
LOOP_ELEMS = 16  # elements per thread in each block of a loop
SHIFTED_ELEMS = 8  # ... where rows start off 16-byte boundaries and every element loads under its own mask (a
# compare and a select apiece): there 16 run up to 24% slower than 8 (H200, rows of 50257: softmax f16 4096 rows 1.13 of
# the best other against 0.94, cross-entropy f32 1024 rows 1.03 against 0.86), where aligned rows (65536) mostly run
# faster on 16 (up to 25%)
F32_LOOPS = {("softmax", False), ("softmax", True), ("rmsnorm", False)}  # (op, rows off 16 bytes) whose loops over f32
# rows run on 32 warps: there they hold 30-32 registers (NVRTC 13, sm_90a), so two 32-warp programs fit an SM where the
# model counts one; an SM then holds two rows, where 16-warp programs hold three or four, so the second pass finds more
# of each row in L2. On an H200 against the 16 warps the model chose, on 25 points of 300-16384 rows of 20000-262144:
# faster on 23 (softmax 0.5-15%, RMS norm 1-19%), RMS norm 1024x262144 the same, softmax 300x40000 2% slower. Not
# RMS norm's rows off 16 bytes (36 registers: 4% faster and 5% slower) nor layer norm's loop (44, one program an SM:
# 2-9% faster on 8 of 10 aligned points, 32% slower at 2048x20000, 12-23% slower off 16 bytes)
MAX_ROW = {"softmax": 32768, "cross_entropy": 32768, "norm": 16384, "rmsnorm": 16384}  # widest row block kept in
# registers: 32 values per thread at 1024 threads, the most without spills (NVRTC, sm_80/sm_90a: norms spill at 32768)
LONE_BYTES = 65536  # the largest block of a lone whole-row program: one SM streams it in (and out), where a split or a
# loop spreads it (H200, in graphs of launches: f32 rows of 32768, 1-8 rows 1.5-1.7x slower whole than split for softmax,
# 1.14-1.40x for cross-entropy, which only reads; 128 rows 1.08-1.09x slower than looped)
MAX_PARTS = 1024  # chunks per row in a split plan
TOLERANCE = 1.03  # a preferred candidate within 3% of the fastest wins: the model ranks, it does not measure
TRAFFIC = {"softmax": 2, "norm": 2, "rmsnorm": 2, "cross_entropy": 1}  # row passes to DRAM at best: read + write,
# or read
WAIT = 0.7e-6  # seconds a program reduces and waits after each step of loads, whatever the step's size: its SM's
# memory idles through it unless another program is loading meanwhile, so a step of more bytes idles a smaller part of
# its time. Measured on an H200, each 0.65-0.78 us: rmsnorm and layer norm f32 128x32768, one program per SM, 2.6-2.7 us
# faster at 32 warps (4 steps) than at 16 (8 steps); rows of 50257 f32 at 0.68-0.71x with one 32-warp program per SM
# of two 16-warp ones (measured while those rows, off 16-byte boundaries, still loaded through a run-time check per
# group); a split of 128 rows of 32768 f32, four 8-warp programs per SM started at once, 1.7-1.8x what its bytes in
# flight allow


@dataclass(frozen=True)
class Plan:
    """A launch configuration. kind: "rows" (ROWS whole rows per program), "looped" (a program per row)
    or "split" (`parts` programs per row of `chunk` columns each). block: the row block (and `tail`, a
    second, smaller one after it), or the loop's."""
    kind: str
    block: int
    warps: int
    rows: int = 1
    parts: int = 1
    chunk: int = 0
    tail: int = 0
    regs: int = 0  # registers a thread may use at most (`_one_wave`; 0: no cap)
    seconds: float = 0.0  # the model's estimate, for benchmarks and debugging

    @property
    def blocks(self) -> int:
        """A split's chunk in blocks, as its kernels take it: a chunk of whole blocks whatever they are passed."""
        return self.chunk // self.block


def registers(values: int) -> int:
    """Registers per thread holding `values` f32 values of a row block: NVRTC's counts for the stdlib row
    kernels on sm_90a lie at or under this line (softmax 53 and layer norm 59 at 32 values, 93 and 107 at 64)."""
    return 24 + 2 * values


def resident(g: Gpu, warps: int, regs: int) -> int:
    """Programs resident per SM: limited by warps, by registers (allocated per warp, 256 at a time) and by
    the hardware's cap on resident blocks. A kernel's launch bounds make the compiler fit the registers of
    one program per SM (MAX_ROW keeps that free of spills)."""
    per_warp = _cdiv(min(regs, 255, g.regs // (32 * warps)) * 32, 256) * 256
    return min(g.ctas, g.warps // warps, g.regs // (per_warp * warps))


def seconds(g: Gpu, programs: int, per_sm: int, in_flight: int, dram: float, l2: float = 0.0,
            stores: bool = True) -> float:
    """The time of one kernel of `programs` equal programs, up to `per_sm` of them resident per SM, each
    with `in_flight` bytes of loads outstanding, moving `dram` bytes from DRAM and `l2` from L2, at the rate
    of as many programs at once as fit. No waves: an SM starts a program as soon as one ends, so a last part-full
    wave of short programs costs about one program's latency (on an H200, in graphs of launches, a model with waves
    grouped short rows 2-8 to a program for it, 10-25% slower than a row or two per program: softmax f16
    4096 x 768, layer norm f16 4096 x 1024). With `stores`, each program ends by storing its rows, which
    the next program's loads overlap. Without (a loop, whose stores do not cover the waits between its
    steps, or cross-entropy), an SM's memory idles through its programs' reductions and waits (WAIT after
    each step) unless another program on it is loading meanwhile: programs that start apart, as in a launch of several
    waves, do; a lone program per SM has none; the programs of a launch that fits in one wave start at once
    and run the same steps, so they wait together."""
    wave = g.sms * per_sm
    together = programs <= wave

    def rate(n: int) -> float:  # bytes/s of n programs running at once
        on_sm = min(per_sm, _cdiv(n, g.sms))
        share = SM_BANDWIDTH if n >= g.sms else min(SM_PEAK, g.sms * SM_BANDWIDTH / n)  # idle SMs leave more
        step = max(LATENCY, in_flight / share)  # a program's step of loads, which its wait follows
        busy = 1.0 if stores else step / (step + WAIT) if together else min(1.0, on_sm * step / (step + WAIT))
        return min(n, g.sms) * busy * min(share, on_sm * in_flight / LATENCY)

    return (dram + l2 / L2_SPEEDUP) / rate(min(programs, wave))


def _covers(width: int) -> list[tuple[int, int]]:
    """(block, tail) pairs of powers of two that cover a row: the next power of two, and where the row
    passes a power of two by at most half of it, that one and a smaller tail (5120: 8192, or 4096 + 1024)."""
    block = _pow2(width)
    tail = _pow2(width - block // 2) if block > 1 else block
    return [(block, 0)] + ([(block // 2, tail)] if tail < block // 2 else [])


def _one_wave(g: Gpu, programs: int, warps: int, values: int) -> int:
    """The registers a thread may use so that a launch of `programs` fits in one wave where its warps allow that, if
    a thread's `values` leave them enough (0: no cap). A launch a few programs short of a wave waits a whole program
    for its last ones: RMS norm f16 1024 x 5120 took 65 registers to bf16's 64, fitting 7 programs an SM where bf16 fit
    8, and ran 1.20x slower (H200)."""
    need = _cdiv(programs, g.sms)
    cap = min(255, g.regs // (32 * warps * need) // 8 * 8)  # registers are allocated 8 a thread
    return cap if need <= min(g.ctas, g.warps // warps) and values + 24 <= cap < 255 else 0  # the row in registers


def _whole_rows(op: str, group: int, n_cols: int, itemsize: int, lead: int, g: Gpu, n_rows: int):
    """Whole-row candidates in order of preference: where there are more rows than SMs, a block and a tail
    before one block for the norms, 16-bit rows and rows off 16 bytes (masked lanes cost registers, so occupancy,
    but no bytes; measured on an H200 they cost time too: layer norm f32 32768 x 11008 30% faster as 8192 + 4096
    than as 16384, softmax and layer norm f16 32768 x 768 9-28% as 512 + 256; but aligned f32 softmax and
    cross-entropy 3-5% slower),
    then ROWS (up to `group`) nearest to programs of PROGRAM_BYTES, then fewest warps (the most of the row per
    thread, up to THREAD_BYTES; for RMS norm first the fewest that hold at most RMS_BYTES a thread, up to 16).
    A launch of at most one program per SM is bound by its programs' latency, not by bytes in flight (the
    time is the same for every candidate): there each program should do the least. Rows are grouped only
    as far as every SM still gets a program (128 rows of 128: a row per program on 128 SMs, not 16 on 8),
    and the threads are about LONE_THREADS * sqrt(tile bytes): a lone program's latency grows with the bytes
    each thread walks through and with the warps its reductions cross, a * bytes / threads + b * threads,
    least at sqrt(a / b * bytes) threads. A norm's threads also load the weight (and bias) after the reduction,
    a second dependent step that more threads shorten: there each thread holds NORM_LONE bytes, up to 16 warps
    (measured on an H200 in graphs of launches: layer norm f32 1 x 4096 2.21 us at 16 warps, 2.50 at 32; 8 x 16384
    5.01 at 16, 6.54 at 32), and a block of up to 1 KB keeps one warp. A lone block over LONE_BYTES is left to
    loops and splits."""
    preferred = max(1, min(PROGRAM_BYTES // (n_cols * itemsize), n_rows // g.sms))
    covers = _covers(n_cols + lead)
    tail_first = n_rows > g.sms and (op in NORMS or itemsize < 4 or lead)
    for block, tail in covers[::-1] if tail_first else covers:
        width = block + tail
        if width > MAX_ROW[op]:
            continue
        options = [1 << k for k in range(_pow2(group).bit_length()) if (1 << k) * width <= max(width, 16384)]
        for rows in sorted(options, key=lambda r: (abs(math.log2(r / preferred)), r)):
            tile, programs = rows * width * itemsize, _cdiv(n_rows, rows)
            lone = programs <= g.sms
            if lone and tile > LONE_BYTES:
                continue
            best = LONE_THREADS * math.sqrt(tile) if op not in NORMS else \
                32 if tile <= 32 * 32 else min(tile / NORM_LONE, 16 * 32)
            order = sorted((32, 16, 8, 4, 2, 1), key=lambda w: abs(math.log2(32 * w / best))) if lone else \
                (1, 2, 4, 8, 16, 32)
            if op == "rmsnorm" and not lone:  # first the fewest warps that hold at most RMS_BYTES a thread, up to 16
                order = sorted(order, key=lambda w: (w < 16 and tile > 32 * w * RMS_BYTES, w))
            for warps in order:
                # rows off 16 bytes: a tail too short for a vector a thread grows to one, so that a row the lead
                # carries past a power of two is not a block twice its size (H200, softmax 16-bit and f32 rows of
                # 513-4095 at 4096 and 32768 rows, tail first: 0.99-1.67x; aligned rows' tails as before, unmeasured)
                t = max(tail, 32 * warps * VECTOR // (rows * itemsize)) if tail and lead else tail
                if t >= block:
                    continue
                tile = rows * (block + t) * itemsize
                per_thread, values = tile // (32 * warps), rows * (block + t) // (32 * warps)  # bytes, f32 values
                per_sm = resident(g, warps, registers(values))
                streaming = programs > STREAM_WAVES * g.sms * per_sm and tile <= 2 * 32 * STREAM_BYTES
                crowded = op in NORMS and not lone and n_rows >= CROWDED * g.sms * g.ctas
                paired = crowded and rows == warps and tile < 2 * MIN_WARPS * 512
                too_few = warps < (2 if streaming or paired else MIN_WARPS) and tile >= MIN_WARPS * 512 or \
                    crowded and warps < 2
                if per_thread > THREAD_BYTES or per_thread < min(VECTOR, tile // 32) or too_few or \
                        t and rows * t * itemsize < 32 * warps * VECTOR:  # a tail gives every thread a vector
                    continue
                if per_sm:
                    row_bytes = n_cols * itemsize
                    yield Plan("rows", block, warps, rows=rows, tail=t, regs=_one_wave(g, programs, warps, values),
                               seconds=seconds(g, programs, per_sm, min(rows, n_rows) * row_bytes,
                                               TRAFFIC[op] * n_rows * row_bytes, stores=op != "cross_entropy"))


def _looped(op: str, n_rows: int, n_cols: int, itemsize: int, lead: int, g: Gpu):
    """One program per row. More warps mean fewer rows in flight, so more of the second pass hits L2; but
    between its steps a program reduces and waits, so a lone program per SM, or programs started together,
    leave its memory idle there (WAIT; measured on an H200: rows of 50257 f32 ran at 44% of copy with one
    32-warp program per SM, 62-65% with two of 16 warps, while such rows still loaded through a run-time check
    per group). Most warps first where a second pass re-reads the rows: the model counts L2 hits in proportion
    to how much of the window fits, which overstates what a window larger than L2 keeps, so it undervalues the
    smaller windows of more warps (measured: 16 warps 3-25% faster than the 8 the model had within TOLERANCE,
    layer norm f16 4096x32768 and bf16 1024x32768, rmsnorm bf16 1024x262144, softmax f16 4096x262144 and f32
    4096x128256); fewest first for cross-entropy, which reads once (4-16 warps within 1.5% there); 32 for the
    F32_LOOPS."""
    row_bytes, elems = n_cols * itemsize, SHIFTED_ELEMS if lead else LOOP_ELEMS
    order = (4, 8, 16, 32) if op == "cross_entropy" else (32, 16, 8, 4)
    for warps in (32,) if itemsize == 4 and (op, lead > 0) in F32_LOOPS else order:
        block = elems * 32 * warps
        per_sm = resident(g, warps, registers(elems))
        window = min(n_rows, g.sms * per_sm) * row_bytes
        hit = min(1.0, L2_SHARE * g.l2_bytes / window) if op != "cross_entropy" else 0.0
        total = n_rows * row_bytes
        reread = total if op != "cross_entropy" else 0.0
        yield Plan("looped", block, warps, seconds=seconds(
            g, n_rows, per_sm, min(block, n_cols + lead) * itemsize,
            (TRAFFIC[op] - 1) * total + total + reread * (1 - hit), reread * hit, stores=False))


def _split(op: str, n_rows: int, n_cols: int, itemsize: int, lead: int, g: Gpu):
    """Chunks of a row on their own programs, fewest chunks first, up to one wave of programs: a split fills
    SMs that whole rows leave idle, and beyond a wave every SM is full. The second kernel re-reads the input
    (in reverse order: what L2 still holds first), or for cross-entropy only the partial statistics. Both
    kernels loop over their chunks, and a launch of one wave starts its programs together (`seconds`)."""
    total, elems = n_rows * n_cols * itemsize, SHIFTED_ELEMS if lead else LOOP_ELEMS
    hit = min(1.0, L2_SHARE * g.l2_bytes / total)
    for warps in (4, 8, 16):
        block = elems * 32 * warps
        per_sm = resident(g, warps, registers(elems))
        parts, seen = 2, 0
        while parts <= MAX_PARTS:
            chunk = _cdiv(_cdiv(n_cols + lead, parts), block) * block
            actual = _cdiv(n_cols + lead, chunk)
            parts *= 2
            if actual < 2 or actual == seen or actual * n_rows > g.sms * per_sm:  # no split left, the same
                break  # chunks as the last candidate's, or more than a wave: the GPU is full already
            seen = actual
            programs = actual * n_rows
            t = LAUNCH + seconds(g, programs, per_sm, block * itemsize, total, stores=False)
            if op != "cross_entropy":
                t += seconds(g, programs, per_sm, block * itemsize, total * (1 - hit) + total, total * hit,
                             stores=False)
            yield Plan("split", block, warps, parts=actual, chunk=chunk, seconds=t)


@functools.lru_cache(maxsize=4096)
def plan(op: str, n_rows: int, n_cols: int, itemsize: int, shift: bool, g: Gpu = Gpu(), grouped: bool = True) -> Plan:
    """The configuration of a row op ("softmax", "cross_entropy", "norm" or "rmsnorm") on n_rows x n_cols elements of
    `itemsize` bytes. With `shift`, rows start off a 16-byte boundary and a block covers 16 bytes more;
    without `grouped`, a program takes one row. The ALONE ops' long rows leave the model's group."""
    options = candidates(op, n_rows, n_cols, itemsize, shift, g, grouped)
    best = min(c.seconds for c in options)
    p = next(c for c in options if c.seconds <= best * TOLERANCE)
    if op not in ALONE or p.kind != "rows" or p.rows == 1 or n_cols * itemsize < PROGRAM_BYTES:
        return p
    warps = max(1, p.warps // p.rows)  # each row alone, on the warps it had
    return replace(p, rows=1, warps=warps, regs=_one_wave(g, n_rows, warps, (p.block + p.tail) // (32 * warps)))


def candidates(op: str, n_rows: int, n_cols: int, itemsize: int, shift: bool, g: Gpu = Gpu(),
               grouped: bool = True) -> list[Plan]:
    """Every plan `plan` chooses from, in its order of preference, each with the model's time."""
    lead = 16 // itemsize - 1 if shift else 0
    return [*_whole_rows(op, n_rows if grouped else 1, n_cols, itemsize, lead, g, n_rows),
            *_looped(op, n_rows, n_cols, itemsize, lead, g),
            *_split(op, n_rows, n_cols, itemsize, lead, g)]


# ---- launching ------------------------------------------------------------------------------------
#
# An op lists its launches as steps (kernel, grid, args, meta). In args, `_In(i)` stands for value i of the
# call: its inputs, then per-call scalars (eps), then its outputs; everything else is fixed by the shape.
# The general path runs the steps through `kernel[grid]`. On the GPU it then binds them to their compiled
# kernels and caches them per (op, shape, strides, dtypes, device), so that the next call of that key only
# allocates its outputs, reads the data pointers and launches: no reshapes, no planning, no specialization
# key. A call whose tensors are not 16-byte aligned (the bound specializations assume they are) takes the
# general path.


@dataclass(frozen=True)
class _In:
    i: int


A, B, C, D, E, F = (_In(i) for i in range(6))
_fast: dict = {}  # key -> _bound(...); an entry is only ever added, and two threads adding one add equal ones


def _bind(kernel, args: tuple, meta: dict, device: int):
    """The launch function (stream, values, *grid) of the specialization these arguments select: the same
    compiled binary as the kernel's own launches, loaded into the device's context."""
    binary = kernel.binary(args, meta, driver.arch(device))
    previous = driver.current_context()
    driver.set_device(device)
    try:
        return jit.Launcher(binary, device).function()
    finally:
        driver.set_context(previous)


def _bound(steps, values: tuple, n_inputs: int, n_scalars: int, device: int, zeroed: tuple = ()):
    """The op's launches bound for one key, as straight-line Python made for them (as jit makes its launch path):
    call(*inputs, *scalars) reads the inputs' data pointers (None if one is not 16-byte aligned or on another device:
    the caller takes the general path, which says so), makes the outputs and launches each step with its constants in
    place; it returns the first output. An output is made as torch.empty_like of a one-element tensor of its dtype
    expanded to its shape (contiguous, and the cheapest allocation from Python); those in `zeroed` as zeros_like."""
    names = [f"a{i}" for i in range(n_inputs)] + [f"s{i}" for i in range(n_scalars)]
    made = values[n_inputs + n_scalars:]
    outputs = [f"o{i}" for i in range(len(made))]
    value = [f"p{i}" for i in range(n_inputs)] + names[n_inputs:] + [f"q{i}" for i in range(len(made))]
    scope = {"empty_like": torch.empty_like, "zeros_like": torch.zeros_like, "raw_stream": _raw_stream, "device": device}
    scope |= {f"t{i}": torch.empty(1, dtype=o.dtype, device=o.device).expand(o.shape) for i, o in enumerate(made)}
    if not all(torch.empty_like(scope[f"t{i}"]).is_contiguous() for i in range(len(made))):
        return None
    # not 16-byte aligned, or on another device than the first input (whose device the key holds)
    general = [f"({' | '.join(value[:n_inputs])}) & 15", *(f"a{i}.get_device() != device" for i in range(1, n_inputs))]
    lines = [f"def call({', '.join(names)}):",
             *[f"    p{i} = a{i}.data_ptr()" for i in range(n_inputs)],
             f"    if {' or '.join(general)}:", "        return None",
             *[f"    o{i} = {'zeros_like' if i in zeroed else 'empty_like'}(t{i})" for i in range(len(made))],
             *[f"    q{i} = o{i}.data_ptr()" for i in range(len(made))],
             "    stream = raw_stream(device)"]
    for k, (kernel, grid, args, meta) in enumerate(steps):
        scope[f"launch{k}"] = _bind(kernel, tuple(values[a.i] if isinstance(a, _In) else a for a in args), meta, device)
        passed = ", ".join(value[a.i] if isinstance(a, _In) else repr(a) for a in args)
        lines.append(f"    launch{k}(stream, ({passed},), {', '.join(map(str, grid))})")
    exec(compile("\n".join(lines + ["    return o0"]) + "\n", "<newt op>", "exec"), scope)
    return scope["call"]


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU builds, which never bind


def _run(key, steps, alloc, inputs: tuple, scalars: tuple = (), x: Tensor | None = None, zeroed: tuple = ()) -> Tensor:
    """The general path: launch the steps on the inputs and the outputs that alloc(x) makes (x: the caller's
    first input, before any reshape; it makes those at the indices in `zeroed` as zeros), then, on the GPU and with
    `key` (None: the inputs are copies, not the caller's tensors), bind them."""
    outputs = alloc(inputs[0] if x is None else x)
    values = inputs + scalars + outputs
    for kernel, grid, args, meta in steps:
        kernel[grid](*(values[a.i] if isinstance(a, _In) else a for a in args), **meta)
    if key is not None and _bindable(inputs + outputs):
        bound = _bound(steps, values, len(inputs), len(scalars), inputs[0].get_device(), zeroed)
        if bound is not None:
            _fast[key] = bound
    return outputs[0]


def _bindable(tensors: tuple) -> bool:
    """Launches on these tensors can be bound: on the GPU (not under NEWT_INTERPRET), 16-byte aligned."""
    return not jit.INTERPRET and tensors[0].is_cuda and all(t.data_ptr() % 16 == 0 for t in tensors)


def _like(x: Tensor) -> tuple:
    return (torch.empty_like(x, memory_format=torch.contiguous_format),)


# ---- the ops ----------------------------------------------------------------------------------------
def _rows(x: Tensor) -> Tensor:
    """x as [rows, n_cols] with unit column stride: a view where one exists (rows evenly spaced, as a batch of
    rows sliced from wider ones), else a contiguous copy."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    y = x.reshape(-1, x.shape[-1] if x.dim() else 1)
    return y if y.stride(1) == 1 else y.contiguous()


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _float(x: Tensor, what: str, fp8: bool = False) -> None:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16) + (FP8 if fp8 else ()):
        raise NkError(f"{what} takes f32, f16{', bf16 or fp8' if fp8 else ' or bf16'} tensors, got {x.dtype}")


def _configure(op: str, x2: Tensor, out_stride: int) -> tuple[Plan, dict]:
    """The plan for x2 ([rows, n_cols]) and the constexprs every row kernel takes: VEC (elements per 16
    bytes), SHIFT (rows start off 16-byte boundaries, and the output's rows at the same offsets) and DIV
    (a power of two up to VEC dividing n_cols and the strides: a width of 1000 or 3000 is not a multiple of
    16, which the launch specializes on, but whole 16-byte groups of it are still provably unmasked)."""
    rows, n = x2.shape
    s, stride = x2.element_size(), x2.stride(0)
    vec = 16 // s
    shift = stride % vec != 0 and stride % vec == out_stride % vec
    # several rows per program prove their vector accesses from the first row's: every row on a boundary
    grouped = shift or (stride % vec == 0 and out_stride % vec == 0)
    meta = dict(VEC=vec, SHIFT=shift, DIV=math.gcd(n, stride, out_stride, vec))
    return plan(op, rows, n, s, shift, gpu(x2.get_device()), grouped), meta


def _rows_meta(p: Plan, meta: dict) -> dict:
    return dict(BLOCK=p.block, TAIL=p.tail, ROWS=p.rows, num_warps=p.warps, maxnreg=p.regs, **meta)


def _looped_meta(p: Plan, meta: dict) -> dict:
    return dict(BLOCK=p.block, WARPS=p.warps, num_warps=p.warps, **meta)


def _key(x: Tensor, x2: Tensor, key):
    """The fast path's key, or None when x2 is a copy of x (a later x could not stand in for it)."""
    return key if x2.data_ptr() == x.data_ptr() else None


def _with_partials(size: int, alloc, x: Tensor) -> tuple:
    """The outputs and a workspace of `size` f32 partial statistics (split plans)."""
    return alloc(x) + (torch.empty(size, dtype=torch.float32, device=x.device),)


def _softmax_steps(x2: Tensor, log: bool) -> tuple:
    """The launches of (log-)softmax over x2 and the allocation of their outputs.
    Values: A = x, B = out, C = partials."""
    (rows, n), stride = x2.shape, x2.stride(0)
    p, meta = _configure("softmax", x2, n)
    mod = _stdlib("softmax")
    if p.kind == "rows":
        return [(mod.softmax, (_cdiv(rows, p.rows),), (A, B, rows, n, stride, n),
                 dict(LOG=log, **_rows_meta(p, meta)))], _like
    if p.kind == "looped":
        return [(mod.softmax_looped, (rows,), (A, B, n, stride, n), dict(LOG=log, **_looped_meta(p, meta)))], _like
    return [(mod.row_partials, (p.parts, rows), (A, C, n, stride, p.blocks), _looped_meta(p, meta)),
            (mod.softmax_split, (p.parts, rows), (A, B, C, n, stride, n, p.blocks),
             dict(BLOCK=p.block, PARTS=_pow2(p.parts), LOG=log, num_warps=p.warps, **meta))], \
        functools.partial(_with_partials, rows * p.parts * 2, _like)


def _softmax(x: Tensor, log: bool, key=None) -> Tensor:
    _float(x, "softmax")
    if x.numel() == 0:
        return torch.empty_like(x)
    x2 = _rows(x)
    return _run(_key(x, x2, key), *_softmax_steps(x2, log), (x2,), x=x)


def _losses(x: Tensor) -> tuple:
    return (torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device),)


def _cross_entropy_steps(x2: Tensor) -> tuple:
    """Values: A = logits, B = target, C = loss, D = partials."""
    (rows, n), stride = x2.shape, x2.stride(0)
    p, meta = _configure("cross_entropy", x2, stride)
    mod = _stdlib("softmax")
    if p.kind == "rows":
        return [(mod.cross_entropy, (_cdiv(rows, p.rows),), (A, B, C, rows, n, stride),
                 _rows_meta(p, meta))], _losses
    if p.kind == "looped":
        return [(mod.cross_entropy_looped, (rows,), (A, B, C, n, stride), _looped_meta(p, meta))], _losses
    return [(mod.row_partials, (p.parts, rows), (A, D, n, stride, p.blocks), _looped_meta(p, meta)),
            (mod.cross_entropy_split, (rows,), (A, B, C, D, p.parts, n, stride), dict(PARTS=_pow2(p.parts)))], \
        functools.partial(_with_partials, rows * p.parts * 2, _losses)


def _cross_entropy(logits: Tensor, target: Tensor, key=None) -> Tensor:
    _float(logits, "cross_entropy")
    if logits.numel() == 0:
        return _losses(logits)[0]
    x2, t = _rows(logits), target.reshape(-1)
    if t.dim() != 1 or t.shape[0] != x2.shape[0] or t.dtype not in (torch.int64, torch.int32):
        raise NkError(f"cross_entropy takes one int64 or int32 target per row: {x2.shape[0]} rows, "
                      f"target {tuple(target.shape)} {target.dtype}")
    if t.stride(0) != 1:
        t, key = t.contiguous(), None
    return _run(_key(logits, x2, key), *_cross_entropy_steps(x2), (x2, t), x=logits)


def _norm_steps(x2: Tensor, rms: bool, bias: bool) -> tuple:
    """Values: A = x, B = weight, C = bias, D = eps, E = out, F = partials."""
    (rows, n), stride = x2.shape, x2.stride(0)
    p, meta = _configure("rmsnorm" if rms else "norm", x2, n)
    mod = _stdlib("norm")
    if p.kind == "rows":
        return [(mod.norm, (_cdiv(rows, p.rows),), (A, B, C, E, rows, n, stride, n, D),
                 dict(RMS=rms, BIAS=bias, **_rows_meta(p, meta)))], _like
    if p.kind == "looped":
        return [(mod.norm_looped, (rows,), (A, B, C, E, n, stride, n, D),
                 dict(RMS=rms, BIAS=bias, **_looped_meta(p, meta)))], _like
    return [(mod.norm_partials, (p.parts, rows), (A, F, n, stride, p.blocks), dict(RMS=rms, **_looped_meta(p, meta))),
            (mod.norm_split, (p.parts, rows), (A, B, C, E, F, n, stride, n, p.blocks, D),
             dict(BLOCK=p.block, PARTS=_pow2(p.parts), BIAS=bias, num_warps=p.warps, **meta))], \
        functools.partial(_with_partials, rows * p.parts * 3, _like)


def _norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, rms: bool, key=None) -> Tensor:
    _float(x, "rmsnorm" if rms else "layernorm")
    if x.numel() == 0:
        return torch.empty_like(x)
    x2 = _rows(x)
    n = x2.shape[1]
    w, b = weight.contiguous(), (bias if bias is not None else weight).contiguous()
    if w.numel() != n or b.numel() != n:
        raise NkError(f"{'rmsnorm' if rms else 'layernorm'} of rows of {n} takes a weight (and bias) of {n}, "
                      f"got {weight.numel()}" + ("" if bias is None else f" and {bias.numel()}"))
    if w.data_ptr() != weight.data_ptr() or bias is not None and b.data_ptr() != bias.data_ptr():
        key = None
    return _run(_key(x, x2, key), *_norm_steps(x2, rms, bias is not None), (x2, w, b), (float(eps),), x)


def _row_reduce(x: Tensor, op: str, key=None) -> Tensor:
    _float(x, op)
    if x.numel() == 0:  # torch's results: 0 rows, or empty rows' 0 (sum), NaN (mean) or its error (amax)
        return getattr(torch, op)(x, -1)
    x2 = _rows(x)
    (rows, n), block = x2.shape, min(_pow2(x2.shape[1]), 4096)
    steps = [(_stdlib("reduce").row_reduce, (rows,), (A, B, n, x2.stride(0)),
              dict(BLOCK=block, OP=op, num_warps=max(4, min(16, block * x2.element_size() // 4096))))]
    return _run(_key(x, x2, key), steps, _reduced, (x2,), x=x)


def _reduced(x: Tensor) -> tuple:
    return (torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device),)


def _add(x: Tensor, y: Tensor, key=None) -> Tensor:
    bx, by = torch.broadcast_tensors(x, y)
    cx, cy = bx.contiguous(), by.contiguous()
    if cx.data_ptr() != x.data_ptr() or cy.data_ptr() != y.data_ptr() or cx.shape != x.shape or cy.shape != y.shape:
        key = None
    n, block = cx.numel(), 1024
    steps = [(_stdlib("add").add, (max(1, _cdiv(n, block)),), (A, B, C, n), dict(BLOCK=block, num_warps=4))]
    return _run(key, steps, _like, (cx, cy))


def _bias_gelu(x: Tensor, bias: Tensor, key=None) -> Tensor:
    if x.dim() == 0 or bias.shape != x.shape[-1:]:  # the kernel reads one bias per column, whatever its shape
        raise NkError(f"bias_gelu takes a bias of one value per column of x, {list(x.shape[-1:])}; "
                      f"got {list(bias.shape)}")
    cx, cb = x.contiguous(), bias.contiguous()
    if cx.data_ptr() != x.data_ptr() or cb.data_ptr() != bias.data_ptr():
        key = None
    n, block = cx.numel(), 1024
    steps = [(_stdlib("gelu").bias_gelu, (max(1, _cdiv(n, block)),), (A, B, C, n, cx.shape[-1]), dict(BLOCK=block))]
    return _run(key, steps, _like, (cx, cb))


def _transpose(x: Tensor, key=None) -> Tensor:
    if x.dim() != 2:
        raise NkError(f"transpose takes a 2-D tensor, got {x.dim()}-D")
    x, key = _transposable(x, key)
    (m, n) = x.shape
    return _run(key, [_transpose_step(A, B, m, n, x.stride(0), m, x.element_size())], _transposed, (x,))


def _transposable(x: Tensor, key) -> tuple[Tensor, object]:
    """x as the transpose kernel reads it, and the key to bind the launch by (None for a copy: not the caller's tensor).
    Rows of a view off 16-byte boundaries are copied: the analysis would take the first row's alignment for all
    (passes/axisinfo.py: the divisibility of rm[:, None] * x_stride), and M, N multiples of 16 prove the masks."""
    if x.stride(1) != 1 or x.stride(0) % (16 // x.element_size()) and not x.is_contiguous():
        return x.contiguous(), None
    return x, key


def _transpose_step(x: _In, out: _In, m: int, n: int, x_stride: int, out_stride: int, itemsize: int,
                    trans: bool = True) -> tuple:
    """The launch that writes x's [m, n], transposed where `trans`, into out (rows out_stride apart)."""
    bm = bn = TRANSPOSE_TILE[itemsize]
    return (_stdlib("transpose").transpose, (_cdiv(m, bm), _cdiv(n, bn)), (x, out, m, n, x_stride, out_stride),
            dict(BM=bm, BN=bn, TRANS=trans, num_warps=4))


# element bytes -> the square tile (H200, 4 warps, 1000^2 to 8192^2: fp8 1.0-1.1x at 64, f16 1.2x at 32 against 64)
TRANSPOSE_TILE = {4: 32, 2: 32, 1: 64}


def _transposed(x: Tensor) -> tuple:
    return (torch.empty((x.shape[1], x.shape[0]), dtype=x.dtype, device=x.device),)


# ---- the public ops: the bound path of a known key, else the general path ------------------------------
def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dimension."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.softmax(x)
    key = ("softmax", x.shape, x.stride(), x.dtype, x.get_device())
    bound = _fast.get(key)
    if bound is None or (out := bound(x)) is None:
        out = _softmax(x, False, key)
    return out


def log_softmax(x: Tensor) -> Tensor:
    """Log-softmax over the last dimension."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.log_softmax(x)
    key = ("log_softmax", x.shape, x.stride(), x.dtype, x.get_device())
    bound = _fast.get(key)
    if bound is None or (out := bound(x)) is None:
        out = _softmax(x, True, key)
    return out


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Per-row loss (reduction='none') over the last dimension of the logits, with int64 (or int32) class
    targets, in f32: logsumexp(row) - row[target]. A target of -100 (torch's ignore_index) gives 0, any other
    outside [0, n) NaN (torch raises there)."""
    if torch.compiler.is_compiling() or logits.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.cross_entropy(logits, target)
    key = ("cross_entropy", logits.shape, logits.stride(), logits.dtype, logits.get_device(), target.dtype,
           target.shape, target.stride())
    bound = _fast.get(key)
    if bound is None or (out := bound(logits, target)) is None:
        out = _cross_entropy(logits, target, key)
    return out


def layernorm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """Layer norm over the last dimension, with weight and (optional) bias."""
    if torch.compiler.is_compiling() or (x.requires_grad or weight.requires_grad or bias is not None and
                                         bias.requires_grad) and torch.is_grad_enabled():
        return torch.ops.newt.layernorm(x, weight, bias, eps)
    b = bias if bias is not None else weight
    key = ("layernorm", x.shape, x.stride(), x.dtype, x.get_device(), weight.dtype, weight.shape, weight.stride(),
           None if bias is None else (b.dtype, b.shape, b.stride()))
    bound = _fast.get(key)
    if bound is None or (out := bound(x, weight, b, eps)) is None:
        out = _norm(x, weight, bias, eps, False, key)
    return out


def rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMS norm over the last dimension, with weight."""
    if torch.compiler.is_compiling() or (x.requires_grad or weight.requires_grad) and torch.is_grad_enabled():
        return torch.ops.newt.rmsnorm(x, weight, eps)
    key = ("rmsnorm", x.shape, x.stride(), x.dtype, x.get_device(), weight.dtype, weight.shape, weight.stride())
    bound = _fast.get(key)
    if bound is None or (out := bound(x, weight, weight, eps)) is None:
        out = _norm(x, weight, None, eps, True, key)
    return out


def _reduce(x: Tensor, op: str) -> Tensor:
    key = (op, x.shape, x.stride(), x.dtype, x.get_device())
    bound = _fast.get(key)
    if bound is None or (out := bound(x)) is None:
        out = _row_reduce(x, op, key)
    return out


def sum(x: Tensor) -> Tensor:  # noqa: A001 - mirrors torch.sum over the last dim
    """Sum over the last dimension."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.sum(x)
    return _reduce(x, "sum")


def mean(x: Tensor) -> Tensor:
    """Mean over the last dimension."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.mean(x)
    return _reduce(x, "mean")


def amax(x: Tensor) -> Tensor:
    """Maximum over the last dimension."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.amax(x)
    return _reduce(x, "amax")


def add(x: Tensor, y: Tensor) -> Tensor:
    """x + y, broadcast, in x's dtype."""
    if torch.compiler.is_compiling() or (x.requires_grad or y.requires_grad) and torch.is_grad_enabled():
        return torch.ops.newt.add(x, y)
    key = ("add", x.shape, x.stride(), x.dtype, x.get_device(), y.shape, y.stride(), y.dtype)
    bound = _fast.get(key)
    if bound is None or (out := bound(x, y)) is None:
        out = _add(x, y, key)
    return out


def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """gelu(x + bias) (exact, erf form) with bias broadcast over the last dimension."""
    if torch.compiler.is_compiling() or (x.requires_grad or bias.requires_grad) and torch.is_grad_enabled():
        return torch.ops.newt.bias_gelu(x, bias)
    key = ("bias_gelu", x.shape, x.stride(), x.dtype, x.get_device(), bias.shape, bias.stride(), bias.dtype)
    bound = _fast.get(key)
    if bound is None or (out := bound(x, bias)) is None:
        out = _bias_gelu(x, bias, key)
    return out


def transpose(x: Tensor) -> Tensor:
    """A contiguous transpose of a 2-D tensor (rows may be strided)."""
    if torch.compiler.is_compiling() or x.requires_grad and torch.is_grad_enabled():
        return torch.ops.newt.transpose(x)
    key = ("transpose", x.shape, x.stride(), x.dtype, x.get_device())
    bound = _fast.get(key)
    if bound is None or (out := bound(x)) is None:
        out = _transpose(x, key)
    return out


# ---- torch custom ops: torch.ops.newt.*, traced by torch.compile without a graph break ------------------
def _register(fn, fake, ref) -> None:
    """`fn` as the custom op torch.ops.newt.<its name>, with `fake` for tracing (fake and meta tensors) and the
    gradient of `ref`, the same op in torch (`_ref_grad`). The ops above call it while torch.compile traces and
    where autograd wants a gradient (an input that requires one, grad mode on); otherwise they skip the dispatcher
    (~50 us a call)."""
    op = torch.library.custom_op(f"newt::{fn.__name__}", fn, mutates_args=())
    op.register_fake(fake)
    op.register_autograd(_ref_grad(ref), setup_context=_save_inputs)


def _save_inputs(ctx, inputs, output) -> None:  # the tensors through autograd's saving, the rest (eps) in place
    ctx.tensors = [isinstance(x, Tensor) for x in inputs]
    ctx.others = [None if t else x for x, t in zip(inputs, ctx.tensors)]
    ctx.save_for_backward(*(x for x, t in zip(inputs, ctx.tensors) if t))


def _ref_grad(ref):
    """The backward of an op: the vector-Jacobian product of `ref` (torch's own op, the same math) recomputed at the
    saved inputs, so that a newt forward trains with torch's gradients."""
    def backward(ctx, grad):
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved).detach().requires_grad_(need) if t else x
                  for t, x, need in zip(ctx.tensors, ctx.others, ctx.needs_input_grad)]
        wanted = [x for x, need in zip(inputs, ctx.needs_input_grad) if need]
        with torch.enable_grad():
            grads = iter(torch.autograd.grad(ref(*inputs), wanted, grad))
        return tuple(next(grads) if need else None for need in ctx.needs_input_grad)
    return backward


def _fake_add(x: Tensor, y: Tensor) -> Tensor:
    return x.new_empty(torch.broadcast_shapes(x.shape, y.shape))


def _ref_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """torch's loss over the rows of any leading shape, in f32 as ops.cross_entropy gives it."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1).long(),
                                             reduction="none").reshape(logits.shape[:-1])


def _ref_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5, rms: bool = False) -> Tensor:
    """torch's layer or RMS norm in f32 (ops' norms take a weight and bias of other dtypes than x), in x's dtype."""
    f = torch.nn.functional
    w, b = weight.float(), None if bias is None else bias.float()
    y = f.rms_norm(x.float(), x.shape[-1:], w, eps) if rms else f.layer_norm(x.float(), x.shape[-1:], w, b, eps)
    return y.to(x.dtype)


for _fn, _fake, _ref in (
        (softmax, lambda x: _like(x)[0], lambda x: torch.softmax(x, -1)),
        (log_softmax, lambda x: _like(x)[0], lambda x: torch.log_softmax(x, -1)),
        (cross_entropy, lambda logits, target: _losses(logits)[0], _ref_cross_entropy),
        (layernorm, lambda x, weight, bias, eps=1e-5: _like(x)[0], _ref_norm),
        (rmsnorm, lambda x, weight, eps=1e-6: _like(x)[0],
         lambda x, weight, eps=1e-6: _ref_norm(x, weight, None, eps, rms=True)),
        (sum, lambda x: _reduced(x)[0], lambda x: x.sum(-1)), (mean, lambda x: _reduced(x)[0], lambda x: x.mean(-1)),
        (amax, lambda x: _reduced(x)[0], lambda x: x.amax(-1)),
        (add, _fake_add, lambda x, y: (x + y).to(x.dtype)),
        (bias_gelu, lambda x, bias: _like(x)[0], lambda x, bias: torch.nn.functional.gelu(x + bias).to(x.dtype)),
        (transpose, lambda x: _transposed(x)[0], lambda x: x.t())):
    _register(_fn, _fake, _ref)


# ---- matmul -------------------------------------------------------------------------------------------
def _arch(t: Tensor) -> str:
    """The GPU the tensor is on, or the one the interpreter plans for."""
    return driver.arch(t.get_device()) if t.is_cuda else "sm_90a"


# The tiles a large product may take, (BM, BN, warps, ring slots): each one's TFLOP/s on a full H200 per wave of tiles
# (f16; the persistent kernel with its producer warpgroup over 36 products of 1,536-8,192 rows and columns and K of
# 2,048-8,192, more tiles than SMs, fitted at 746, 677 and 503 with a 4% spread; a wave or less of 128x256 a program
# each, or of 128x128 with a producer, runs at about the same; 64x64 kept at its old share of 64x128's:
# bench/RESULTS.md, thirty-second session). A bigger tile reads less per product but leaves more SMs idle on its last
# wave; _matmul_config weighs the two.
MATMUL_TILES = {(128, 256, 8, 4): 746, (128, 128, 4, 4): 677, (64, 128, 4, 6): 503, (64, 64, 4, 6): 442}
SK_STEPS = 32  # K steps (128 bytes of a row's K each) from which the largest tile may go stream-K (matmul_sk): its
# grid is a program per SM, where a smaller tile loses the overlap of the programs it would share an SM with, and the
# persistent kernel's producer does better (H200, f16, stream-K against the persistent kernel: 2000x4100x1024 in
# 128x256, 16 steps, 217 / 241; in 64x128 or 64x64 tiles 128x11008x4096 183 / 253, bf16 256x11008x4096 330 / 459,
# 1536x1536x4096 370 / 429; 128x128 tiles over 36 products 0.62-0.97x 128x256's)
SK_RATE = 685  # stream-K's TFLOP/s per wave over the tiles it runs whole; the split ones run as if SK_COST steps longer
SK_COST = 13  # (a part through memory, read by the program that stores the tile): fitted over the 36 products of
# MATMUL_TILES' rates with a 3.9% spread (K of 32-128 steps, 140-576 tiles)
SPLIT_BYTES = 4096  # the least of a row's K (in bytes of A) that a split-K share takes (`_splits`)
DECODE = 64  # rows of A up to which a product decodes: its programs stream B in column strips (`_matmul_config`)
NARROW = 64  # columns of B up to which A streams from memory: where its rows would take more than a wave of 64x64
NARROW_TILE = (128, 64, 4, 8)  # tiles: there 128 rows a program, in one warpgroup, 8 slots deep (sm_90a; H200, 32
# random products of 1-64 columns, 8,600-262,144 rows, f16, bf16 and fp8: 1.02-1.58x 64x64 in 6 slots, geomean 1.16;
# on fewer rows, a wave of 64x64 or less, 0.87-1.18x, geomean 1.00: twice the programs pull A there)
SHORT_K = 2  # K steps up to which a lone program per SM leaves its first loads and its stores exposed, where tiles of
# two or more programs an SM overlap them (H200, f16, K of 64 and 128 at 4096-16384 rows: 128x128 1.11-1.20x 128x256,
# which still wins by 15% at 4 steps)


def _matmul_config(m: int, n: int, k: int, itemsize: int, arch: str = "sm_90a", sms: int = Gpu.sms,
                   ws: int = 0) -> dict:
    """Tile sizes by shape. Few rows (decoding) stream B from memory: the width whose programs fill the SMs in the
    fewest waves of columns (the wider on a tie: A is read once per program), and up to 6 slots of 256 (else 128) K a
    step, for 150-200 KB of loads in flight per SM (measured at 16x4096x4096 and 64x8192x8192: 1.2-1.26x the 4-slot
    ring of 128). Otherwise the tile of MATMUL_TILES with the most work done: its rate times the share of its waves'
    products that are C's (M * N over waves * SMs * the tile: SMs left idle, and tiles past C's edges, do none; 4096
    x 64 takes 64x64, not 128x256 with three quarters of each tile outside), or stream-K's (`_tile_rate`). So 4096^3
    takes 128x256 (512 tiles, 97% of 4 waves), 1024^3 64x128 (128 tiles, where 128x256 would leave 100 SMs idle),
    3072^3 128x256 stream-K (whole, 73% of 3 waves), and 3584x4096x2048 128x128 (448 tiles, 85% of 4 waves; H200:
    1.10x stream-K). 128x256 keeps a 4-slot ring: 3 slots leave asynchronous wgmma one tile of prefetch (504 against
    621 TFLOP/s at 4096^3 in the eighth session). f32 (tf32) halves BK, fp8 doubles it. With `ws` (a producer
    warpgroup; the output's element bytes), the ring stays in use while the tile's output goes out through shared
    memory in column halves (HALVES), so the slots share the limit with half a tile.
    A K loop of at most SHORT_K steps takes a tile two programs an SM can share, and without `ws` no more slots than
    K steps and one (4096x4096x64: 128x128 in 2 slots, 129 TFLOP/s, where 128x256 ran 109 and 128x128 in 4 slots 90).
    Few columns (NARROW) stream A as few rows stream B: past a wave of 64x64 tiles, in NARROW_TILE's deeper ring."""
    smem_limit = smem.LIMIT.get(arch, 48 * 1024)
    if m <= DECODE:  # (wgmma's fp8 takes blocks of 64 rows: those past M cost tensor time, no bytes: TMA fills zeros)
        bm = 64 if itemsize == 1 else max(16, _pow2(m))
        bn = min((32, 64), key=lambda bn: (_cdiv(_cdiv(n, bn), sms) * bn, -bn))
        bk = 256 if 6 * (bm + bn) * 256 * itemsize <= smem_limit else 128
        if itemsize == 1:  # fp8 keeps f16's K a step here: 6 slots of its 64-row A blocks (1.0-1.2x 4 slots of 512 K)
            bk //= 2
        cfg = dict(BM=bm, BN=bn, BK=bk, num_warps=4, num_stages=6)
    else:
        steps = _cdiv(k, 128 // itemsize)

        def work(tile: tuple) -> float:
            tiles = _cdiv(m, tile[0]) * _cdiv(n, tile[1])
            return _tile_rate(tiles, steps, sms, arch, tile[:2])[0] * m * n / (tiles * tile[0] * tile[1])

        short = steps <= SHORT_K
        narrow = n <= NARROW and _cdiv(m, 64) > sms and not short and arch == "sm_90a" and itemsize <= 2
        bm, bn, warps, stages = NARROW_TILE if narrow else \
            max((t for t in MATMUL_TILES if not short or _per_sm(*t[:3]) >= 2), key=work)
        cfg = dict(BM=bm, BN=bn, BK=64, num_warps=warps, num_stages=stages)
    cfg["BK"] = cfg["BK"] * 2 // itemsize  # 128 bytes of K a step (wgmma's swizzled rows), 256 with few rows
    cfg["BK"] = min(cfg["BK"], max(16, _pow2(k)))
    ring = (cfg["BM"] + cfg["BN"]) * cfg["BK"] * itemsize  # one slot of the A and B rings
    out = cfg["BM"] * cfg["BN"] * ws // 2
    cap = (smem_limit - out) // ring
    if not ws:  # no more slots than K steps and one: the rest would never fill (with ws, the next tile's K steps do)
        cap = min(cap, _cdiv(k, cfg["BK"]) + 1)  # and would only crowd out a second program per SM
    cfg["num_stages"] = max(2, min(cfg["num_stages"], cap))
    return cfg


def _tile_rate(tiles: int, steps: int, sms: int, arch: str, tile: tuple) -> tuple[float, int]:
    """The TFLOP/s of `tiles` of `tile` (BM, BN) as if every one were C's, and the tiles that go stream-K for it: whole
    tiles run at MATMUL_TILES' rate over the waves they take (SMs left idle on the last do none); stream-K, where it is
    faster, at SK_RATE with the tiles it splits SK_COST steps longer. Stream-K takes none off sm_90a (measured on an
    H200 only; mma.sync's 128x256 tile spills in it), where the K loop is short or the tile not the largest (SK_STEPS),
    or where the tiles are one wave or fewer (every tile split over more programs: H200, f16, 0.52-0.97x a program each
    over 14 products); else those past the last full wave but one, so that each program's run is one to two tiles long
    (as CUTLASS's hybrid stream-K: a run of a few steps would add a part through memory for little work)."""
    whole = next(r for t, r in MATMUL_TILES.items() if t[:2] == tile) * tiles / (_cdiv(tiles, sms) * sms)
    if arch != "sm_90a" or tiles <= sms or steps < SK_STEPS or tile != max(MATMUL_TILES, key=lambda t: t[0] * t[1])[:2]:
        return whole, 0
    sk = tiles % sms + sms if tiles >= 2 * sms else tiles
    split = SK_RATE / (1 + sk * SK_COST / (tiles * steps))
    return (split, sk) if split > whole else (whole, 0)


def _per_sm(bm: int, bn: int, warps: int, smem_bytes: int = 0, arch: str = "sm_90a") -> int:
    """The programs of a BM x BN tile on `warps` warps an SM holds: by a thread's accumulator registers and ~26 more,
    and by the shared memory of its ring (smem_bytes; a program may take all the SM has, less 1 KB)."""
    held = smem.LIMIT.get(arch, 48 * 1024) // smem_bytes if smem_bytes else Gpu.ctas
    return min(held, resident(Gpu(), warps, bm * bn // (32 * warps) + 26))


def _splits(tiles: int, k_bytes: int, sms: int, per_sm: int = 1, arch: str = "sm_90a") -> int:
    """The programs each tile's K is split over (stdlib matmul_split): as many as fill one wave, each share SPLIT_BYTES
    of a row's K or more, so only tiles that fill half of the SMs or less split; where an SM holds per_sm programs of
    the tile, as many as fill those too, each share twice as long: a second program on a busy SM gains less than an
    idle SM does (H200, f16 and bf16, 64x64 tiles two an SM, 36-128 tiles, K 8192-16384: 1.07-1.31x the split of one
    program an SM, one product 0.98x; shares of SPLIT_BYTES at 96-130 tiles lost up to 7%); none off sm_90a (measured
    on an H200 only). The shares add their sums by vector reductions (red.v4, four f32 a lane), which with a share's
    fixed costs pay where the shares are long (H200, the unsplit tile split: f16 300x260x8192 in 5 1.6x, 16x1024x16384
    in 4 1.83x, 256x256x32768 in 8 3.5x, 512x512x16384 in 2 1.42-1.47x, 640x384x8192 1.28x, 256x1024x4096 1.05x,
    48x2048x8192 1.10x; fp8 512x512x16384 1.30x; but shares of 2 KB lost: f16 512x512x2048 0.79x, 128x2048x2048 0.89x,
    fp8 512x512x4096 0.86x). Tiles made bigger so as to be split lost too (333x4096x1000 to 512x512x16384, 0.2-0.66x,
    with an atomic a value; 512x4096x11008 in 128x256 split 2 ran 1.05x 128x128 unsplit, 128x11008x4096 0.88x): ops
    splits the tile chosen unsplit."""
    if arch != "sm_90a":
        return 1
    return max(1, min(sms // tiles, k_bytes // SPLIT_BYTES), min(sms * per_sm // tiles, k_bytes // (2 * SPLIT_BYTES)))


def _tma_ready(t: Tensor) -> bool:
    """A 2-D operand whose tiles the matmul's specialization copies by TMA on sm_90a (passes/pipeline.py): a 16-byte
    aligned base, a unit stride, and the other one 16 bytes apart and a multiple of 8 elements (a launch proves 16 and
    odd multiples of 8)."""
    s0, s1 = t.stride()
    e = max(8, 16 // t.element_size())
    return t.data_ptr() % 16 == 0 and (s1 == 1 and s0 % e == 0 < s0 or s0 == 1 and s1 % e == 0 < s1)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
           out_dtype: torch.dtype | None = None, scale_a: torch.Tensor | None = None,
           scale_b: torch.Tensor | None = None) -> torch.Tensor:
    """(a @ b) * scale_a * scale_b + bias over the columns, then relu or gelu, for 2-D f16, bf16 or f32 tensors (f32
    runs as tf32), or fp8 (float8_e4m3fn, float8_e5m2); any strides, so transposed views need no copy. The product
    is in `out_dtype` (f16, bf16 or f32): by default a's dtype, bf16 for fp8. The scales, both or neither, are f32
    tensors as torch._scaled_mm takes them: one value each, or one per row of a ([M] or [M, 1]) and per column of b
    ([N] or [1, N]). On sm_90a fp8 runs at its own rate, which reads both tiles K-contiguous (a row-major, b
    column-major: b = bt.t(), as torch._scaled_mm takes it): other layouts are copied so first; and in large
    products or long K loops, operands whose rows sit off 16 bytes (which TMA cannot copy) are first copied into aligned
    rows."""
    if torch.compiler.is_compiling() or (a.requires_grad or b.requires_grad or bias is not None and bias.requires_grad
                                         or scale_a is not None and scale_a.requires_grad
                                         or scale_b is not None and scale_b.requires_grad) and torch.is_grad_enabled():
        return torch.ops.newt.matmul(a, b, bias, activation, out_dtype, scale_a, scale_b)
    key = ("matmul", a.shape, a.stride(), a.dtype, b.shape, b.stride(), b.dtype, a.get_device(), activation,
           *((t.shape, t.stride(), t.dtype) if t is not None else None for t in (bias, scale_a, scale_b)), out_dtype)
    bound = _fast.get(key)
    inputs = tuple(t for t in (a, b, bias, scale_a, scale_b) if t is not None)
    if bound is None or (out := bound(*inputs)) is None:
        out = _matmul(a, b, bias, activation, out_dtype, scale_a, scale_b, key)
    return out


def _matmul_plan(a: Tensor, b: Tensor, sms: int, arch: str, out: int) -> tuple[dict, int, int, int]:
    """The constexprs, the grid, the stream-K tiles and the K splits of a @ b: a program per tile; each tile's K steps
    split over programs where the tiles are too few for the SMs (`_splits`); stream-K where whole tiles leave the SMs
    idle (`_tile_rate`); else, with more tiles than SMs on sm_90a and TMA copies of 16-bit A and B (or fp8
    ones wgmma takes as they are), a program per SM walking the tiles, with a producer warpgroup that loads the next
    tile's K steps while the consumers store this one (H200, f16 and bf16, 4096^3, 8192^3, 2048x14336x4096,
    16384x4096x4096: 1.00-1.03x a program a tile; 4096x4096x512 1.09x; fp8 4096^3 and 8192^3 1.06x). tf32's B is not
    read by asynchronous wgmma from its TMA copy, so no producer takes its loop. A wave of tiles or fewer takes the
    producer too where one consumer warpgroup holds 128 rows (a 16-bit 128x128 tile on 4 warps), which without it
    waits on its own loads: 1.17-1.27x on 14 products of 64-128 tiles (H200, f16 and bf16, 512x4096x8192 to
    1024x2048x16384); two warpgroups (128x256) cover each other's waits (0.97-1.03x), and 64 rows gain nothing."""
    (m, k), n = a.shape, b.shape[1]
    item = _mma_bytes(a, b, arch)
    cfg = _matmul_config(m, n, k, item, arch, sms)
    tiles = _cdiv(m, cfg["BM"]) * _cdiv(n, cfg["BN"])
    sk = _tile_rate(tiles, _cdiv(k * item, 128), sms, arch, (cfg["BM"], cfg["BN"]))[1] \
        if m > DECODE and n > NARROW else 0  # (few rows or few columns stream an operand: never stream-K)
    ring = (cfg["BM"] + cfg["BN"]) * cfg["BK"] * item * cfg["num_stages"]
    # a second program an SM counts where it was measured: 16-bit products past DECODE rows (tf32's decoding tiles
    # would split too, unmeasured)
    per_sm = _per_sm(cfg["BM"], cfg["BN"], cfg["num_warps"], ring, arch) if item == 2 and m > DECODE else 1
    splits = _splits(tiles, k * item, sms, per_sm, arch)
    lone = item == 2 and splits == 1 and (cfg["BM"], cfg["num_warps"]) == (128, 4)  # one warpgroup of 128 rows
    if sk or tiles <= sms and not lone or m <= DECODE or arch != "sm_90a" or item > 2 or \
            not (_tma_ready(a) and _tma_ready(b)):
        return dict(GROUP_M=8, **cfg), sms if sk else tiles * splits, sk, splits
    cfg = _matmul_config(m, n, k, item, arch, sms, ws=out)  # the same tile, its ring beside the staged output
    return dict(GROUP_M=8, WS=True, HALVES=True, **cfg), min(tiles, sms), 0, 1


def _mma_bytes(a: Tensor, b: Tensor, arch: str) -> int:
    """The bytes an operand element weighs in _matmul_config (K a step, ring slots): fp8 one in wgmma, whose fp8 tiles
    hold K contiguous (sm_90a, a row-major, b column-major); elsewhere mma.sync takes it converted to f16 pair by
    pair, which holds twice the registers of f16's K step, so as 4 (half that step: 128x256 spills at f16's)."""
    if a.element_size() > 1:
        return a.element_size()
    return 1 if arch == "sm_90a" and a.stride(1) == 1 and b.stride(0) == 1 else 4


def _scale_stride(s: Tensor, n: int, what: str) -> int:
    """The stride between a scale's values: 0 for one value (it scales everything), else its one dim's of n."""
    if s.dtype != torch.float32 or s.numel() not in (1, n) or len([x for x in s.shape if x > 1]) > 1:
        raise NkError(f"matmul's {what} is f32 with one value or {n}, got {s.dtype} of shape {list(s.shape)}")
    return 0 if s.numel() == 1 else next(st for size, st in zip(s.shape, s.stride()) if size > 1)


COPY_MIN = 2**28  # multiply-adds of a product from which an operand TMA cannot copy is copied into aligned rows first
COPY_REUSE = 64  # ... if the product's other side is this wide at least (the copy's bytes against the product's work;
# H200, f16, at 256 against 64: 1079x254x4866 21.8 -> 68.4 TFLOP/s, 4097x128x4097 36.8 -> 77.3, 64x4097x4097 31.0 ->
# 32.5); and in a product that decodes (DECODE), whatever its size: its programs stream B through plain loads that
# each wait (cp.async's fallback), slower than a copy and TMA (H200, copied against not: f16 1x4095x4096 1.30x,
# 32x5001x2048 1.67x, 1x1001x1001 1.68x; bf16 1x50257x4096 1.16x, 10x13083x4187 1.41x, 15x3015x1163 1.62x; 4x2047x511
# 1.01x); and where the product's K loop takes COPY_STEPS steps of 128 bytes or more, whatever its size:
COPY_STEPS = 4  # each step of the fallback waits for its loads, where the copy's fixed cost (a launch) is paid once
# (H200, 50 products of 65-7924 rows and 16-6441 columns off 16 bytes, copied against not: 27 of 4 steps and more
# 1.10-3.92x, 654x16x490 1.73x, 257x178x1037 2.64x; 7 of 3 steps 0.85-1.15x; 16 of 1 or 2 steps 0.55-0.84x, but fp8
# 4534x87x152 1.28x)


def _copies(views: list, m: int, n: int, k: int, arch: str, key) -> tuple[list, object]:
    """The operands ops.matmul copies before the product (sm_90a), each as (0 for a, 1 for b; the copy's source, rows
    with a unit stride; transposed or not; the copy's shape; its strides seen as [K, outer]), and the key to bind by.
    views: a and b as [K, M] and [K, N]. wgmma's fp8 form reads K-contiguous tiles, so fp8 operands laid out otherwise
    are transposed (else mma.sync would take them as f16: 4096^3 with B row-major 139 TFLOP/s, Triton's 308, copied
    1165). 16-bit or fp8 operands TMA cannot copy (rows off 16-byte boundaries) are copied into aligned rows in
    products of COPY_MIN and more, in K loops of COPY_STEPS and more, and where the product decodes (H200, with copies
    made ahead: 4097^3 f16 127 -> 466 TFLOP/s, fp8 80 -> 443; 1001^3 f16 34 -> 126; fp8 1000^3 23 -> 152): rows along K
    for fp8, else as the operand's."""
    out = []
    for i, v in enumerate(views):
        kmajor, fp8, item = v.stride(0) == 1, v.dtype in FP8, v.element_size()
        worth = m * n * k >= COPY_MIN and (n, m)[i] >= COPY_REUSE or _cdiv(k * item, 128) >= COPY_STEPS or m <= DECODE
        if arch != "sm_90a" or not k or not (fp8 and not kmajor or item <= 2 and worth and
                                             not _tma_ready(v.t() if i == 0 else v)):
            continue
        rows_k, e = fp8 or v.stride(1) != 1, max(8, 16 // item)
        src, key = _transposable(v.t() if rows_k and kmajor else v, key)
        w = _cdiv(k if rows_k else v.shape[1], e) * e
        out.append((i, src, rows_k and not kmajor, (v.shape[1], w) if rows_k else (k, w), (1, w) if rows_k else (w, 1)))
    return out, key


def _product_dtype(a: Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    """matmul's output dtype: out_dtype, by default a's (bf16 for fp8)."""
    return out_dtype or (torch.bfloat16 if a.dtype in FP8 else a.dtype)


def _ref_matmul(a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None,
                out_dtype: torch.dtype | None = None, scale_a: Tensor | None = None,
                scale_b: Tensor | None = None) -> Tensor:
    """torch's product in f32 with matmul's scales, bias and activation, in its output dtype (for the gradient)."""
    y = a.float() @ b.float()
    if scale_a is not None:
        y = y * scale_a.reshape(-1, 1) * scale_b.reshape(1, -1)
    y = y if bias is None else y + bias.float()
    y = torch.relu(y) if activation == "relu" else torch.nn.functional.gelu(y) if activation == "gelu" else y
    return y.to(_product_dtype(a, out_dtype))


_register(matmul, lambda a, b, bias=None, activation=None, out_dtype=None, scale_a=None, scale_b=None:
          a.new_empty((a.shape[0], b.shape[1]), dtype=_product_dtype(a, out_dtype)), _ref_matmul)


def _matmul(a: Tensor, b: Tensor, bias: Tensor | None, activation: str | None, out_dtype: torch.dtype | None,
            scale_a: Tensor | None = None, scale_b: Tensor | None = None, key=None) -> Tensor:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise NkError(f"matmul takes [M, K] @ [K, N], got {list(a.shape)} @ {list(b.shape)}")
    _float(a, "matmul", fp8=True)
    if b.dtype != a.dtype:
        raise NkError(f"matmul operands must share a dtype, got {a.dtype} and {b.dtype}")
    out_dtype = _product_dtype(a, out_dtype)
    if out_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise NkError(f"matmul's out_dtype is f32, f16 or bf16, got {out_dtype}")
    if activation not in (None, "relu", "gelu"):
        raise NkError(f"matmul's activation is None, \"relu\" or \"gelu\", got {activation!r}")
    (m, k), n = a.shape, b.shape[1]
    if bias is not None and bias.shape != (n,):  # the kernel reads N values of it, whatever its shape
        raise NkError(f"matmul's bias has one value per column of the product, [{n}]; got {list(bias.shape)}")
    if (scale_a is None) != (scale_b is None):
        raise NkError("matmul takes scale_a and scale_b together", hint="pass torch.ones((), device=...) for the other")
    scaled = scale_a is not None
    strides = (_scale_stride(scale_a, m, "scale_a"), _scale_stride(scale_b, n, "scale_b")) if scaled else (0, 0)
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=a.device)
    sms, arch = gpu(a.get_device()).sms, _arch(a)
    views = [a.t(), b]  # a and b as [K, M] and [K, N]
    copies, key = _copies(views, m, n, k, arch, key)
    for i, src, _, shape, st in copies:  # as the product reads them: a copy seen as [K, outer] (meta: strides count)
        views[i] = torch.empty_strided(views[i].shape, st, dtype=a.dtype, device="meta")
    ka, kb = views
    meta, grid, sk, splits = _matmul_plan(ka.t(), kb, sms, arch, out_dtype.itemsize)
    meta["ACTIVATION"] = activation or "none"
    fused = dict(meta, BIAS=bias is not None, SCALE=scaled)
    sizes, mod = (m, n, k, *ka.t().stride(), *kb.stride(), n, 1), _stdlib("matmul")
    cb = None if bias is None else bias.contiguous()
    key = key if bias is None or cb.data_ptr() == bias.data_ptr() else None
    operands = [a, b]
    for i, src, *_ in copies:  # what the copy reads (only the data pointer counts)
        operands[i] = src
    inputs = tuple(t for t in (*operands, cb, scale_a, scale_b) if t is not None)
    out = len(inputs)  # the inputs' places in the launch: the product's, the bias's and the scales' (or any tensor)
    ep = (_In(out), C if bias is not None else A, *((_In(out - 2), _In(out - 1)) if scaled else (A, A)))
    tile = meta["BM"] * meta["BN"]
    # made after the product: stream-K's parts and flags, or the splits' f32 tiles and counts; zeros where the kernel
    # needs them so (made per call: a buffer kept between calls would be shared by streams)
    work = [(sms * tile, torch.float32, False), (sms, torch.int32, True)] if sk else \
        [(grid // splits * (tile + 1), torch.float32, True)] if splits > 1 else []
    copy = out + 1 + len(work)  # the copies' places
    at = {i: _In(copy + j) for j, (i, *_) in enumerate(copies)}
    x, y = at.get(0, A), at.get(1, B)
    steps = [_transpose_step(_In(i), _In(copy + j), *src.shape, src.stride(0), shape[1], a.element_size(), trans)
             for j, (i, src, trans, shape, _) in enumerate(copies)]

    def made(t: Tensor) -> tuple:
        return (torch.empty((m, n), dtype=out_dtype, device=t.device),
                *((torch.zeros if zero else torch.empty)(size, dtype=dt, device=t.device) for size, dt, zero in work),
                *(torch.empty(shape, dtype=a.dtype, device=t.device) for _, _, _, shape, _ in copies))
    if sk:
        step = (mod.matmul_sk, (grid,), (x, y, *ep, _In(out + 1), _In(out + 2), *sizes, *strides, sk), fused)
    elif splits > 1:
        step = (mod.matmul_split, (grid,), (x, y, *ep, _In(out + 1), *sizes, *strides, splits), fused)
    elif bias is None and not scaled:
        step = (mod.matmul, (grid,), (x, y, _In(out), *sizes), meta)
    else:
        step = (mod.matmul_fused, (grid,), (x, y, *ep, *sizes, *strides), fused)
    return _run(key, steps + [step], made, inputs, zeroed=tuple(1 + i for i, (*_, zero) in enumerate(work) if zero))


# ---- attention ----------------------------------------------------------------------------------------
# Attention's blocks, (kernel, wgmma) -> head dim -> (held rows, streamed rows): measured on an H200 over blocks, warps
# and stages (bench/attention_blocks.py; bench/RESULTS.md), for every head dim the kernels take. mma.sync (sm_80) keeps
# the blocks that compile without spills there.
ATTENTION_BLOCKS = {("fwd", True): {64: (64, 64), 128: (128, 64), 256: (64, 32)},
                    ("dq", True): {64: (64, 64), 128: (64, 64), 256: (64, 32)},
                    ("dkdv", True): {64: (64, 128), 128: (64, 64), 256: (64, 32)},
                    ("fwd", False): {64: (128, 64), 128: (128, 64), 256: (64, 32)},
                    ("dq", False): {64: (128, 64), 128: (128, 32), 256: (64, 16)},
                    ("dkdv", False): {64: (128, 32), 128: (64, 16), 256: (64, 16)}}
WGMMA_ACC = 192  # f32 accumulator values per thread (the held tile and the block's scores) one warpgroup carries


def _attention_blocks(d: int, rows: int, keys: int, kernel: str, arch: str) -> dict:
    """Blocks by head dim. The block a program holds (queries for the forward and dQ, keys for dK/dV) is 64 or
    128 rows (64: wgmma's M); the streamed block is as long as the other live tiles leave registers for: fewer
    as D grows. With wgmma (the streamed tiles come by TMA) dQ and dK/dV hold 64 rows, and so does the forward
    but at D 128, where 128 rows share each K/V tile; dK/dV at D 64 streams 128 queries (measured fastest,
    with a few spills). The fewest warpgroups that keep the live f32 accumulators under WGMMA_ACC values a
    thread: the held [rows, D] tile (dK/dV: two) and the block's [rows, streamed] scores (S; dQ and dK/dV also
    dP). mma.sync holds its fragments in more registers: 8 warps. Two stages; three for mma.sync's forward at
    D 64 (a cp.async ring of two 128-key tiles: 3 beat 2 by 8% there). Blocks shrink to cover short sequences
    (16: a tensor-core step)."""
    wgmma = arch == "sm_90a"
    held, streamed = ATTENTION_BLOCKS[kernel, wgmma][d]
    tiles = (2, 2) if kernel == "dkdv" else (1, 2) if kernel == "dq" else (1, 1)  # held tiles, score tiles
    values = held * (tiles[0] * d + tiles[1] * streamed)
    warps = 4 * _cdiv(values, 128 * WGMMA_ACC) if wgmma else 8
    bm, bn = (streamed, held) if kernel == "dkdv" else (held, streamed)
    return dict(BM=min(bm, max(16, _pow2(rows))), BN=min(bn, max(16, _pow2(keys))), D=d, num_warps=warps,
                num_stages=3 if d == 64 and kernel == "fwd" and not wgmma else 2)


def _attention_args(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None):
    """The checked (B, H, L, D) inputs, with a unit last stride (else copied) and the scale."""
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise NkError(f"attention takes q (B, H, L_q, D) and k, v (B, H_kv, L_k, D), got {list(q.shape)}, "
                      f"{list(k.shape)}, {list(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise NkError(f"attention: the {q.shape[1]} query heads must be a multiple of the {k.shape[1]} K/V heads")
    if q.shape[3] not in (64, 128, 256) or q.dtype not in (torch.float16, torch.bfloat16) or \
            not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        raise NkError(f"attention takes f16 or bf16 q, k, v of one dtype on one device with head dim 64, 128 or "
                      f"256, got {q.dtype}, {k.dtype}, {v.dtype} and D {q.shape[3]}")
    if 0 in q.shape or 0 in k.shape:
        raise NkError(f"attention takes non-empty tensors, got {list(q.shape)} and {list(k.shape)}")
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    return *(_unit_last(t) for t in (q, k, v)), bool(causal), scale


def _unit_last(t: Tensor) -> Tensor:
    return t if t.stride(3) == 1 else t.contiguous()


def _strides(*ts: Tensor) -> tuple:
    return tuple(s for t in ts for s in t.stride()[:3])


def _attention_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    (b, h, lq, d), (hk, lk) = q.shape, k.shape[1:3]
    o, lse = _like(q)[0], q.new_empty((b, h, lq), dtype=torch.float32)
    if scale <= 0:  # the kernel scales the row max of raw scores, so it takes a positive scale: -Q flips the sign
        q, scale = (-q if scale < 0 else q), max(-scale, 2.0 ** -126)
    cfg = _attention_blocks(d, lq, lk, "fwd", _arch(q))
    _stdlib("attention").attention_fwd[(_cdiv(lq, cfg["BM"]), b * h)](
        q, k, v, o, lse, lq, lk, h, hk, scale, *_strides(q, k, v, o), CAUSAL=causal, **cfg)
    return o, lse


def _attention_backward(g: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool,
                        scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """dQ (which also writes delta = rowsum(dO * O)), then dK and dV (a program per key block, summing the query
    heads of its group)."""
    mod, g = _stdlib("attention"), _unit_last(g)
    (b, h, lq, d), (hk, lk) = q.shape, k.shape[1:3]
    dq, dk, dv = _like(q)[0], _like(k)[0], _like(v)[0]
    delta = torch.empty_like(lse)
    qcfg, kcfg = (_attention_blocks(d, lq, lk, kernel, _arch(q)) for kernel in ("dq", "dkdv"))
    mod.attention_bwd_dq[(_cdiv(lq, qcfg["BM"]), b * h)](q, k, v, o, g, lse, delta, dq, lq, lk, h, hk, scale,
                                                          *_strides(q, k, v, o, g, dq), CAUSAL=causal, **qcfg)
    mod.attention_bwd_dkdv[(_cdiv(lk, kcfg["BN"]), b * hk)](q, k, v, g, lse, delta, dk, dv, lq, lk, h, hk, scale,
                                                            *_strides(q, k, v, g, dk, dv), CAUSAL=causal, **kcfg)
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    """Eager autograd, and the autograd of the custom op torch.ops.newt.attention (the same two methods)."""
    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
        return _attention_forward(q, k, v, causal, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], *output)
        ctx.causal, ctx.scale = inputs[3:]
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, g: Tensor, _lse_grad):  # through the op, so that a traced backward stays one node
        return *torch.ops.newt.attention_backward(g, *ctx.saved_tensors, ctx.causal, ctx.scale), None, None


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: float | None = None) -> Tensor:
    """Flash attention, softmax(q k^T * scale) v, differentiable: (B, H, L_q, D) queries, (B, H_kv, L_k, D) keys
    and values with H_kv dividing H (GQA/MQA), f16 or bf16, D 64, 128 or 256; scale defaults to 1/sqrt(D).
    Causal masks align at the bottom right (query i sees keys up to i + L_k - L_q). Tensors whose last
    dimension is strided are copied."""
    q, k, v, causal, scale = _attention_args(q, k, v, causal, scale)
    if torch.compiler.is_compiling():
        return torch.ops.newt.attention(q, k, v, causal, scale)[0]
    return _Attention.apply(q, k, v, causal, scale)[0]


def _fake_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    return _like(q)[0], q.new_empty(q.shape[:3], dtype=torch.float32)


torch.library.custom_op("newt::attention", _attention_forward, mutates_args=()).register_fake(_fake_attention)
torch.library.custom_op("newt::attention_backward", _attention_backward, mutates_args=()).register_fake(
    lambda g, q, k, v, o, lse, causal, scale: (_like(q)[0], _like(k)[0], _like(v)[0]))
torch.library.register_autograd("newt::attention", _Attention.backward, setup_context=_Attention.setup_context)
