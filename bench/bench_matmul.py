"""Matmul: newt (newtc.ops.matmul, stdlib/matmul.nk; and its descriptor kernel matmul_tma, TMA copies on sm_90a) vs
Triton (its tutorial kernel, autotuned over the tutorial's configurations) vs cuBLAS (torch.matmul), f16 and bf16,
TFLOP/s. fp8 (e4m3, A row-major and B column-major as torch._scaled_mm takes them, the product in bf16): cuBLAS is
torch._scaled_mm with unit scales (newt's too) and fast accumulation (wgmma's own f32 sums, as newt's and Triton's), Triton its
tutorial's fp8 configurations.

    python bench/bench_matmul.py [--quick] [--sweep] [--shapes] [--splits] [--tiles] [--random N]

--shapes times ops.matmul, Triton and cuBLAS on shapes off the bench (OFF_BENCH: small, ragged, skinny, long K, rows
not 16-byte aligned), f16 (and every third in bf16): where _matmul_config's choice of tile must hold up.
--random N times them on N shapes drawn at random (seeded: the same N shapes each run; f16, bf16 and fp8 in turn),
each side log-uniform from 1 (M) or 16 (N, K) to 16384, at most 2^36 multiply-adds: cliffs no list foresaw (only
that table).
--splits times, on products whose tiles fill one wave or less (SPLIT_SHAPES), ops.matmul as it plans them against each
tile of ops.MATMUL_TILES and SPLIT_TILES (128x64) with its K split over 1-8 programs (shares of 1024 K or more;
stdlib matmul_split, whose shares sum by vector reductions), and cuBLAS: whether another tile split would beat the one
ops picks and splits.
--tiles times, on more tiles than SMs (TILE_SHAPES, f16), ops.matmul against each tile of ops.MATMUL_TILES forced whole
and the largest forced stream-K, and fits what ops weighs them by: each tile's TFLOP/s per wave of tiles
(MATMUL_TILES) and stream-K's over its tiles with its split ones SK_COST steps longer (SK_RATE).
--sweep also times newt's kernel over a grid of tile configurations on 4096^3 and, without --quick, on the LLM shape
16384x4096x4096 (to tune ops._matmul_config):
warp-specialized (ws) or not, a program per tile or persistent (a program per SM walking the tiles), in clusters that
share B's copies or not.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import sys

import common
from common import Table, check_close, measure_all, ratio

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096), (16, 4096, 4096)]
OFF_BENCH = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (3072, 3072, 3072),
             (1000, 1000, 1000), (1001, 1001, 1001), (4097, 4097, 4097), (333, 4096, 1000), (1, 4096, 4096),
             (64, 4096, 4096), (128, 11008, 4096), (512, 4096, 11008), (2048, 14336, 4096), (4096, 1024, 4096),
             (8192, 128, 8192), (128, 8192, 8192), (512, 512, 16384), (4096, 4096, 64), (16384, 5120, 5120),
             (4096, 4096, 4104), (4104, 4104, 4096), (2000, 4100, 1024)]


def random_shapes(count: int, seed: int = 0) -> list:
    """count (M, N, K), each side log-uniform from 1 or 16 to 16384, redrawn while the product is over 2^36."""
    import math
    import random
    rng, out = random.Random(seed), []
    while len(out) < count:
        m, n, k = (round(math.exp(rng.uniform(math.log(lo), math.log(16384)))) for lo in (1, 16, 16))
        if m * n * k <= 2**36:
            out.append((m, n, k))
    return out


def triton_matmul(fp8: bool = False):
    """Triton's matmul tutorial (03-matrix-multiplication.py), autotuned over its CUDA configurations (its fp8 ones
    with `fp8`); fp8 products in bf16."""
    import torch
    import triton
    import triton.language as tl

    tiles = ((128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
             (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4)) if fp8 else \
        ((128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
         (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8),
         (16, 64, 128, 4, 4), (16, 32, 256, 4, 4))
    configs = [triton.Config({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 8},
                             num_stages=s, num_warps=w) for m, n, k, s, w in tiles]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
               BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
               GROUP_SIZE_M: tl.constexpr):
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        num_pid_in_group = GROUP_SIZE_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_SIZE_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
            accumulator = tl.dot(a, b, accumulator)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        c = accumulator.to(c_ptr.dtype.element_ty)
        offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))

    def matmul(a, b):
        (m, k), n = a.shape, b.shape[1]
        c = torch.empty((m, n), device=a.device, dtype=out_dtype(a))
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)  # noqa: E731
        kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride())
        return c
    return matmul


def tma_matmul(a, b):
    """stdlib/matmul.nk's matmul_tma with ops.matmul's tiles (row-major operands)."""
    import torch
    from newtc import ops
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=a.dtype)
    cfg = ops._matmul_config(m, n, k, a.element_size(), ops._arch(a))
    ops._stdlib("matmul").matmul_tma[(-(-m // cfg["BM"]) * -(-n // cfg["BN"]),)](
        a, b, c, m, n, k, a.stride(0), b.stride(0), c.stride(0), GROUP_M=8, **cfg)
    return c


def out_dtype(a):
    import torch
    return torch.bfloat16 if a.element_size() == 1 else a.dtype


def operands(dtype, m: int, n: int, k: int) -> tuple:
    """Random A [m, k] and B [k, n]; fp8's B column-major (K contiguous: what wgmma's fp8 form and cuBLAS take)."""
    import torch
    a = torch.randn(m, k, device="cuda").to(dtype)
    if dtype.itemsize == 1:
        return a, torch.randn(n, k, device="cuda").to(dtype).t()
    return a, torch.randn(k, n, device="cuda").to(dtype)


def cublas(a, b):
    import torch
    if a.element_size() > 1:
        return a @ b
    one = torch.ones((), device=a.device)
    return torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)


def newt(a, b):
    """ops.matmul; fp8 with unit scales, as cuBLAS takes them (the epilogue multiplies by them)."""
    import torch
    from newtc import ops
    if a.element_size() > 1:
        return ops.matmul(a, b)
    one = torch.ones((), device=a.device)
    return ops.matmul(a, b, scale_a=one, scale_b=one)


def tflops(m, n, k, ms) -> float | str:
    return 2 * m * n * k / ms / 1e9 if isinstance(ms, float) else ms


def close(ref):
    """The check of a product against ref (its f32 product): 16-bit inputs, sums K long."""
    atol = 2e-2 * ref.abs().mean().item() * 4
    return lambda out: check_close(out.float(), ref, rtol=2e-2, atol=atol)


def run(quick: bool, sweep: bool = False, shapes: bool = False, random: int = 0, splits: bool = False,
        tiles: bool = False):
    import torch
    try:
        tmm = {torch.float16: triton_matmul(), torch.float8_e4m3fn: triton_matmul(fp8=True)}
        tmm[torch.bfloat16] = tmm[torch.float16]
    except ImportError:
        tmm = {}
    dtypes = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
    if random:
        cases = [(dtypes[i % 3], s) for i, s in enumerate(random_shapes(random))]
        yield products("matmul on random shapes (TFLOP/s)", cases, tmm, quick)
        return
    cases = [(dtype, shape) for dtype in dtypes for shape in (SHAPES[:2] if quick else SHAPES)]
    yield products("matmul (TFLOP/s; ratios are speed: above 1, newt is faster)", cases, tmm, quick)
    if shapes:
        cases = [(torch.float16, s) for s in OFF_BENCH] + [(torch.bfloat16, s) for s in OFF_BENCH[::3]]
        yield products("matmul off the bench (ops.matmul's tiles by shape, TFLOP/s)", cases, tmm, quick)
    if sweep:
        yield sweep_configs(quick, SHAPES[:1] if quick else [SHAPES[0], SHAPES[2]])
    if splits:
        yield sweep_splits(quick, SPLIT_SHAPES)
    if tiles:
        yield from sweep_tiles(quick, TILE_SHAPES)


def products(title: str, cases: list, tmm, quick: bool) -> Table:
    """newt (ops.matmul, and the descriptor kernel), Triton and cuBLAS on each (dtype, (m, n, k)), interleaved."""
    rows = []
    for dtype, (m, n, k) in cases:
        a, b = operands(dtype, m, n, k)
        fns = {"newt": lambda: newt(a, b), "cuBLAS": lambda: cublas(a, b)}
        if dtype.itemsize > 1:  # (matmul_tma reads row-major B)
            fns["TMA"] = lambda: tma_matmul(a, b)
        if dtype in tmm:
            fns["Triton"] = functools.partial(tmm[dtype], a, b)
        times = measure_all(fns, close(a.float() @ b.float()), quick)
        t_newt, t_tma, t_tri, t_cub = (times.get(name, "n/a") for name in ("newt", "TMA", "Triton", "cuBLAS"))
        rows.append({"kernel": f"matmul {str(dtype)[6:]}", "shape": f"{m}x{n}x{k}",
                     "newt TFLOP/s": tflops(m, n, k, t_newt), "newt TMA TFLOP/s": tflops(m, n, k, t_tma),
                     "Triton TFLOP/s": tflops(m, n, k, t_tri),
                     "cuBLAS TFLOP/s": tflops(m, n, k, t_cub), "newt/Triton": ratio(t_tri, t_newt),
                     "newt/cuBLAS": ratio(t_cub, t_newt), "TMA/newt": ratio(t_newt, t_tma),
                     "TMA/Triton": ratio(t_tri, t_tma)})
        print(rows[-1], flush=True)
    return Table(title, rows)


# (BM, BN, BK, warps, slots, warp-specialized, persistent, the tile stored in halves, CTAs a cluster)
SWEEP = [(128, 256, 64, 8, 4, False, False, False, 1), (128, 256, 64, 8, 4, False, True, False, 1),
         (128, 256, 32, 8, 6, False, False, False, 1), (128, 256, 64, 8, 3, True, True, False, 1),
         (128, 256, 64, 8, 4, True, True, True, 1), (128, 256, 64, 8, 4, True, False, True, 1),
         (256, 128, 64, 8, 3, True, True, False, 1), (128, 128, 64, 4, 4, True, True, False, 1),
         (128, 256, 64, 8, 4, True, True, True, 2), (128, 256, 64, 8, 4, True, False, True, 2),
         (128, 256, 64, 8, 3, True, True, False, 2), (256, 128, 64, 8, 3, True, True, False, 2),
         (128, 128, 64, 4, 4, True, True, False, 2), (128, 256, 64, 8, 4, True, True, True, 4)]


SWEEP_FP8 = [(128, 256, 128, 8, 3, False, False, False, 1), (128, 256, 128, 8, 4, False, False, False, 1),
             (128, 256, 64, 8, 4, False, False, False, 1), (128, 128, 128, 4, 4, False, False, False, 1),
             (256, 128, 128, 8, 3, False, False, False, 1), (128, 256, 128, 8, 4, True, True, True, 1),
             (128, 256, 128, 8, 3, True, True, True, 1), (128, 256, 128, 8, 3, True, True, False, 1),
             (128, 128, 128, 4, 4, True, True, False, 1), (128, 256, 128, 8, 4, True, True, True, 2)]


def sweep_configs(quick: bool, shapes: list, dtypes: tuple = ()) -> Table:
    """newt's kernel over tile configurations, f16, bf16 and fp8 (or `dtypes`), on each of `shapes`: what
    ops._matmul_config should pick."""
    import torch
    import newtc.ops as ops
    mod = ops._stdlib("matmul")
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for (m, n, k), dtype in itertools.product(shapes, dtypes or (torch.float16, torch.bfloat16, torch.float8_e4m3fn)):
        a, b = operands(dtype, m, n, k)
        fns = {}
        for bm, bn, bk, w, s, ws, persistent, halves, ctas in SWEEP if dtype.itemsize > 1 else SWEEP_FP8:
            per_cluster = -(-m // (bm * ctas)) * -(-n // bn)  # tiles, counted by clusters
            grid = (min(per_cluster, sms // ctas) * ctas if persistent else per_cluster * ctas,)
            meta = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, WS=ws, HALVES=halves, CTAS=ctas, num_warps=w, num_stages=s,
                        num_ctas=ctas)
            config = f"{bm}x{bn}x{bk} w{w} s{s}" + " ws" * ws + " halves" * halves + " persistent" * persistent + \
                f" cluster {ctas}" * (ctas > 1)
            fns[config] = functools.partial(product, mod.matmul, grid, a, b, meta)
        for config, t in measure_all(fns, close(a.float() @ b.float()), quick).items():
            rows.append({"shape": f"{m}x{n}x{k}", "dtype": str(dtype)[6:], "config": config,
                         "TFLOP/s": tflops(m, n, k, t)})
            print(rows[-1], flush=True)
    return Table("newt matmul configurations", rows)


# products of one wave of tiles or less, f16, where ops.matmul trails cuBLAS by 17-40% (28th and 29th sessions)
SPLIT_SHAPES = [(512, 4096, 11008), (128, 11008, 4096), (512, 512, 16384), (640, 384, 8192), (256, 1024, 4096),
                (512, 1024, 4096), (1024, 512, 8192), (768, 512, 12288)]
SPLIT_TILES = [(128, 64, 4, 4)]  # besides MATMUL_TILES: two programs an SM (4 slots of 24 KB), wgmma's 64 columns


def sweep_splits(quick: bool, shapes: list) -> Table:
    """ops.matmul and cuBLAS against each tile of MATMUL_TILES and SPLIT_TILES split over 1-8 programs a tile (f16)."""
    import torch
    import newtc.ops as ops
    rows = []
    for m, n, k in shapes:
        a, b = operands(torch.float16, m, n, k)
        fns = {"ops.matmul": lambda: newt(a, b), "cuBLAS": lambda: a @ b}
        for (bm, bn, warps, slots), s in itertools.product([*ops.MATMUL_TILES, *SPLIT_TILES], (1, 2, 3, 4, 6, 8)):
            if k // s < 1024:
                continue
            meta = dict(BM=bm, BN=bn, BK=64, GROUP_M=8, num_warps=warps, num_stages=slots)
            fns[f"{bm}x{bn} split {s}"] = functools.partial(split_product, a, b, s, meta)
        for config, t in measure_all(fns, close(a.float() @ b.float()), quick).items():
            rows.append({"shape": f"{m}x{n}x{k}", "config": config, "TFLOP/s": tflops(m, n, k, t)})
            print(rows[-1], flush=True)
    return Table("newt matmul tiles split over K", rows)


# products of 1-4 waves of 128x256 tiles (140-576 on an H200), K of 32-128 steps: where the tile, and stream-K, matter
TILE_SHAPES = [(m, n, (4096, 2048, 8192)[i % 3]) for i, (m, n) in enumerate(
    [(1536, 3072), (1536, 4096), (1536, 5120), (2048, 2560), (2048, 3072), (2048, 3840), (2048, 5120), (2304, 2048),
     (2304, 3072), (2304, 3840), (2304, 5120), (2816, 2048), (2816, 2560), (2816, 4096), (2816, 5120), (3072, 1536),
     (3072, 2048), (3072, 2560), (3072, 3072), (3584, 1280), (3584, 1536), (3584, 2048), (3584, 2560), (3584, 3840),
     (4096, 1280), (4096, 1536), (4096, 2560), (4096, 3840), (5120, 1280), (5120, 2048), (5120, 2560), (6144, 1536),
     (6144, 3072), (8192, 1280), (4096, 4096), (3072, 4096)])]


def sweep_tiles(quick: bool, shapes: list):
    """ops.matmul as planned, each tile of MATMUL_TILES forced whole and the largest forced stream-K, and cuBLAS
    (f16), then the rates fitted to them: a tile's TFLOP/s over its waves' fill (geomean), stream-K's over its
    tiles, the split ones SK_COST steps longer."""
    import math
    from unittest import mock
    import torch
    import newtc.ops as ops
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    largest = max(ops.MATMUL_TILES, key=lambda t: t[0] * t[1])
    forced = [(t, False) for t in ops.MATMUL_TILES] + [(largest, True)]
    rows, fits, planned = [], {}, ops._fast
    for m, n, k in shapes:
        a, b = operands(torch.float16, m, n, k)
        fns = {"ops.matmul": functools.partial(_bound, planned, a, b), "cuBLAS": lambda: a @ b}
        for tile, sk in forced:
            bound = {}  # the launch ops binds for this tile (its own cache: the shape alone keys ops._fast)
            with mock.patch.object(ops, "MATMUL_TILES", {tile: ops.MATMUL_TILES[tile]}), \
                    mock.patch.object(ops, "SK_RATE", math.inf if sk else 0), mock.patch.object(ops, "_fast", bound):
                newt(a, b)
            fns[f"{tile[0]}x{tile[1]}" + " sk" * sk] = functools.partial(_bound, bound, a, b)
        try:
            times = measure_all(fns, close(a.float() @ b.float()), quick)
        finally:
            ops._fast = planned
        rows.append({"shape": f"{m}x{n}x{k}", **{c: tflops(m, n, k, t) for c, t in times.items()}})
        print(rows[-1], flush=True)
        for tile, sk in forced:
            count, rate = -(-m // tile[0]) * -(-n // tile[1]), rows[-1][f"{tile[0]}x{tile[1]}" + " sk" * sk]
            if not isinstance(rate, float):
                continue
            if sk:  # over the tiles, the split ones SK_COST steps longer: ops' own model, at a rate of 1 TFLOP/s
                with mock.patch.object(ops, "SK_RATE", 1e9):
                    modeled = ops._tile_rate(count, k * 2 // 128, sms, "sm_90a", tile[:2])[0] / 1e9
                rate *= count * tile[0] * tile[1] / (m * n) / modeled
            else:  # per wave
                rate *= -(-count // sms) * sms * tile[0] * tile[1] / (m * n)
            fits.setdefault((tile, sk), []).append(rate)
    yield Table("matmul tiles forced (f16, TFLOP/s)", rows)
    yield Table("matmul tile rates fitted (TFLOP/s per wave of tiles; ops.MATMUL_TILES, ops.SK_RATE)",
                [{"tile": f"{t[0]}x{t[1]}" + " stream-K" * sk, "fitted": math.exp(sum(map(math.log, v)) / len(v)),
                  "ops": ops.SK_RATE if sk else ops.MATMUL_TILES[t], "products": len(v)} for (t, sk), v in fits.items()])


def _bound(bound: dict, a, b):
    """ops.matmul through the launches bound in `bound` (a plan's; set, not patched per call: a patch costs
    microseconds)."""
    import newtc.ops as ops
    ops._fast = bound
    return newt(a, b)


def split_product(a, b, splits: int, meta: dict):
    """a @ b by the stdlib matmul_split, each tile's K over `splits` programs (as ops launches it: its f32 sums and
    counts zeroed per call), or by matmul for one."""
    import torch
    import newtc.ops as ops
    (m, k), n, mod = a.shape, b.shape[1], ops._stdlib("matmul")
    tiles = -(-m // meta["BM"]) * -(-n // meta["BN"])
    if splits == 1:
        return product(mod.matmul, (tiles,), a, b, meta)
    c = torch.empty(m, n, device=a.device, dtype=out_dtype(a))
    part = torch.zeros(tiles * (meta["BM"] * meta["BN"] + 1), device=a.device)
    mod.matmul_split[(tiles * splits,)](a, b, c, c, c, c, part, m, n, k, *a.stride(), *b.stride(), *c.stride(), 0, 0,
                                        splits, **meta)
    return c


def product(kernel, grid: tuple, a, b, meta: dict):
    """a @ b by one launch of the stdlib kernel with these constexprs."""
    import torch
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=out_dtype(a))
    kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), **meta)
    return c


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--shapes", action="store_true")
    p.add_argument("--splits", action="store_true")
    p.add_argument("--tiles", action="store_true")
    p.add_argument("--random", type=int, default=0, metavar="N")
    args = p.parse_args()
    if not common.cuda_available():
        print("no CUDA GPU: nothing to benchmark")
        sys.exit(0)
    for t in run(args.quick, args.sweep, args.shapes, args.random, args.splits, args.tiles):
        print(t.markdown() + "\n")
        common.write(f"matmul_{t.title.split()[0]}.md", t.markdown())
