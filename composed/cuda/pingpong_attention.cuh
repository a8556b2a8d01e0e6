// pingpong_attention.cuh: the body of stages 7 and 8: two consumers taking turns on the tensor cores beside the producer warpgroup.
#pragma once
#include "attn_merge.cuh"
#include "ragged_units.cuh"
#include "tma_attention.cuh"
#include "v_staging.cuh"
#include "pingpong_schedule.cuh"
#include "pingpong_producer.cuh"
#include "pingpong_epilogue.cuh"

namespace sdpa {

// Timeline marks for `sdpa trace` (composed::trace), which builds stage 7 with SDPA_TRACE_MARKS defined and its own
// Marks (clock64 stamps into a buffer, lane 0 of each consumer warp of a few blocks); here they are no-ops, and
// stage 7's SASS is the same with them as without (its snapshot).
enum Mark {
  kMarkTurn = 1,
  kMarkIssued = 2,
  kMarkSoftmax = 3,
  kMarkSoftmaxEnd = 4,
  kMarkUnit = 5,
  kMarkEpilogueEnd = 6,
  kMarkLastCommit = 7,  // a unit's last P·V committed, before consumer 1 asks for the next unit
  kMarkQReady = 8,      // a unit's Q has landed (its first turn, before the first key tile's wait)
  kMarkTileReady = 9,   // a unit's first key tile has landed (before the grant's barrier)
  kMarkOReady = 10,     // a unit's last P·V has retired: O is in registers (the dense epilogue's start)
};
#ifndef SDPA_TRACE_MARKS
struct Marks {
  __device__ void operator()(Mark) const {}
};
#endif

// A consumer that holds none of its unit's rows (VARLEN: all of them below its 64; a decode unit's few rows — a
// token's G packed heads — are consumer 0's): consume_unit's waits, turns and releases, turn for turn, without its
// GEMMs, softmax or stores, so that the other consumer has the tensor cores to itself and the ring's stages go back as
// soon as it is done with them.
template <class Block, class Next>
__device__ __forceinline__ void idle_unit(const Block& blk, int wg, int n, int tiles,
                                          tma::Cursor<Block::kStages>& at, Next&& next) {
  blk.wait_q(n);
  if (wg == 1 && n == 0) roles::arrive(1, 256);
  static_assert(!Block::kSplit, "idle units come in packed batches, whose rings are not split");
  at.wait();
  roles::sync(1 + wg, 256);
  roles::arrive(2 - wg, 256);
  for (int tt = 1; tt < tiles; ++tt) {
    at.advance();
    if (tt > 1) {
      __syncwarp();
      if (roles::lane() == 0) at.release_prev2();
    }
    at.wait();
    roles::sync(1 + wg, 256);
    roles::arrive(2 - wg, 256);
  }
  __syncwarp();
  if (roles::lane() == 0) {
    if (tiles > 1) at.release_prev();
    blk.release_q(n);
  }
  roles::sync(1 + wg, 256);
  if (wg == 0 || next()) roles::arrive(2 - wg, 256);
  __syncwarp();
  if (roles::lane() == 0) at.release();
}

// Consumer warpgroup wg's part of unit w (the block's n-th; `at`: the ring at its first key tile, left at its
// last); `next()`: whether the block has a unit after this one (then its last turn hands over), asked by consumer
// 1 only, after its last GEMM issue (a block learns its next unit from the producer as it goes). The unit's last
// slot and Q's buffer go back always: behind a test of `next`, ptxas's schedule of the loop cost 13% at
// (4, 16, 4096, 64).
// VARLEN: unit w is the plan's (`rg`, ragged_units.cuh): its sequence's rows, Sq and Sk, scales per (sequence, head),
// O and the LSE by direct stores into the packed outputs (no split tail).
// WIN: the unit's key tiles start at its window's first (k0), each row's keys cut on both sides (osm::mask_below for
// the left edge, the limit for the right).
// PACK (VARLEN, no window): a plan of packed heads (packed_view): row r of the unit is query head r % group of token r /
// group, each with its own Q scale (osm::RowScale), its causal limit its token's, its O and LSE stored at its head and
// token (relayout::GroupedRows, store_lse_grouped); group divides 64.
// HALF: a halved unit's block (the host's SplitPlan::halved): both consumers on the block's 64 rows, consumer wg over
// key tiles k0 .. k0 + kt − 1 (its half); consumer 0 merges the two halves (merge_halves) and stores the rows.
template <int D, int BC, bool VARLEN = false, bool WIN = false, bool PACK = false, bool ACC = false, bool HALF = false,
          class Block, class Next>
__device__ __forceinline__ void consume_unit(const Params& p, const Block& blk, int wg, int w, int n,
                                             tma::Cursor<Block::kStages>& at,
                                             Next&& next, Marks& mark, const tma::Map* mo, unsigned char* so, int k0,
                                             int kt, int dest, const RaggedArgs& rg = RaggedArgs(),
                                             const Window& win = kNoWindow) {
  mark(kMarkUnit);
  if (roles::thread_in_group() == 0) blk.qb->dest[wg] = dest;
  constexpr wgmma::Swizzle SW = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;
  constexpr wgmma::Swizzle SWT = Block::kSwVt;
  using SL = frag::WgmmaD<BC>;
  using OL = frag::WgmmaD<D>;
  // kt >= 0: a split tail's part, key tiles k0 .. k0 + kt − 1, its limits moved instead of its columns (never causal).
  // bh and kv: the scales' heads (VARLEN: sequence · heads + head, sequence · K/V heads + K/V head).
  static_assert(!PACK || (VARLEN && !WIN), "packed heads: a packed batch without a window");
  static_assert(!ACC || (!VARLEN && !WIN), "accumulated rows: the dense schedule");
  const UnitView u = unit_view<VARLEN, BC, WIN, PACK>(p, rg, w, kt, win);
  if constexpr (VARLEN) {
    if (u.rows <= 64 * wg) return idle_unit(blk, wg, n, u.tiles, at, next);
  }
  const int bh = u.bh, kv = u.kv, q0 = u.q0, tiles = u.tiles;
  const typename UnitScale<PACK>::T scale = UnitScale<PACK>::of(p, u, wg, rg.one_scale);
  const auto c = times(scale, kLog2e);
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + 64 * wg + frag::wgmma_d_row(roles::thread_in_group(), 2 * h);
    const int tok = PACK ? row / p.group : row;  // packed heads: the row's token
    limit[h] = p.causal ? min(u.sk, max(0, tok + u.sk - u.sq + 1)) : u.sk - k0 * BC;
  }
  // WIN: both edges of each row's window, relative to the unit's first key tile.
  int lo[2];
  if constexpr (WIN) {
    k0 = win.tiles<BC>(q0, u.sq, u.sk, p.causal != 0).x;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + 64 * wg + frag::wgmma_d_row(roles::thread_in_group(), 2 * h);
      limit[h] = win.key_end(row, u.sq, u.sk, p.causal != 0) - k0 * BC;
      lo[h] = win.first_key(row, u.sq, u.sk) - k0 * BC;
    }
  }
  osm::RowState st;
  osm::init(st);
  frag::Regs<OL> o[1];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
  // P(t) is packed at the start of the next turn, after the wait that retires P·V(t − 1) (whose A registers
  // it overwrites), across the loop's back edge from the softmax. Packed at the end of the softmax, behind
  // that wait, ptxas hoisted the wait above the whole softmax (SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 before the
  // row max), so each turn's softmax started only after both of its GEMMs had retired.
  unsigned a[BC / 32][4];
  frag::Regs<SL> s[1];
  blk.wait_q(n);
  mark(kMarkQReady);
  // Turns: consumer 0 first. Each consumer has tiles + 1 turns a unit (the first issues Q·Kᵀ alone, the last
  // P·V alone) and each turn hands over but consumer 1's last of the block's last unit, so both barriers end
  // with as many arrivals as waits; consumer 1's first arrival, before its first unit, gives consumer 0 the
  // first turn. First and last turns are peeled: ptxas serialises wgmma (C7514 / C7515) when it cannot see
  // that every path through a wgmma's pipeline stage waits before touching its accumulators.
  const unsigned char* q_tile = blk.q_tile(n, wg);
  if (wg == 1 && n == 0) roles::arrive(1, 256);
  float alpha[2];
  at.wait();
  mark(kMarkTileReady);
  roles::sync(1 + wg, 256);
  mark(kMarkTurn);
  wgmma::fence_operand(s[0].x);
  wgmma::fence();
  wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, q_tile, SW, blk.k_stage(at.stage()), false);
  wgmma::commit();
  roles::arrive(2 - wg, 256);
  mark(kMarkIssued);
  wgmma::wait<0>();
  wgmma::fence_operand(s[0].x);
  mark(kMarkSoftmax);
  osm::RowSum sum;  // the tile before's row sums: l's update waits for the next GEMM issue (softmax_defer_l)
  if constexpr (WIN) osm::mask_below<SL>(s, 0, lo);
  softmax_defer_l<BC>(s, 0, limit, c, st, alpha, sum);
  mark(kMarkSoftmaxEnd);
  for (int tt = 1; tt < tiles; ++tt) {
    at.advance();
    // P·V(t − 2) has retired (nothing is in flight at t = 1): P(t − 1) into its A registers, its slot back.
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    wgmma::fence_operand(s[0].x);
    relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);  // O is zero at t = 1: its rescale by α(0) = 0 keeps it so
    if constexpr (Block::kSplit) {
      // K(t − 1) (Q·Kᵀ(t − 1) retired a turn ago) and Vᵀ(t − 2) (P·V(t − 2) just did).
      __syncwarp();
      if (roles::lane() == 0) {
        at.release_prev();
        if (tt > 1) at.release_second_prev2();
      }
    } else if (tt > 1) {
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
    // O's rescale by α(t − 1) while Q·Kᵀ(t) runs, before P·V(t − 1) adds to it. The wait never waits (one
    // group in flight); without it ptxas serialises the wgmmas (C7515: O written inside Q·Kᵀ's stage).
    wgmma::wait<1>();
    // α = 1 exactly where a row's max did not grow: a warp none of whose 16 rows grew skips the 64 FMULs.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) osm::rescale<OL>(o, alpha);
    if constexpr (Block::kSplit) at.wait_second_prev();  // Vᵀ(t − 1) landed (a split ring's own barrier)
    wgmma::fence();
    wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_stage(at.stage_prev()), true);
    wgmma::commit();
    roles::arrive(2 - wg, 256);
    mark(kMarkIssued);
    osm::step_end(sum, alpha, st);  // l of tile t − 1, under this turn's GEMMs
    wgmma::wait<1>();  // Q·Kᵀ(t): committed first, so retired first; P·V(t − 1) runs on under the softmax
    wgmma::fence_operand(s[0].x);
    mark(kMarkSoftmax);
    if constexpr (WIN) osm::mask_below<SL>(s, tt * BC, lo);
    softmax_defer_l<BC>(s, tt * BC, limit, c, st, alpha, sum);
    mark(kMarkSoftmaxEnd);
  }
  wgmma::wait<0>();  // P·V(tiles − 2), and every Q·Kᵀ of the unit: Q's buffer goes back with the slot
  wgmma::fence_operand(o[0].x);
  wgmma::fence_operand(s[0].x);
  relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);
  __syncwarp();
  if (roles::lane() == 0) {
    if constexpr (Block::kSplit) {
      at.release();  // K of the last tile
      if (tiles > 1) at.release_second_prev();
    } else if (tiles > 1) {
      at.release_prev();
    }
    blk.release_q(n);
  }
  roles::sync(1 + wg, 256);
  mark(kMarkTurn);
  osm::rescale<OL>(o, alpha);
  if constexpr (Block::kSplit) at.wait_second();
  wgmma::fence();
  wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, blk.vt_stage(at.stage()), true);
  wgmma::commit();
  mark(kMarkLastCommit);
  if (wg == 0 || next()) roles::arrive(2 - wg, 256);
  mark(kMarkIssued);
  osm::step_end(sum, alpha, st);
  // The rows' 1/l and LSE, and the LSE's stores, while the last P·V runs; O waits for it.
  float inv[2], lse[2];
  osm::finish_rows<kFp8POffset>(st, scale, inv, lse);
  // A split tail's part writes its O and LSE, as a unit would, to virtual unit dst past the real ones (in O's and the
  // LSE's buffers and O's map), for the merge kernel; dst read back from shared memory, not kept in a register.
  static_assert(!Block::kSplit || !VARLEN, "packed batches' rings are not split");
  if constexpr (PACK) {
    // The unit's packed rows in the packed outputs: this consumer's row r is head head0 + r % group of token token0 +
    // r / group (its first row a token's first head: group divides 64).
    const int head0 = bh - u.seq * rg.heads, token0 = u.q_row0 + 64 * wg / p.group, valid = u.rows - 64 * wg;
    store_lse_grouped(p.lse + (long long)head0 * rg.total_q + token0, lse, valid, p.group, rg.total_q);
    const float vs = p.v_scale[scale_at(rg.one_scale, kOneV, kv)];
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    __syncwarp();
    if (roles::lane() == 0) at.release();
    epilogue_rows<D>(p, o, inv, vs, ((long long)token0 * rg.heads + head0) * D,
                     relayout::GroupedRows{p.group, (long long)rg.heads * D, D}, valid, wg);
  } else if constexpr (VARLEN) {
    // The unit's rows in the packed outputs: O [total_q, heads, D], the LSE [heads, total_q].
    const int head = bh - u.seq * rg.heads, row0 = u.q_row0 + 64 * wg, valid = u.rows - 64 * wg;
    store_lse_rows(p.lse + (long long)head * rg.total_q + row0, lse, valid);
    const float vs = p.v_scale[scale_at(rg.one_scale, kOneV, kv)];
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    __syncwarp();
    if (roles::lane() == 0) at.release();
    epilogue_rows<D>(p, o, inv, vs, ((long long)row0 * rg.heads + head) * D, relayout::RowPitch{(long long)rg.heads * D},
                     valid, wg);
  } else if constexpr (HALF) {
    const float vs = p.v_scale[kv];
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    __syncwarp();
    if (roles::lane() == 0) at.release();
    merge_halves<D>(p, blk, o, inv, vs, lse, wg, bh, q0 + 64 * int(blockIdx.x & 1), mo, so);
  } else {
    const int dst = blk.qb->dest[wg];
    const int obh = dst < 0 ? bh : dst / p.q_tiles, orow = (dst < 0 ? q0 : dst % p.q_tiles * kUnitRows) + 64 * wg;
    if constexpr (!ACC) store_lse(p, lse, obh, orow);
    const float vs = p.v_scale[kv];
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    mark(kMarkOReady);
    __syncwarp();
    if (roles::lane() == 0) {
      if constexpr (Block::kSplit) at.release_second();  // Vᵀ of the last tile (its K went back before P·V)
      else at.release();
    }
    store_or_accumulate<D, ACC>(p, o, inv, vs, lse, dst, obh, orow, wg, mo, so);
  }
  mark(kMarkEpilogueEnd);
}

