// warp_reduce.cuh: row max and row sum over accumulator fragments (wmma 16x16, mma m16n8), with column masks.
//
// A lane holds parts of two rows of a 16-row accumulator tile: row frag::acc_row(lane, h) for h = 0, 1. Each
// function returns out[h] for those two rows, equal in all four lanes of the row's quad.
//
// Masks: only columns < kv_valid are real (partial K/V tiles). Masked cells count as -inf for max, 0 for sum.
// NaN policy: a NaN in a valid cell propagates (the row's max and sum are NaN); a NaN in a masked cell is
// ignored. Sums are deterministic: the same inputs give the same bits, in an order the CPU model mirrors.
#pragma once
#include "frag_layout.cuh"

namespace wr {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// fmaxf drops NaN (IEEE maxNum); attention must not hide a NaN score. max.NaN (sm_80+) returns NaN when either
// input is NaN in one FMNMX, where `a != a ? a : …` cost two compares and a branch a cell.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// kChains: independent partial results a lane folds its cells into, round robin, before combining them in
// order: a row of 32 cells is then kChains chains, not one of 32 dependent instructions (the softmax waits on
// the max before its first exponential, and the sum trails the exponentials). Max is exact in any order; the
// sum's order is part of its result, and the CPU model (row_sum_device, SUM_CHAINS) mirrors it.
struct MaxOp {
  static constexpr int kChains = 4;
  __device__ float operator()(float a, float b) const { return max_nan(a, b); }
  __device__ static float identity() { return neg_inf(); }
};
struct SumOp {
  static constexpr int kChains = 2;
  __device__ float operator()(float a, float b) const { return a + b; }
  __device__ static float identity() { return 0.0f; }
};

// Across the quad that owns a row: xor 1, then xor 2. All four lanes end with the same value.
template <class Op>
__device__ __forceinline__ float quad(float v, Op op) {
#pragma unroll
  for (int s = 0; s < 2; ++s) v = op(v, __shfl_xor_sync(0xffffffffu, v, frag::kQuadXorMasks[s]));
  return v;
}

// Row reduction within one warp. frags[f] covers columns col0 + f * L::kCols + [0, L::kCols); Frag is a
// wmma accumulator fragment or frag::Regs<L>. Each lane folds its own cells in (f, i) order into Op::kChains
// partials (cell k of the row into partial k % kChains), combines them in order, then the quad. Row h of the
// lane keeps the columns < limit[h] (a causal mask gives each row its own limit).
// MASKED = false is for callers that know every column is below both limits (a full tile): no per-cell compare.
template <class L, class Op, bool MASKED = true, int NF, class Frag>
__device__ __forceinline__ void rows_limited(const Frag (&frags)[NF], int col0, const int (&limit)[2], Op op,
                                             float (&out)[2]) {
  const int lane = threadIdx.x & 31;
  constexpr int K = Op::kChains;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = Op::identity();
    int k = 0;
#pragma unroll
    for (int f = 0; f < NF; ++f) {
#pragma unroll
      for (int i = 0; i < L::kElems; ++i) {
        if (frag::acc_half(i) != h) continue;
        const int c = col0 + f * L::kCols + L::col(lane, i);
        v[k % K] = op(v[k % K], !MASKED || c < limit[h] ? frags[f].x[i] : Op::identity());
        ++k;
      }
    }
#pragma unroll
    for (int j = 1; j < K; ++j) v[0] = op(v[0], v[j]);
    out[h] = quad(v[0], op);
  }
}

// Both rows with the same limit: only columns < kv_valid are real (a partial K/V tile).
template <class L, class Op, bool MASKED = true, int NF, class Frag>
__device__ __forceinline__ void rows(const Frag (&frags)[NF], int col0, int kv_valid, Op op, float (&out)[2]) {
  const int limit[2] = {kv_valid, kv_valid};
  rows_limited<L, Op, MASKED>(frags, col0, limit, op, out);
}

template <class L, bool MASKED = true, int NF, class Frag>
__device__ __forceinline__ void row_max(const Frag (&frags)[NF], int col0, int kv_valid, float (&out)[2]) {
  rows<L, MaxOp, MASKED>(frags, col0, kv_valid, MaxOp{}, out);
}
template <class L, bool MASKED = true, int NF, class Frag>
__device__ __forceinline__ void row_sum(const Frag (&frags)[NF], int col0, int kv_valid, float (&out)[2]) {
  rows<L, SumOp, MASKED>(frags, col0, kv_valid, SumOp{}, out);
}

// Combines the row results of WN warps that hold different columns of the same 16 rows. smem holds WN * 16
// floats. Every thread of the block must call it. Partials are combined in warp order, so the result is
// deterministic and the same in every warp. Ends with a barrier, so smem may be reused at once.
template <int WN, class Op>
__device__ __forceinline__ void across_warps(float (&v)[2], float* smem, Op op) {
  if (WN == 1) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (frag::thread_in_group(lane) == 0) {
    smem[warp * 16 + frag::acc_row(lane, 0)] = v[0];
    smem[warp * 16 + frag::acc_row(lane, 1)] = v[1];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = frag::acc_row(lane, h);
    float acc = smem[r];
#pragma unroll
    for (int w = 1; w < WN; ++w) acc = op(acc, smem[w * 16 + r]);
    v[h] = acc;
  }
  __syncthreads();
}

}  // namespace wr
