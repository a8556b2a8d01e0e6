// stage7.cu: stage 6 with the two consumer warpgroups in pingpong on the tensor cores.
#include "pingpong_attention.cuh"

#define STAGE7(D, BC)                                                                                                \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage7_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mvt) {                                                       \
    sdpa::pingpong_attention<D, 4, BC>(p, &mq, &mk, &mvt);                                                             \
  }
// Keys a tile: Stage::bc on the host, which sizes the tensor maps' boxes and the shared memory from it.
STAGE7(64, 128)
STAGE7(128, 192)
