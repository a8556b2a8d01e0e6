// test_fp8_codec.cu: cuda_fp8.h's conversions over given inputs, and the lab's quantize / dequantize kernels.
#include "fp8_codec.cuh"

// out[4i + {0,1,2,3}] = (E4M3 satfinite, E4M3 no-sat, E5M2 satfinite, E5M2 no-sat) of x[i].
extern "C" __global__ void encode_all(const float* x, unsigned char* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[4 * i + 0] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3);
  out[4 * i + 1] = __nv_cvt_float_to_fp8(x[i], __NV_NOSAT, __NV_E4M3);
  out[4 * i + 2] = __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E5M2);
  out[4 * i + 3] = __nv_cvt_float_to_fp8(x[i], __NV_NOSAT, __NV_E5M2);
}

// out[c] = E4M3 code c as f16 bits, out[256 + c] = E5M2 code c; one block of 256 threads.
extern "C" __global__ void decode_all(unsigned short* out) {
  const int c = threadIdx.x;
  out[c] = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3).x;
  out[256 + c] = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E5M2).x;
}

// One block (256 threads) per head of per_head contiguous elements: scales[head] = scale_from_amax(max |x|).
extern "C" __global__ void head_scales(const float* x, long long per_head, float* scales) {
  __shared__ float red[256];
  const float* h = x + blockIdx.x * per_head;
  float m = 0.0f;
  for (long long i = threadIdx.x; i < per_head; i += blockDim.x) m = fmaxf(m, fabsf(h[i]));
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) scales[blockIdx.x] = fp8::scale_from_amax(red[0]);
}

extern "C" __global__ void quantize_e4m3(const float* x, const float* scales, long long per_head, unsigned char* q, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) q[i] = fp8::quantize(x[i], scales[i / per_head]);
}

// Each block stages 4096 codes in shared memory, then each thread decodes 16 of them with one 16-byte load:
// h = the codes as half (unscaled, exact), f = h * scale in f32. n is a multiple of 16.
extern "C" __global__ void dequantize_smem(const unsigned char* q, const float* scales, long long per_head, long long n,
                                           __half* h, float* f) {
  __shared__ __align__(16) unsigned char stage[4096];
  const long long base = (long long)blockIdx.x * 4096;
  const int len = (int)min(4096LL, n - base);
  for (int i = threadIdx.x; i < len / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(stage)[i] = reinterpret_cast<const uint4*>(q + base)[i];
  __syncthreads();
  for (int i = threadIdx.x; i < len / 16; i += blockDim.x) {
    __half2 v[8];
    fp8::decode16(reinterpret_cast<const uint4*>(stage)[i], v);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const long long e = base + 16LL * i + 2 * k;
      reinterpret_cast<__half2*>(h + e)[0] = v[k];
      f[e] = __low2float(v[k]) * scales[e / per_head];
      f[e + 1] = __high2float(v[k]) * scales[(e + 1) / per_head];
    }
  }
}


// fp8::store2 over n pairs of x (2n floats): each pair into out16, outbf and out32 (2n elements each).
extern "C" __global__ void store_pairs(const float* x, int n, __half* out16, __nv_bfloat16* outbf, float* out32) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    fp8::store2(out16 + 2 * i, x[2 * i], x[2 * i + 1]);
    fp8::store2(outbf + 2 * i, x[2 * i], x[2 * i + 1]);
    fp8::store2(out32 + 2 * i, x[2 * i], x[2 * i + 1]);
  }
}
