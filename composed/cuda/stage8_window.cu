// stage8_window.cu: stage 8 under a sliding window: each unit reads only the key tiles its rows' windows reach.
#include "pingpong_attention.cuh"

// Stage 8's kernel (stage8.cu: V as the caller has it, transposed in the kernel; the same tiles, ring and staging)
// with a window: row i sees keys i + Sk − Sq − win_left ≤ j ≤ i + Sk − Sq + win_right (a side < 0: unbounded; under
// causal masking the right side is 0). A unit's key tiles start at its first row's first visible key's tile
// (sdpa::Window), each row's left edge masked by osm::mask_below and its right edge by the softmax's limit. The host
// plans no split tail for it.
#define STAGE8W(D, BC, ST, VS)                                                                                    \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage8w_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,    \
                   const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads,         \
                   int win_left, int win_right) {                                                                \
    sdpa::pingpong_attention<D, ST, BC, VS, false, true>(p, &mq, &mk, &mv, &mo, heads, sdpa::RaggedArgs(), nullptr, \
                                                         sdpa::Window{win_left, win_right});                    \
  }
STAGE8W(64, 256, 4, 2)
STAGE8W(128, 192, 3, 1)

// The packed (variable-length) kernel (stage8_varlen.cu) under a window: each unit's key-tile count is the plan's
// (ragged-plan's key_range), its first tile its window's.
#define STAGE8W_VARLEN(D, BC, ST, VS)                                                                             \
  extern "C" __global__ void __launch_bounds__(384, 1) stage8w_varlen_d##D(                                     \
      sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,                 \
      const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads, const int* table,     \
      const int* cu_q, const int* cu_k, int total_q, const int* block_table, int max_pages, int page_shift,      \
      int box, int oob_row, const int* past, int one_scale, int win_left, int win_right) {                      \
    const sdpa::RaggedArgs rg{table, cu_q, cu_k, total_q, heads, past, one_scale};                             \
    const sdpa::PagedArgs pg{{block_table, max_pages, page_shift}, box, oob_row};                               \
    sdpa::pingpong_attention<D, ST, BC, VS, true, true>(p, &mq, &mk, &mv, &mo, heads, rg, &pg,                  \
                                                        sdpa::Window{win_left, win_right});                     \
  }
STAGE8W_VARLEN(64, 256, 4, 2)
STAGE8W_VARLEN(128, 192, 3, 1)
