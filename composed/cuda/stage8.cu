// stage8.cu: stage 7 reading V as the caller has it: the producer warpgroup transposes each V tile in shared memory.
#include "pingpong_attention.cuh"

// The third map is V's (K's boxes over V); no Vᵀ is made beforehand. Q's, K's and V's maps are (D, S, heads, B) over
// the caller's strides: [B, H, S, D], [B, S, H, D] or any layout with D contiguous and 16-byte strides. Keys a tile, ring stages and V
// staging slots: Stage::bc, Stage::ring_stages and Stage::v_slots on the host. At D = 128, 192-key tiles in three ring
// stages and one staging slot fit beside Q's two buffers and O's panels: a third ring stage hides K's load behind the
// consumers' release (two stages of 224-key tiles ran 38% slower; docs/decisions.md, "Stage 8's third ring stage");
// at D = 64, 256-key tiles in four ring stages and two slots.
#define STAGE8(D, BC, ST, VS)                                                                                     \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage8_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads) {        \
    sdpa::pingpong_attention<D, ST, BC, VS>(p, &mq, &mk, &mv, &mo, heads);                                   \
  }
STAGE8(64, 256, 4, 2)
STAGE8(128, 192, 3, 1)

// Halved (SplitPlan::halved): a unit's rows in two blocks of 64, each block's keys halved between its consumers. Its
// tiles are Stage::halved_bc's: the stage's, and at D = 64 128-key ones where Sk is 2 or 4 of them (at the mission
// shape each consumer then has two tiles whose turns overlap, where one 256-key tile runs its GEMMs and softmax in
// series).
#define STAGE8H_AS(NAME, D, BC, ST, VS)                                                                           \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      NAME(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,            \
           const __grid_constant__ tma::Map mv, const __grid_constant__ tma::Map mo, int heads) {               \
    sdpa::pingpong_attention<D, ST, BC, VS, false, false, false, false, true>(p, &mq, &mk, &mv, &mo, heads);  \
  }
#define STAGE8H(D, BC, ST, VS) STAGE8H_AS(stage8h_d##D, D, BC, ST, VS)
STAGE8H(64, 256, 4, 2)
STAGE8H(128, 192, 3, 1)
STAGE8H_AS(stage8h_d64_k128, 64, 128, 4, 2)

// The split tail's merge, as stage 7's.
SDPA_MERGE_KERNEL(64)
SDPA_MERGE_KERNEL(128)
