// stage2.cu: stage 1 with P·V on the tensor cores: P (f16) in its own shared-memory buffer.
#include "smem_softmax.cuh"

namespace sdpa {

// P in a separate [64][BC] f16 buffer.
struct SeparateP {
  __half* p;
  int ld;
  __device__ SeparateP(unsigned char* own, float*, int bc) : p(reinterpret_cast<__half*>(own)), ld(bc) {}
  __device__ void operator()(int r, int j, float v) const { p[r * ld + j] = __float2half(v); }
  __device__ const __half* at(int r, int c) const { return p + r * ld + c; }
};

}  // namespace sdpa

extern "C" __global__ void __launch_bounds__(128) stage2_d64(sdpa::Params p) { sdpa::smem_softmax_wmma_pv<64, sdpa::SeparateP>(p); }
extern "C" __global__ void __launch_bounds__(128) stage2_d128(sdpa::Params p) { sdpa::smem_softmax_wmma_pv<128, sdpa::SeparateP>(p); }
