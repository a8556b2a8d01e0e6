// fp8_codec.cuh: the lab's E4M3 quantizer, exact vectorized fp8 -> half2 decoding, and f32 pairs stored as O's types.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace fp8 {

// The scale that maps a tensor's largest magnitude onto E4M3's 448; 1 for an all-zero tensor (a zero scale
// would make x / scale NaN).
// __fdiv_rn: IEEE division whatever the compile flags, as the host model divides.
__device__ __forceinline__ float scale_from_amax(float amax) {
  return (amax > 0.0f && isfinite(amax)) ? __fdiv_rn(amax, 448.0f) : 1.0f;
}

// The quantizer of every Q, K, V: q = E4M3(x / scale), round to nearest even, saturating to +-448.
__device__ __forceinline__ unsigned char quantize(float x, float scale) {
  return __nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3);
}

// ---- Whole tensors: [groups][len] f32 -> E4M3 codes with one scale per head, in three grid-wide steps. ----

// Step 1. Block b of a grid of groups x parts folds max |x| over its part of group b / parts into
// amax_bits[b / parts] (zeroed before). Max is exact and order-free, so any split agrees with the host model;
// non-negative floats order as their bit patterns, so atomicMax on the bits is the float max. fmaxf drops
// NaN as the host's f32::max does (inputs are checked finite anyway). 256 threads; len4 float4s a group.
__device__ __forceinline__ void group_amax(const float4* x, long long len4, int parts, unsigned* amax_bits) {
  const long long group = blockIdx.x / parts;
  const int part = blockIdx.x % parts;
  const float4* g = x + group * len4;
  float m = 0.0f;
  for (long long i = (long long)part * blockDim.x + threadIdx.x; i < len4; i += (long long)parts * blockDim.x) {
    const float4 v = g[i];
    m = fmaxf(fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits + group, __float_as_uint(m));
}

// Step 2. scales[h] for every head h of `heads`, from the amax of its group (heads_per_group heads a group:
// 1 per head, all of them per tensor). Grid-stride.
__device__ __forceinline__ void head_scales(const unsigned* amax_bits, long long heads, long long heads_per_group,
                                            float* scales) {
  for (long long h = (long long)blockIdx.x * blockDim.x + threadIdx.x; h < heads; h += (long long)gridDim.x * blockDim.x)
    scales[h] = scale_from_amax(__uint_as_float(amax_bits[h / heads_per_group]));
}

// Step 3. Sixteen elements a thread (four 16-byte loads, one 16-byte store) of a tensor of n16 such runs,
// head_len16 runs a head (S * D is a multiple of 16, so a run never straddles two heads). Grid-stride.
__device__ __forceinline__ void quantize_tensor(const float4* x, long long n16, long long head_len16,
                                                const float* scales, uint4* q) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
    const float s = scales[i / head_len16];
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 v = x[4 * i + j];
      w[j] = (unsigned)quantize(v.x, s) | ((unsigned)quantize(v.y, s) << 8) | ((unsigned)quantize(v.z, s) << 16) |
             ((unsigned)quantize(v.w, s) << 24);
    }
    q[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ---- Views: [B][H][S][D] of T (f32, f16, bf16) with element strides, D contiguous -> contiguous E4M3 codes
// [B][H][S][D] with one scale per (b, h), in two grid-wide steps. A chunk is 8 consecutive elements of one row: D is a
// multiple of 8 and every chunk starts 16-byte aligned (the host checks the address and the strides). Widening
// f16 / bf16 to f32 is exact, so the codes are the whole-tensor quantizer's of the widened values, bit for bit.

__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const __half* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
    v[2 * j] = f.x; v[2 * j + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
    v[2 * j] = f.x; v[2 * j + 1] = f.y;
  }
}

// Where a view's elements are: x + b·sb + h·sh + s·ss + d. `heads` heads a batch, `rows` rows (S) a head; a head
// holds rows·d/8 < 2^31 chunks (the host checks), so chunk indices within a head are 32-bit.
template <class T>
struct View {
  const T* x;
  long long sb, sh, ss;
  int heads, rows, d;
  __device__ __forceinline__ const T* head(long long hd) const { return x + (hd / heads) * sb + (hd % heads) * sh; }
  __device__ __forceinline__ const T* at(const T* head, unsigned c) const {
    const unsigned cpr = d >> 3, r = c / cpr;
    return head + r * ss + (c - r * cpr) * 8;
  }
  __device__ __forceinline__ unsigned chunks() const { return (unsigned)rows * (unsigned)(d >> 3); }
};

