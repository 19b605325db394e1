"""The generated CUDA of a launch, run on the CPU: every CUDA thread an OS thread, a block's threads at once and the
blocks in waves of WAVE at once (in the order a GPU starts them, each with shared memory of its own, poisoned), so
that a layout, a reduction's shuffles, a conversion through shared memory and a tensor-core pipeline run as the GPU
would run them, where CI has no GPU (the interpreter runs the IR before the passes, this runs their output).

The kernel's source is newt's own, with the prelude (PTX asm for conversions and fast math) swapped for C++ that
rounds the same way (`CPU_PRELUDE`: f16 through _Float16, bf16 and f32 math as IEEE, exp2 and log2 exact where the
GPU's approximate units are within 2 ulp), compiled by the host's g++. A shuffle is a write to the warp's slots
between two barriers of its 32 threads; `__syncthreads` a barrier of the block. The rest of the PTX, `ASM`, becomes
C++ that follows the PTX tables: mma.sync and ldmatrix exchange their fragments through the warp's slots; wgmma reads
its operands through their descriptors' canonical layouts and swizzles; cp.async and TMA copy at once (TMA through a
tensor map of simt's own, `MAP`), completing the bytes an mbarrier expects; mbarrier waits block until their phase
completes, and named barriers count their threads. Atomics (and red) read, modify and write under one lock: a block
starts after every lower one, so a program that waits only for lower ones (stream-K's parts) finds them done or
running; programs of a wave that race (a shared scratch, a count read too early) show it as on a GPU. A cluster's
CTAs run in one wave: a multicast copy lands in each CTA of its mask, an arrival through `mapa` on the other CTA's
barrier, and the cluster's barrier waits for their threads that have not exited (as the GPU's). What it does not
know (a user's inline asm) it leaves: `run` then takes the next arch, or raises NeedsGpu.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

from newtc import jit
from newtc.errors import NkError
from newtc.codegen.prelude import PRELUDE

GXX = shutil.which("g++")
INTERPRET = jit.Kernel.interpret  # the interpreter, whatever a test puts in its place


def _section(start: str, end: str | None = None) -> str:
    return PRELUDE[PRELUDE.index(start):PRELUDE.index(end) if end else None]


# the prelude's plain C++, which the CPU build shares: fp8 conversions (torch's software path, as no __CUDA_ARCH__ is
# defined), bit casts, zeros, shuffles of any type, vector words, packed tensor-core operands, wgmma descriptors,
# floating-point atomic max and min
SHARED = _section("// fp8 as torch converts it", "// Triton's choices for f32") + \
    _section("template <class T, class U> __device__ __forceinline__ T nk_bitcast", "// cp.async of B bytes") + \
    _section("// A wgmma matrix descriptor", "// A store under a predicate") + \
    _section("// Floating-point atomic max/min")
GPU_ONLY = re.compile(r"\basm\b")  # PTX left untranslated


class NeedsGpu(Exception):
    """The kernel's code has instructions only a GPU runs."""
SMEM = 232448  # an H200's shared memory a block may have
WAVE = 4  # blocks that run at once: programs that race show it, as on a GPU (whose SMs run many)
EXTERN_SMEM = "extern __shared__ __align__(1024) unsigned char nk_smem[];"  # a CTA's own, in the CPU prelude

