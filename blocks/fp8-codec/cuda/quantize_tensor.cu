// quantize_tensor.cu: the block's library kernels, f32 tensors to E4M3 on the device (fp8_codec::TensorQuantizer).
#include "fp8_codec.cuh"

extern "C" __global__ void fp8_tensor_amax(const float4* x, long long len4, int parts, unsigned* amax_bits) {
  fp8::group_amax(x, len4, parts, amax_bits);
}

extern "C" __global__ void fp8_tensor_scales(const unsigned* amax_bits, long long heads, long long heads_per_group,
                                             float* scales) {
  fp8::head_scales(amax_bits, heads, heads_per_group, scales);
}

extern "C" __global__ void fp8_tensor_quantize(const float4* x, long long n16, long long head_len16,
                                               const float* scales, uint4* q) {
  fp8::quantize_tensor(x, n16, head_len16, scales, q);
}

// Views [B][H][S][D] of f32, f16 or bf16 with strides (fp8_codec::ViewQuantizer): amax, then codes and scales.
#define FP8_VIEW_ARGS(T) const T *x, long long sb, long long sh, long long ss, int heads, int rows, int d
extern "C" __global__ void fp8_view_amax_f32(FP8_VIEW_ARGS(float), unsigned* amax_bits) {
  fp8::view_amax(fp8::View<float>{x, sb, sh, ss, heads, rows, d}, amax_bits);
}
extern "C" __global__ void fp8_view_amax_f16(FP8_VIEW_ARGS(__half), unsigned* amax_bits) {
  fp8::view_amax(fp8::View<__half>{x, sb, sh, ss, heads, rows, d}, amax_bits);
}
extern "C" __global__ void fp8_view_amax_bf16(FP8_VIEW_ARGS(__nv_bfloat16), unsigned* amax_bits) {
  fp8::view_amax(fp8::View<__nv_bfloat16>{x, sb, sh, ss, heads, rows, d}, amax_bits);
}
extern "C" __global__ void fp8_view_quantize_f32(FP8_VIEW_ARGS(float), const unsigned* amax_bits,
                                                 uint2* q, float* scales) {
  fp8::view_quantize(fp8::View<float>{x, sb, sh, ss, heads, rows, d}, amax_bits, q, scales);
}
extern "C" __global__ void fp8_view_quantize_f16(FP8_VIEW_ARGS(__half), const unsigned* amax_bits,
                                                 uint2* q, float* scales) {
  fp8::view_quantize(fp8::View<__half>{x, sb, sh, ss, heads, rows, d}, amax_bits, q, scales);
}
extern "C" __global__ void fp8_view_quantize_bf16(FP8_VIEW_ARGS(__nv_bfloat16), const unsigned* amax_bits,
                                                  uint2* q, float* scales) {
  fp8::view_quantize(fp8::View<__nv_bfloat16>{x, sb, sh, ss, heads, rows, d}, amax_bits, q, scales);
}
