// attn_merge.cuh: attention over disjoint key sets merged from its parts' (O, LSE) pairs, row by row.
//
// A part j is attention over keys K_j: O_j = Σ_{k∈K_j} p_k v_k / Σ_{k∈K_j} p_k (normalised) and LSE_j = ln Σ_{k∈K_j} p_k
// (natural log; −inf for a part that saw no key, whose O_j is 0). Over the union: LSE = ln Σ_j e^{LSE_j} and
// O = Σ_j e^{LSE_j − LSE} O_j — FlashAttention's split-KV combine, used by a split tail, split-KV decode and the steps
// of ring attention. Computed against m = max_j LSE_j, so that no e^x overflows whatever the LSEs (scores of 10^4
// are fine) and the largest part's weight is exactly 1; a row no part saw (m = −inf) is O = 0, LSE = −inf. Full-precision
// expf / logf: the merge adds ~1 ulp a part to O and the LSE, far below the FP8 error of the parts.
#pragma once

namespace amerge {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// The weights of n ≤ N parts: w_j = e^{LSE_j − m} (0 for every part when m = −inf), their sum, and the merged LSE.
template <int N>
struct Weights {
  float w[N];
  float sum, lse;
};
template <int N>
__device__ __forceinline__ Weights<N> weights(const float (&lse)[N], int n) {
  float m = neg_inf();
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (j < n) m = fmaxf(m, lse[j]);
  Weights<N> r;
  r.sum = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    r.w[j] = (j < n && m != neg_inf()) ? expf(lse[j] - m) : 0.0f;
    r.sum += r.w[j];
  }
  r.lse = r.sum > 0.0f ? m + logf(r.sum) : neg_inf();
  return r;
}

// 1 / the weights' sum (0 for a row no part saw).
template <int N>
__device__ __forceinline__ float inv_sum(const Weights<N>& w) {
  return w.sum > 0.0f ? 1.0f / w.sum : 0.0f;
}

// One column of a row merged from n parts' values v[j], by the weights above and their inv_sum: every merge's
// arithmetic, so that a merge in a kernel's epilogue gives the merge kernel's bits.
template <int N>
__device__ __forceinline__ float merge1(const Weights<N>& w, const float (&v)[N], int n, float inv) {
  float x = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (j < n) x += w.w[j] * v[j];
  return x * inv;
}

// Eight consecutive columns of a row merged from n parts' values v[j][0..8), by the weights above.
template <int N>
__device__ __forceinline__ void merge8(const Weights<N>& w, const float (&v)[N][8], int n, float (&out)[8]) {
  const float inv = inv_sum(w);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float c[N];
#pragma unroll
    for (int j = 0; j < N; ++j) c[j] = v[j][i];
    out[i] = merge1(w, c, n, inv);
  }
}

}  // namespace amerge
