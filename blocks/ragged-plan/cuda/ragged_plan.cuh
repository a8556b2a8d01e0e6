// ragged_plan.cuh: a packed batch's work units, longest first: each unit's key tiles, its place in the table, its rows.
//
// A packed (variable-length) batch holds B sequences one after another: Q [total_q, H, D], K and V [total_k, Hkv, D],
// sequence i's queries at rows cu_q[i] .. cu_q[i + 1] − 1 and its keys at cu_k[i] .. cu_k[i + 1] − 1. A unit is one
// (sequence, query head, query tile of `tile_rows` rows); it reads `key_tiles` tiles of `bc` keys: every key tile of
// its sequence, or under a causal mask (bottom-right aligned per sequence: row i sees keys j ≤ i + Sk − Sq) those up
// to its last row's last visible key, and at least one (rows that see no key still end with O = 0, LSE = −inf).
//
// The plan is a table of int4 units {seq, head, q0, key_tiles} sorted by key_tiles, longest first, after a 16-byte
// head whose first word is the unit count: a persistent grid taking units in order from a counter then ends on its
// shortest units, and no SM idles on a long one. Built on the device by three kernels (ragged_plan.cu): a histogram
// of the units' key tiles (atomics; every head of a query tile alike), offsets that put longer units first (one
// block's scan), and a scatter (one atomic a unit into its key-tile count's run). Units of one length land in any
// order within their run: the order of atomics is the device's; each unit's result does not depend on it.
//
// Packed grouped-query heads (`group` > 1, pack-gqa): a unit is one (sequence, K/V head, tile of `tile_rows` packed
// rows), packed row r being query head r % group of token r / group, so a sequence of Sq tokens has Sq · group rows;
// `heads` then counts K/V heads, and a unit's key tiles run from its first row's token's to its last row's.
#pragma once

