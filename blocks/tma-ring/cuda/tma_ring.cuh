// tma_ring.cuh: an N-stage ring of TMA tile loads (cp.async.bulk.tensor) completing on mbarriers, producer to consumers (sm_90).
//
// Two mbarriers per stage. full[s]: the producer arms it with the tile's byte count (arrive.expect_tx) and
// the copy engine completes it as the bytes land. empty[s]: every consumer arrives once when it is done
// with the stage. Tile t lives in stage t % STAGES; its barriers are in phase (t / STAGES) & 1.
//   producer (one thread):  ring.acquire(t, bytes); tma::load_tile(...)         for t = 0, 1, ...
//   consumer:               ring.wait_full(t); read stage(t); ring.release(t)   (one release per consumer)
//   or, tile after tile:    Cursor cur(ring); cur.wait(); read cur.stage(); cur.release(); cur.advance()
// acquire(t) first waits for empty[stage(t)]'s previous phase: a fresh barrier counts its phase "-1" as
// complete, so the first STAGES tiles go out at once.
// The tile a load_tile() writes is the canonical K-major wgmma tile of wgmma.cuh (k_major): one TMA box per
// swizzle-width panel, so a TMA map and a wgmma descriptor are made from one wgmma::Swizzle.
// Stores go the other way (store_4d, a bulk-async group per thread: store_commit, store_wait_read, store_wait).
// In a cluster (sm_90a): load_4d_multicast / bulk_load_multicast land one load in several CTAs' shared memory,
// arrive_cluster_at releases a slot to another CTA's producer, cluster_sync orders barrier set-up and exit.
#pragma once
#include "wgmma.cuh"

namespace tma {

// CUtensorMap as the kernel sees it: passed by value as `const __grid_constant__ tma::Map`.
struct alignas(64) Map {
  unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// ---- mbarrier ----
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the other threads and to the copy engine; a barrier follows.
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem(bar)), "r"(bytes) : "memory");
}
// The barrier at shared address `bar` (tma::smem of it): for a caller that keeps the addresses in registers
// across a loop instead of converting a pointer each time.
__device__ __forceinline__ void arrive_at(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void arrive(unsigned long long* bar) { arrive_at(smem(bar)); }
// Whether the phase of parity `parity` has completed, as a bool: try_wait may suspend the thread a while first
// (a wait loop's body); test_wait answers at once, so a consumer can look ahead at a stage and skip the wait
// when the answer was yes. Both have acquire semantics when they say yes.
#define LAB_MBAR_PHASE_DONE(OP)                                                                        \
  unsigned done;                                                                                       \
  asm volatile("{\n.reg .pred p;\nmbarrier." OP ".parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n" \
               : "=r"(done)                                                                            \
               : "r"(bar), "r"(parity)                                                                 \
               : "memory");                                                                            \
  return done != 0
__device__ __forceinline__ bool try_wait_at(unsigned bar, unsigned parity) { LAB_MBAR_PHASE_DONE("try_wait"); }
__device__ __forceinline__ bool test_wait_at(unsigned bar, unsigned parity) { LAB_MBAR_PHASE_DONE("test_wait"); }
#undef LAB_MBAR_PHASE_DONE
__device__ __forceinline__ bool try_wait(unsigned long long* bar, unsigned parity) { return try_wait_at(smem(bar), parity); }
__device__ __forceinline__ bool test_wait(unsigned long long* bar, unsigned parity) { return test_wait_at(smem(bar), parity); }
// Waits until the phase of parity `parity` has completed. Tests bound the spin (LAB_TMA_SPIN_LIMIT), so
// that a broken mutant ends with wrong bytes instead of a hung device; a test whose mutants deadlock outright also
// sets LAB_TMA_SPIN_PROBE=test_wait_at, so that each bounded spin takes its iterations' time, not try_wait's
// suspensions'.
#ifndef LAB_TMA_SPIN_PROBE
#define LAB_TMA_SPIN_PROBE try_wait_at
#endif
__device__ __forceinline__ void wait_at(unsigned bar, unsigned parity) {
#ifdef LAB_TMA_SPIN_LIMIT
  for (long long i = 0; !LAB_TMA_SPIN_PROBE(bar, parity) && i < LAB_TMA_SPIN_LIMIT; ++i) {
  }
#else
  while (!try_wait_at(bar, parity)) {
  }
#endif
}
__device__ __forceinline__ void wait(unsigned long long* bar, unsigned parity) { wait_at(smem(bar), parity); }

// ---- the copy engine ----
__device__ __forceinline__ void prefetch(const Map* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// One box of a 4-D map (coordinates innermost first, in elements) into shared memory; completes on `bar`.
__device__ __forceinline__ void load_4d(const Map* map, unsigned long long* bar, void* dst, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::
          "r"(smem(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem(bar))
      : "memory");
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) as one bulk copy, not through a
// tensor map: for data laid out in global memory as it will sit in shared memory (swizzle included); completes on
// `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem(dst)),
               "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(smem(bar))
               : "memory");
}

