// fp8_codec.cuh: the lab's E4M3 quantizer and exact vectorized fp8 -> half2 decoding, on top of cuda_fp8.h.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace fp8 {

// The scale that maps a tensor's largest magnitude onto E4M3's 448; 1 for an all-zero tensor (a zero scale
// would make x / scale NaN).
__device__ __forceinline__ float scale_from_amax(float amax) {
  return (amax > 0.0f && isfinite(amax)) ? amax / 448.0f : 1.0f;
}

// The quantizer of every Q, K, V: q = E4M3(x / scale), round to nearest even, saturating to +-448.
__device__ __forceinline__ unsigned char quantize(float x, float scale) {
  return __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
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

}  // namespace fp8
