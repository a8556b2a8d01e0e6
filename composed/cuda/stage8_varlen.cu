// stage8_varlen.cu: stage 8 over a packed (variable-length) batch: units from ragged-plan's table, outputs packed.
#include "pingpong_attention.cuh"

// Q [total_q, H, D], K and V [total_k, Hkv, D] (maps (D, total, heads, 1)), or K and V a paged cache's pool (block_table
// set: [B][max_pages] page indices, pages of 2^page_shift rows, maps (D, pool rows, Hkv, 1) in boxes of `box` rows,
// cu_k then the prefix sums of the sequences' lengths); the units and their count from the plan's table (ragged-plan's
// Planner, made on the device from cu_seqlens); scales per (sequence, head); O [total_q, H, D] and the LSE [H,
// total_q] by direct stores (mo is not read). Tiles, ring and staging as stage 8's.
#define STAGE8_VARLEN(D, BC, ST, VS)                                                                              \
  extern "C" __global__ void __launch_bounds__(384, 1) stage8_varlen_d##D(                                      \
      sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,                 \
      const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads, const int* table,     \
      const int* cu_q, const int* cu_k, int total_q, const int* block_table, int max_pages, int page_shift,      \
      int box, int oob_row) {                                                                                   \
    const sdpa::RaggedArgs rg{table, cu_q, cu_k, total_q, heads};                                               \
    const sdpa::PagedArgs pg{{block_table, max_pages, page_shift}, box, oob_row};                               \
    sdpa::pingpong_attention<D, ST, BC, VS, true>(p, &mq, &mk, &mv, &mo, heads, rg, &pg);                       \
  }
STAGE8_VARLEN(64, 128, 4, 2)
STAGE8_VARLEN(128, 192, 3, 1)

