// lab.cuh: the few device helpers every block shares (indices, lane ids, a static-size assert).
#pragma once

namespace lab {

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }
__device__ __forceinline__ unsigned warp_id() { return threadIdx.x >> 5; }

// 64-bit: [B, H, S, D] tensors overflow 32-bit indices at the ladder's largest shapes.
__device__ __forceinline__ long long global_index() {
  return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

}  // namespace lab
