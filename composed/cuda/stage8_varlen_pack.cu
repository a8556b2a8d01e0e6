// stage8_varlen_pack.cu: stage 8 over a packed batch with packed grouped-query heads (pack-gqa): a K/V head's query heads share its keys.
#include "pingpong_attention.cuh"

// stage8_varlen_dD's arguments (stage8_varlen.cu), with packed heads (for decode): the plan's units (sequence, K/V head, 128 packed rows), row r the
// query head r % group of token r / group (group = H / Hkv, dividing 64); Q's map (D, group, total_q, Hkv) in boxes of
// group heads × 64 / group tokens; `heads` is H. A module of its own: stage8_varlen's kernels compile alone, as before.
#define STAGE8_VARLEN_PACK(D, BC, ST, VS)                                                                         \
  extern "C" __global__ void __launch_bounds__(384, 1) stage8_varlen_pack_d##D(                                 \
      sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,                 \
      const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads, const int* table,     \
      const int* cu_q, const int* cu_k, int total_q, const int* block_table, int max_pages, int page_shift,      \
      int box, int oob_row) {                                                                                   \
    const sdpa::RaggedArgs rg{table, cu_q, cu_k, total_q, heads};                                               \
    const sdpa::PagedArgs pg{{block_table, max_pages, page_shift}, box, oob_row};                               \
    sdpa::pingpong_attention<D, ST, BC, VS, true, false, true>(p, &mq, &mk, &mv, &mo, heads, rg, &pg);          \
  }
STAGE8_VARLEN_PACK(64, 128, 4, 2)
STAGE8_VARLEN_PACK(128, 192, 3, 1)