__device__ __forceinline__ float amax8(const float (&e)[8], float m) {
#pragma unroll
  for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(e[j]));
  return m;
}

// Step 1. Block (x, y) of a grid of (B·heads) x parts folds max |x| over part y of head x into amax_bits[x] (zeroed
// before), as group_amax does; four loads in flight a thread.
template <class T>
__device__ __forceinline__ void view_amax(View<T> v, unsigned* amax_bits) {
  const T* hb = v.head(blockIdx.x);
  const unsigned n = v.chunks(), step = gridDim.y * blockDim.x;
  unsigned c = blockIdx.y * blockDim.x + threadIdx.x;
  float m = 0.0f;
  for (; c + 3 * step < n; c += 4 * step) {
    float e[4][8];
#pragma unroll
    for (int u = 0; u < 4; ++u) load8(v.at(hb, c + u * step), e[u]);
#pragma unroll
    for (int u = 0; u < 4; ++u) m = amax8(e[u], m);
  }
  for (; c < n; c += step) {
    float e[8];
    load8(v.at(hb, c), e);
    m = amax8(e, m);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits + blockIdx.x, __float_as_uint(m));
}

// Eight codes of e at scale s, as one 8-byte word.
__device__ __forceinline__ uint2 quantize8(const float (&e)[8], float s) {
  unsigned w[2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
    w[j] = (unsigned)quantize(e[4 * j], s) | ((unsigned)quantize(e[4 * j + 1], s) << 8) |
           ((unsigned)quantize(e[4 * j + 2], s) << 16) | ((unsigned)quantize(e[4 * j + 3], s) << 24);
  return make_uint2(w[0], w[1]);
}

// Step 2. Block (x, y) of a grid of (B·heads) x parts: chunks c and c + step of head x a thread (both loads before
// either store), eight codes (one 8-byte store) each at their place in the contiguous output, with the head's scale
// from step 1's amax; block (x, 0)'s first thread stores the scale.
template <class T>
__device__ __forceinline__ void view_quantize(View<T> v, const unsigned* amax_bits, uint2* q, float* scales) {
  const T* hb = v.head(blockIdx.x);
  const unsigned n = v.chunks(), step = gridDim.y * blockDim.x;
  uint2* qh = q + (long long)blockIdx.x * n;
  const float s = scale_from_amax(__uint_as_float(amax_bits[blockIdx.x]));
  for (unsigned c = blockIdx.y * blockDim.x + threadIdx.x; c < n; c += 2 * step) {
    float e[2][8];
    const bool second = c + step < n;
    load8(v.at(hb, c), e[0]);
    if (second) load8(v.at(hb, c + step), e[1]);
    qh[c] = quantize8(e[0], s);
    if (second) qh[c + step] = quantize8(e[1], s);
  }
  if (blockIdx.y == 0 && threadIdx.x == 0) scales[blockIdx.x] = s;
}

// Four E4M3 codes in one 32-bit word (one 4-byte shared-memory load) as two half2, exactly: every E4M3 value
// is an f16. The lowest byte becomes lo.x.
__device__ __forceinline__ void decode4(unsigned w, __half2& lo, __half2& hi) {
  lo = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3));
  hi = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3));
}

// Sixteen codes (one 16-byte load) as eight half2, in order.
__device__ __forceinline__ void decode16(uint4 v, __half2 (&h)[8]) {
  decode4(v.x, h[0], h[1]);
  decode4(v.y, h[2], h[3]);
  decode4(v.z, h[4], h[5]);
  decode4(v.w, h[6], h[7]);
}

// Two adjacent f32 results a, b stored at p as T, each rounded to nearest even: bf16 and f16 pairs as one 32-bit
// store, f32 pairs as one 64-bit store (p aligned to the pair). The one conversion every kernel's output goes through.
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }

}  // namespace fp8
