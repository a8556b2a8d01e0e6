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
