// register_softmax.cuh: the body of stages 3b and 4: softmax in registers on the score fragments, no score buffer.
#pragma once
#include "online_softmax.cuh"
#include "sdpa_common.cuh"

namespace sdpa {

// Q·Kᵀ lands in accumulator fragments; osm::step turns them into P in place (row max and sum through
// warp-reduce's quad shuffles, frag-layout's row ownership); P becomes a matrix_a operand in registers
// (acc_to_matrix_a, exact by the probed layouts) for P·V. STAGES is the depth of the K/V ring.
template <int D, int STAGES>
__device__ void register_softmax(const Params& p) {
  constexpr int BC = Tile<D>::kBC, BQ = Tile<D>::kBQ, NO = D / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem<D, STAGES> sm(smem_raw);
  const Block b(p, BQ);
  const KV<D, STAGES> kv(p, sm, b.bh);
  kv.begin(p, sm, b);
  osm::RowState st;
  osm::init(st);
  Acc o[NO];
#pragma unroll
  for (int j = 0; j < NO; ++j) wmma::fill_fragment(o[j], 0.0f);
  for (int t = 0; t < kv.tiles(); ++t) {
    kv.next(t, sm);
    Acc s[BC / 16];
    qk<D>(sm.q, sm.k, s);
    float alpha[2];
    osm::step<frag::WmmaAcc>(s, t * BC, p.sk, b.c, st, alpha);
    osm::rescale<frag::WmmaAcc>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
      osm::acc_to_matrix_a(s[kk], pa);
      pv_tile<D>(pa, kk, sm.v, o);
    }
  }
  float lse[2];
  osm::finish<frag::WmmaAcc>(o, st, b.scale, lse);
  store_o<D>(p, b.bh, b.q0, o, lse);
}

}  // namespace sdpa
