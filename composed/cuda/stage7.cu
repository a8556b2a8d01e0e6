// stage7.cu: stage 6 with the two consumer warpgroups in pingpong on the tensor cores.
#include "pingpong_attention.cuh"

#define STAGE7(D, BC, ST, P)                                                                                     \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage7_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mvt) {                                                       \
    sdpa::pingpong_attention<D, ST, BC, P>(p, &mq, &mk, &mvt);                                                  \
  }
// Keys a tile, ring stages and persistence: Stage::bc, Stage::ring_stages and Stage::persistent on the host, which
// size the tensor maps' boxes, the shared memory and the grid from them (224-key tiles, FlashAttention-3's FP8
// choice at D = 128, fit three stages; persistent blocks measured +7% at D = 64, and at D = 128 +2% on long rows
// and GQA but −2…−5% causal: docs/ladder.md, sixth pass).
STAGE7(64, 128, 4, true)
STAGE7(128, 224, 3, false)
