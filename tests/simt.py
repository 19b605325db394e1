"""The generated CUDA of a launch, run on the CPU: every CUDA thread an OS thread, a block's threads at once and the
blocks one after another, so that a layout, a reduction's shuffles and a conversion through shared memory run as the
GPU would run them, where CI has no GPU (the interpreter runs the IR before the passes, this runs their output).

The kernel's source is newt's own, with the prelude (PTX asm for conversions and fast math) swapped for C++ that
rounds the same way (`CPU_PRELUDE`: f16 through _Float16, bf16 and f32 math as IEEE, exp2 and log2 exact where the
GPU's approximate units are within 2 ulp), compiled by the host's g++. A shuffle is a write to the warp's slots
between two barriers of its 32 threads; `__syncthreads` a barrier of the block. Kernels whose code needs a GPU (tensor
cores, TMA, cp.async, atomics) are out of its reach: `run` raises NeedsGpu for them.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from newtc.codegen.prelude import PRELUDE

GXX = shutil.which("g++")
# the prelude's plain C++, which the CPU build shares: bit casts, zeros, shuffles of any type, vector words
SHARED = PRELUDE[PRELUDE.index("template <class T, class U> __device__ __forceinline__ T nk_bitcast"):
                 PRELUDE.index("// Tensor-core operands")]
GPU_ONLY = re.compile(r"\basm\b|nk_pack[24]\(|nk_cp_async|nk_desc|\batomic|nk_map")  # PTX, tensor cores, TMA, atomics


class NeedsGpu(Exception):
    """The kernel's code has instructions only a GPU runs."""
SMEM = 232448  # an H200's shared memory a block may have

CPU_PRELUDE = r"""
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __maxnreg__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__
struct nk_dim3 { unsigned x, y, z; };
thread_local nk_dim3 threadIdx, blockIdx;
nk_dim3 blockDim, gridDim;
alignas(1024) unsigned char nk_smem[NK_SMEM];
// A barrier of n threads; one waiting 20 s has met a barrier some thread never reaches (a divergent shuffle or
// __syncthreads): the process stops rather than hang.
struct nk_barrier {
  std::mutex m; std::condition_variable cv; unsigned n, waiting = 0, round = 0;
  explicit nk_barrier(unsigned n) : n(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(m);
    unsigned r = round;
    if (++waiting == n) { waiting = 0; round++; cv.notify_all(); return; }
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return round != r; })) {
      std::fprintf(stderr, "simt: a barrier of %u threads waited 20 s for %u of them\n", n, n - waiting);
      std::abort();
    }
  }
};
static nk_barrier* nk_block;
static nk_barrier* nk_warps[32];
static unsigned long long nk_slots[1024];
inline void __syncthreads() { nk_block->arrive_and_wait(); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
  unsigned t = threadIdx.x;
  std::memcpy(&nk_slots[t], &v, sizeof v);
  nk_warps[t >> 5]->arrive_and_wait();
  std::memcpy(&v, &nk_slots[(t & ~31u) | ((t & 31) ^ m)], sizeof v);
  nk_warps[t >> 5]->arrive_and_wait();
  return v;
}
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }
template <class T, class U> inline T nk_cast(U u) { T t; std::memcpy(&t, &u, sizeof t); return t; }
inline float __uint_as_float(unsigned u) { return nk_cast<float>(u); }
inline float __int_as_float(int u) { return nk_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return nk_cast<unsigned>(f); }
inline int __float_as_int(float f) { return nk_cast<int>(f); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
struct nk_f16 { unsigned short x; };
struct nk_bf16 { unsigned short x; };
inline float nk_tof(nk_f16 h) { return (float)nk_cast<_Float16>(h.x); }
inline float nk_tof(nk_bf16 h) { return __uint_as_float(((unsigned)h.x) << 16); }
inline nk_f16 nk_to_f16(float f) { return {nk_cast<unsigned short>((_Float16)f)}; }
inline nk_bf16 nk_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
  return {(unsigned short)((u + 0x7fffu + ((u >> 16) & 1)) >> 16)};
}
inline float nk_exp2(float x) { return std::exp2(x); }
inline float nk_exp(float x) { return nk_exp2(x * 1.4426950408889634f); }
inline float nk_log2(float x) { return std::log2(x); }
inline float nk_log(float x) { return nk_log2(x) * 0.6931471805599453f; }
inline float nk_div(float a, float b) { return a / b; }
#define nk_opaque(x) (x)
NK_SHARED
inline unsigned nk_bits32(float x) { return __float_as_uint(x); }
template <class W> inline void nk_store_if(W* p, W v, bool m) { if (m) *p = v; }
"""