// As tma_attention, but the consumers alternate: in its turn (named barrier 1 + wg, handed over with an arrive on
// the other's) a consumer issues Q·Kᵀ of tile t and P·V of tile t − 1, hands the tensor cores over, and runs tile
// t's softmax while the other consumer's GEMMs run (FlashAttention-3's pingpong). Its own P·V(t − 1) also runs under
// that softmax: only P(t)'s packing and O's rescale, both at the start of the next turn, wait for it (O and P's A
// registers belong to the wgmma until it retires). BC keys a tile (Stage::bc: 224 at D = 128, 256 at D = 64).
// Grouped-query attention: the block of query head bh reads K/V head bh / p.group (and its scales). Causal masking
// (p.causal): each row's key limit min(Sk, row + Sk − Sq + 1) goes to the softmax (softmax_defer_l: osm::step_rows
// with l's update left for after the next turn's GEMM issue), and key tiles past the block's last visible key are
// never loaded (at least one is, so that rows with no visible key still end with O = 0, LSE = −inf).
// A unit is a (head, query tile) of 128 rows, in unit_coord's order. Blocks are persistent (the host launches one
// an SM, at most one a unit): a block's first unit is blockIdx.x, and as its producer has issued a unit's last key
// tile it takes the next unit in order from a counter (p.sched), so that blocks finishing early take more units
// (causal units differ in length up to Sk / BC times); it names each later unit to the consumers in Q's buffer
// slot (TmaBlock::unit). The producer runs ahead across units (ring slots and Q's two buffers are counted across
// them), so a unit's Q and first key tiles land under the unit before, and the turns hand over across units. The
// last block done with the counter sets it back to zero for the next launch.
// VS > 0 (stage 8): V comes as the caller has it, by `mvt` (V's map: K's boxes) into VS staging slots, and the
// producer warpgroup's warps 1–3 transpose each tile into the ring stage's Vᵀ (transpose_v_tiles) while its first
// thread issues the loads; a stage is full once K has landed and the three warps have arrived. Q's, K's and V's maps
// are then (D, S, H, B) over the caller's strides ([B, H, S, D], [B, S, H, D] or any other with D contiguous), and
// `heads` is H; O's is stage 7's ([B·H + virtual heads, Sq, D], contiguous).
// VARLEN (stage 8 varlen): units from the plan's table (`rg`: ragged-plan's, built on the device), their count read
// there; no split tail.
// WIN (stage 8's windowed kernels): every unit's key tiles and masks are `win`'s (the host plans no split tail for
// dense ones; a packed batch's plan counts each unit's tiles under the window).
// PACK (stage 8 varlen with packed heads): the plan's units are (sequence, K/V head, 128 packed rows), a token's
// p.group query heads in consecutive rows (consume_unit, produce_q_grouped).
// HALF (stage 8's halved kernels, the host's SplitPlan::halved): block b holds rows 64 · (b % 2) … of unit b / 2, its
// consumers the unit's first and second halves of the key tiles (every tile in its own ring stage); no counter.
template <int D, int STAGES, int BC, int VS = 0, bool VARLEN = false, bool WIN = false, bool PACK = false,
          bool ACC = false, bool HALF = false>
