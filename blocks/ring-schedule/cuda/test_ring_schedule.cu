// test_ring_schedule.cu: the schedule as the device computes it, for every (world, rank, step, causal) asked.
#include "ring_schedule.cuh"

// Thread i of n: world[i], rank[i], step[i], causal[i] → out[12·i …]: the source rank, the block count, three
// (q, kv, mask) triples (zeros past the count) and a zero; and chunk_begin(s[i], world[i], c) for c = 0 … 2·world into
// begins[i · 17 …] (world ≤ 8).
extern "C" __global__ void ring_schedule(const int* world, const int* rank, const int* step, const int* causal,
                                         const long long* s, int n, int* out, long long* begins) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  ring::Block b[3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  const int count = ring::blocks(world[i], rank[i], step[i], causal[i] != 0, b);
  int* o = out + 12 * i;
  o[0] = ring::source(world[i], rank[i], step[i]);
  o[1] = count;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    const bool on = j < count;
    o[2 + 3 * j] = on ? b[j].q : 0;
    o[3 + 3 * j] = on ? b[j].kv : 0;
    o[4 + 3 * j] = on ? b[j].mask : 0;
  }
  o[11] = 0;
  for (int c = 0; c <= 2 * world[i]; ++c) begins[17 * i + c] = ring::chunk_begin(s[i], world[i], c);
}
