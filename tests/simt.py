"""The generated CUDA of a launch, run on the CPU: every CUDA thread an OS thread, a block's threads at once and the
blocks one after another, so that a layout, a reduction's shuffles and a conversion through shared memory run as the
GPU would run them, where CI has no GPU (the interpreter runs the IR before the passes, this runs their output).

The kernel's source is newt's own, with the prelude (PTX asm for conversions and fast math) swapped for C++ that
rounds the same way (`CPU_PRELUDE`: f16 through _Float16, bf16 and f32 math as IEEE, exp2 and log2 exact where the
GPU's approximate units are within 2 ulp), compiled by the host's g++. A shuffle is a write to the warp's slots
between two barriers of its 32 threads; `__syncthreads` a barrier of the block. The code is an H200's (sm_90a) or,
where that has wgmma or TMA, an A100's (sm_80), whose tensor-core PTX `ASM` turns into C++ by the PTX tables: mma.sync
and ldmatrix exchange their fragments through the warp's slots, cp.async copies at once. Code with other PTX (wgmma,
TMA, atomics, inline asm) is out of reach: `run` raises NeedsGpu.
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


def _section(start: str, end: str) -> str:
    return PRELUDE[PRELUDE.index(start):PRELUDE.index(end)]


# the prelude's plain C++, which the CPU build shares: fp8 conversions (torch's software path, as no __CUDA_ARCH__ is
# defined), bit casts, zeros, shuffles of any type, vector words, packed tensor-core operands
SHARED = _section("// fp8 as torch converts it", "// Triton's choices for f32") + \
    _section("template <class T, class U> __device__ __forceinline__ T nk_bitcast", "// cp.async of B bytes")
GPU_ONLY = re.compile(r"\basm\b|nk_desc|\batomic|nk_map")  # PTX left untranslated, wgmma, TMA, atomics


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
static unsigned nk_words[1024][8];
inline void __syncthreads() { nk_block->arrive_and_wait(); }
// A warp-wide exchange (shuffles, ldmatrix, mma.sync): each lane posts N words, a barrier of the warp, every lane
// reads every lane's, a barrier again before the slots are reused.
template <int N> inline void nk_gather(const unsigned (&mine)[N], unsigned (&all)[32][N]) {
  unsigned t = threadIdx.x;
  std::memcpy(nk_words[t], mine, sizeof mine);
  nk_warps[t >> 5]->arrive_and_wait();
  for (unsigned l = 0; l < 32; l++) std::memcpy(all[l], nk_words[(t & ~31u) | l], sizeof mine);
  nk_warps[t >> 5]->arrive_and_wait();
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) {
  static_assert(sizeof v <= 8);
  unsigned mine[2] = {}, all[32][2];
  std::memcpy(mine, &v, sizeof v);
  nk_gather<2>(mine, all);
  std::memcpy(&v, all[(threadIdx.x & 31) ^ m], sizeof v);
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
// ldmatrix.x N: lanes 8j..8j+7 give the byte addresses of matrix j's 8 rows of 8 b16; lane l = 4g + t receives row g,
// elements 2t and 2t + 1 (transposed: column g, rows 2t and 2t + 1)
template <int N, bool TRANS> inline void nk_ldmatrix(unsigned addr, unsigned* d) {
  unsigned all[32][1], l = threadIdx.x & 31;
  nk_gather<1>({addr}, all);
  for (int j = 0; j < N; j++)
    for (unsigned h = 0; h < 2; h++) {
      unsigned row = TRANS ? 2 * (l % 4) + h : l / 4, col = TRANS ? l / 4 : 2 * (l % 4) + h;
      unsigned short e;
      std::memcpy(&e, nk_smem + all[8 * j + row][0] + 2 * col, 2);
      d[j] = h ? d[j] | (unsigned)e << 16 : e;
    }
}
// mma.sync.m16n8kK, K / 8 = W elements a 32-bit register; lane l = 4g + t. A (16 x K) register i: row g + 8 (i % 2),
// k t W + 4 W (i / 2) + e; B (K x 8) register i: k t W + 4 W i + e, column g; C and D register i: row g + 8 (i / 2),
// column 2t + i % 2. Products and sums in double (f16, bf16 and tf32 products are exact), rounded once.
enum { NK_F16, NK_BF16, NK_TF32, NK_S8, NK_U8 };
template <int TYPE, int W> inline double nk_element(unsigned reg, unsigned e) {
  unsigned bits = reg >> (32 / W * e);
  switch (TYPE) {
    case NK_F16: return nk_tof(nk_f16{(unsigned short)bits});
    case NK_BF16: return nk_tof(nk_bf16{(unsigned short)bits});
    case NK_TF32: return __uint_as_float(bits & ~0x1fffu);  // the tensor cores read a tf32's top 19 bits
    case NK_S8: return (signed char)bits;
    default: return (unsigned char)bits;
  }
}
template <int K, int TYPE, class Acc> inline void nk_mma(Acc& d0, Acc& d1, Acc& d2, Acc& d3, unsigned a0, unsigned a1,
    unsigned a2, unsigned a3, unsigned b0, unsigned b1, Acc c0, Acc c1, Acc c2, Acc c3) {
  constexpr int W = K / 8;
  unsigned all[32][6], l = threadIdx.x & 31, g = l / 4, t = l % 4;
  nk_gather<6>({a0, a1, a2, a3, b0, b1}, all);
  Acc c[4] = {c0, c1, c2, c3}, *d[4] = {&d0, &d1, &d2, &d3};
  for (unsigned i = 0; i < 4; i++) {
    unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    double s = 0;
    long long n = 0;
    for (unsigned k = 0; k < K; k++) {
      unsigned kt = k % (4 * W) / W, kh = k / (4 * W), e = k % W;
      double x = nk_element<TYPE, W>(all[4 * (row % 8) + kt][row / 8 + 2 * kh], e);
      double y = nk_element<TYPE, W>(all[4 * col + kt][4 + kh], e);
      if (TYPE >= NK_S8) n += (long long)x * (long long)y; else s += x * y;
    }
    *d[i] = TYPE >= NK_S8 ? (Acc)(int)(unsigned)((long long)c[i] + n) : (Acc)((double)c[i] + s);
  }
}
template <int B> inline void nk_cp_async(unsigned dst, const void* src, bool pred) {
  if (pred) std::memcpy(nk_smem + dst, src, B); else std::memset(nk_smem + dst, 0, B);
}
NK_SHARED
template <class W> inline void nk_store_if(W* p, W v, bool m) { if (m) *p = v; }
"""