__device__ void pingpong_attention(const Params& p, const tma::Map* mq, const tma::Map* mk, const tma::Map* mvt,
                                   const tma::Map* mo, int heads = 0, const RaggedArgs& rg = RaggedArgs(),
                                   const PagedArgs* pg = nullptr, const Window win = kNoWindow) {
  // Two ring stages (D = 256) split K's and Vᵀ's barriers (TmaBlock's SPLIT): released together, a stage came back
  // just before the consumers needed it again, and every tile waited for its load.
  constexpr bool kSplit = STAGES == 2;
  static_assert(!kSplit || VS == 0, "a split ring's Vᵀ comes by TMA (no staging)");
  using Block = TmaBlock<D, STAGES, BC, 2, kSplit>;
  __shared__ tma::Barriers<STAGES> bars[kSplit ? 2 : 1];
  __shared__ QBarriers<2> qbars;
  extern __shared__ unsigned char smem_raw[];
  const Block blk(smem_raw, bars, &qbars, 2, VS > 0 ? 1 + kVWarps : 1);
  const typename StagingOf<Block, VS>::type vst = StagingOf<Block, VS>::make(blk, heads);
  // Programmatic dependent launch (the host's Stage::programmatic): this grid may start while the kernel before it in
  // the stream runs. Above, only shared memory and the parameters are touched; past the wait that kernel has finished
  // and its writes are visible (without the launch attribute the wait returns at once). The next kernel may then be
  // launched: every block of this grid is resident by the time all have triggered, and it waits in turn.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // Whether any block takes a second unit. If not (at most one unit an SM: the mission shape), each block runs
  // unit blockIdx.x alone, and neither the counter nor the slots are touched: they cost ~0.3 µs a launch there.
  const int work = VARLEN ? ragged::count(rg.table) : p.work;
  const bool tickets = int(gridDim.x) < work;
  // Registers after setmaxnreg: the producer's and each consumer's (128·producer + 256·consumer ≤ 64K). At D = 256 a
  // consumer holds O (128 a thread), S (64) and P (16): 232 left ptxas 16 bytes short (a spill and wgmma serialised,
  // C7512), so the producer gives up 16 more.
  // A halved kernel at D = 128 gives its producer 8 more: at 40 its transposing warps spilled a word.
  constexpr int kProducerRegs = D == 256 ? 24 : HALF && D == 128 ? 48 : 40;
  constexpr int kConsumerRegs = D == 256 ? 240 : HALF && D == 128 ? 224 : 232;
  if (roles::warpgroup() == 0) {
    roles::release_registers<kProducerRegs>();
    if (HALF && threadIdx.x == 0) {
      static_assert(!HALF || (VS > 0 && !VARLEN && !WIN && !ACC), "a halved launch is stage 8's dense schedule");
      if constexpr (HALF) produce_halved_unit<Block, BC>(p, blk, mq, mk, mvt, vst);
    } else if (threadIdx.x == 0) {
      Block::prefetch(mq, mk, mvt);
      int r0 = 0, n = 0;
      // Whole units below `split`; past it the split tail's parts, piece after piece (the table's order). A split
      // tail's work is dealt: each block its split / G whole units, then its piece's parts (taken greedily, the whole
      // units' ends were ragged by up to a unit) — unless the plan is taken (beside another kernel's blocks, a block
      // may start late): then whole units and then pieces come from the counter, a piece's parts one after another.
      // Only stage 7's kernels (no V staging) take them (the host's Stage::takes_pieces): the branch moved ptxas's
      // schedule of stage 8's consumer loop.
      const SplitTable tab(p);
      SplitHead* sched = reinterpret_cast<SplitHead*>(p.sched);
      const int split = tickets && !VARLEN ? tab.split() : work, pieces = tickets && !VARLEN ? tab.pieces() : 0;
      const bool taken = VS == 0 && pieces > 0 && tab.taken();
      // Dealt: this block's piece's parts are mine .. end − 1. Taken: end is the piece in hand's end (0: none).
      const int mine = pieces > 0 ? split + tab.first(blockIdx.x) : 0;
      int end = pieces > 0 && !taken ? split + tab.first(blockIdx.x + 1) : 0;
      for (int w = blockIdx.x; w < split || w < end; ++n) {
        if constexpr (VARLEN) {
          r0 += produce_ragged_unit<WIN, PACK>(p, rg, *pg, blk, mq, mk, mvt, w, n, r0, vst, win);
        } else {
          const int4 g = w < split ? make_int4(w, 0, -1, -1) : tab.part(w - split);
          r0 += produce_unit<Block, BC, typename StagingOf<Block, VS>::type, WIN>(
              p, blk, mq, mk, mvt, Seg{g.x, g.y, g.z, g.w}, n, r0, vst, win);
        }
        if (taken) {
          if (w >= split && w + 1 < end) {
            ++w;  // the piece's next part
          } else {
            // A whole unit, else piece q's first part (its parts end at `end`), else past every part: done.
            const int c = int(gridDim.x) + atomicAdd(&sched->counter, 1), q = c - split;
            const bool piece = q >= 0 && q < pieces;
            w = c < split ? c : split + tab.first(piece ? q : pieces);
            end = piece ? split + tab.first(q + 1) : 0;
          }
        } else if (pieces > 0) {
          w = w >= split ? w + 1 : w + int(gridDim.x) < split ? w + int(gridDim.x) : mine;
        } else {
          w = tickets ? int(gridDim.x) + atomicAdd(&sched->counter, 1) : work;
        }
      }
      if constexpr (VS > 0) vst.end(r0);
      if (tickets) {
        blk.end_units(n, work);
        __threadfence();  // this block's last ticket is taken before it counts itself done
        if (atomicAdd(&sched->done, 1) == int(gridDim.x) - 1) {
          sched->counter = 0;
          sched->done = 0;
        }
      }
    } else {
      if constexpr (VS > 0) {
        if constexpr (HALF) {
          if (threadIdx.x >= 32) transpose_v_tiles(blk, vst, int(threadIdx.x) / 32 - 1, HalfOrder{halved_half<BC>(p)});
        } else if (threadIdx.x >= 32) {
          transpose_v_tiles(blk, vst, int(threadIdx.x) / 32 - 1);
        }
      }
    }
  } else {
    roles::claim_registers<kConsumerRegs>();
    const int wg = roles::warpgroup() - 1;
    // The consumer's place in the K/Vᵀ ring, carried across units (tma::Cursor: stages and parity kept in registers,
    // not divided out of a tile number at each access, which put a chain of uniform-datapath ops between the barrier
    // wait and the Q·Kᵀ issue).
    tma::Cursor<STAGES> at(blk.ring);
    Marks mark;
    // O's staging panels (epilogue_staged), 64 rows × 128 bytes a consumer, after the ring.
    unsigned char* so = blk.svt + STAGES * Block::kTile + wg * 64 * 128;
    if constexpr (HALF) {
      // Consumer 1 starts at the unit's middle key tile (its ring stage: no tile shares one).
      const int half = halved_half<BC>(p);
      if (wg == 1)
        for (int i = 0; i < half; ++i) at.advance();
      consume_unit<D, BC, false, false, false, false, true>(p, blk, wg, int(blockIdx.x) / 2, 0, at, [] { return false; },
                                                            mark, mo, so, wg * half, half, -1);
    } else {
      // The unit count: read from Params at each use in the dense schedule (a copy in a register moved ptxas's
      // schedule of stage 7's last turn and epilogue), the plan's count in the ragged one.
      const auto units = [&] { return VARLEN ? work : p.work; };
      for (int w = blockIdx.x, n = 0; w < units(); w = tickets ? blk.unit(++n) : units()) {
        // A block's first unit is whole (the host splits only past a first wave); later ones say so in their slot.
        consume_unit<D, BC, VARLEN, WIN, PACK, ACC>(p, blk, wg, w, n, at, [&] { return tickets && blk.unit(n + 1) < units(); },
                                    mark, mo, so, n > 0 ? blk.k0(n) : 0, n > 0 ? blk.kt(n) : -1, n > 0 ? blk.dst(n) : -1,
                                    rg, win);
        at.advance();
      }
    }
    if (threadIdx.x % 128 == 0) tma::store_wait<0>();  // O's last stores written before the block's shared memory goes
  }
}

