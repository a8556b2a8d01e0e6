// test_online_softmax.cu: one warp runs the register-level update over K/V tiles of given scores S and values V.
#include <cuda_fp16.h>
#include <mma.h>
#include "online_softmax.cuh"

using namespace nvcuda;

// S: [16][sk_pad] raw scores (columns >= sk are garbage the mask must hide); V: [sk_pad][64] half, zero past
// sk (the cp.async ring's contract); O: [16][64] float; lse: [16]. Tiles of BC = 16 * NF keys.
// WINDOW: row r sees columns lo[r] .. hi[r] − 1 only (mask_below for the left edge, step_rows's limit for the right).
// ROWS: row r's softmax is over row_scale[r]·S (osm::RowScale), not `scale`.
template <int NF, bool PIECES = false, bool WINDOW = false, bool ROWS = false>
__device__ void attend(const float* S, const __half* V, int sk, int sk_pad, float scale, float* O, float* lse_out,
                       const int* lo = nullptr, const int* hi = nullptr, const float* row_scale = nullptr) {
  constexpr int D = 64, NO = D / 16;
  const int lane = threadIdx.x & 31;
  const int r0 = frag::acc_row(lane, 0), r1 = frag::acc_row(lane, 1);
  const auto sc = [&] {
    if constexpr (ROWS) return osm::RowScale{{row_scale[r0], row_scale[r1]}};
    else return scale;
  }();
  const auto c = [&] {
    if constexpr (ROWS) return osm::RowScale{{sc.c[0] * 1.4426950408889634f, sc.c[1] * 1.4426950408889634f}};
    else return scale * 1.4426950408889634f;
  }();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[NO], s[NF];
#pragma unroll
  for (int j = 0; j < NO; ++j) wmma::fill_fragment(o[j], 0.0f);
  osm::RowState st;
  osm::init(st);
  for (int k0 = 0; k0 < sk; k0 += 16 * NF) {
#pragma unroll
    for (int f = 0; f < NF; ++f) wmma::load_matrix_sync(s[f], S + k0 + 16 * f, sk_pad, wmma::mem_row_major);
    float alpha[2];
    if constexpr (PIECES) {
      // step's pieces, the cells in two ranges, as a caller that issues P·V between them does.
      float bias[2];
      osm::step_max<frag::WmmaAcc>(s, k0, sk, c, st, alpha, bias);
      osm::RowSum sum;
      osm::init(sum);
      osm::exp_cells<frag::WmmaAcc, 0, 4>(s[0].x, c, bias);
      osm::sum_cells<frag::WmmaAcc, 0, 4>(s[0].x, sum);
      osm::exp_cells<frag::WmmaAcc, 4, 8>(s[0].x, c, bias);
      osm::sum_cells<frag::WmmaAcc, 4, 8>(s[0].x, sum);
      osm::step_end(sum, alpha, st);
    } else if constexpr (WINDOW) {
      const int left[2] = {lo[r0], lo[r1]}, limit[2] = {min(hi[r0], sk), min(hi[r1], sk)};
      osm::mask_below<frag::WmmaAcc>(s, k0, left);
      osm::step_rows<frag::WmmaAcc>(s, k0, limit, c, st, alpha);
    } else {
      osm::step<frag::WmmaAcc>(s, k0, sk, c, st, alpha);
    }
    osm::rescale<frag::WmmaAcc>(o, alpha);
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> p;
      osm::acc_to_matrix_a(s[f], p);
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> v;
        wmma::load_matrix_sync(v, V + (k0 + 16 * f) * D + 16 * j, D);
        wmma::mma_sync(o[j], p, v, o[j]);
      }
    }
  }
  float lse[2];
  osm::finish<frag::WmmaAcc>(o, st, sc, lse);
#pragma unroll
  for (int j = 0; j < NO; ++j) wmma::store_matrix_sync(O + 16 * j, o[j], D, wmma::mem_row_major);
  if (frag::thread_in_group(lane) == 0) {
    lse_out[r0] = lse[0];
    lse_out[r1] = lse[1];
  }
}

extern "C" __global__ void attend_bc16(const float* S, const __half* V, int sk, int skp, float scale, float* O, float* lse) {
  attend<1>(S, V, sk, skp, scale, O, lse);
}
extern "C" __global__ void attend_bc32(const float* S, const __half* V, int sk, int skp, float scale, float* O, float* lse) {
  attend<2>(S, V, sk, skp, scale, O, lse);
}
// Row r over columns lo[r] .. hi[r] − 1 only (a sliding window: mask_below, then step_rows with hi as the limit).
extern "C" __global__ void attend_window_bc16(const float* S, const __half* V, int sk, int skp, float scale, const int* lo,
                                              const int* hi, float* O, float* lse) {
  attend<1, false, true>(S, V, sk, skp, scale, O, lse, lo, hi);
}
// The same with osm::step in its pieces (step_max, exp_cells, sum_cells, step_end): bit-identical to attend_bc16.
extern "C" __global__ void attend_pieces_bc16(const float* S, const __half* V, int sk, int skp, float scale, float* O,
                                              float* lse) {
  attend<1, true>(S, V, sk, skp, scale, O, lse);
}
// Row r's softmax over row_scale[r]·S (osm::RowScale: rows of different query heads in one tile), by step and by
// its pieces.
extern "C" __global__ void attend_rows_bc16(const float* S, const __half* V, int sk, int skp, const float* row_scale,
                                            float* O, float* lse) {
  attend<1, false, false, true>(S, V, sk, skp, 0.0f, O, lse, nullptr, nullptr, row_scale);
}
extern "C" __global__ void attend_rows_pieces_bc16(const float* S, const __half* V, int sk, int skp,
                                                   const float* row_scale, float* O, float* lse) {
  attend<1, true, false, true>(S, V, sk, skp, 0.0f, O, lse, nullptr, nullptr, row_scale);
}
