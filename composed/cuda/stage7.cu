// stage7.cu: stage 6 with the two consumer warpgroups in pingpong on the tensor cores.
#include "pingpong_attention.cuh"

#define STAGE7(D, BC, ST)                                                                                     \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage7_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mvt, const __grid_constant__ tma::Map mo) {                  \
    sdpa::pingpong_attention<D, ST, BC>(p, &mq, &mk, &mvt, &mo);                                             \
  }
// Keys a tile and ring stages: Stage::bc and Stage::ring_stages on the host, which size the tensor maps' boxes and
// the shared memory from them (224-key tiles, FlashAttention-3's FP8 choice at D = 128, fit three stages; at D = 64
// 256-key tiles, half the turns of 128 keys, in four; at D = 256 two stages of 128-key tiles fit beside Q's two
// buffers). Blocks are persistent (Stage::persistent), taking units from a counter (docs/decisions.md, "Stage 7's
// grid").
STAGE7(64, 256, 4)
STAGE7(128, 224, 3)
STAGE7(256, 128, 2)

// The split tail's merge (sdpa::merge_split_tail), launched after stage7_dD where the host split the tail.
SDPA_MERGE_KERNEL(64)
SDPA_MERGE_KERNEL(128)
SDPA_MERGE_KERNEL(256)
