// test_warp_reduce.cu: row max / sum of a 16 x (WN*NF*kCols) tile held by WN warps, through wmma and mma C fragments.
#include <mma.h>
#include "warp_reduce.cuh"

using namespace nvcuda;

// Warp w's fragments hold columns w*NF*kCols...; out[0..16) = row max, out[16..32) = row sum, written by
// warp 0's quad leaders. Columns < kv_valid are real, and with diag >= 0 only those <= row + diag as well
// (a causal mask: per-row limits); diag < 0 is the plain row_max / row_sum.
template <class L, int WN, int NF, class Frag>
__device__ void reduce_rows(const Frag (&frags)[NF], int kv_valid, int diag, float* red, float* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float mx[2], sm[2];
  if (diag < 0) {
    wr::row_max<L>(frags, warp * NF * L::kCols, kv_valid, mx);
    wr::row_sum<L>(frags, warp * NF * L::kCols, kv_valid, sm);
  } else {
    const int limit[2] = {min(kv_valid, frag::acc_row(lane, 0) + diag + 1),
                          min(kv_valid, frag::acc_row(lane, 1) + diag + 1)};
    wr::rows_limited<L, wr::MaxOp>(frags, warp * NF * L::kCols, limit, wr::MaxOp{}, mx);
    wr::rows_limited<L, wr::SumOp>(frags, warp * NF * L::kCols, limit, wr::SumOp{}, sm);
  }
  wr::across_warps<WN>(mx, red, wr::MaxOp{});
  wr::across_warps<WN>(sm, red, wr::SumOp{});
  if (warp == 0 && frag::thread_in_group(lane) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      out[frag::acc_row(lane, h)] = mx[h];
      out[16 + frag::acc_row(lane, h)] = sm[h];
    }
  }
}

template <int NF, int WN>
__device__ void reduce_wmma(const float* tile, int kv_valid, int diag, float* out) {
  __shared__ float red[WN * 16];
  const int warp = threadIdx.x >> 5;
  constexpr int kCols = WN * NF * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f) wmma::load_matrix_sync(acc[f], tile + (warp * NF + f) * 16, kCols, wmma::mem_row_major);
  reduce_rows<frag::WmmaAcc, WN>(acc, kv_valid, diag, red, out);
}

template <int NF, int WN>
__device__ void reduce_mma(const float* tile, int kv_valid, int diag, float* out) {
  __shared__ float red[WN * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kCols = WN * NF * 8;
  frag::Regs<frag::MmaC> c[NF];
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      c[f].x[i] = tile[frag::mma_c_row(lane, i) * kCols + (warp * NF + f) * 8 + frag::mma_c_col(lane, i)];
  reduce_rows<frag::MmaC, WN>(c, kv_valid, diag, red, out);
}

#define LAB_REDUCE(KIND, NF, WN)                                                                    \
  extern "C" __global__ void reduce_##KIND##_nf##NF##_wn##WN(const float* t, int kv_valid, int diag, float* o) { \
    reduce_##KIND<NF, WN>(t, kv_valid, diag, o);                                                               \
  }

LAB_REDUCE(wmma, 1, 1)
LAB_REDUCE(wmma, 2, 1)
LAB_REDUCE(wmma, 4, 1)
LAB_REDUCE(wmma, 1, 2)
LAB_REDUCE(wmma, 2, 4)
LAB_REDUCE(mma, 1, 1)
LAB_REDUCE(mma, 2, 1)
LAB_REDUCE(mma, 8, 1)
LAB_REDUCE(mma, 2, 2)
LAB_REDUCE(mma, 4, 4)