namespace ragged {

// Key tiles of the unit at query row q0 (rows rows) of a sequence of sq queries and sk keys (mirrors the model).
__host__ __device__ __forceinline__ int key_tiles(int sq, int sk, int q0, int rows, int bc, bool causal) {
  long long visible = sk;
  if (causal) {
    const long long last = (long long)q0 + rows + sk - sq;  // keys the unit's last row sees
    visible = last < 0 ? 0 : last < sk ? last : sk;
  }
  const int t = int((visible + bc - 1) / bc);
  return t > 1 ? t : 1;
}

// The key tiles of the unit at query row q0 (rows rows) under a sliding window (mirrors the model's key_range): its
// first tile (its first row's first visible key's) and its tiles from there to its last row's last visible key, at
// least one. Row i sees keys i + sk − sq − left ≤ j ≤ i + sk − sq + right; a side < 0 is unbounded, and causal
// masking makes the right side 0. With both sides unbounded: (0, key_tiles).
__host__ __device__ __forceinline__ int2 key_range(int sq, int sk, int q0, int rows, int bc, bool causal, int left,
                                                  int right) {
  long long first_key = left < 0 ? 0 : (long long)q0 + sk - sq - left;
  if (first_key < 0) first_key = 0;
  const int r = causal ? 0 : right;
  long long end = sk;
  if (r >= 0) {
    const long long last = (long long)q0 + rows + sk - sq + r;  // one past the unit's last row's last visible key
    end = last < 0 ? 0 : last < sk ? last : sk;
  }
  const int first = int(first_key / bc);
  const int t = int((end + bc - 1) / bc) - first;
  return make_int2(first, t > 1 ? t : 1);
}

// A unit as the table holds it (one int4).
struct Unit {
  int seq, head, q0, key_tiles;
};

// Where a unit's rows are in the packed tensors: its first query row and its valid rows (tile_rows, or fewer in a
// sequence's last tile), its sequence's first key row, query and key counts.
struct Coord {
  int q_row0, rows, k_row0, sq, sk;
};
// With `group` packed heads (a plan of packed grouped-query heads): q_row0 is the token of the unit's first row (u.q0 /
// group), rows its valid packed rows (of sq · group).
__device__ __forceinline__ Coord coord_packed(const int* cu_q, const int* cu_k, Unit u, int tile_rows, int group) {
  const int q = cu_q[u.seq], k = cu_k[u.seq];
  const int sq = cu_q[u.seq + 1] - q, sk = cu_k[u.seq + 1] - k;
  const int left = sq * group - u.q0;
  return Coord{q + u.q0 / group, left < tile_rows ? left : tile_rows, k, sq, sk};
}
__device__ __forceinline__ Coord coord(const int* cu_q, const int* cu_k, Unit u, int tile_rows) {
  return coord_packed(cu_q, cu_k, u, tile_rows, 1);
}

// Key tiles of the unit at packed row q0 (rows rows, `group` heads a token) of a sequence of sq tokens and sk keys: its
// tokens' key_tiles, or under a window (a side ≥ 0) key_range's count.
__host__ __device__ __forceinline__ int unit_key_tiles(int sq, int sk, int q0, int rows, int bc, bool causal, int left,
                                                       int right, int group) {
  const int t0 = q0 / group, tokens = (q0 + rows - 1) / group - t0 + 1;
  return left < 0 && right < 0 ? key_tiles(sq, sk, t0, tokens, bc, causal)
                               : key_range(sq, sk, t0, tokens, bc, causal, left, right).y;
}

// The table: the unit count, then (after 4 words) unit i at int4 i.
__device__ __forceinline__ int count(const int* table) { return table[0]; }
__device__ __forceinline__ Unit unit(const int* table, int i) {
  const int4 w = reinterpret_cast<const int4*>(table + 4)[i];
  return Unit{w.x, w.y, w.z, w.w};
}

// Plan step 1, block `seq` of a grid of B: counts[t] += heads for each of its query tiles reading t key tiles.
// Under a window (left, right ≥ 0 on a side) a unit's count is key_range's; `group` heads packed a token.
__device__ __forceinline__ void histogram(const int* cu_q, const int* cu_k, int seq, int heads, int tile_rows, int bc,
                                          bool causal, int* counts, int left = -1, int right = -1, int group = 1) {
  const int sq = cu_q[seq + 1] - cu_q[seq], sk = cu_k[seq + 1] - cu_k[seq], all = sq * group;
  for (int qt = threadIdx.x; qt * tile_rows < all; qt += blockDim.x) {
    const int q0 = qt * tile_rows, rows = all - q0 < tile_rows ? all - q0 : tile_rows;
    const int kt = unit_key_tiles(sq, sk, q0, rows, bc, causal, left, right, group);
    atomicAdd(&counts[kt], heads);
  }
}

// Plan step 2, one block: counts[t] becomes the first slot of the units of t key tiles, longer units first
// (Σ counts[t'] over t' > t), and table[0] the unit count. Each thread sums a run of `per` bins from the top, a
// warp-shuffle scan then a scan across warps gives each run its start, and each thread writes its run's offsets.
__device__ __forceinline__ void offsets(int* counts, int bins, int* table) {
  __shared__ int warp_sums[32];
  const int t = threadIdx.x, n = blockDim.x, per = (bins + n - 1) / n;
  // Run t covers bins from the top: hi = bins − 1 − t·per down to hi − per + 1.
  const int hi = bins - 1 - t * per;
  int sum = 0;
  for (int j = 0; j < per; ++j)
    if (hi - j >= 0) sum += counts[hi - j];
  int incl = sum;
  const int lane = t % 32, w = t / 32;
  for (int o = 1; o < 32; o *= 2) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  if (lane == 31) warp_sums[w] = incl;
  __syncthreads();
  if (w == 0) {
    int v = lane < (n + 31) / 32 ? warp_sums[lane] : 0;
    for (int o = 1; o < 32; o *= 2) {
      const int x = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += x;
    }
    warp_sums[lane] = v;  // inclusive over warps 0 .. lane
  }
  __syncthreads();
  int start = incl - sum + (w > 0 ? warp_sums[w - 1] : 0);
  for (int j = 0; j < per; ++j)
    if (hi - j >= 0) {
      const int c = counts[hi - j];
      counts[hi - j] = start;
      start += c;
    }
  if (t == n - 1) table[0] = warp_sums[(n - 1) / 32];
}

// Plan step 3, block `seq`: each of its units to the next free slot of its key-tile count's run.
__device__ __forceinline__ void scatter(const int* cu_q, const int* cu_k, int seq, int heads, int tile_rows, int bc,
                                        bool causal, int* cursors, int* table, int left = -1, int right = -1,
                                        int group = 1) {
  const int sq = cu_q[seq + 1] - cu_q[seq], sk = cu_k[seq + 1] - cu_k[seq], all = sq * group;
  const int tiles_q = (all + tile_rows - 1) / tile_rows;
  for (int i = threadIdx.x; i < tiles_q * heads; i += blockDim.x) {
    const int qt = i / heads, head = i % heads;
    const int q0 = qt * tile_rows, rows = all - q0 < tile_rows ? all - q0 : tile_rows;
    const int kt = unit_key_tiles(sq, sk, q0, rows, bc, causal, left, right, group);
    const int slot = atomicAdd(&cursors[kt], 1);
    reinterpret_cast<int4*>(table + 4)[slot] = make_int4(seq, head, q0, kt);
  }
}

}  // namespace ragged
