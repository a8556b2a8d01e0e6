// stage3a.cu: stage 2 with P written over the score buffer (no P buffer); its output is stage 2's, bit for bit.
#include "smem_softmax.cuh"

namespace sdpa {

// P (f16) over the f32 scores of the same row: row r's P[j] takes bytes [2j, 2j + 2) of the row, which held
// S[j / 2], a score this row's thread has already read (j / 2 <= j). The stores go through st.shared.b16
// with a memory clobber, so the compiler cannot move them above the reads of the scores they overwrite.
struct POverScores {
  unsigned char* base;
  int ld;  // in halves: the score row's bytes / 2
  __device__ POverScores(unsigned char*, float* scores, int bc) : base(reinterpret_cast<unsigned char*>(scores)), ld(2 * bc) {}
  __device__ void operator()(int r, int j, float v) const {
    const unsigned short h = __half_as_ushort(__float2half(v));
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(base + (r * ld + j) * 2));
    asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(addr), "h"(h) : "memory");
  }
  __device__ const __half* at(int r, int c) const { return reinterpret_cast<const __half*>(base) + r * ld + c; }
};

}  // namespace sdpa

extern "C" __global__ void __launch_bounds__(128) stage3a_d64(sdpa::Params p) { sdpa::smem_softmax_wmma_pv<64, sdpa::POverScores>(p); }
extern "C" __global__ void __launch_bounds__(128) stage3a_d128(sdpa::Params p) { sdpa::smem_softmax_wmma_pv<128, sdpa::POverScores>(p); }
