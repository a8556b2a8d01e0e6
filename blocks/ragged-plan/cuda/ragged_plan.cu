// ragged_plan.cu: the plan's library kernels, one-line wrappers over ragged_plan.cuh (launched by ragged_plan::Planner).
#include "ragged_plan.cuh"

// left, right: a sliding window's sides (−1: unbounded; both −1: no window); group: query heads packed a token (1:
// none; then heads counts K/V heads).
extern "C" __global__ void ragged_histogram(const int* cu_q, const int* cu_k, int heads, int tile_rows, int bc,
                                            int causal, int* counts, int left, int right, int group) {
  ragged::histogram(cu_q, cu_k, blockIdx.x, heads, tile_rows, bc, causal != 0, counts, left, right, group);
}

extern "C" __global__ void ragged_offsets(int* counts, int bins, int* table) { ragged::offsets(counts, bins, table); }

extern "C" __global__ void ragged_scatter(const int* cu_q, const int* cu_k, int heads, int tile_rows, int bc,
                                          int causal, int* cursors, int* table, int left, int right, int group) {
  ragged::scatter(cu_q, cu_k, blockIdx.x, heads, tile_rows, bc, causal != 0, cursors, table, left, right, group);
}