// Stage 8's kernel over a packed batch, named NAME (stage8_varlen.cu, stage8_varlen_pack.cu: PACK, packed heads): Q
// [total_q, H, D], K and V [total_k, Hkv, D] (maps (D, total, heads, 1); with packed heads Q's (D, G, total_q, Hkv)),
// or K and V a paged cache's pool (block_table set: [B][max_pages] page indices, pages of 2^page_shift rows, maps (D,
// pool rows, Hkv, 1) in boxes of `box` rows, cu_k then the prefix sums of the sequences' lengths); the units and their
// count from the plan's table (ragged-plan's Planner, made on the device from cu_seqlens); scales per (sequence, head);
// O [total_q, H, D] and the LSE [H, total_q] by direct stores (mo is not read). `heads` is H; `past` (null: none) each
// sequence's keys past its end that its rows see (RaggedArgs: split-KV's chunks under a causal mask); `one_scale` the
// scales that are one value for the batch (RaggedArgs::one_scale's bits).
#define SDPA_VARLEN_KERNEL(NAME, D, BC, ST, VS, PACK)                                                            \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      NAME(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,            \
           const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads, const int* table, \
           const int* cu_q, const int* cu_k, int total_q, const int* block_table, int max_pages, int page_shift, \
           int box, int oob_row, const int* past, int one_scale) {                                              \
    const sdpa::RaggedArgs rg{table, cu_q, cu_k, total_q, heads, past, one_scale};                              \
    const sdpa::PagedArgs pg{{block_table, max_pages, page_shift}, box, oob_row};                               \
    sdpa::pingpong_attention<D, ST, BC, VS, true, false, PACK>(p, &mq, &mk, &mv, &mo, heads, rg, &pg);          \
  }