def _statement(source: str, start: int) -> int:
    """The index just past the parenthesis that closes the one at `start`, string literals skipped."""
    depth, i = 0, start
    while True:
        c = source[i]
        if c == '"':
            i = source.index('"', i + 1)
        depth += (c == "(") - (c == ")")
        i += 1
        if not depth:
            return i


def _split(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside parentheses and string literals."""
    parts, depth, quoted, last = [], 0, False, 0
    for i, c in enumerate(text):
        quoted ^= c == '"'
        depth += (not quoted) * ((c == "(") - (c == ")"))
        if c == sep and not depth and not quoted:
            parts.append(text[last:i])
            last = i + 1
    return [*parts, text[last:]]


MMA_TYPES = {"f16": "NK_F16", "bf16": "NK_BF16", "tf32": "NK_TF32", "s8": "NK_S8", "u8": "NK_U8"}
# PTX the CPU runs, as C++: (pattern of the instruction, its statement from the match, outputs and inputs)
ASM = [(re.compile(r"cp\.async\.(commit|wait)_group"), lambda m, outs, ins: "(void)0"),
       (re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x(\d)(\.trans)?\.shared\.b16 "),
        lambda m, outs, ins: f"{{ unsigned nk_d[{m[1]}]; nk_ldmatrix<{m[1]}, {str(bool(m[2])).lower()}>({ins[0]}, nk_d); "
                             + " ".join(f"{o} = nk_d[{j}];" for j, o in enumerate(outs)) + " }"),
       (re.compile(r"mma\.sync\.aligned\.m16n8k(\d+)\.row\.col\.\w+\.(\w+)\."),
        lambda m, outs, ins: f"nk_mma<{m[1]}, {MMA_TYPES[m[2]]}>({', '.join(outs + ins)})")]


def _translate(body: str) -> str:
    """The kernel's inline PTX that ASM knows replaced by calls of the CPU prelude's emulations; the rest is left."""
    out, last = [], 0
    for m in re.finditer(r'\basm(\s+volatile)?\s*\(\s*"', body):
        found = next(((f, cpp) for pattern, cpp in ASM if (f := pattern.match(body, m.end()))), None)
        if found is None or m.start() < last:
            continue
        end = _statement(body, body.index("(", m.start()))
        _, outs, ins, *_ = [*_split(body[m.end() - 1:end - 1], ":"), "", ""]
        operands = [[re.fullmatch(r'\s*"[^"]*"\s*\((.*)\)\s*', o)[1] for o in _split(x, ",") if o.strip()]
                    for x in (outs, ins)]
        out += [body[last:m.start()], found[1](found[0], *operands)]
        last = end
    return "".join(out) + body[last:]


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
    text = CPU_PRELUDE.replace("NK_SMEM", str(SMEM)).replace("NK_SHARED", SHARED) + source + runner
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
    for arch in ("sm_90a", "sm_80"):  # an H200's code, else an A100's (mma.sync, ldmatrix, cp.async where no wgmma)
        out = kernel.output(list(args), dict(meta), "cuda", arch).cuda
        body = _translate(out.source.replace(PRELUDE.strip(), ""))
        if not GPU_ONLY.search(body):
            break
    else:
        raise NeedsGpu(out.name)
    params = _params(body, out.name)  # the kernel's runtime parameters, in order
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
    _library(body, out.name, params).nk_run(argv, gx, gy, gz, out.threads)