// ---- stores: shared memory to global memory through a map ----
// One box of a 4-D map from shared memory `src` (the box's image, swizzle included; 128-byte aligned, 1024 with a
// 128-byte swizzle), into this thread's bulk-async group; elements past the tensor's extent are not written. The
// ordinary stores that wrote `src` must be fenced into the async proxy (wgmma::proxy_fence, by each writing
// thread) and ordered before this by a barrier.
__device__ __forceinline__ void store_4d(const Map* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(smem(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// Closes this thread's bulk-async group of stores.
__device__ __forceinline__ void store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most N of this thread's store groups still read their shared memory (which may then be written again).
template <int N>
__device__ __forceinline__ void store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until at most N of this thread's store groups are still in flight (their writes done): before the block exits.
template <int N>
__device__ __forceinline__ void store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- a cluster of CTAs: one load, several CTAs' shared memory ----
// This CTA's rank in its cluster (0 without one).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA in the cluster, in convergent code: after it, each CTA's barriers initialised before
// it (fence_barrier_init) may be used by the others; at the end of a kernel, no CTA exits while another can still
// write into its shared memory or arrive on its barriers.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// One arrival on the barrier at shared address `bar` (tma::smem of this CTA's own) in CTA `rank` of the cluster:
// the same offset there (mapa). Release at CTA scope, as CUTLASS's cluster barriers arrive: .release.cluster
// puts a MEMBAR before every arrival (12 of them in a stage 7 built on it, branch attempt/cluster-multicast).
__device__ __forceinline__ void arrive_cluster_at(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, "
      "[remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
// load_4d into the same shared offset of every CTA in `mask` (bit r: cluster rank r), each completing on the
// barrier at `bar`'s offset in its own CTA (sm_90a is the fast path: PTX ISA, multicast::cluster).
__device__ __forceinline__ void load_4d_multicast(const Map* map, unsigned long long* bar, void* dst, int c0, int c1,
                                                  int c2, int c3, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4, "
      "%5}], [%6], %7;\n" ::"r"(smem(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem(bar)), "h"(mask)
      : "memory");
}
// bulk_load into the same shared offset of every CTA in `mask`, as load_4d_multicast.
__device__ __forceinline__ void bulk_load_multicast(void* dst, const void* src, unsigned bytes, unsigned long long* bar,
                                                    unsigned short mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem(dst)),
      "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(smem(bar)), "h"(mask)
      : "memory");
}

// A [ROWS x D_BYTES] tile of rows row0.. of head (h, b), as wgmma::k_major lays it out: D_BYTES / panel boxes of
// [ROWS][panel] bytes, panel = wgmma::row_bytes(SW), one after the other. Rows past the tensor's end are zeros
// (the map's out-of-bounds fill); the barrier still counts every byte of every box.
template <int ROWS, int D_BYTES, wgmma::Swizzle SW, int ELEM>
struct Tile {
  static constexpr int kPanel = int(wgmma::row_bytes(SW));
  static constexpr int kPanels = D_BYTES / kPanel;
  static constexpr unsigned kBytes = unsigned(ROWS * D_BYTES);
  static_assert(D_BYTES % kPanel == 0, "a tile is whole panels");
  static_assert(ROWS <= 256, "a TMA box has at most 256 rows");
  __device__ static void load(const Map* map, unsigned long long* bar, unsigned char* dst, int row0, int h, int b) {
#pragma unroll
    for (int p = 0; p < kPanels; ++p) load_4d(map, bar, dst + p * ROWS * kPanel, p * kPanel / ELEM, row0, h, b);
  }
};

// ---- the ring ----
template <int STAGES>
struct Barriers {
  unsigned long long full[STAGES];
  unsigned long long empty[STAGES];
};

// A split ring: two barrier sets over the same stages (say K's and Vᵀ's of one tile), each filled and released on its
// own, so that a consumer that reads K(t) in one turn and Vᵀ(t) in the next gives K's slot back a turn sooner. The
// second set sits right after the first: a Cursor over the first reaches it (the *_second calls) from its addresses.
template <int STAGES>
struct SplitBarriers {
  Barriers<STAGES> first, second;
};

template <int STAGES>
struct Ring {
  static_assert(STAGES >= 2 && STAGES <= 8, "2 to 8 stages");
  Barriers<STAGES>* bars;

  __device__ static int stage(int t) { return t % STAGES; }
  __device__ static unsigned phase(int t) { return unsigned(t / STAGES) & 1u; }

  // One thread, before any other use; then a block-wide barrier. `consumers` arrivals release a stage; a stage is
  // full once its bytes landed and `producers` arrivals came (the acquiring thread's arrive_expect_tx, and one from
  // each warp that writes part of the stage with ordinary stores, after its proxy fence).
  __device__ void init(int consumers, int producers = 1) const {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&bars->full[s], unsigned(producers));
      mbar_init(&bars->empty[s], unsigned(consumers));
    }
    fence_barrier_init();
  }
  // Producer: waits until every consumer released tile t - STAGES, then arms full[stage(t)] for `bytes`.
  __device__ void acquire(int t, unsigned bytes) const {
    wait(&bars->empty[stage(t)], phase(t) ^ 1u);
    arrive_expect_tx(&bars->full[stage(t)], bytes);
  }
  __device__ unsigned long long* full(int t) const { return &bars->full[stage(t)]; }
  // Consumer: tile t has landed in stage(t).
  __device__ void wait_full(int t) const { wait(&bars->full[stage(t)], phase(t)); }
  // Consumer: whether tile t has landed, without waiting (true: read stage(t) as after wait_full(t)).
  __device__ bool test_full(int t) const { return test_wait(&bars->full[stage(t)], phase(t)); }
  // Consumer: done with tile t (once per consumer, after all its threads finished reading).
  __device__ void release(int t) const { arrive(&bars->empty[stage(t)]); }
  // A producer that writes part of tile t with ordinary stores: its stage is free (every consumer released tile
  // t - STAGES; the acquiring thread waits the same phase); then, after its proxy fence, its arrival on full.
  __device__ void wait_empty(int t) const { wait(&bars->empty[stage(t)], phase(t) ^ 1u); }
  __device__ void arrive_full(int t) const { arrive(&bars->full[stage(t)]); }
};

