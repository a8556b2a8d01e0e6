// test_attn_merge.cu: rows merged from up to four parts' f32 (O, LSE), as a split-KV combine or a ring step runs it.
#include "attn_merge.cuh"

// Part j's O is o + j·rows·d and its LSE lse + j·rows (f32); n parts (≤ 4). Thread (row, c) merges columns 8c … 8c + 7
// of its row into out_o (and, for c = 0, the LSE into out_lse). Grid-stride over rows · d / 8.
extern "C" __global__ void merge_parts(const float* o, const float* lse, int n, long long rows, int d, float* out_o,
                                       float* out_lse) {
  const long long chunks = rows * (d / 8);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / (d / 8);
    const int c = int(i % (d / 8));
    float l[4], v[4][8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      l[j] = j < n ? lse[j * rows + row] : 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) v[j][k] = j < n ? o[(j * rows + row) * d + 8 * c + k] : 0.0f;
    }
    const amerge::Weights<4> w = amerge::weights(l, n);
    float x[8];
    amerge::merge8(w, v, n, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) out_o[row * d + 8 * c + k] = x[k];
    if (c == 0) out_lse[row] = w.lse;
  }
}
