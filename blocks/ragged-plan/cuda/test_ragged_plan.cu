// test_ragged_plan.cu: every unit of a plan's table decoded as an attention kernel would (its rows in the packed tensors).
#include "ragged_plan.cuh"

// Thread i < count(table): unit i's {seq, head, q0, key_tiles} and its Coord {q_row0, rows, k_row0, sq, sk} at out[9i …]
// (coord_packed: with group 1, coord).
extern "C" __global__ void ragged_decode(const int* table, const int* cu_q, const int* cu_k, int tile_rows, int group,
                                         int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= ragged::count(table)) return;
  const ragged::Unit u = ragged::unit(table, i);
  const ragged::Coord c = ragged::coord_packed(cu_q, cu_k, u, tile_rows, group);
  const int v[9] = {u.seq, u.head, u.q0, u.key_tiles, c.q_row0, c.rows, c.k_row0, c.sq, c.sk};
  for (int j = 0; j < 9; ++j) out[9 * i + j] = v[j];
}
