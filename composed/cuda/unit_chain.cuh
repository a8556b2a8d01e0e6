// unit_chain.cuh: a consumer's dense units as one chain of turns: a unit's last P·V shares its turn with the next unit's first Q·Kᵀ.
#pragma once

namespace sdpa {

// A dense unit (or a split tail's part of one) as a consumer of the chain holds it: its view, the scale of its logits
// and each of its rows' key limit (consume_unit's, for the dense schedule).
template <int BC>
struct ChainUnit {
  UnitView u;
  float scale, c;
  int limit[2];
  __device__ __forceinline__ void begin(const Params& p, int wg, int w, int k0, int kt) {
    u = dense_view<BC>(p, w, kt, kNoWindow);
    scale = UnitScale<false>::of(p, u, wg);
    c = times(scale, kLog2e);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = u.q0 + 64 * wg + frag::wgmma_d_row(roles::thread_in_group(), 2 * h);
      limit[h] = p.causal ? min(u.sk, max(0, row + u.sk - u.sq + 1)) : u.sk - k0 * BC;
    }
  }
};

// A chained unit's end: its LSE stored; once its last P·V (and the next unit's first Q·Kᵀ, issued before it) retired,
// its last tile's slot back (`release`, by each warp's lane 0) and its O through epilogue_staged, to its own rows or
// to the virtual unit its destination names (QBarriers::dest, written at the unit's start; every thread reads it
// before the epilogue's first barrier).
template <int D, bool ACC, class Block, class SL, class Release>
__device__ __forceinline__ void finish_chain_unit(const Params& p, const Block& blk, int wg, const UnitView& u,
                                                  const float (&inv)[2], const float (&lse)[2],
                                                  frag::Regs<frag::WgmmaD<D>> (&o)[1], SL (&s)[1], Release&& release,
                                                  Marks& mark, const tma::Map* mo, unsigned char* so) {
  const int dst = blk.qb->dest[wg];
  const int obh = dst < 0 ? u.bh : dst / p.q_tiles, orow = (dst < 0 ? u.q0 : dst % p.q_tiles * kUnitRows) + 64 * wg;
  if constexpr (!ACC) store_lse(p, lse, obh, orow);
  const float vs = p.v_scale[u.kv];
  wgmma::wait<0>();
  wgmma::fence_operand(o[0].x);
  wgmma::fence_operand(s[0].x);
  __syncwarp();
  if (roles::lane() == 0) release();
  store_or_accumulate<D, ACC>(p, o, inv, vs, lse, dst, obh, orow, wg, mo, so);
  mark(kMarkEpilogueEnd);
}

