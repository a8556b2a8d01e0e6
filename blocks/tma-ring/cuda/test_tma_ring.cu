// test_tma_ring.cu: each head's [S, D] rows through the TMA ring, every stage written out by every consumer warpgroup.
#include "tma_ring.cuh"
#include "warp_roles.cuh"

// Block (b, h) = blockIdx.x = b * heads + h. Warpgroup 0 is the producer (one thread issues), warpgroups
// 1..CONSUMERS each copy every tile's whole stage to out[c][bh][t] and release it once, after a named barrier
// among their own 128 threads.
template <int STAGES, int ROWS, int D_BYTES, wgmma::Swizzle SW, int ELEM, int CONSUMERS, bool SETMAXNREG>
__device__ void ring_copy(const tma::Map* map, int seq, int heads, unsigned char* out, int max_tiles) {
  using T = tma::Tile<ROWS, D_BYTES, SW, ELEM>;
  __shared__ tma::Barriers<STAGES> bars;
  extern __shared__ unsigned char raw[];
  unsigned char* tiles = raw + ((1024 - (tma::smem(raw) & 1023)) & 1023);  // swizzled tiles start 1024-aligned
  const tma::Ring<STAGES> ring{&bars};
  if (threadIdx.x == 0) ring.init(CONSUMERS);
  __syncthreads();
  const int bh = blockIdx.x, b = bh / heads, h = bh % heads;
  const int n_tiles = (seq + ROWS - 1) / ROWS;
  const int wg = roles::warpgroup();
  if (wg == 0) {
    if constexpr (SETMAXNREG) roles::release_registers<40>();
    if (threadIdx.x == 0) {
      tma::prefetch(map);
      for (int t = 0; t < n_tiles; ++t) {
        ring.acquire(t, T::kBytes);
        T::load(map, ring.full(t), tiles + ring.stage(t) * T::kBytes, t * ROWS, h, b);
      }
    }
  } else {
    if constexpr (SETMAXNREG) roles::claim_registers<232>();
    const int c = wg - 1, ct = roles::thread_in_group();
    const long long heads_all = (long long)gridDim.x;
    // Consumer 2 looks ahead: it tests the next tile's barrier (test_full) after copying this one, and waits
    // at the top only when that tile had not landed (stage 6's pattern); consumer 1 always waits.
    const bool look_ahead = c == 1;
    bool landed = false;
    for (int t = 0; t < n_tiles; ++t) {
      if (!(look_ahead && landed)) ring.wait_full(t);
      const uint4* src = reinterpret_cast<const uint4*>(tiles + ring.stage(t) * T::kBytes);
      uint4* dst = reinterpret_cast<uint4*>(out + ((c * heads_all + bh) * max_tiles + t) * T::kBytes);
      for (int i = ct; i < int(T::kBytes / 16); i += 128) dst[i] = src[i];
      if (look_ahead) landed = t + 1 < n_tiles && ring.test_full(t + 1);
      roles::sync(1 + c, 128);  // all 128 threads of this consumer have read the stage
      if (ct == 0) ring.release(t);
    }
  }
}

#define LAB_TMA_RING(N, ROWS, DB, SW, ELEM, C, NAME, REGS, THREADS)                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                \
      NAME(const __grid_constant__ tma::Map map, int seq, int heads, unsigned char* out, int max_tiles) { \
    ring_copy<N, ROWS, DB, wgmma::Swizzle::SW, ELEM, C, REGS>(&map, seq, heads, out, max_tiles);           \
  }

// setmaxnreg exists on sm_90a alone: these are compiled there only.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Registers per role: 384 threads cap every thread at 168 registers on entry. The producer warpgroup gives
// registers back (40) and fills x[] in shared memory; after a named barrier with the consumers (all 384
// threads), each consumer thread claims 232 and keeps kLive values live at once, more than 168 can hold, so
// without the claim ptxas spills. out[t'] for consumer thread t' = sum_i (i + 1) * x[(t' + i) % kLive] * 2^r.
constexpr int kLive = 176;
extern "C" __global__ void __launch_bounds__(384, 1) roles_claim(const float* in, float* out, int rounds) {
  __shared__ float x[kLive];
  const int wg = roles::warpgroup();
  if (wg == 0) {
    roles::release_registers<40>();
    for (int i = roles::thread_in_group(); i < kLive; i += 128) x[i] = in[i];
    roles::arrive(1, 384);  // x is written: the consumers may go
  } else {
    roles::claim_registers<232>();
    roles::sync(1, 384);
    const int t = threadIdx.x - 128;
    float v[kLive];
#pragma unroll
    for (int i = 0; i < kLive; ++i) v[i] = x[(t + i) % kLive];
    for (int r = 0; r < rounds; ++r) {
#pragma unroll
      for (int i = 0; i < kLive; ++i) v[i] = v[i] * 2.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kLive; ++i) s += float(i + 1) * v[i];
    out[t] = s;
  }
}