// One consumer's walk over a Ring, tile by tile: tile t (the current) and the two before it, as stages, with t's
// parity; the same barriers and rule as Ring's (stage(t) = t % STAGES, parity (t / STAGES) & 1), carried from tile
// to tile by advance() instead of divided out at each access, and the barriers' shared addresses held in registers.
// Tiles count from 0 at construction, across as many passes over the data (a persistent block's units) as the
// caller makes; a caller that holds tile t − 1 or t − 2 past the wait for t releases it with release_prev / _prev2.
//   consumer:  for t: if (t) cur.advance(); cur.wait(); read stage cur.stage() [, cur.stage_prev()]; release
template <int STAGES>
struct Cursor {
  // empty[0] sits right after full[STAGES − 1]: its address is full[0]'s plus 8·STAGES (no second conversion).
  static_assert(sizeof(Barriers<STAGES>::full) == 8 * STAGES && sizeof(Barriers<STAGES>) == 16 * STAGES,
                "Barriers: full[], then empty[], unpadded");
  unsigned full0, empty0;                        // shared addresses of full[0] and empty[0]
  int s0 = 0, s1 = STAGES - 1, s2 = STAGES - 2;  // the stages of tiles t, t − 1, t − 2
  unsigned par = 0;                              // tile t's parity
  __device__ explicit Cursor(const Ring<STAGES>& r) : full0(smem(r.full(0))) {
    asm volatile("" : "+r"(full0));  // opaque: kept in a register, not rebuilt from the CTA's shared window in a loop
    empty0 = full0 + 8 * STAGES;
  }
  // To tile t + 1.
  __device__ void advance() {
    s2 = s1;
    s1 = s0;
    if (++s0 == STAGES) {
      s0 = 0;
      par ^= 1u;
    }
  }
  __device__ int stage() const { return s0; }
  __device__ int stage_prev() const { return s1; }
  __device__ int stage_prev2() const { return s2; }
  __device__ unsigned parity() const { return par; }
  // Tile t has landed (acquire: its bytes may be read).
  __device__ void wait() const { wait_at(full0 + 8 * s0, par); }
  // Done with tile t, t − 1, t − 2 (once per consumer each, after all its threads finished reading it).
  __device__ void release() const { arrive_at(empty0 + 8 * s0); }
  __device__ void release_prev() const { arrive_at(empty0 + 8 * s1); }
  __device__ void release_prev2() const { arrive_at(empty0 + 8 * s2); }
  // Tile t − 1's parity: the round before where tile t opens a round.
  __device__ unsigned parity_prev() const { return s0 == 0 ? par ^ 1u : par; }
  // The second barrier set of a split ring (SplitBarriers, the cursor made over the first): tile t's or t − 1's
  // part there has landed; done with tile t's, t − 1's or t − 2's part there.
  __device__ void wait_second() const { wait_at(full0 + 16 * STAGES + 8 * s0, par); }
  __device__ void wait_second_prev() const { wait_at(full0 + 16 * STAGES + 8 * s1, parity_prev()); }
  __device__ void release_second() const { arrive_at(empty0 + 16 * STAGES + 8 * s0); }
  __device__ void release_second_prev() const { arrive_at(empty0 + 16 * STAGES + 8 * s1); }
  __device__ void release_second_prev2() const { arrive_at(empty0 + 16 * STAGES + 8 * s2); }
};

}  // namespace tma