// The split tail's merge kernel of head dimension D (sdpa::merge_split_tail), launched after a stage 7 or 8 kernel where
// the host split the tail; named stage7_merge_dD in every source that has it.
#define SDPA_MERGE_KERNEL(D)                                                                                       \
  extern "C" __global__ void __launch_bounds__(128) stage7_merge_d##D(sdpa::Params p) {                           \
    sdpa::merge_split_tail<D, false>(p);                                                                           \
  }
// The same in the accumulating kernels' source (stage7_acc.cu): each split unit's rows hold the running result, which
// is merged with the parts, first.
#define SDPA_MERGE_ACC_KERNEL(D)                                                                                   \
  extern "C" __global__ void __launch_bounds__(128) stage7_merge_d##D(sdpa::Params p) {                           \
    sdpa::merge_split_tail<D, true>(p);                                                                            \
  }

// Parts of a split unit at most (the host's SplitPlan, whose test checks it).
constexpr int kMaxParts = 4;

// Eight consecutive elements of O as written (T), widened, and back.
template <class T>
__device__ __forceinline__ void load8(const T* at, float (&x)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(at)), b = __ldcg(reinterpret_cast<const float4*>(at) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(at));
    const T* h = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = float(h[i]);
  }
}
template <class T>
__device__ __forceinline__ void store8(T* at, const float (&x)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i += 2) relayout::store2(at + i, x[i], x[i + 1]);
}

