// stage6.cu: stage 5's math fed by a TMA producer warpgroup through an mbarrier ring, consumers with setmaxnreg.
#include "tma_attention.cuh"

#define STAGE6(D, BC)                                                                                            \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage6_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mvt) {                                                       \
    sdpa::tma_attention<D, 4, BC>(p, &mq, &mk, &mvt);                                                           \
  }
// Keys a tile: Stage::bc on the host, which sizes the tensor maps' boxes and the shared memory from it.
STAGE6(64, 128)
STAGE6(128, 128)
