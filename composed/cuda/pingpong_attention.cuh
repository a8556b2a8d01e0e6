// pingpong_attention.cuh: the body of stage 7: stage 6's producer and ring, the two consumers taking turns on the tensor cores.
#pragma once
#include "tma_attention.cuh"

namespace sdpa {

// As tma_attention, but the consumers alternate: in its turn (named barrier 1 + wg, handed over with an arrive on
// the other's) a consumer issues Q·Kᵀ of tile t and P·V of tile t − 1, hands the tensor cores over, and runs tile
// t's softmax while the other consumer's GEMMs run (FlashAttention-3's pingpong). Its own P·V(t − 1) also runs under
// that softmax: only P(t)'s packing and O's rescale, both at the start of the next turn, wait for it (O and P's A
// registers belong to the wgmma until it retires). BC keys a tile (Stage::bc: 224 at D = 128, 128 at D = 64).
// Grouped-query attention: the block of query head bh reads K/V head bh / p.group (and its scales). Causal masking
// (p.causal): each row's key limit min(Sk, row + Sk − Sq + 1) goes to the softmax (softmax_defer_l: osm::step_rows
// with l's update left for after the next turn's GEMM issue), and key tiles past the block's last visible key are
// never loaded (at least one is, so that rows with no visible key still end with O = 0, LSE = −inf).
template <int D, int STAGES, int BC>
__device__ void pingpong_attention(const Params& p, const tma::Map* mq, const tma::Map* mk, const tma::Map* mvt) {
  using Block = TmaBlock<D, STAGES, BC>;
  constexpr int BQ = 128;
  constexpr wgmma::Swizzle SW = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;
  constexpr wgmma::Swizzle SWT = Block::kSwVt;
  using SL = frag::WgmmaD<BC>;
  using OL = frag::WgmmaD<D>;
  __shared__ tma::Barriers<STAGES> bars;
  __shared__ unsigned long long q_bar;
  extern __shared__ unsigned char smem_raw[];
  const Block blk(smem_raw, &bars, &q_bar);
  const TileCoord tc = tile_coord();
  const int bh = tc.bh, kv = bh / p.group, q0 = tc.qt * BQ;
  const int visible = p.causal ? min(p.sk, max(0, min(q0 + BQ, p.sq) + p.sk - p.sq)) : p.sk;
  const int tiles = max(1, (visible + BC - 1) / BC);
  if (roles::warpgroup() == 0) {
    roles::release_registers<40>();
    if (threadIdx.x == 0) blk.produce(mq, mk, mvt, bh, kv, q0, tiles);
  } else {
    roles::claim_registers<232>();
    const int wg = roles::warpgroup() - 1;
    const float scale = p.softmax_scale * p.q_scale[bh] * p.k_scale[kv], c = scale * kLog2e;
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + 64 * wg + frag::wgmma_d_row(roles::thread_in_group(), 2 * h);
      limit[h] = p.causal ? min(p.sk, max(0, row + p.sk - p.sq + 1)) : p.sk;
    }
    osm::RowState st;
    osm::init(st);
    frag::Regs<OL> o[1];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
    // P(t) is packed at the start of the next turn, after the wait that retires P·V(t − 1) (whose A registers it
    // overwrites), across the loop's back edge from the softmax. Packed at the end of the softmax, behind that
    // wait, ptxas hoisted the wait above the whole softmax (SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 before the row
    // max), so each turn's softmax started only after both of its GEMMs had retired.
    unsigned a[BC / 32][4];
    frag::Regs<SL> s[1];
    tma::wait(&q_bar, 0);
    // Turns: consumer 0 first. Each consumer has tiles + 1 turns (the first issues Q·Kᵀ alone, the last P·V
    // alone) and each turn but consumer 1's last hands over, so both barriers end with as many arrivals as
    // waits. First and last turns are peeled: ptxas serialises wgmma (C7514 / C7515) when it cannot see that
    // every path through a wgmma's pipeline stage waits before touching its accumulators.
    const unsigned char* q_tile = blk.sq + wg * 64 * D;
    if (wg == 1) roles::arrive(1, 256);
    float alpha[2];
    blk.ring.wait_full(0);
    roles::sync(1 + wg, 256);
    wgmma::fence_operand(s[0].x);
    wgmma::fence();
    wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, q_tile, SW, blk.k_tile(0), false);
    wgmma::commit();
    roles::arrive(2 - wg, 256);
    wgmma::wait<0>();
    wgmma::fence_operand(s[0].x);
    osm::RowSum sum;  // the tile before's row sums: l's update waits for the next GEMM issue (softmax_defer_l)
    softmax_defer_l<BC>(s, 0, limit, c, st, alpha, sum);
    for (int tt = 1; tt < tiles; ++tt) {
      // P·V(t − 2) has retired (nothing is in flight at t = 1): P(t − 1) into its A registers, its slot back.
      wgmma::wait<0>();
      wgmma::fence_operand(o[0].x);
      wgmma::fence_operand(s[0].x);
      relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);  // O is zero at t = 1: its rescale by α(0) = 0 keeps it so
      if (tt > 1) {
        __syncwarp();
        if (roles::lane() == 0) blk.ring.release(tt - 2);
      }
      blk.ring.wait_full(tt);
      roles::sync(1 + wg, 256);
      wgmma::fence_operand(s[0].x);
      wgmma::fence_operand(o[0].x);
      wgmma::fence();
      wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, q_tile, SW, blk.k_tile(tt), false);
      wgmma::commit();
      // O's rescale by α(t − 1) while Q·Kᵀ(t) runs, before P·V(t − 1) adds to it. The wait never waits (one
      // group in flight); without it ptxas serialises the wgmmas (C7515: O written inside Q·Kᵀ's stage).
      wgmma::wait<1>();
      osm::rescale<OL>(o, alpha);
      wgmma::fence();
      wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_tile(tt - 1), true);
      wgmma::commit();
      roles::arrive(2 - wg, 256);
      osm::step_end(sum, alpha, st);  // l of tile t − 1, under this turn's GEMMs
      wgmma::wait<1>();  // Q·Kᵀ(t): committed first, so retired first; P·V(t − 1) runs on under the softmax
      wgmma::fence_operand(s[0].x);
      softmax_defer_l<BC>(s, tt * BC, limit, c, st, alpha, sum);
    }
    wgmma::wait<0>();  // P·V(tiles − 2)
    wgmma::fence_operand(o[0].x);
    wgmma::fence_operand(s[0].x);
    relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);
    if (tiles > 1) {
      __syncwarp();
      if (roles::lane() == 0) blk.ring.release(tiles - 2);
    }
    roles::sync(1 + wg, 256);
    osm::rescale<OL>(o, alpha);
    wgmma::fence();
    wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_tile(tiles - 1), true);
    wgmma::commit();
    if (wg == 0) roles::arrive(2, 256);
    osm::step_end(sum, alpha, st);
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    epilogue<D>(p, o, st, scale, bh, q0 + 64 * wg);
  }
}

}  // namespace sdpa