// Consumer warpgroup wg's part of every unit of its block (the dense schedule: stages 7 and 8 with a ring of three or
// more stages, no window), the turns of consume_unit chained across units: where the block has a next unit, the
// turn that issues a unit's last P·V issues the next unit's first Q·Kᵀ before it (their ring tiles are consecutive,
// its Q in the other buffer), so the tensor cores never run a unit's boundary GEMM alone; the consumer then runs the
// next unit's first softmax, and the finished unit's LSE and epilogue, under the other consumer's turn. A consumer
// has Σ tiles + 1 turns a block (consume_unit: tiles + 1 a unit), each handing over but consumer 1's last, so both
// barriers end with as many arrivals as waits. Both consumers learn the next unit at the boundary (its Q slot, which
// the producer filled a ring's depth before). The bits of each unit are consume_unit's: the same GEMMs, softmax and
// epilogue in the same order on the same registers.
template <int D, int BC, bool ACC, class Block>
__device__ __forceinline__ void consume_chain(const Params& p, const Block& blk, int wg, bool tickets,
                                              tma::Cursor<Block::kStages>& at, Marks& mark, const tma::Map* mo,
                                              unsigned char* so) {
  static_assert(!Block::kSplit, "a split ring's releases are consume_unit's");
  constexpr wgmma::Swizzle SW = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;
  constexpr wgmma::Swizzle SWT = Block::kSwVt;
  using SL = frag::WgmmaD<BC>;
  using OL = frag::WgmmaD<D>;
  if (int(blockIdx.x) >= p.work) return;
  mark(kMarkUnit);
  ChainUnit<BC> cur;
  cur.begin(p, wg, int(blockIdx.x), 0, -1);  // a block's first unit is whole, to its own rows
  int n = 0;
  if (roles::thread_in_group() == 0) blk.qb->dest[wg] = -1;
  osm::RowState st;
  osm::init(st);
  frag::Regs<OL> o[1];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
  unsigned a[BC / 32][4];
  frag::Regs<SL> s[1];
  float alpha[2];
  osm::RowSum sum;
  // The block's first turn: Q·Kᵀ of its first unit's first tile alone (consumer 1's arrival gives consumer 0 the
  // first turn).
  blk.wait_q(0);
  if (wg == 1) roles::arrive(1, 256);
  at.wait();
  roles::sync(1 + wg, 256);
  mark(kMarkTurn);
  wgmma::fence_operand(s[0].x);
  wgmma::fence();
  wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, blk.q_tile(0, wg), SW, blk.k_stage(at.stage()), false);
  wgmma::commit();
  roles::arrive(2 - wg, 256);
  mark(kMarkIssued);
  wgmma::wait<0>();
  wgmma::fence_operand(s[0].x);
  mark(kMarkSoftmax);
  softmax_defer_l<BC>(s, 0, cur.limit, cur.c, st, alpha, sum);
  mark(kMarkSoftmaxEnd);
  while (true) {
    const unsigned char* q_tile = blk.q_tile(n, wg);
    // The unit's middle turns: consume_unit's (non-split ring), copied so that consume_unit's code, and the SASS of
    // the kernels that keep it, stay as they are.
    for (int tt = 1; tt < cur.u.tiles; ++tt) {
      at.advance();
      wgmma::wait<0>();
      wgmma::fence_operand(o[0].x);
      wgmma::fence_operand(s[0].x);
      relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);
      if (tt > 1) {
        __syncwarp();
        if (roles::lane() == 0) at.release_prev2();
      }
      at.wait();
      roles::sync(1 + wg, 256);
      mark(kMarkTurn);
      wgmma::fence_operand(s[0].x);
      wgmma::fence_operand(o[0].x);
      wgmma::fence();
      wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, q_tile, SW, blk.k_stage(at.stage()), false);
      wgmma::commit();
      wgmma::wait<1>();
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) osm::rescale<OL>(o, alpha);
      wgmma::fence();
      wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_stage(at.stage_prev()), true);
      wgmma::commit();
      roles::arrive(2 - wg, 256);
      mark(kMarkIssued);
      osm::step_end(sum, alpha, st);
      wgmma::wait<1>();
      wgmma::fence_operand(s[0].x);
      mark(kMarkSoftmax);
      softmax_defer_l<BC>(s, tt * BC, cur.limit, cur.c, st, alpha, sum);
      mark(kMarkSoftmaxEnd);
    }
    // The unit's last P·V: P of its last tile packed, the tile before's slot and Q's buffer back.
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    wgmma::fence_operand(s[0].x);
    relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);
    __syncwarp();
    if (roles::lane() == 0) {
      if (cur.u.tiles > 1) at.release_prev();
      blk.release_q(n);
    }
    // The block's next unit (the producer names it in its Q slot, with its part; a number ≥ work: none).
    const int wn = tickets ? blk.unit(n + 1) : p.work;
    float inv[2], lse[2];
    if (wn < p.work) {
      // The finished unit's LSE and where its O goes, and the next unit's limits, while the other consumer's turn
      // runs (its last tile's row sums are in hand; its last P·V changes neither m nor l).
      osm::step_end(sum, alpha, st);
      osm::finish_rows<kFp8POffset>(st, cur.scale, inv, lse);
      const int dst = blk.qb->dest[wg];  // by every thread before the turn's barrier, which thread 0 passes to write the next
      const int obh = dst < 0 ? cur.u.bh : dst / p.q_tiles;
      const int orow = (dst < 0 ? cur.u.q0 : dst % p.q_tiles * kUnitRows) + 64 * wg;
      if constexpr (!ACC) store_lse(p, lse, obh, orow);
      const float vs = p.v_scale[cur.u.kv];
      ++n;
      cur.begin(p, wg, wn, blk.k0(n), blk.kt(n));
      osm::init(st);
      at.advance();  // the next unit's first tile; the finished unit's last is the stage before
      at.wait();
      roles::sync(1 + wg, 256);
      mark(kMarkUnit);
      mark(kMarkTurn);
      osm::rescale<OL>(o, alpha);
      wgmma::fence_operand(s[0].x);
      wgmma::fence_operand(o[0].x);
      wgmma::fence();
      wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_stage(at.stage_prev()), true);
      wgmma::commit();
      mark(kMarkLastCommit);
      wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, blk.q_tile(n, wg), SW, blk.k_stage(at.stage()), false);
      wgmma::commit();
      roles::arrive(2 - wg, 256);
      mark(kMarkIssued);
      // The finished unit's O once its last P·V retired (its last tile's slot back first), while the next unit's
      // first Q·Kᵀ runs; then that tile's softmax, under the other consumer's turn.
      wgmma::wait<1>();
      wgmma::fence_operand(o[0].x);
      __syncwarp();
      if (roles::lane() == 0) at.release_prev();
      store_or_accumulate<D, ACC>(p, o, inv, vs, lse, dst, obh, orow, wg, mo, so);
      mark(kMarkEpilogueEnd);
      // The next unit's destination, for its epilogue (every thread read this one's before the epilogue's barrier).
      // A unit of one key tile (a split tail's part) has no turn barrier before its end reads it: one here, so that no
      // warp reads the finished unit's destination as its own.
      if (roles::thread_in_group() == 0) blk.qb->dest[wg] = blk.dst(n);
      if (cur.u.tiles == 1) roles::sync(3 + wg, 128);
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
      wgmma::wait<0>();
      wgmma::fence_operand(s[0].x);
      mark(kMarkSoftmax);
      softmax_defer_l<BC>(s, 0, cur.limit, cur.c, st, alpha, sum);
      mark(kMarkSoftmaxEnd);
      continue;
    }
    // The block's last unit: its last P·V alone (consumer 1's last turn hands nothing over).
    roles::sync(1 + wg, 256);
    mark(kMarkTurn);
    osm::rescale<OL>(o, alpha);
    wgmma::fence();
    wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_stage(at.stage()), true);
    wgmma::commit();
    mark(kMarkLastCommit);
    if (wg == 0) roles::arrive(2 - wg, 256);
    mark(kMarkIssued);
    osm::step_end(sum, alpha, st);
    osm::finish_rows<kFp8POffset>(st, cur.scale, inv, lse);
    finish_chain_unit<D, ACC>(p, blk, wg, cur.u, inv, lse, o, s, [&] { at.release(); }, mark, mo, so);
    return;
  }
}

}  // namespace sdpa