LAB_TMA_RING(2, 64, 128, B128, 1, 2, tma_n2_r64_d128_sw128_e1_c2, true, 384)
LAB_TMA_RING(3, 64, 64, B64, 1, 1, tma_n3_r64_d64_sw64_e1_c1, true, 256)
LAB_TMA_RING(4, 64, 128, B32, 1, 2, tma_n4_r64_d128_sw32_e1_c2, true, 384)
LAB_TMA_RING(2, 128, 128, B128, 2, 2, tma_n2_r128_d128_sw128_e2_c2, true, 384)
LAB_TMA_RING(3, 64, 128, None, 1, 1, tma_n3_r64_d128_none_e1_c1, true, 256)
LAB_TMA_RING(4, 32, 256, B128, 2, 2, tma_n4_r32_d256_sw128_e2_c2, true, 384)
#endif
// The ring alone needs only sm_90: the same copy without setmaxnreg.
LAB_TMA_RING(2, 64, 128, B128, 1, 1, tma_plain_n2_r64_d128_sw128_e1_c1, false, 256)

// tma::bulk_load: `tiles` tiles of `bytes` each from `in` (one after the other) through a 2-stage ring of one bulk
// copy a tile, each landed tile copied out by the block's 128 threads and released (sm_90: no tensor map).
extern "C" __global__ void __launch_bounds__(128, 1) bulk_ring(const unsigned char* in, int bytes, int tiles,
                                                                unsigned char* out) {
  __shared__ tma::Barriers<2> bars;
  extern __shared__ __align__(16) unsigned char bulk_raw[];
  unsigned char* buf = bulk_raw + ((1024 - (tma::smem(bulk_raw) & 1023)) & 1023);
  const tma::Ring<2> ring{&bars};
  if (threadIdx.x == 0) ring.init(1);
  __syncthreads();
  for (int t = 0; t < tiles; ++t) {
    if (threadIdx.x == 0) {
      ring.acquire(t, unsigned(bytes));
      tma::bulk_load(buf + ring.stage(t) * bytes, in + (long long)t * bytes, unsigned(bytes), ring.full(t));
    }
    ring.wait_full(t);
    const uint4* src = reinterpret_cast<const uint4*>(buf + ring.stage(t) * bytes);
    uint4* dst = reinterpret_cast<uint4*>(out + (long long)t * bytes);
    for (int i = threadIdx.x; i < bytes / 16; i += 128) dst[i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) ring.release(t);
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // multicast is sm_90a's (ptxas advises against it on sm_90: a budget failure)
// A cluster of two CTAs sharing a 2-stage ring: each CTA's thread 0 loads half of every tile
// (tma::bulk_load_multicast into both CTAs) and arms its own full barrier for the whole tile; each CTA copies every
// landed tile to out[rank][t] and releases it to both producers (tma::arrive_cluster_at), whose empty barriers
// count both CTAs. One load a half tile, two copies: what stage 7's cluster kernel does with K and Vᵀ.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128, 1)
    cluster_ring(const unsigned char* in, int bytes, int tiles, unsigned char* out) {
  __shared__ tma::Barriers<2> bars;
  extern __shared__ __align__(16) unsigned char cluster_raw[];
  unsigned char* buf = cluster_raw + ((1024 - (tma::smem(cluster_raw) & 1023)) & 1023);
  const tma::Ring<2> ring{&bars};
  const unsigned rank = tma::cluster_rank();
  const int half = bytes / 2;
  if (threadIdx.x == 0) ring.init(2);
  tma::cluster_sync();
  for (int t = 0; t < tiles; ++t) {
    if (threadIdx.x == 0) {
      ring.acquire(t, unsigned(bytes));
      tma::bulk_load_multicast(buf + ring.stage(t) * bytes + rank * half, in + (long long)t * bytes + rank * half,
                               unsigned(half), ring.full(t), 0x3);
    }
    ring.wait_full(t);
    const uint4* src = reinterpret_cast<const uint4*>(buf + ring.stage(t) * bytes);
    uint4* dst = reinterpret_cast<uint4*>(out + ((long long)rank * tiles + t) * bytes);
    for (int i = threadIdx.x; i < bytes / 16; i += 128) dst[i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned empty = tma::smem(&bars.empty[ring.stage(t)]);
      tma::arrive_cluster_at(empty, 0);
      tma::arrive_cluster_at(empty, 1);
    }
  }
  tma::cluster_sync();
}
#endif

// tma::store_4d of one box the other way: 128 threads write `img` (the box as it sits in shared memory, swizzle
// included) into shared memory with ordinary stores, fence it into the async proxy, and thread 0 stores it at
// (c0, c1, c2, 0) of `map`'s tensor and waits for the writes. What stage 7's epilogue does with a panel of O.
extern "C" __global__ void __launch_bounds__(128) store_box(const __grid_constant__ tma::Map map, const unsigned* img,
                                                           int words, int c0, int c1, int c2) {
  __shared__ __align__(1024) unsigned box[8192 / 4];
  for (int i = threadIdx.x; i < words; i += 128) box[i] = img[i];
  wgmma::proxy_fence();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::store_4d(&map, box, c0, c1, c2, 0);
    tma::store_commit();
    tma::store_wait<0>();
  }
}

// tma::Cursor over a STAGES-deep ring of `bytes`-byte tiles (bulk copies of in[t]): warp 0's lane 0 produces, warp 1
// consumes with a Cursor, holding `lag` tiles past the current one (0: releases tile t after reading it; 1: reads t
// and t − 1, then releases t − 1; 2: stage 7's order, t − 2 released before the wait for t, t and t − 1 read). Out:
// out[t] = the bytes seen in stage() after the wait for t, prev[t − 1] = those in stage_prev() then, and
// log[4t ..] = stage(), parity(), stage_prev(), stage_prev2() at tile t. The producer sleeps before each copy, so
// that a consumer that does not wait for the right phase reads a stale stage.
template <int STAGES>
__device__ void cursor_walk(const unsigned char* in, int bytes, int tiles, int lag, unsigned char* out,
                            unsigned char* prev, int* log) {
  __shared__ tma::Barriers<STAGES> bars;
  extern __shared__ __align__(16) unsigned char cursor_raw[];
  unsigned char* buf = cursor_raw + ((1024 - (tma::smem(cursor_raw) & 1023)) & 1023);
  const tma::Ring<STAGES> ring{&bars};
  if (threadIdx.x == 0) ring.init(1);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  if (threadIdx.x / 32 == 0) {
    if (lane == 0) {
      for (int t = 0; t < tiles; ++t) {
        ring.acquire(t, unsigned(bytes));
        for (int i = 0; i < 8; ++i) __nanosleep(1000);
        tma::bulk_load(buf + ring.stage(t) * bytes, in + (long long)t * bytes, unsigned(bytes), ring.full(t));
      }
      for (int t = tiles > STAGES ? tiles - STAGES : 0; t < tiles; ++t) ring.wait_full(t);  // no copy outlives the block
    }
  } else {
    tma::Cursor<STAGES> cur(ring);
    for (int t = 0; t < tiles; ++t) {
      if (t > 0) cur.advance();
      if (lag == 2 && t >= 2 && lane == 0) cur.release_prev2();
      cur.wait();
      if (lane == 0) {
        log[4 * t] = cur.stage();
        log[4 * t + 1] = int(cur.parity());
        log[4 * t + 2] = cur.stage_prev();
        log[4 * t + 3] = cur.stage_prev2();
      }
      const uint4* src = reinterpret_cast<const uint4*>(buf + cur.stage() * bytes);
      for (int i = lane; i < bytes / 16; i += 32) reinterpret_cast<uint4*>(out + (long long)t * bytes)[i] = src[i];
      if (lag > 0 && t > 0) {
        const uint4* p = reinterpret_cast<const uint4*>(buf + cur.stage_prev() * bytes);
        for (int i = lane; i < bytes / 16; i += 32) reinterpret_cast<uint4*>(prev + (long long)(t - 1) * bytes)[i] = p[i];
      }
      __syncwarp();
      if (lane == 0) {
        if (lag == 0) cur.release();
        if (lag == 1 && t > 0) cur.release_prev();
      }
    }
    if (lane == 0) {
      if (lag == 2 && tiles > 1) cur.release_prev();
      if (lag > 0) cur.release();
    }
  }
}

#define LAB_CURSOR_WALK(N)                                                                                         \
  extern "C" __global__ void __launch_bounds__(64, 1) cursor_walk_n##N(const unsigned char* in, int bytes, int tiles, \
                                                                       int lag, unsigned char* out,                \
                                                                       unsigned char* prev, int* log) {            \
    cursor_walk<N>(in, bytes, tiles, lag, out, prev, log);                                                         \
  }
