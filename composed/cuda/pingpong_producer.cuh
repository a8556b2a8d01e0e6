// pingpong_producer.cuh: the producer's loads of one unit (dense or ragged): Q, then K and Vᵀ, or K and V into the staging slots.
#pragma once
#include "pingpong_schedule.cuh"
#include "v_staging.cuh"

namespace sdpa {

// The producer's part of unit s.u (the block's n-th unit or part of one, its key tiles ring tiles r0, …): Q, then
// K and Vᵀ (stage 7: `mvt` is Vᵀ's map), or K and V into `vst`'s slots for the transposing warps (stage 8: `mvt` is
// V's map, and every map is (D, S, H, B) over the caller's strides: a head's coordinates are (h, b)).
// WIN: the unit's key tiles are its window's (no split tail with a window: s is a whole unit).
template <class Block, int BC, class Staging = NoStaging, bool WIN = false>
__device__ __forceinline__ int produce_unit(const Params& p, const Block& blk, const tma::Map* mq, const tma::Map* mk,
                                            const tma::Map* mvt, Seg s, int n, int r0, const Staging& vst = Staging(),
                                            const Window& win = kNoWindow) {
  const TileCoord u = unit_coord(p, s.u);
  if constexpr (WIN) {
    const int2 wt = win.tiles<BC>(u.qt * kUnitRows, p.sq, p.sk, p.causal != 0);
    s.k0 = wt.x;
    s.kt = wt.y;
  }
  const int tiles = s.kt < 0 ? key_tiles<BC>(p, u.qt * kUnitRows) : s.kt;
  if constexpr (Staging::kSlots == 0) {
    blk.produce_q(mq, n, u.bh, u.qt * kUnitRows, s.u, s.k0, s.kt, s.dst);
    const int kv = u.bh / p.group;
    blk.produce_kv(mk, mvt, p.vt_tiles + (long long)kv * ((p.sk + BC - 1) / BC) * Block::kTile, kv, r0, tiles, s.k0);
  } else {
    const int kv = u.bh / p.group, hkv = vst.heads / p.group, b = u.bh / vst.heads;
    blk.produce_q(mq, n, u.bh - b * vst.heads, u.qt * kUnitRows, s.u, s.k0, s.kt, s.dst, b);
    blk.template produce_k<true>(mk, [&](int r, int t, const KeyRows& at) { vst.load(mvt, r, t, kv - b * hkv, b, at); }, Block::kTile, kv - b * hkv, r0,
                  tiles, s.k0, b);
  }
  return tiles;
}

// The producer's part of a halved launch's block (HALF, stage 8): the block's 64 rows of unit blockIdx.x / 2 into both
// consumers' halves of Q's buffer, then every key tile of the unit, K into ring tile t and V into `vst`'s slots, in
// HalfOrder (key tiles 0, half, 1, half + 1, …: each consumer's next tile in turn), and the staging's end.
template <class Block, int BC, class Staging>
__device__ __forceinline__ void produce_halved_unit(const Params& p, const Block& blk, const tma::Map* mq,
                                                    const tma::Map* mk, const tma::Map* mv, const Staging& vst) {
  Block::prefetch(mq, mk, mv);
  const TileCoord u = unit_coord(p, int(blockIdx.x) / 2);
  const int hkv = vst.heads / p.group, b = u.bh / vst.heads, kv = u.bh / p.group - b * hkv;
  const int half = halved_half<BC>(p), tiles = 2 * half;
  blk.produce_q_same(mq, 0, u.bh - b * vst.heads, u.qt * kUnitRows + 64 * int(blockIdx.x & 1), b);
  const HalfOrder order{half};
  for (int i = 0; i < tiles; ++i) {
    const int t = order(i);
    blk.template produce_k<true>(mk, [&](int, int kt, const KeyRows& at) { vst.load(mv, i, kt, kv, b, at); }, Block::kTile, kv, t, 1, t, b);
  }
  vst.end(tiles);
}

// The producer's part of ragged unit s.u (a packed batch's unit from the plan's table, `rg`; stage 8 varlen): Q's rows
// of the unit's sequence and head, then its key tiles from the sequence's first key row (maps over the packed tensors:
// (D, total, heads, 1)), or from its pages of a paged cache (maps over the pool); V into `vst`'s slots.
// WIN: the unit's key tiles start at its window's first (their count is the plan's).
// PACK: a plan of packed heads (its unit's head a K/V head; Q's map (D, group, tokens, K/V heads): produce_q_grouped).
template <bool WIN = false, bool PACK = false, class Block, class Staging>
__device__ __forceinline__ int produce_ragged_unit(const Params& p, const RaggedArgs& rg, const PagedArgs& pg,
                                                   const Block& blk, const tma::Map* mq, const tma::Map* mk,
                                                   const tma::Map* mv, int u, int n, int r0, const Staging& vst,
                                                   const Window& win = kNoWindow) {
  const ragged::Unit ru = ragged::unit(rg.table, u);
  const ragged::Coord rc = PACK ? ragged::coord_packed(rg.cu_q, rg.cu_k, ru, kUnitRows, p.group)
                                : ragged::coord(rg.cu_q, rg.cu_k, ru, kUnitRows);
  if constexpr (PACK) {
    blk.produce_q_grouped(mq, n, ru.head, rc.q_row0, p.group, u);
  } else {
    blk.produce_q(mq, n, ru.head, rc.q_row0, u);
  }
  const int kv = PACK ? ru.head : ru.head / p.group;
  int k0 = 0;
  if constexpr (WIN) k0 = win.tiles<Block::kBc>(ru.q0, rc.sq, rc.sk, p.causal != 0).x;
  if (pg.pages.pages != nullptr) {
    const PagedRows rows{pg.pages, ru.seq, rc.sk, pg.box, pg.oob_row};
    blk.template produce_k<true>(mk, [&](int r, int t, const PagedTile<Block::kBc / PagedRows::kMinPage>& at) { vst.load(mv, r, t, kv, 0, at); }, Block::kTile, kv, r0, ru.key_tiles, k0, 0,
                  rows);
  } else {
    const KeyRows rows{rc.k_row0};
    blk.template produce_k<true>(mk, [&](int r, int t, const KeyRows& at) { vst.load(mv, r, t, kv, 0, at); }, Block::kTile, kv, r0, ru.key_tiles, k0, 0,
                  rows);
  }
  return ru.key_tiles;
}

}  // namespace sdpa
