"""Compile time (check, passes, codegen, NVRTC) of the matmul configurations people use, on the CPU: the
stdlib kernel, Triton's tutorial ported line for line (loop-carried pointers), and the CUDA-core fallback.

    python bench/bench_compile.py
"""
from __future__ import annotations

import time
from pathlib import Path

from newtc import compiler, syntax
from newtc.types import Ptr, f16, f32, i32

ROOT = Path(__file__).resolve().parent.parent
INTS = "M N K stride_am stride_ak stride_bk stride_bn stride_cm stride_cn".split()


def spec(ptrs, dt, consts, warps, stages, arch):
    sig = {**{p: Ptr(dt) for p in ptrs}, **{n: i32 for n in INTS}}
    aligned = [*ptrs, "M", "N", "K", "stride_am", "stride_bk", "stride_cm"]
    return compiler.Spec.of(sig, consts, num_warps=warps, num_stages=stages, aligned=aligned,
                            ones=("stride_ak", "stride_bn", "stride_cn"), arch=arch)


def timed(path: str, kernel: str, s: compiler.Spec) -> tuple[float, int]:
    module = syntax.parse((ROOT / path).read_text(), path)
    t = time.perf_counter()
    out = compiler.compile(module, kernel, s)
    return time.perf_counter() - t, len(out.cuda.source.splitlines())


def main() -> None:
    rows = []
    for bm, bn, bk, w in ((64, 64, 32, 4), (128, 128, 32, 4), (128, 128, 64, 4), (128, 256, 64, 8)):
        for arch in ("sm_80", "sm_90a"):
            tile = f"{bm}x{bn}x{bk} w{w}"
            s = spec(("a", "b", "c"), f16, dict(BM=bm, BN=bn, BK=bk, GROUP_M=8), w, 3, arch)
            rows.append(("stdlib matmul f16", tile, arch, *timed("stdlib/matmul.nk", "matmul", s)))
            s = spec(("a_ptr", "b_ptr", "c_ptr"), f16, dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                                                            GROUP_SIZE_M=8), w, 3, arch)
            rows.append(("tutorial port f16", tile, arch, *timed("examples/tutorials/03_matmul.nk", "matmul_kernel", s)))
    for bm, bn, bk, w in ((64, 64, 32, 4), (128, 128, 32, 4)):
        s = spec(("a", "b", "c"), f32, dict(BM=bm, BN=bn, BK=bk, GROUP_M=8), w, 3, "sm_90a")
        module = syntax.parse((ROOT / "stdlib/matmul.nk").read_text().replace("acc = dot(x, y, acc)",
                              "acc = dot(x, y, acc, input_precision='ieee')"), "fma.nk")
        t = time.perf_counter()
        out = compiler.compile(module, "matmul", s)
        rows.append(("CUDA-core f32 (ieee)", f"{bm}x{bn}x{bk} w{w}", "sm_90a", time.perf_counter() - t,
                     len(out.cuda.source.splitlines())))
    print(f"| kernel | tile | arch | compile s | CUDA lines |\n| --- | --- | --- | --- | --- |")
    for name, tile, arch, sec, lines in rows:
        print(f"| {name} | {tile} | {arch} | {sec:.2f} | {lines} |")


if __name__ == "__main__":
    main()