// Columns 8c .. 8c + 7 of row `row` of head bh (and, for c = 0, the row's LSE) merged from n parts' O and LSE at
// virtual units dsts (each a whole unit's over its key tiles), in piece order, by the attn-merge block (FlashAttention's
// split-KV combine); ACC: the row's own (O, LSE), a running result, first. Every load is issued before the first is
// used. `lanes`: the row's threads (consecutive lanes of one warp), which have all read its LSE before it is written.
template <class T, int D, bool ACC>
__device__ __forceinline__ void merge_row(const Params& p, const int* dsts, int n, int bh, int row, int c,
                                          unsigned lanes) {
  constexpr int kIn = kMaxParts + (ACC ? 1 : 0);
  const int m = n + (ACC ? 1 : 0);
  T* o = static_cast<T*>(p.o);
  const long long out = (long long)bh * p.sq + row;
  long long at[kIn];
  float lse[kIn], v[kIn][8];
#pragma unroll
  for (int j = 0; j < kIn; ++j) {
    lse[j] = wr::neg_inf();
    if (j < m) {
      const int i = j - (ACC ? 1 : 0);
      at[j] = ACC && j == 0 ? out
                            : (long long)(dsts[i] / p.q_tiles) * p.sq + dsts[i] % p.q_tiles * kUnitRows + row % kUnitRows;
      lse[j] = __ldcg(p.lse + at[j]);
      load8(o + at[j] * D + 8 * c, v[j]);
    }
  }
  const amerge::Weights<kIn> w = amerge::weights(lse, m);
  if constexpr (ACC) __syncwarp(lanes);  // the row's LSE read by each of its threads before c = 0 writes it
  if (c == 0) p.lse[out] = w.lse;
  float x[8];
  amerge::merge8(w, v, m, x);
  store8(o + out * D + 8 * c, x);
}

