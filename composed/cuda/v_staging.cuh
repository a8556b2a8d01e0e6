// v_staging.cuh: V as the caller has it: TMA into staging slots, transposed into the ring's Vᵀ by the producer warpgroup (stage 8).
#pragma once
#include "fp8_relayout.cuh"
#include "tma_ring.cuh"
#include "warp_roles.cuh"

namespace sdpa {

// Warps of the producer warpgroup that transpose V: warps 1–3 (warp 0's first thread issues every load).
constexpr int kVWarps = 3;

// The staging's barriers: a slot's full (V's bytes landed, or end() said there are no more) and empty (every
// transposing warp has read the slot), and `done`, which completes once, when the block has no more tiles and every
// earlier one has been released. Only barrier state passes between the loading thread and the transposing warps: no
// word in shared memory is written by one and read by the other.
template <int VS>
struct VBarriers {
  unsigned long long full[VS];
  unsigned long long empty[VS];
  unsigned long long done;
};

// One block's VS staging slots of one V tile each (BC keys × D, laid out as K's tiles: the canonical K-major layout
// of K's swizzle, as V's map, K's boxes over V, lays them down). Tiles are counted across the block's units as the
// ring's are: ring tile r's V goes through slot r % VS.
template <class Block, int VS>
struct VStaging {
  static constexpr int kSlots = VS;
  unsigned char* sv;
  VBarriers<VS>* b;
  // Query heads a batch (H): stage 8's maps are (D, S, H, B) over the caller's strides, so a head's coordinates are
  // (h, b), not B·H flat.
  int heads;
  __device__ static int slot(int r) { return r % VS; }
  __device__ static unsigned phase(int r) { return unsigned(r / VS) & 1u; }
  __device__ unsigned char* tile(int r) const { return sv + slot(r) * Block::kTile; }
  // Thread 0, before any use; a block barrier follows.
  __device__ void init() const {
    for (int s = 0; s < VS; ++s) {
      tma::mbar_init(&b->full[s], 1);
      tma::mbar_init(&b->empty[s], kVWarps);
    }
    tma::mbar_init(&b->done, 1);
    tma::fence_barrier_init();
  }
  // The loading thread: ring tile r's V is key tile t of K/V head kv of batch bat, its rows where `rows` says (as K's),
  // through V's map (K's boxes), once every transposing warp is done with the slot's tile before (a fresh barrier's
  // phase "−1" counts as done).
  template <class Rows = KeyRows>
  __device__ void load(const tma::Map* mv, int r, int t, int kv, int bat, const Rows& rows = Rows{0}) const {
    const int s = slot(r);
    tma::wait(&b->empty[s], phase(r) ^ 1u);
    tma::arrive_expect_tx(&b->full[s], Block::kTile);
    rows.template load<Block::kBc, Block::kQkPanel, Block::kQkPanels>(mv, &b->full[s], tile(r), t, kv, bat);
  }
  // The loading thread: there is no ring tile r (the block's last tile was r − 1). `done` completes once every slot's
  // tile before r has been released; then slot(r)'s full barrier completes its phase without bytes, so that a warp
  // waiting there for tile r wakes at once (a try_wait on a phase that never completes sleeps until the hardware's
  // time limit) and, its wait having acquired what came before that arrival, sees `done`.
  __device__ void end(int r) const {
    for (int i = 0; i < VS; ++i) tma::wait(&b->empty[slot(r + i)], phase(r + i) ^ 1u);
    tma::arrive(&b->done);
    tma::arrive(&b->full[slot(r)]);
  }
  // A transposing warp: whether ring tile r comes (its V then sits in tile(r)), or the block's tiles are over.
  __device__ bool wait(int r) const {
    tma::wait(&b->full[slot(r)], phase(r));
    return !tma::test_wait(&b->done, 0u);
  }
  __device__ void release(int r) const { tma::arrive(&b->empty[slot(r)]); }
};

// The staging's barriers, in static shared memory of the kernel that instantiates it.
template <int VS>
__device__ VBarriers<VS>* v_barriers() {
  __shared__ VBarriers<VS> b;
  return &b;
}

// Transposing warp w (0 .. kVWarps − 1) of the producer warpgroup, ring tile after ring tile until the end: V from
// its slot into the ring stage's Vᵀ (relayout::TransposeLdsm, keys in p_key order as the consumers' P registers
// hold them), once the consumers have released the stage; then a proxy fence (wgmma reads Vᵀ through the async
// proxy, and TMA writes the slot next), and one arrival each on the stage's full barrier and the slot's empty one.
// `ring(i)`: the ring tile the i-th staged tile goes to (InOrder: tile i; HalfOrder: a halved block's).
struct InOrder {
  __device__ int operator()(int i) const { return i; }
};
// A halved block's order (the producer's produce_halved_unit): its 2 · half key tiles staged alternately from each
// consumer's half — key tiles 0, half, 1, half + 1, … — so that consumer 1's first tile is not behind consumer 0's.
struct HalfOrder {
  int half;
  __device__ int operator()(int i) const { return (i & 1) * half + (i >> 1); }
};
template <class Block, class Staging, class Order = InOrder>
__device__ void transpose_v_tiles(const Block& blk, const Staging& st, int w, Order ring = Order()) {
  using T = relayout::TransposeLdsm<Block::kBc, Block::kD, Block::kSwK, Block::kSwVt>;
  const int lane = roles::lane();
  for (int i = 0; st.wait(i); ++i) {
    const int r = ring(i);
    blk.ring.wait_empty(r);
    T::template run<kVWarps>(st.tile(i), blk.svt + blk.ring.stage(r) * Block::kTile, w, lane);
    wgmma::proxy_fence();
    __syncwarp();
    if (lane == 0) {
      blk.ring.arrive_full(r);
      st.release(i);
    }
  }
}

// Stage 7's producer has no staging: Vᵀ comes by TMA (its map, or tile images) straight into the ring.
struct NoStaging {
  static constexpr int kSlots = 0;
};

// The staging a producer has: none with VS = 0 (stage 7), else VS slots after O's staging panels (two consumers'
// 64 rows × 128 bytes past the ring), initialised here (thread 0, then a block barrier); `heads`: H.
template <class Block, int VS>
struct StagingOf {
  using type = VStaging<Block, VS>;
  __device__ static type make(const Block& blk, int heads) {
    const type st{blk.svt + Block::kStages * Block::kTile + 2 * 64 * 128, v_barriers<VS>(), heads};
    if (threadIdx.x == 0) st.init();
    __syncthreads();
    return st;
  }
};
template <class Block>
struct StagingOf<Block, 0> {
  using type = NoStaging;
  __device__ static type make(const Block&, int) { return NoStaging(); }
};

}  // namespace sdpa