LAB_CURSOR_WALK(2)
LAB_CURSOR_WALK(3)
LAB_CURSOR_WALK(4)

// A split ring (tma::SplitBarriers) walked in stage 7's pingpong order: tile t's first part (K) read in turn t, its
// second part (Vᵀ) in turn t + 1. Warp 0's lane 0 loads tile t's first part (in[t]) and, a tile later, its second
// (in[tiles + t]), each acquired on its own barrier set; warp 1's Cursor gives the first part of tile t − 1 back at the top of turn t
// and the second part of tile t − 2, waits for first(t), then for second(t − 1). out[t] = the first part as read,
// out[tiles + t] = the second. The producer sleeps before each copy, so a wait on the wrong phase reads stale bytes.
template <int STAGES>
__device__ void split_walk(const unsigned char* in, int bytes, int tiles, unsigned char* out) {
  __shared__ tma::SplitBarriers<STAGES> bars;
  extern __shared__ __align__(16) unsigned char split_raw[];
  unsigned char* buf = split_raw + ((1024 - (tma::smem(split_raw) & 1023)) & 1023);
  unsigned char* second_buf = buf + STAGES * bytes;
  const tma::Ring<STAGES> first{&bars.first}, second{&bars.second};
  if (threadIdx.x == 0) {
    first.init(1);
    second.init(1);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const auto copy = [&](const unsigned char* from, unsigned char* to) {
    const uint4* src = reinterpret_cast<const uint4*>(from);
    for (int i = lane; i < bytes / 16; i += 32) reinterpret_cast<uint4*>(to)[i] = src[i];
  };
  if (threadIdx.x / 32 == 0) {
    if (lane == 0) {
      // Tile t's first part, then tile t − 1's second: the consumer's wait for second(t − 1) comes right after
      // first(t) landed, before second(t − 1) is even issued.
      for (int t = 0; t <= tiles; ++t) {
        if (t < tiles) {
          first.acquire(t, unsigned(bytes));
          for (int i = 0; i < 8; ++i) __nanosleep(1000);
          tma::bulk_load(buf + first.stage(t) * bytes, in + (long long)t * bytes, unsigned(bytes), first.full(t));
        }
        if (t > 0) {
          second.acquire(t - 1, unsigned(bytes));
          for (int i = 0; i < 8; ++i) __nanosleep(1000);
          tma::bulk_load(second_buf + second.stage(t - 1) * bytes, in + (long long)(tiles + t - 1) * bytes,
                         unsigned(bytes), second.full(t - 1));
        }
      }
      for (int t = tiles > STAGES ? tiles - STAGES : 0; t < tiles; ++t) {  // no copy outlives the block
        first.wait_full(t);
        second.wait_full(t);
      }
    }
  } else {
    tma::Cursor<STAGES> cur(first);
    for (int t = 0; t < tiles; ++t) {
      if (t > 0) cur.advance();
      if (lane == 0 && t >= 1) cur.release_prev();
      if (lane == 0 && t >= 2) cur.release_second_prev2();
      cur.wait();
      copy(buf + cur.stage() * bytes, out + (long long)t * bytes);
      if (t >= 1) {
        cur.wait_second_prev();
        copy(second_buf + cur.stage_prev() * bytes, out + (long long)(tiles + t - 1) * bytes);
      }
      __syncwarp();
    }
    if (tiles > 0) {
      if (lane == 0) {
        cur.release();
        if (tiles > 1) cur.release_second_prev();
      }
      cur.wait_second();
      copy(second_buf + cur.stage() * bytes, out + (long long)(2 * tiles - 1) * bytes);
      __syncwarp();
      if (lane == 0) cur.release_second();
    }
  }
}

#define LAB_SPLIT_WALK(N)                                                                                          \
  extern "C" __global__ void __launch_bounds__(64, 1) split_walk_n##N(const unsigned char* in, int bytes, int tiles, \
                                                                      unsigned char* out) {                         \
    split_walk<N>(in, bytes, tiles, out);                                                                           \
  }
LAB_SPLIT_WALK(2)
LAB_SPLIT_WALK(3)
