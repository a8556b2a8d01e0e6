// ring_schedule.cuh: ring attention's schedule: the K/V shard a rank holds at each step and the (Q, K/V) blocks it computes.
//
// A sequence of S tokens over W ranks is cut into 2W chunks, chunk c = tokens chunk_begin(c) … chunk_begin(c + 1) − 1
// (⌊c·S / 2W⌋: S need not divide). Zigzag sharding: rank r holds chunks r and 2W − 1 − r of Q, K and V (its first and
// second half), so that under a causal mask every rank has the same work. K/V shards travel the ring to the next rank
// (r + 1) each step: at step s rank r holds the shard of rank (r − s) mod W. What rank r computes at step s is up to
// three blocks, each (its Q halves, the shard's K/V halves, a mask): halves as a bit set (1: first, 2: second, 3:
// both); kFull sees every key, kCausal is the diagonal (the same chunk of Q and K/V: key j seen from query i when
// j ≤ i). Without the mask: one block, both halves of each, kFull. With it:
//   step 0 (its own shard): Q first × K/V first causal, Q second × K/V first full, Q second × K/V second causal;
//   a shard from a lower rank (src < r): both Q halves × its first half, full (its second half is later than both);
//   a shard from a higher rank (src > r): Q's second half × both its halves, full (Q's first half is earlier than both).
// The last two are each half a full block, which is the balance zigzag buys.
#pragma once

namespace ring {

enum Mask : int { kFull = 1, kCausal = 2 };

// One block of a step: Q halves `q`, K/V halves `kv` (bit sets), mask.
struct Block {
  int q, kv, mask;
};

// The first token of chunk c of a sequence of s tokens over `world` ranks (2·world chunks).
__host__ __device__ __forceinline__ long long chunk_begin(long long s, int world, int c) {
  return (long long)c * s / (2 * world);
}

// The rank whose K/V shard rank `rank` holds at step `step`.
__host__ __device__ __forceinline__ int source(int world, int rank, int step) {
  return ((rank - step) % world + world) % world;
}

// The blocks rank `rank` computes at step `step` into out[0 .. n), n returned (1 to 3).
__host__ __device__ __forceinline__ int blocks(int world, int rank, int step, bool causal, Block (&out)[3]) {
  if (!causal) {
    out[0] = Block{3, 3, kFull};
    return 1;
  }
  const int src = source(world, rank, step);
  if (src == rank) {
    out[0] = Block{1, 1, kCausal};
    out[1] = Block{2, 1, kFull};
    out[2] = Block{2, 2, kCausal};
    return 3;
  }
  if (src < rank) {
    out[0] = Block{3, 1, kFull};
  } else {
    out[0] = Block{2, 3, kFull};
  }
  return 1;
}

}  // namespace ring