CPU_PRELUDE = r"""
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
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
#define __grid_constant__
#define __cluster_dims__(...)
struct nk_tmap { unsigned long long v[16]; };
struct nk_dim3 { unsigned x, y, z; };
thread_local nk_dim3 threadIdx, blockIdx;
nk_dim3 blockDim, gridDim;
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
  void leave() {  // a thread that has exited counts as arrived (a cluster's barrier)
    std::lock_guard<std::mutex> lock(m);
    if (--n == waiting && waiting) { waiting = 0; round++; cv.notify_all(); }
  }
};
struct nk_mbar { unsigned count, pending, phase; long long tx; };
// A CTA's own state, one for each CTA of a wave: its shared memory (poisoned at its start, as the GPU leaves it
// undefined), its barriers, its warps' exchange slots, its mbarriers and named barriers
struct nk_cta {
  alignas(1024) unsigned char smem[NK_SMEM];
  nk_barrier* block; nk_barrier* warps[32] = {}; unsigned words[1024][8];
  std::map<unsigned, nk_mbar> mbars; nk_barrier* named[16] = {};
  nk_cta** cluster; unsigned rank; nk_barrier* cluster_bar;  // its cluster's CTAs (by rank), its rank, their barrier
};
thread_local nk_cta* nk_me;
#define nk_smem (nk_me->smem)
inline void __syncthreads() { nk_me->block->arrive_and_wait(); }
// a trap or a failed assertion stops the process, as it stops the GPU's context
[[noreturn]] inline void nk_trap(const char* what) { std::fprintf(stderr, "simt: %s\n", what); std::abort(); }
inline void __assertfail(const char* msg, const char*, unsigned, const char*, int) { nk_trap(msg); }
inline void __syncwarp() { nk_me->warps[threadIdx.x >> 5]->arrive_and_wait(); }
// A warp-wide exchange (shuffles, ldmatrix, mma.sync): each lane posts N words, a barrier of the warp, every lane
// reads every lane's, a barrier again before the slots are reused.
template <int N> inline void nk_gather(const unsigned (&mine)[N], unsigned (&all)[32][N]) {
  unsigned t = threadIdx.x;
  std::memcpy(nk_me->words[t], mine, sizeof mine);
  nk_me->warps[t >> 5]->arrive_and_wait();
  for (unsigned l = 0; l < 32; l++) std::memcpy(all[l], nk_me->words[(t & ~31u) | l], sizeof mine);
  nk_me->warps[t >> 5]->arrive_and_wait();
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
inline unsigned long long __cvta_generic_to_global(const void* p) { return (unsigned long long)p; }
// atomics at any scope: the old value, read, modified and written under one lock
static std::mutex nk_atomic_lock;
#define NK_RMW(f, e) \
  template <class T, class U> inline T f(T* p, U u) { \
    std::lock_guard<std::mutex> g(nk_atomic_lock); T o = *p, v = (T)u; *p = (e); return o; } \
  template <class T, class U> inline T f##_block(T* p, U u) { return f(p, u); } \
  template <class T, class U> inline T f##_system(T* p, U u) { return f(p, u); }
NK_RMW(atomicAdd, o + v) NK_RMW(atomicMax, o > v ? o : v) NK_RMW(atomicMin, o < v ? o : v) NK_RMW(atomicExch, v)
NK_RMW(atomicOr, o | v) NK_RMW(atomicAnd, o & v) NK_RMW(atomicXor, o ^ v)
template <class T, class U, class V> inline T atomicCAS(T* p, U c, V u) {
  std::lock_guard<std::mutex> g(nk_atomic_lock); T o = *p; if (o == (T)c) *p = (T)u; return o;
}
template <class T, class U, class V> inline T atomicCAS_block(T* p, U c, V u) { return atomicCAS(p, c, u); }
template <class T, class U, class V> inline T atomicCAS_system(T* p, U c, V u) { return atomicCAS(p, c, u); }
template <class T, class U> inline T nk_cast(U u) { T t; std::memcpy(&t, &u, sizeof t); return t; }
inline float __uint_as_float(unsigned u) { return nk_cast<float>(u); }
inline float __int_as_float(int u) { return nk_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return nk_cast<unsigned>(f); }
inline int __float_as_int(float f) { return nk_cast<int>(f); }
inline double __longlong_as_double(long long u) { return nk_cast<double>(u); }
inline long long __double_as_longlong(double d) { return nk_cast<long long>(d); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
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
// the GPU's integer division, where x86 traps: x // 0 = x, x % 0 = 0, the most negative value // -1 wraps to itself
template <class T> inline T nk_idiv(T a, T b) {
  return b == 0 ? a : (T)-1 < (T)0 && b == (T)-1 ? (T)(0ull - (unsigned long long)a) : a / b;
}
template <class T> inline T nk_imod(T a, T b) { return b == 0 || ((T)-1 < (T)0 && b == (T)-1) ? (T)0 : a % b; }
#define nk_opaque(x) (x)
NK_SHARED
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
enum { NK_F16, NK_BF16, NK_TF32, NK_S8, NK_U8, NK_E4M3, NK_E5M2 };
template <int TYPE, int W> inline double nk_element(unsigned reg, unsigned e) {
  unsigned bits = reg >> (32 / W * e);
  switch (TYPE) {
    case NK_F16: return nk_tof(nk_f16{(unsigned short)bits});
    case NK_BF16: return nk_tof(nk_bf16{(unsigned short)bits});
    case NK_TF32: return __uint_as_float(bits & ~0x1fffu);  // the tensor cores read a tf32's top 19 bits
    case NK_S8: return (signed char)bits;
    case NK_E4M3: return nk_tof(nk_f8e4m3{(unsigned char)bits});
    case NK_E5M2: return nk_tof(nk_f8e5m2{(unsigned char)bits});
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
// wgmma.mma_async m64nNkK: warp w of the warpgroup holds rows 16w.. of D (64 x N, f32) as mma.sync's C fragments, one
// per 8 columns (register i: row g + 8 ((i / 2) % 2), column 8 (i / 4) + 2t + i % 2), and with A in registers its 16
// rows as mma.sync's A fragment (m16n8k16). Operands in shared memory are read through their descriptors in the
// canonical forms: K-major, rows of the swizzle's width 8-row groups SBO apart; MN-major (transposed), columns of
// the swizzle's width, 8 K rows to an atom, atoms SBO apart along K and LBO along M or N; the swizzle XORs address
// bits 7.. into bits 4.. . The product lands at once: the fences and waits around it have nothing to wait for.
inline unsigned nk_swizzle(unsigned a, unsigned bytes) { return bytes ? a ^ ((a >> 7) & (bytes / 16 - 1)) << 4 : a; }
inline unsigned nk_desc_at(unsigned long long d, unsigned mn, unsigned k, bool trans, unsigned item) {
  unsigned start = (d & 0x3fff) << 4, lbo = ((d >> 16) & 0x3fff) << 4, sbo = ((d >> 32) & 0x3fff) << 4;
  unsigned mode = 256 >> (d >> 62), width = mode / item;  // mode 1: 128 bytes, 2: 64, 3: 32
  return nk_swizzle(start + (trans ? (mn % width + k % 8 * width) * item + mn / width * lbo + k / 8 * sbo
                                   : (mn % 8 * width + k) * item + mn / 8 * sbo), mode);
}
template <int TYPE> inline double nk_shared_element(unsigned addr) {
  unsigned bits = 0;
  std::memcpy(&bits, nk_smem + addr, TYPE >= NK_E4M3 ? 1 : 2);
  return nk_element<TYPE, 1>(bits, 0);
}
template <int N, int K, int TYPE, bool REG_A, int SCALE_D, int TA, int TB>
inline void nk_wgmma(float* const* d, const unsigned* a, unsigned long long da, unsigned long long db) {
  unsigned l = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = l / 4, t = l % 4, item = TYPE >= NK_E4M3 ? 1 : 2;
  unsigned all[32][4];
  if (REG_A) nk_gather<4>({a[0], a[1], a[2], a[3]}, all);
  for (unsigned i = 0; i < N / 2; i++) {
    unsigned row = 16 * w + g + 8 * (i / 2 % 2), col = 8 * (i / 4) + 2 * t + i % 2;
    double s = 0;
    for (unsigned k = 0; k < K; k++) {
      double x = REG_A ? nk_element<TYPE, 2>(all[4 * g + k % 8 / 2][i / 2 % 2 + 2 * (k / 8)], k % 2)
                       : nk_shared_element<TYPE>(nk_desc_at(da, row, k, TA, item));
      s += x * nk_shared_element<TYPE>(nk_desc_at(db, col, k, TB, item));
    }
    *d[i] = (SCALE_D ? *d[i] : 0.0f) + (float)s;
  }
}
// mbarriers: a phase completes when its arrivals are in and the bytes it expects have landed; a wait for parity p
// returns once the phase of that parity has completed.
static std::mutex nk_mbar_lock;
static std::condition_variable nk_mbar_done;
inline void nk_mbar_init(unsigned a, unsigned n) {
  std::lock_guard<std::mutex> g(nk_mbar_lock); nk_me->mbars[a] = {n, n, 0, 0};
}
inline void nk_mbar_inval(unsigned a) { std::lock_guard<std::mutex> g(nk_mbar_lock); nk_me->mbars.erase(a); }
inline void nk_mbar_update(unsigned a, unsigned arrivals, long long tx, nk_cta* cta = nk_me) {
  std::lock_guard<std::mutex> g(nk_mbar_lock);
  nk_mbar& b = cta->mbars.at(a);
  b.pending -= arrivals;
  b.tx += tx;
  if (!b.pending && !b.tx) { b.phase ^= 1; b.pending = b.count; nk_mbar_done.notify_all(); }
}
inline void nk_mbar_wait(unsigned a, unsigned parity) {
  std::unique_lock<std::mutex> g(nk_mbar_lock);
  if (!nk_mbar_done.wait_for(g, std::chrono::seconds(20), [&] { return nk_me->mbars.at(a).phase != (parity & 1); })) {
    std::fprintf(stderr, "simt: an mbarrier wait of 20 s\n");
    std::abort();
  }
}
// bar.sync id, n: a barrier of n threads (the consumer warpgroups), made at its first use
inline void nk_bar_sync(unsigned id, unsigned n) {
  { std::lock_guard<std::mutex> g(nk_mbar_lock); if (!nk_me->named[id]) nk_me->named[id] = new nk_barrier(n); }
  nk_me->named[id]->arrive_and_wait();
}
// TMA: simt's tensor map (run() writes it where the driver's would be): the box at the coordinates, innermost first,
// written row by row into shared memory under the swizzle (zeros out of bounds), or read back out of it; a multicast
// load (a mask of the cluster's CTAs) writes the same slot of each CTA of the mask, completing on its barrier there
struct nk_map { unsigned long long base; unsigned rank, item, swizzle, dims[5], box[5]; unsigned long long strides[5]; };
template <int R, bool LOAD> inline void nk_tma(const void* m, unsigned smem, const int (&c)[R], unsigned mbar = 0,
                                               unsigned mask = 0) {
  const nk_map& map = *(const nk_map*)m;
  unsigned n = 1;
  for (int r = 0; r < R; r++) n *= map.box[r];
  for (unsigned to = 0; to < 8; to++) {
    nk_cta* cta = mask ? (mask >> to & 1 ? nk_me->cluster[to] : nullptr) : to ? nullptr : nk_me;
    if (!cta) continue;
    for (unsigned e = 0; e < n; e++) {
      unsigned long long at = map.base;
      bool inside = true;
      for (unsigned r = 0, rest = e; r < (unsigned)R; rest /= map.box[r], r++) {
        long long x = c[r] + (long long)(rest % map.box[r]);
        inside = inside && x >= 0 && x < map.dims[r];
        at += x * (r ? map.strides[r - 1] : map.item);
      }
      unsigned char* s = cta->smem + nk_swizzle(smem + e * map.item, map.swizzle);
      if (LOAD && inside) std::memcpy(s, (const void*)at, map.item);
      else if (LOAD) std::memset(s, 0, map.item);
      else if (inside) std::memcpy((void*)at, s, map.item);
    }
    if (LOAD) nk_mbar_update(mbar, 0, -(long long)(n * map.item), cta);
  }
}
template <int B> inline void nk_cp_async(unsigned dst, const void* src, bool pred) {
  if (pred) std::memcpy(nk_smem + dst, src, B); else std::memset(nk_smem + dst, 0, B);
}
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


MMA_TYPES = {"f16": "NK_F16", "bf16": "NK_BF16", "tf32": "NK_TF32", "s8": "NK_S8", "u8": "NK_U8", "e4m3": "NK_E4M3",
             "e5m2": "NK_E5M2"}


def _wgmma(m, outs: list, ins: list) -> str:
    """wgmma.mma_async: its accumulators by address, A's four registers or descriptor, B's descriptor."""
    n, k, types, flags = m[1], m[2], MMA_TYPES[m[3]], [int(f) for f in m[4].split(",")[1:]]
    scale_d, reg_a = flags[0], len(ins) == 5
    ta, tb = (0, 0, *flags[3:])[-2:] if not reg_a else (0, (0, *flags[3:])[-1])
    a = f"nk_a, 0ull, {ins[4]}" if reg_a else f"nullptr, {ins[0]}, {ins[1]}"
    return (f"{{ float* const nk_d[] = {{{', '.join('&' + o for o in outs)}}}; " +
            (f"unsigned nk_a[] = {{{', '.join(ins[:4])}}}; " if reg_a else "") +
            f"nk_wgmma<{n}, {k}, {types}, {str(reg_a).lower()}, {scale_d}, {ta}, {tb}>(nk_d, {a}); }}")


def _tma(load: bool, multicast: bool = False):
    """cp.async.bulk.tensor: the map, the box in shared memory, its coordinates (and a load's mbarrier, and a
    multicast's mask of CTAs)."""
    def cpp(m, outs: list, ins: list) -> str:
        last = len(ins) - load - multicast  # the coordinates end where the mbarrier and the mask begin
        return f"nk_tma<{last - 2}, {str(load).lower()}>((const void*)({ins[0]}), {ins[1]}, " \
            f"{{{', '.join(ins[2:last])}}}{''.join(', ' + x for x in ins[last:])})"
    return cpp


RED_TYPES = {"f32": "float", "f64": "double", "s32": "int", "u32": "unsigned", "b32": "unsigned", "s64": "long long",
             "u64": "unsigned long long", "b64": "unsigned long long"}  # red's operand types, in C
NOTHING = lambda m, outs, ins: "(void)0"  # noqa: E731 - ordering, register pins and waits a synchronous copy needs not
# PTX the CPU runs, as C++: (pattern of the instruction, its statement from the match, outputs and inputs)
ASM = [(re.compile(r'cp\.async\.(bulk\.)?(commit|wait)_group|wgmma\.(fence|commit_group|wait_group)|fence\.|'
                   r'setmaxnreg|"'), NOTHING),
       (re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x(\d)(\.trans)?\.shared\.b16 "),
        lambda m, outs, ins: f"{{ unsigned nk_d[{m[1]}]; nk_ldmatrix<{m[1]}, {str(bool(m[2])).lower()}>({ins[0]}, "
                             "nk_d); " + " ".join(f"{o} = nk_d[{j}];" for j, o in enumerate(outs)) + " }"),
       (re.compile(r"mma\.sync\.aligned\.m16n8k(\d+)\.row\.col\.\w+\.(\w+)\."),
        lambda m, outs, ins: f"nk_mma<{m[1]}, {MMA_TYPES[m[2]]}>({', '.join(outs + ins)})"),
       (re.compile(r'wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.f32\.(\w+)\.\w+ [^"]*?((?:, \d+)+);"'), _wgmma),
       (re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.mbarrier::complete_tx::bytes \["),
        _tma(True)),
       (re.compile(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                   r"\.multicast::cluster \["), _tma(True, True)),
       (re.compile(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta\.bulk_group \["), _tma(False)),
       (re.compile(r"mov\.u32 %0, %%cluster_ctarank;"), lambda m, outs, ins: f"{outs[0]} = nk_me->rank"),
       (re.compile(r"\{ \.reg \.b32 ra; mapa\.shared::cluster\.u32 ra, %0, (\d+); mbarrier\.arrive\.shared::cluster"),
        lambda m, outs, ins: f"nk_mbar_update({ins[0]}, 1, 0, nk_me->cluster[{m[1]}])"),
       (re.compile(r"barrier\.cluster\.arrive\.release\.aligned; barrier\.cluster\.wait"),
        lambda m, outs, ins: "nk_me->cluster_bar->arrive_and_wait()"),
       (re.compile(r"mbarrier\.init\.shared::cta\.b64 \[%0\], (\d+);"),
        lambda m, outs, ins: f"nk_mbar_init({ins[0]}, {m[1]})"),
       (re.compile(r"mbarrier\.inval\.shared::cta"), lambda m, outs, ins: f"nk_mbar_inval({ins[0]})"),
       (re.compile(r"mbarrier\.arrive\.expect_tx\.shared::cta"),
        lambda m, outs, ins: f"nk_mbar_update({ins[0]}, 1, {ins[1]})"),
       (re.compile(r"mbarrier\.arrive\.shared::cta"), lambda m, outs, ins: f"nk_mbar_update({ins[0]}, 1, 0)"),
       (re.compile(r"\{ \.reg \.pred p; W: mbarrier\.try_wait\.parity\.shared::cta"),
        lambda m, outs, ins: f"nk_mbar_wait({ins[0]}, {ins[1]})"),
       (re.compile(r"red\.relaxed\.\w+\.global\.(\w+)(?:\.v\d)?\.(\w+) "),
        lambda m, outs, ins: "{ " + " ".join(f"atomic{m[1].title()}(({RED_TYPES[m[2]]}*){ins[0]} + {j}, {v});"
                                             for j, v in enumerate(ins[1:])) + " }"),
       (re.compile(r"bar\.sync (\d+), (\d+);"), lambda m, outs, ins: f"nk_bar_sync({m[1]}, {m[2]})"),
       (re.compile(r"trap;"), lambda m, outs, ins: 'nk_trap("trap")')]


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
    return [re.sub(r"__restrict__|const|__grid_constant__", "", p.rsplit(None, 1)[0]).strip() for p in sig.split(",")]


def _library(source: str, name: str, params: list) -> ctypes.CDLL:
    """The kernel and a launcher, `nk_run(args, gx, gy, gz, threads, wave, cluster)`, built once per source: the
    blocks in waves of `wave` (whole clusters of `cluster` CTAs along x) that run at once, in the order a GPU starts
    them."""
    call = ", ".join(f"({t})args[{i}]" if t.endswith("*") else f"*({t}*)args[{i}]" for i, t in enumerate(params))
    runner = f"""
extern "C" void nk_run(void** args, unsigned gx, unsigned gy, unsigned gz, unsigned threads, unsigned wave,
                       unsigned cluster) {{
  blockDim = {{threads, 1, 1}}; gridDim = {{gx, gy, gz}};
  std::vector<nk_cta*> ctas(wave);
  for (unsigned c = 0; c < wave; c++) {{
    ctas[c] = new nk_cta();
    ctas[c]->block = new nk_barrier(threads);
    for (unsigned w = 0; w < threads / 32; w++) ctas[c]->warps[w] = new nk_barrier(32);
    ctas[c]->cluster = &ctas[c - c % cluster];
    ctas[c]->rank = c % cluster;
    ctas[c]->cluster_bar = c % cluster ? ctas[c - c % cluster]->cluster_bar : new nk_barrier(threads * cluster);
  }}
  for (unsigned first = 0, n = gx * gy * gz; first < n; first += wave) {{
    std::vector<std::thread> ts;
    for (unsigned b = first; b < n && b < first + wave; b++) {{
      nk_cta* me = ctas[b - first];
      std::memset(me->smem, 0xff, sizeof me->smem);
      if (!me->rank) me->cluster_bar->n = threads * cluster;
      for (unsigned t = 0; t < threads; t++)
        ts.emplace_back([=] {{ nk_me = me; threadIdx = {{t, 0, 0}}; blockIdx = {{b % gx, b / gx % gy, b / gx / gy}};
                              {name}({call}); me->cluster_bar->leave(); }});
    }}
    for (auto& th : ts) th.join();
  }}
  for (auto* c : ctas) {{
    if (!c->rank) delete c->cluster_bar;
    delete c->block;
    for (auto* b : c->warps) delete b;
    for (auto* b : c->named) delete b;
    delete c;
  }}
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
        if missing := re.search(r"error: .(\w+). was not declared in this scope", r.stderr):
            raise NeedsGpu(f"{name} calls {missing[1]}, which only the GPU's math library has")
        if r.returncode:
            raise RuntimeError(f"g++ failed on {src}:\n{r.stderr[-3000:]}")
        tmp.replace(out)
    return ctypes.CDLL(str(out))


SCALARS = {"bool": ctypes.c_bool, "signed char": ctypes.c_byte, "short": ctypes.c_short, "int": ctypes.c_int,
           "long long": ctypes.c_longlong, "unsigned char": ctypes.c_ubyte, "unsigned short": ctypes.c_ushort,
           "unsigned": ctypes.c_uint, "unsigned long long": ctypes.c_ulonglong, "float": ctypes.c_float,
           "double": ctypes.c_double}  # a scalar parameter's C type (codegen.cexpr.CTYPES) -> its ctypes
MAP = struct.Struct("<QIII5I5I4x5Q")  # the CPU prelude's nk_map: base, rank, itemsize, swizzle, dims, box, strides


def _map(m: dict, args: list) -> bytes:
    """simt's tensor map for TMA map `m` of a launch: the fields the launcher gives the driver (jit.tmap_fields)."""
    item, base, dims, strides, box, swizzle = jit.tmap_fields(
        m, [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args])
    pad = lambda xs: [*xs, *[0] * (5 - len(xs))]  # noqa: E731
    return MAP.pack(base, len(dims), item, swizzle, *pad(dims), *pad(box), *pad(strides))


def run(kernel, grid: tuple, args: list, meta: dict, archs: tuple = ("sm_90a", "sm_80")) -> None:
    """Launch `kernel[grid](*args, **meta)` on the CPU (torch CPU tensors), through its generated CUDA for the first
    of `archs` whose code the CPU runs (an H200's, else an A100's: clusters are out of reach)."""
    args = list(args)
    for i, arch in enumerate(archs):
        try:
            compiled = kernel.output(list(args), dict(meta), "cuda", arch)
        except NkError:
            if i == 0:
                raise
            continue  # a later arch that cannot take the launch (clusters on sm_80)
        out = compiled.cuda
        body = _translate(out.source.replace(PRELUDE.strip(), "").replace(EXTERN_SMEM, ""))
        if not GPU_ONLY.search(body):
            break
    else:
        raise NeedsGpu(kernel.name)
    kernel.check_scalars([p.type.dtype for p in compiled.kernel.params], args)  # as the interpreter and launcher do
    params = _params(body, out.name)  # the kernel's runtime parameters, in order, then its tensor maps
    keep, values = [], []
    for t, a in zip(params, args + [_map(m, args) for m in compiled.kernel.tmaps], strict=True):
        if isinstance(a, torch.Tensor):
            values.append(ctypes.c_void_p(a.data_ptr()))
        elif isinstance(a, bytes):
            keep.append(ctypes.create_string_buffer(a, 128))
            values.append(ctypes.cast(keep[-1], ctypes.c_void_p))
        else:
            c = SCALARS[t](a)
            keep.append(c)
            values.append(ctypes.cast(ctypes.pointer(c), ctypes.c_void_p))
    argv = (ctypes.c_void_p * len(values))(*values)
    gx, gy, gz = (*grid, 1, 1)[:3]
    ctas = compiled.kernel.spec.num_ctas
    _library(body, out.name, params).nk_run(argv, gx, gy, gz, out.threads, -(-WAVE // ctas) * ctas, ctas)


def run_or_interpret(kernel, grid: tuple, args: list, meta: dict) -> None:
    """`run`, or the interpreter where the kernel's code needs a GPU."""
    try:
        run(kernel, grid, args, meta)
    except NeedsGpu:
        INTERPRET(kernel, grid, args, meta)
