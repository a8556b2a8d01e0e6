// stage8_varlen_pack.cu: stage 8 over a packed batch with packed grouped-query heads (pack-gqa): a K/V head's query heads share its keys.
#include "pingpong_attention.cuh"

// The plan's units are (sequence, K/V head, 128 packed rows), row r the query head r % G of token r / G (G = H / Hkv,
// dividing 64); Q's map (D, G, total_q, Hkv) in boxes of G heads × 64 / G tokens. A module of its own: stage8_varlen's
// kernels compile alone, as before.
#define STAGE8_VARLEN_PACK(D, BC, ST, VS) SDPA_VARLEN_KERNEL(stage8_varlen_pack_d##D, D, BC, ST, VS, true)
STAGE8_VARLEN_PACK(64, 256, 4, 2)
STAGE8_VARLEN_PACK(128, 192, 3, 1)
