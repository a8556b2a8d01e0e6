// stage8_varlen.cu: stage 8 over a packed (variable-length) batch: units from ragged-plan's table, outputs packed.
#include "pingpong_attention.cuh"

// Tiles, ring and staging as stage 8's (SDPA_VARLEN_KERNEL says what the arguments hold).
#define STAGE8_VARLEN(D, BC, ST, VS) SDPA_VARLEN_KERNEL(stage8_varlen_d##D, D, BC, ST, VS, false)
STAGE8_VARLEN(64, 256, 4, 2)
STAGE8_VARLEN(128, 192, 3, 1)