// merge_row in the type with_o_type names.
template <int D, bool ACC>
struct MergeRow {
  const Params& p;
  const int* dsts;
  int n, bh, row, c;
  unsigned lanes;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    merge_row<T, D, ACC>(p, dsts, n, bh, row, c, lanes);
  }
};

// Stage 7's split tail, merged after the attention kernel: block (r, y) merges rows y · 128 / (D / 8) … of split unit
// split + r, a thread 8 columns; ACC: into the running result already in the unit's rows.
template <int D, bool ACC>
__device__ void merge_split_tail(const Params& p) {
  const SplitTable tab(p);
  const MergeList& m = tab.merged(int(blockIdx.x));
  const TileCoord tc = unit_coord(p, tab.split() + int(blockIdx.x));
  // A warp over consecutive 16-byte chunks of rows (coalesced): D / 8 chunks a row, 128 / (D / 8) rows a block.
  constexpr int kChunks = D / 8, kRows = 128 / kChunks;
  const int c = int(threadIdx.x) % kChunks;
  const int row = tc.qt * kUnitRows + int(blockIdx.y) * kRows + int(threadIdx.x) / kChunks;
  if (m.parts == 0 || row >= p.sq) return;
  const unsigned lanes = kChunks >= 32 ? ~0u : ((1u << kChunks) - 1) << (int(threadIdx.x) % 32 / kChunks * kChunks);
  with_o_type(p.o_dtype, MergeRow<D, ACC>{p, m.dst, m.parts, tc.bh, row, c, lanes});
}

}  // namespace sdpa