def _params(source: str, name: str) -> list[str]:
    """The C types of the generated kernel's parameters (one per runtime parameter, in order)."""
    sig = re.search(rf"void\s+(?:__\w+__\([^)]*\)\s+)*{name}\(([^)]*)\)", source).group(1)
    return [p.rsplit(None, 1)[0].replace("__restrict__", "").replace("const", "").strip() for p in sig.split(",")]


def _library(source: str, name: str, params: list) -> ctypes.CDLL:
    """The kernel and a launcher, `nk_run(args, gx, gy, gz, threads)`, built once per source."""
    call = ", ".join(f"({t})args[{i}]" if t.endswith("*") else f"*({t}*)args[{i}]" for i, t in enumerate(params))
    runner = f"""
extern "C" void nk_run(void** args, unsigned gx, unsigned gy, unsigned gz, unsigned threads) {{
  blockDim = {{threads, 1, 1}}; gridDim = {{gx, gy, gz}};
  nk_barrier block(threads); nk_block = &block;
  std::vector<nk_barrier*> warps;
  for (unsigned w = 0; w < threads / 32; w++) warps.push_back(nk_warps[w] = new nk_barrier(32));
  for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) {{
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++)
      ts.emplace_back([=] {{ threadIdx = {{t, 0, 0}}; blockIdx = {{x, y, z}}; {name}({call}); }});
    for (auto& th : ts) th.join();
  }}
  for (auto* b : warps) delete b;
}}
"""
    text = CPU_PRELUDE.replace("NK_SMEM", str(SMEM)).replace("NK_SHARED", SHARED) + source.replace(PRELUDE.strip(), "") \
        + runner
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "newt-simt" / f"{digest}.so"
    if not out.exists():
        out.parent.mkdir(exist_ok=True)
        src = out.with_suffix(".cpp")
        src.write_text(text)
        tmp = out.with_suffix(f".{id(text)}.so")
        r = subprocess.run([GXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", tmp, src],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"g++ failed on {src}:\n{r.stderr[-3000:]}")
        tmp.replace(out)
    return ctypes.CDLL(str(out))


def run(kernel, grid: tuple, args: list, meta: dict) -> None:
    """Launch `kernel[grid](*args, **meta)` on the CPU (torch CPU tensors), through its generated CUDA."""
    out = kernel.output(list(args), dict(meta), "cuda", "sm_90a").cuda
    if GPU_ONLY.search(out.source.replace(PRELUDE.strip(), "")):
        raise NeedsGpu(out.name)
    params = _params(out.source, out.name)  # the kernel's runtime parameters, in order
    keep, values = [], []
    for t, a in zip(params, args, strict=True):
        if isinstance(a, torch.Tensor):
            values.append(ctypes.c_void_p(a.data_ptr()))
        else:
            c = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "float": ctypes.c_float,
                 "double": ctypes.c_double, "unsigned": ctypes.c_uint}[t](a)
            keep.append(c)
            values.append(ctypes.cast(ctypes.pointer(c), ctypes.c_void_p))
    argv = (ctypes.c_void_p * len(values))(*values)
    gx, gy, gz = (*grid, 1, 1)[:3]
    _library(out.source, out.name, params).nk_run(argv, gx, gy, gz, out.threads)
