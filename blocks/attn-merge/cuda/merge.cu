// merge.cu: the block's library kernels: a part merged into a running (O, LSE) in place, and f32 O stored as 16-bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attn_merge.cuh"

// acc ← merge(acc, part), rows × d f32 O and f32 LSE, in place (acc starts as a part, or as O = 0, LSE = −inf: an
// empty part). Part row r merges into acc row (r / per) · stride + off + r % per: the part's rows in groups of `per`,
// each group's into a group of acc's `stride` rows from row `off` (per = rows, off = 0: row r into row r). A thread 8
// columns of a row (and, for the row's first 8, its LSE, after every thread of the row has read it: the row's 8-column
// chunks are one warp's consecutive lanes when d ≤ 256). Grid-stride over rows · d / 8.
extern "C" __global__ void amerge_accumulate(float* o_acc, float* lse_acc, const float* o_part, const float* lse_part,
                                             long long rows, int d, long long per, long long stride, long long off) {
  const int per_row = d / 8;
  const long long chunks = rows * per_row;
  for (long long base = (long long)blockIdx.x * blockDim.x; base < chunks; base += (long long)gridDim.x * blockDim.x) {
    const long long i = base + threadIdx.x;
    const bool on = i < chunks;
    const long long row = on ? i / per_row : 0;
    const long long arow = row / per * stride + off + row % per;
    const int c = on ? int(i % per_row) : 0;
    float l[2] = {on ? lse_acc[arow] : 0.0f, on ? lse_part[row] : 0.0f}, v[2][8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      v[0][k] = on ? o_acc[arow * d + 8 * c + k] : 0.0f;
      v[1][k] = on ? o_part[row * d + 8 * c + k] : 0.0f;
    }
    const amerge::Weights<2> w = amerge::weights(l, 2);
    float x[8];
    amerge::merge8(w, v, 2, x);
    __syncthreads();  // every thread's read of lse_acc before any write of it
    if (on) {
#pragma unroll
      for (int k = 0; k < 8; ++k) o_acc[arow * d + 8 * c + k] = x[k];
      if (c == 0) lse_acc[arow] = w.lse;
    }
  }
}

// n f32 values stored as bf16 / f16, rounded to nearest even. Grid-stride, two a thread.
extern "C" __global__ void amerge_store_bf16(const float2* x, long long n2, __nv_bfloat162* out) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += (long long)gridDim.x * blockDim.x)
    out[i] = __floats2bfloat162_rn(x[i].x, x[i].y);
}
extern "C" __global__ void amerge_store_f16(const float2* x, long long n2, __half2* out) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += (long long)gridDim.x * blockDim.x)
    out[i] = __floats2half2_rn(x[i].x, x[i].y);
}
