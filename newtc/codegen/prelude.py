"""The CUDA prelude every kernel starts with: no headers, so NVRTC needs nothing but itself.

f16/bf16 are 16-bit structs converted with PTX `cvt`; arithmetic on them happens in f32.
"""
PRELUDE = r"""
struct __align__(64) nk_tmap { unsigned long long v[16]; };  // a CUtensorMap, passed as a __grid_constant__
struct nk_f16 { unsigned short x; };
struct nk_bf16 { unsigned short x; };
// f16 converts through libdevice, which NVVM sees into: an asm cvt of a 16-bit operand made it unpack each loaded pair
// early into two registers (f16 layer norm over rows of 11008: 125 registers where bf16 took 80, and 76 now)
extern "C" __device__ float __nv_half2float(unsigned short);
extern "C" __device__ unsigned short __nv_float2half_rn(float);
__device__ __forceinline__ float nk_tof(nk_f16 h) { return __nv_half2float(h.x); }
__device__ __forceinline__ float nk_tof(nk_bf16 h) { return __uint_as_float(((unsigned)h.x) << 16); }
__device__ __forceinline__ nk_f16 nk_to_f16(float f) { return {__nv_float2half_rn(f)}; }
__device__ __forceinline__ nk_bf16 nk_to_bf16(float f) { nk_bf16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h; }
// fp8 as torch converts it: round to nearest even, e4m3 saturates to +-448 (inf too), e5m2 overflows to inf, a NaN
// keeps its sign. sm_89+ converts with cvt; the software path is torch's (c10/util/Float8_*.h), for any arch
// (-DNK_FP8_SOFTWARE selects it on any GPU: the tests run it so on an H200).
#if __CUDA_ARCH__ >= 890 && !defined(NK_FP8_SOFTWARE)
#define NK_FP8_CVT
#endif
struct nk_f8e4m3 { unsigned char x; };
struct nk_f8e5m2 { unsigned char x; };
template <int M, int BIAS, unsigned OVER, unsigned OVER_CODE> __device__ __forceinline__ unsigned char nk_f8_soft(float f) {
  unsigned b = __float_as_uint(f) & 0x7fffffffu, r;
  const unsigned magic = (unsigned)(151 - BIAS - M) << 23;  // adding it rounds a subnormal into the low bits, exactly
  if (b >= OVER) r = b > 0x7f800000u ? 0x7f : OVER_CODE;
  else if (b < (unsigned)(128 - BIAS) << 23) r = __float_as_uint(__uint_as_float(b) + __uint_as_float(magic)) - magic;
  else r = min((b + ((unsigned)(BIAS - 127) << 23) + (1u << (22 - M)) - 1 + ((b >> (23 - M)) & 1)) >> (23 - M), OVER_CODE);
  return (unsigned char)(r | ((__float_as_uint(f) >> 24) & 0x80));
}
__device__ __forceinline__ float nk_f8e4m3_soft(unsigned char x) {
  unsigned e = (x >> 3) & 15, m = x & 7;
  float a = (x & 0x7f) == 0x7f ? __int_as_float(0x7fc00000) : e ? __uint_as_float((e + 120) << 23 | m << 20) : m * 0.001953125f;
  return __uint_as_float(__float_as_uint(a) | (x & 0x80u) << 24);
}
__device__ __forceinline__ nk_f8e4m3 nk_to_f8e4m3(float f) {
#ifdef NK_FP8_CVT
  unsigned short h; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(h) : "f"(f));
  return {(unsigned char)((h & 0x7f) | ((__float_as_uint(f) >> 24) & 0x80))};
#else
  return {nk_f8_soft<3, 7, 1087u << 20, 0x7e>(f)};
#endif
}
__device__ __forceinline__ nk_f8e5m2 nk_to_f8e5m2(float f) {
#ifdef NK_FP8_CVT
  unsigned short h; asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(h) : "f"(f));  // saturates: torch gives inf
  return {(unsigned char)((fabsf(f) < 61440.0f ? h & 0x7f : f != f ? 0x7f : 0x7c) | ((__float_as_uint(f) >> 24) & 0x80))};
#else
  return {nk_f8_soft<2, 15, 143u << 23, 0x7c>(f)};
#endif
}
__device__ __forceinline__ float nk_tof(nk_f8e4m3 v) {
#ifdef NK_FP8_CVT
  unsigned h; asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v.x & 0x7f)));
  return __uint_as_float(__float_as_uint(nk_tof(nk_f16{(unsigned short)h})) | (v.x & 0x80u) << 24);
#else
  return nk_f8e4m3_soft(v.x);
#endif
}
// an f16's top byte; the sign goes on after cvt, which makes every NaN positive (torch keeps a NaN's sign)
__device__ __forceinline__ float nk_tof(nk_f8e5m2 v) {
  return __uint_as_float(__float_as_uint(nk_tof(nk_f16{(unsigned short)((v.x & 0x7f) << 8)})) | (v.x & 0x80u) << 24);
}
// Triton's choices for f32: exp/log through the approximate base-2 units (flushing subnormals, which
// spares three fix-up instructions per call), full-range approximate division.
__device__ __forceinline__ float nk_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float nk_exp(float x) { return nk_exp2(x * 1.4426950408889634f); }
__device__ __forceinline__ float nk_log2(float x) { float y; asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float nk_log(float x) { return nk_log2(x) * 0.6931471805599453f; }
__device__ __forceinline__ float nk_div(float a, float b) { float y; asm("div.full.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b)); return y; }
// Integer // and % as C's, but x // 0 = x and x % 0 = 0, as in the interpreter: C leaves them undefined, and a
// pipeline's arithmetic for a next tile that does not exist may meet them
template <class T> __device__ __forceinline__ T nk_idiv(T a, T b) { return a / (b == 0 ? (T)1 : b); }
template <class T> __device__ __forceinline__ T nk_imod(T a, T b) { return a % (b == 0 ? (T)1 : b); }
// The values integer min, max and where choose from: through an asm ptxas cannot see a negation in (an identity prmt)
// where compiler.compile_cuda defines NK_OPAQUE (ptxas 12.6-13.3 drop a negation folded into sm_90's VIMNMX3).
#ifdef NK_OPAQUE
__device__ __forceinline__ unsigned nk_opaque(unsigned x) { unsigned y; asm("prmt.b32 %0, %1, 0, 0x3210;" : "=r"(y) : "r"(x)); return y; }
__device__ __forceinline__ int nk_opaque(int x) { return (int)nk_opaque((unsigned)x); }
#else
#define nk_opaque(x) (x)
#endif
template <class T, class U> __device__ __forceinline__ T nk_bitcast(U u) { union { U u; T t; } b; b.u = u; return b.t; }
template <class T> __device__ __forceinline__ T nk_zero() { T t{}; return t; }
// A warp shuffle of any value of up to 8 bytes (16-bit floats, bools and narrow integers travel in 32 bits).
template <class T> __device__ __forceinline__ T nk_shfl_xor(T v, int m) {
  union { T t; unsigned long long u; } a, b; a.u = 0; a.t = v;
  if constexpr (sizeof(T) > 4) b.u = __shfl_xor_sync(0xffffffffu, a.u, m);
  else b.u = __shfl_xor_sync(0xffffffffu, (unsigned)a.u, m);
  return b.t;
}
// One memory access of B bytes; alignas makes 8 and 16 bytes a single vector instruction.
struct alignas(16) nk_w16 { unsigned a, b, c, d; };
struct alignas(8) nk_w8 { unsigned a, b; };
template <int B> struct nk_word;
template <> struct nk_word<16> { typedef nk_w16 t; };
template <> struct nk_word<8> { typedef nk_w8 t; };
template <> struct nk_word<4> { typedef unsigned t; };
template <> struct nk_word<2> { typedef unsigned short t; };
template <class T, int N> union nk_pack { typename nk_word<sizeof(T) * N>::t w; T e[N]; };
// Tensor-core operands: 32-bit registers of packed elements.
__device__ __forceinline__ unsigned nk_pack2(nk_f16 a, nk_f16 b) { return (unsigned)a.x | ((unsigned)b.x << 16); }
__device__ __forceinline__ unsigned nk_pack2(nk_bf16 a, nk_bf16 b) { return (unsigned)a.x | ((unsigned)b.x << 16); }
template <class T> __device__ __forceinline__ unsigned nk_pack4(T a, T b, T c, T d) {
  return (unsigned)(unsigned char)a | ((unsigned)(unsigned char)b << 8) | ((unsigned)(unsigned char)c << 16) | ((unsigned)(unsigned char)d << 24);
}
__device__ __forceinline__ unsigned nk_bits32(float x) { return __float_as_uint(x); }
// cp.async of B bytes into shared memory (zeros where pred is false): 16 bytes skip L1.
template <int B> __device__ __forceinline__ void nk_cp_async(unsigned dst, const void* src, bool pred) {
  if (B == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(pred ? 16 : 0));
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" :: "r"(dst), "l"(src), "n"(B), "r"(pred ? B : 0));
}
// A wgmma matrix descriptor: start address, leading and stride byte offsets (16-byte units), swizzle mode.
__device__ __forceinline__ unsigned long long nk_desc(unsigned addr, unsigned lbo, unsigned sbo, int swizzle_bytes) {
  unsigned long long mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)
       | ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (mode << 62);
}
// A store under a predicate, with no branch (used where branches would make ptxas serialize wgmma pipelines).
template <class W> __device__ __forceinline__ void nk_store_if(W* p, W v, bool m) {
  union { W w; unsigned u[(sizeof(W) + 3) / 4]; unsigned short h; } b; b.w = v;
  if constexpr (sizeof(W) == 16)
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %5, 0; @q st.global.v4.b32 [%0], {%1, %2, %3, %4}; }"
                 :: "l"(p), "r"(b.u[0]), "r"(b.u[1]), "r"(b.u[2]), "r"(b.u[3]), "r"((unsigned)m) : "memory");
  else if constexpr (sizeof(W) == 8)
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %3, 0; @q st.global.v2.b32 [%0], {%1, %2}; }"
                 :: "l"(p), "r"(b.u[0]), "r"(b.u[1]), "r"((unsigned)m) : "memory");
  else if constexpr (sizeof(W) == 4)
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q st.global.b32 [%0], %1; }" :: "l"(p), "r"(b.u[0]), "r"((unsigned)m) : "memory");
  else if constexpr (sizeof(W) == 2)
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q st.global.b16 [%0], %1; }" :: "l"(p), "h"(b.h), "r"((unsigned)m) : "memory");
  else
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q st.global.b8 [%0], %1; }" :: "l"(p), "h"((unsigned short)(b.u[0] & 255)), "r"((unsigned)m) : "memory");
}
// Floating-point atomic max/min by compare-and-swap on the bits, at scope S (gpu, cta, sys).
template <class T, class B, int S> __device__ __forceinline__ T nk_atomic_minmax(T* p, T v, bool is_max) {
  B* a = (B*)p; B old = *a, assumed;
  do {
    assumed = old; T cur = nk_bitcast<T>(assumed); B w = nk_bitcast<B>(v);
    if (is_max ? !(v > cur) : !(v < cur)) break;
    old = S == 1 ? atomicCAS_block(a, assumed, w) : S == 2 ? atomicCAS_system(a, assumed, w) : atomicCAS(a, assumed, w);
  } while (old != assumed);
  return nk_bitcast<T>(old);
}
"""
