// tma_attention.cuh: the body of stage 6: a TMA producer warpgroup feeds two consumer warpgroups (setmaxnreg), no block barrier in the loop.
#pragma once
#include "tma_ring.cuh"
#include "warp_roles.cuh"
#include "wgmma_softmax.cuh"

namespace sdpa {

// Q's mbarriers, one pair a Q buffer: full[b] completes as the producer's Q load lands; empty[b] when every
// consumer warp has read the buffer for the last time (stage 7's persistent loop refills it for a later unit).
// unit[b]: which work unit the buffer's Q is of (persistent blocks, which learn their units as they go), or a
// number >= Params::work for "no more"; k0[b], kt[b], dst[b]: a split tail's part of the unit (stage 7, the host's
// SplitPlan): its key tiles k0 .. k0 + kt − 1 and the virtual unit its O and LSE go to (kt, dst < 0: the whole unit,
// to its own rows). Written by the producer before it arrives on full[b], read by consumers after their wait on it
// (the arrive releases, the wait acquires).
template <int QBUFS>
struct QBarriers {
  unsigned long long full[QBUFS];
  unsigned long long empty[QBUFS];
  int unit[QBUFS];
  int k0[QBUFS];
  int kt[QBUFS];
  int dst[QBUFS];
  // Each consumer warpgroup's current unit's dst, kept here across the unit's loop: held in a register there, it
  // moved ptxas's schedule of the loop (its fingerprint; docs/decisions.md, "Split tail").
  int dest[2];
};

// Where a key tile's rows come from: `row0` on, consecutive (the dense and packed layouts). Loads tile t's rows of
// K/V head kv (batch bat) into `dst` (PANELS panels of BC rows × PANEL bytes, one box each) on `bar`.
struct KeyRows {
  int row0;
  // Key tile t's rows: consecutive, nothing to look up.
  template <int BC>
  __device__ __forceinline__ KeyRows at(int) const {
    return *this;
  }
  template <int BC, int PANEL, int PANELS>
  __device__ __forceinline__ void load(const tma::Map* m, unsigned long long* bar, unsigned char* dst, int t, int kv,
                                       int bat) const {
#pragma unroll
    for (int c = 0; c < PANELS; ++c) tma::load_4d(m, bar, dst + c * BC * PANEL, c * PANEL, t * BC + row0, kv, bat);
  }
};

// The shared memory and barriers both TMA stages use: QBUFS Q buffers (128 rows each), then STAGES K tiles and
// STAGES Vᵀ tiles of BC keys, 1024-aligned in the dynamic segment; the ring and Q's barriers (released by the 4
// warps of each of `consumers` warpgroups, 1 or 2) initialised by thread 0 before a block barrier, the last one
// the block meets. A Vᵀ tile is D rows of BC keys in panels of the widest swizzle that divides BC: 128 bytes (BC
// = 128), 64 (192) or 32 (224: seven panels) — wgmma::k_major's K panels, one TMA box each. Ring slots and Q
// buffers are counted across a block's work units: unit n's Q is in buffer n % QBUFS, its key tiles are ring
// tiles r0, r0 + 1, … (r0 the tiles of the units before).
// SPLIT: K's and Vᵀ's halves of a stage have barriers of their own (tma::SplitBarriers: `bars` then the set after
// it), so that consumers give K(t)'s slot back once Q·Kᵀ(t) retired and Vᵀ(t)'s once P·V(t) did: with two stages the
// next tile's K then loads under a whole turn instead of behind the release that frees its slot.
template <int D, int STAGES, int BC, int QBUFS = 1, bool SPLIT = false>
struct TmaBlock {
  static constexpr unsigned kTile = BC * D;  // bytes of a K tile, and of a Vᵀ tile
  static constexpr unsigned kQ = 128 * D;    // bytes of a Q buffer
  static constexpr int kStages = STAGES;
  static constexpr int kQBufs = QBUFS;
  static constexpr wgmma::Swizzle kSwVt =
      BC % 128 == 0 ? wgmma::Swizzle::B128 : BC % 64 == 0 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B32;
  static constexpr int kVtPanel = int(wgmma::row_bytes(kSwVt));
  // Vᵀ in 32-byte panels (BC = 224: stage 7 at D = 128) comes as one bulk copy a tile of its shared-memory image
  // (Params::vt_tiles), not as BC / 32 tensor-map boxes of 32-byte rows: loading one panel of the seven instead of
  // all of them made stage 7 4–6% faster (docs/decisions.md, "Vᵀ as tile images").
  static constexpr bool kVtImage = kSwVt == wgmma::Swizzle::B32;
  static_assert(BC % kVtPanel == 0 && BC <= 256, "a key tile is whole Vᵀ panels and one wgmma N");
  // Q and K rows are D bytes, and a TMA box under the 128-byte swizzle is at most 128 bytes wide: at D = 256 a Q or K
  // tile is two K panels of 128 bytes, rows × 128 bytes apart (wgmma::k_major's panels), one box each; one below.
  static constexpr int kQkPanel = D < 128 ? D : 128;
  static constexpr int kQkPanels = D / kQkPanel;
  static constexpr int kD = D, kBc = BC;
  static constexpr bool kSplit = SPLIT;
  // K's swizzle (rows of D bytes), which V's tiles have too where V comes as the caller has it (stage 8).
  static constexpr wgmma::Swizzle kSwK = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;
  unsigned char* sq;
  unsigned char* sk;
  unsigned char* svt;
  tma::Ring<STAGES> ring;
  tma::Ring<STAGES> vring;  // SPLIT: Vᵀ's barriers (the set after `ring`'s); else `ring` itself
  QBarriers<QBUFS>* qb;
  int consumers;
  // `producers`: arrivals that fill a ring stage (1: the thread that loads it; more where warps write Vᵀ into it).
  __device__ TmaBlock(unsigned char* raw, tma::Barriers<STAGES>* bars, QBarriers<QBUFS>* qb_, int consumers_ = 2,
                      int producers = 1)
      : sq(raw + ((1024 - (wgmma::smem_addr(raw) & 1023)) & 1023)),
        sk(sq + QBUFS * kQ),
        svt(sk + STAGES * kTile),
        ring{bars},
        vring{SPLIT ? bars + 1 : bars},
        qb(qb_),
        consumers(consumers_) {
    if (threadIdx.x == 0) {
      ring.init(4 * consumers, producers);
      if (SPLIT) vring.init(4 * consumers, 1);
      for (int b = 0; b < QBUFS; ++b) {
        tma::mbar_init(&qb->full[b], 1);
        if (QBUFS > 1) tma::mbar_init(&qb->empty[b], 4 * consumers);
      }
      tma::fence_barrier_init();
    }
    __syncthreads();
  }
  __device__ const unsigned char* k_tile(int t) const { return sk + ring.stage(t) * kTile; }
  // K and Vᵀ in ring stage s (a tma::Cursor's stage()).
  __device__ const unsigned char* k_stage(int s) const { return sk + s * kTile; }
  __device__ const unsigned char* vt_stage(int s) const { return svt + s * kTile; }
  __device__ const unsigned char* vt_tile(int t) const { return svt + ring.stage(t) * kTile; }
  // Consumer warpgroup wg's 64 rows of unit n's Q; waiting for them; done with them (once a warp, after its
  // last Q·Kᵀ of the unit retired).
  __device__ const unsigned char* q_tile(int n, int wg) const { return sq + (n % QBUFS) * kQ + wg * 64 * D; }
  __device__ void wait_q(int n) const { tma::wait(&qb->full[n % QBUFS], unsigned(n / QBUFS) & 1u); }
  // The block's n-th unit, once its Q has landed (or the producer said there is none).
  __device__ int unit(int n) const {
    wait_q(n);
    return qb->unit[n % QBUFS];
  }
  // Its part of the unit (key tiles, destination; QBarriers), read after unit(n).
  __device__ int k0(int n) const { return qb->k0[n % QBUFS]; }
  __device__ int kt(int n) const { return qb->kt[n % QBUFS]; }
  __device__ int dst(int n) const { return qb->dst[n % QBUFS]; }
  __device__ void release_q(int n) const { tma::arrive(&qb->empty[n % QBUFS]); }
  __device__ static void prefetch(const tma::Map* mq, const tma::Map* mk, const tma::Map* mvt) {
    tma::prefetch(mq);
    tma::prefetch(mk);
    tma::prefetch(mvt);
  }
  // The producer's one thread. Unit n's Q of head bh (each consumer's 64 rows as its own canonical tile; rows
  // past Sq are the map's zero fill), once every consumer warp released the buffer's previous unit (a fresh
  // barrier counts its phase "−1" as complete, as the ring's do). One buffer means one unit a block (stage 6):
  // the empty barriers are then neither made nor waited on, which keeps its code as it was before Q had two
  // buffers (a wait that always passes still moved ptxas's schedule of stage 6).
  // Persistent blocks (QBUFS > 1) also name the unit, w, in the buffer's slot, from their second unit on (the
  // first is blockIdx.x: a slot written before Q's arrival and read after its wait cost ~0.2 µs of a one-unit
  // block's ~8.5 at the mission shape).
  // `bh` and `bat`: the map's head and batch coordinates (stage 8's maps are (D, S, H, B): head h of batch b; the
  // other stages' are (D, S, B·H, 1): bh = b·H + h, bat = 0).
  __device__ void produce_q(const tma::Map* mq, int n, int bh, int q0, int w = 0, int k0 = 0, int kt = -1,
                            int dst = -1, int bat = 0) const {
    load_q(mq, arm_q(n, w, k0, kt, dst), bh, q0, 64, bat);
  }
  // As produce_q, the same 64 rows from row0 into every consumer's half of the buffer (a halved unit's block: both
  // consumers on the same rows, each over its half of the keys).
  __device__ void produce_q_same(const tma::Map* mq, int n, int bh, int row0, int bat = 0) const {
    load_q(mq, arm_q(n, 0, 0, -1, -1), bh, row0, 0, bat);
  }
  // Q's boxes into buffer b: consumer w's 64 rows from row0 + step · w.
  __device__ __forceinline__ void load_q(const tma::Map* mq, int b, int bh, int row0, int step, int bat) const {
    for (int w = 0; w < consumers; ++w)
#pragma unroll
      for (int c = 0; c < kQkPanels; ++c)
        tma::load_4d(mq, &qb->full[b], sq + b * kQ + w * 64 * D + c * 64 * kQkPanel, c * kQkPanel, row0 + step * w, bh,
                     bat);
  }
  // As produce_q for a unit of packed heads (pack-gqa) of K/V head `kv` from token `token0`, through a map of Q as
  // (D, group, tokens, K/V heads) in boxes of one panel × group heads × 64 / group tokens: consumer c's 64 rows are
  // tokens token0 + c · 64 / group …, each token's group heads in order (row r: head r % group of token r / group).
  __device__ void produce_q_grouped(const tma::Map* mq, int n, int kv, int token0, int group, int w) const {
    const int b = arm_q(n, w, 0, -1, -1);
    for (int c = 0; c < consumers; ++c)
#pragma unroll
      for (int p = 0; p < kQkPanels; ++p)
        tma::load_4d(mq, &qb->full[b], sq + b * kQ + c * 64 * D + p * 64 * kQkPanel, p * kQkPanel, 0,
                     token0 + c * (64 / group), kv);
  }
  // The n-th unit's Q buffer (returned): its empty barrier waited for, its slot written (unit w, key tiles k0, kt,
  // destination dst; from the second unit on), its full barrier armed for consumers · 64 rows of D bytes.
  __device__ int arm_q(int n, int w, int k0, int kt, int dst) const {
    const int b = n % QBUFS;
    if (QBUFS > 1) {
      tma::wait(&qb->empty[b], (unsigned(n / QBUFS) & 1u) ^ 1u);
      if (n > 0) {
        qb->unit[b] = w;
        qb->k0[b] = k0;
        qb->kt[b] = kt;
        qb->dst[b] = dst;
      }
    }
    tma::arrive_expect_tx(&qb->full[b], consumers * 64 * D);
    return b;
  }
  // A persistent block's n-th unit is none (w >= Params::work): its slot says so, its full barrier completes on the
  // arrival alone, and the consumers' loop ends when they read it.
  __device__ void end_units(int n, int w) const {
    const int b = n % QBUFS;
    tma::wait(&qb->empty[b], (unsigned(n / QBUFS) & 1u) ^ 1u);
    qb->unit[b] = w;
    tma::arrive(&qb->full[b]);
  }
  // K of key/value head kv, key tiles k0 .. k0 + tiles − 1, as ring tiles r0 ..., each stage armed for `bytes` (K's, and
  // V's where it comes by TMA into the stage too), and v(r, t): ring tile r's V, of key tile t. V_AHEAD: v(r, t) is
  // issued before the wait for ring stage r (V goes elsewhere, into staging slots that free up before the stage does),
  // so that V has landed when the consumers release the stage; else after K, into the acquired stage.
  // `kv` and `bat`: the map's head and batch coordinates, as produce_q's.
  // `rows`: where the tiles' key rows are (KeyRows: consecutive from a first row; a paged cache's through its block
  // table). `rows.at<BC>(t)`, tile t's rows, is taken before the tile's first wait, so that a paged tile's table
  // lookups are in flight while the producer waits, and K's loads and V's (v(r, t, tile rows)) share them.
  template <bool V_AHEAD = false, class V, class Rows = KeyRows>
  __device__ void produce_k(const tma::Map* mk, const V& v, unsigned bytes, int kv, int r0, int tiles, int k0,
                            int bat = 0, Rows rows = Rows{0}) const {
    for (int t = k0; t < k0 + tiles; ++t) {
      const int r = r0 + t - k0;
      const auto at = rows.template at<BC>(t);
      if constexpr (V_AHEAD) v(r, t, at);
      ring.acquire(r, bytes);
      at.template load<BC, kQkPanel, kQkPanels>(mk, ring.full(r), sk + ring.stage(r) * kTile, t, kv, bat);
      if constexpr (!V_AHEAD) v(r, t, at);
    }
  }
  // K and Vᵀ of key/value head kv, key tiles k0 .. k0 + tiles − 1, as ring tiles r0 ... (kVtImage: Vᵀ's tile t is
  // the kTile bytes at vt_head + t · kTile, and mvt is not read).
  __device__ void produce_kv(const tma::Map* mk, const tma::Map* mvt, const unsigned char* vt_head, int kv, int r0,
                             int tiles, int k0 = 0) const {
    produce_k(
        mk,
        [&](int r, int t, const KeyRows&) {
          if constexpr (SPLIT) vring.acquire(r, kTile);
          if constexpr (kVtImage) {
            tma::bulk_load(svt + ring.stage(r) * kTile, vt_head + (long long)t * kTile, kTile, vring.full(r));
          } else {
#pragma unroll
            for (int p = 0; p < BC / kVtPanel; ++p)
              tma::load_4d(mvt, vring.full(r), svt + ring.stage(r) * kTile + p * D * kVtPanel, t * BC + p * kVtPanel,
                           0, kv, 0);
          }
        },
        SPLIT ? kTile : 2 * kTile, kv, r0, tiles, k0);
  }
};

// Three warpgroups. Warpgroup 0, the producer, gives its registers back and one thread issues every load: Q once
// (its own mbarrier), then per key tile K (BC keys x D) and Vᵀ (D x BC keys, transposed in global memory beforehand,
// keys in p_key order: prep.cu's prep_vt) into a STAGES-deep tma::Ring. Warpgroups 1 and 2 each own 64 query rows,
// claim registers, and run stage 5's tile step with P·V issued a K-step at a time inside the exponentials
// (softmax_pv_steps) and no block barrier: they wait on the tile's full barrier, and release it (one arrival a warp)
// once P·V of that tile has retired, which is after the Q·Kᵀ wait of the next tile. Nothing keeps the two consumers
// in step, so one's softmax can run under the other's GEMMs. A block owns p.q_rows query rows, 128 or 64: the host
// picks 64 when blocks of 128 would leave half the SMs idle (the mission shape: 8 heads × 512 rows), and consumer 2
// then leaves at once.
template <int D, int STAGES, int BC>
__device__ void tma_attention(const Params& p, const tma::Map* mq, const tma::Map* mk, const tma::Map* mvt) {
  using Block = TmaBlock<D, STAGES, BC>;
  constexpr wgmma::Swizzle SW = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;  // rows of D bytes
  using SL = frag::WgmmaD<BC>;
  using OL = frag::WgmmaD<D>;
  __shared__ tma::Barriers<STAGES> bars;
  __shared__ QBarriers<1> qbars;
  extern __shared__ unsigned char smem_raw[];
  const int consumers = p.q_rows / 64;
  const Block blk(smem_raw, &bars, &qbars, consumers);
  const TileCoord tc = tile_coord();
  const int bh = tc.bh, q0 = tc.qt * p.q_rows, tiles = (p.sk + BC - 1) / BC;
  if (roles::warpgroup() == 0) {
    roles::release_registers<40>();
    if (threadIdx.x == 0) {
      Block::prefetch(mq, mk, mvt);
      blk.produce_q(mq, 0, bh, q0);
      blk.produce_kv(mk, mvt, nullptr, bh, 0, tiles);
    }
  } else {
    roles::claim_registers<232>();
    const int wg = roles::warpgroup() - 1;
    if (wg >= consumers) return;
    const float scale = p.softmax_scale * p.q_scale[bh] * p.k_scale[bh], c = scale * kLog2e;
    osm::RowState st;
    osm::init(st);
    frag::Regs<OL> o[1];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
    unsigned a[BC / 32][4];  // P's A registers: read by P·V of tile t until the wait in tile t + 1
    blk.wait_q(0);
    const unsigned char* q_tile = blk.q_tile(0, wg);
    // The tile before's row sums and α: its l update runs under this tile's Q·Kᵀ (a zero sum and α = 1 before
    // the first tile leave l = 0 exactly).
    osm::RowSum sum;
    osm::init(sum);
    float alpha[2] = {1.0f, 1.0f};
    // Q's descriptor and stage 0's K descriptor, built once; stage k's is k·kTile bytes on (a multiple of 1024).
    const unsigned long long qd = wgmma::desc(SW, 64, 0, q_tile), kd = wgmma::desc(SW, BC, 0, blk.sk);
    bool landed = false;  // tile tt had landed when looked at during the tile before
    for (int tt = 0; tt < tiles; ++tt) {
      if (!landed) blk.ring.wait_full(tt);
      frag::Regs<SL> s[1];
      wgmma::fence_operand(s[0].x);
      wgmma::fence();
      wgmma::mma_ss_desc<BC, wg::e4m3, wg::e4m3, D / 32>(
          s[0].x, SW, qd, SW, kd + (unsigned long long)(tma::Ring<STAGES>::stage(tt) * (Block::kTile >> 4)), false);
      wgmma::commit();
      osm::step_end(sum, alpha, st);
      landed = tt + 1 < tiles && blk.ring.test_full(tt + 1);  // looked at under this Q·Kᵀ, not at the loop top
      wgmma::wait<0>();  // Q·Kᵀ of this tile, and (groups retire in order) P·V of the one before
      wgmma::fence_operand(s[0].x);
      wgmma::fence_operand(o[0].x);
      if (tt > 0) {
        __syncwarp();
        if (roles::lane() == 0) blk.ring.release(tt - 1);  // K and Vᵀ of the tile before: every read retired
      }
      softmax_pv_steps<D, BC>(s, tt, p.sk, c, st, o, a, Block::kSwVt, blk.vt_tile(tt), sum, alpha);
    }
    osm::step_end(sum, alpha, st);
    wgmma::wait<0>();
    wgmma::fence_operand(o[0].x);
    epilogue<D>(p, o, st, scale, bh, q0 + 64 * wg);
  }
}

}  // namespace sdpa
