// smem_softmax.cuh: the online softmax of stages 1, 2 and 3a, one thread per query row on scores in shared memory.
#pragma once
#include "sdpa_common.cuh"
#include "warp_reduce.cuh"

namespace sdpa {

// Per-row running state in shared memory: m (raw score units), l, and the last tile's rescale factor.
struct RowStats {
  float* m;
  float* l;
  float* alpha;
  __device__ void init() {
    for (int r = threadIdx.x; r < 64; r += blockDim.x) {
      m[r] = wr::neg_inf();
      l[r] = 0.0f;
    }
  }
};

// The shared memory of stages 1–3a after the common part: scores [64][BC] f32, then the row stats; `after`
// is what a stage may put behind them.
template <int BC>
struct ScoreBuf {
  float* s;
  RowStats st;
  unsigned char* after;
  __device__ explicit ScoreBuf(unsigned char* base)
      : s(reinterpret_cast<float*>(base)),
        st{s + 64 * BC, s + 64 * BC + 64, s + 64 * BC + 128},
        after(reinterpret_cast<unsigned char*>(s + 64 * BC + 192)) {}
  // This warp's score fragments into its 16 rows, then a barrier: the softmax reads every warp's rows.
  template <int NF>
  __device__ void store(const Acc (&sf)[NF]) const {
    const int w = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < NF; ++j) wmma::store_matrix_sync(s + w * 16 * BC + 16 * j, sf[j], BC, wmma::mem_row_major);
    __syncthreads();
  }
};

// Scores S[64][BC] (f32, ldS floats a row) of one tile: threads 0..63 each update one row's m and l, turn its
// scores into P = exp2(S·c − m_use·c) (0 past kv_valid) and hand each P to `write_p(row, col, p)`. The
// guard and the order of operations are the online-softmax block's (osm::step), row-serial.
template <int BC, class WriteP>
__device__ void softmax_rows(const float* s, int lds, int kv_valid, float c, RowStats st, WriteP write_p) {
  const int r = threadIdx.x;
  if (r >= 64) return;
  const float* row = s + r * lds;
  float mx = wr::neg_inf();
#pragma unroll 8
  for (int j = 0; j < BC; ++j)
    if (j < kv_valid) mx = wr::max_nan(mx, row[j]);
  const float m_old = st.m[r], m_new = wr::max_nan(m_old, mx);
  const float m_use = m_new == wr::neg_inf() ? 0.0f : m_new;
  const float alpha = exp2f((m_old - m_use) * c);
  float sum = 0.0f;
#pragma unroll 8
  for (int j = 0; j < BC; ++j) {
    const float p = j < kv_valid ? exp2f(fmaf(row[j], c, -m_use * c)) : 0.0f;
    write_p(r, j, p);
    sum += p;
  }
  st.l[r] = alpha * st.l[r] + sum;
  st.m[r] = m_new;
  st.alpha[r] = alpha;
}

// O / l and LSE = m·scale + ln l for row r, from the stats; l = 0 (no finite score) gives O = 0, LSE = −inf.
__device__ __forceinline__ float inv_l(const RowStats& st, int r) { return st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f; }
__device__ __forceinline__ float row_lse(const RowStats& st, int r, float scale) {
  return st.l[r] > 0.0f ? st.m[r] * scale + logf(st.l[r]) : wr::neg_inf();
}

// Stages 2 and 3a: S stored to shared memory, softmax there, P·V on the tensor cores with O in accumulator
// fragments. PBuf says where P (f16) lives: its own buffer (stage 2) or over the scores (stage 3a).
template <int D, class PBuf>
__device__ void smem_softmax_wmma_pv(const Params& p) {
  constexpr int BC = Tile<D>::kBC, BQ = Tile<D>::kBQ, NO = D / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem<D, 2> sm(smem_raw);
  const ScoreBuf<BC> sb(sm.rest);
  RowStats st = sb.st;
  const PBuf pbuf(sb.after, sb.s, BC);
  const Block b(p, BQ);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const KV<D, 2> kv(p, sm, b.bh);
  kv.begin(p, sm, b);
  st.init();
  Acc o[NO];
#pragma unroll
  for (int j = 0; j < NO; ++j) wmma::fill_fragment(o[j], 0.0f);
  for (int t = 0; t < kv.tiles(); ++t) {
    kv.next(t, sm);
    Acc s[BC / 16];
    qk<D>(sm.q, sm.k, s);
    sb.store(s);
    softmax_rows<BC>(sb.s, BC, p.sk - t * BC, b.c, st, pbuf);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NO; ++j)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[j].x[i] *= st.alpha[w * 16 + frag::wmma_acc_row(lane, i)];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
      wmma::load_matrix_sync(pa, pbuf.at(w * 16, kk * 16), pbuf.ld);
      pv_tile<D>(pa, kk, sm.v, o);
    }
  }
  float lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lse[h] = row_lse(st, w * 16 + frag::acc_row(lane, h), b.scale);
#pragma unroll
  for (int j = 0; j < NO; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[j].x[i] *= inv_l(st, w * 16 + frag::wmma_acc_row(lane, i));
  store_o<D>(p, b.bh, b.q0, o, lse);
}

}  // namespace sdpa
