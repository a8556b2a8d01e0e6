// cp_async_ring.cuh: an N-stage shared-memory ring of K/V tiles, filled with 16-byte cp.async (sm_80+).
//
// The pipeline every user runs (all threads of the block, in lock step):
//   for (t = 0; t < STAGES - 1; ++t) ring.issue(t);          // prologue: STAGES-1 tiles in flight
//   for (t = 0; t < ring.tiles(); ++t) {
//     ring.issue(t + STAGES - 1);                            // refills the stage released at t-1
//     const unsigned char* tile = ring.wait(t);              // tile t has landed, for every thread
//     ... read tile (ring.valid_rows(t) real rows, the rest zero) ...
//     ring.release(t);                                       // nobody reads stage(t) any more
//   }
// issue() commits exactly one group per call, empty past the last tile, so that wait_group<STAGES-1> after
// issuing tile t+STAGES-1 always means "tile t is complete".
#pragma once

namespace ring {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // src_bytes < 16 zero-fills the rest of the 16 bytes: how tail rows become zeros.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Where byte b (a multiple of 16) of row r of a tile goes in its stage: row after row, by default.
template <int ROW_BYTES>
struct RowMajor {
  __device__ static int offset(int r, int b) { return r * ROW_BYTES + b; }
};

// STAGES tiles of ROWS rows of COLS elements of ELEM bytes, copied by THREADS threads. PLACE::offset(r, b) puts
// each 16-byte chunk of a tile: row-major by default; a swizzled tile (a wgmma operand) is any permutation of
// 16-byte chunks within the tile's kRowBytes * ROWS bytes.
template <int STAGES, int ROWS, int COLS, int ELEM, int THREADS, class PLACE = RowMajor<COLS * ELEM>>
struct Ring {
  static constexpr int kRowBytes = COLS * ELEM;
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte copies per row
  static constexpr int kTileBytes = ROWS * kRowBytes;
  static constexpr int kBytes = STAGES * kTileBytes;
  static_assert(kRowBytes % 16 == 0, "a row must be whole 16-byte chunks");
  static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 stages");

  unsigned char* smem;       // kBytes of shared memory, 16-byte aligned
  const unsigned char* src;  // row 0 of the sequence, in global memory
  long long stride;          // bytes from one row to the next: [B, H, S, D] is read in place
  int rows;                  // rows in the sequence (S)

  __device__ int tiles() const { return (rows + ROWS - 1) / ROWS; }
  __device__ static int stage(int t) { return t % STAGES; }
  __device__ int valid_rows(int t) const { return max(0, min(ROWS, rows - t * ROWS)); }
  __device__ unsigned char* tile_ptr(int t) const { return smem + stage(t) * kTileBytes; }

  // Copies tile t into its stage and commits one group (an empty one when t >= tiles()).
  __device__ void issue(int t) const {
    copy(t);
    commit();
  }

  // The copies of issue() without the commit: rings that fill together (K and V of one tile) each copy(t),
  // then one ring::commit() makes them a single group, so wait(t) still means "tile t has landed".
  __device__ void copy(int t) const {
    if (t >= tiles()) return;
    unsigned char* dst = tile_ptr(t);
    const unsigned char* tile = src + (long long)t * ROWS * stride;
    const int left = rows - t * ROWS;  // rows of this tile that exist (may exceed ROWS)
    // A fixed trip count unrolls: each thread's chunk column and swizzle phase stay put and only the row moves,
    // so the addresses fold to constants (stage 5: ~35 instructions a chunk became ~8). By 4, so that rings of 8+
    // chunks a thread do not hold 8 addresses live at once.
    constexpr int kPerThread = ROWS * kChunks % THREADS == 0 ? ROWS * kChunks / THREADS : 0;
    if constexpr (kPerThread > 0) {
#pragma unroll 4
      for (int j = 0; j < kPerThread; ++j) chunk(dst, tile, left, threadIdx.x + j * THREADS);
    } else {
      for (int c = threadIdx.x; c < ROWS * kChunks; c += THREADS) chunk(dst, tile, left, c);
    }
  }

  __device__ void chunk(unsigned char* dst, const unsigned char* tile, int left, int c) const {
    const int r = c / kChunks, k = c % kChunks;
    const bool real = r < left;
    // A row past the end reads nothing (src-size 0) from a valid address: the tile's row 0.
    cp_async_16(dst + PLACE::offset(r, k * 16), tile + (real ? r * stride : 0) + k * 16, real ? 16 : 0);
  }

  // Waits until tile t (and every earlier tile) has landed and is visible to the whole block.
  __device__ const unsigned char* wait(int t) const {
    wait_group<STAGES - 1>();
    __syncthreads();
    return tile_ptr(t);
  }

  // Every thread is done with tile t's stage: the next issue() may refill it.
  __device__ void release(int) const { __syncthreads(); }
};

}  // namespace ring
