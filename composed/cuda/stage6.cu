// stage6.cu: stage 5's math fed by a TMA producer warpgroup through an mbarrier ring, consumers with setmaxnreg.
#include "tma_attention.cuh"

#define STAGE6(D)                                                                                                \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage6_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,     \
                  const __grid_constant__ tma::Map mvt) {                                                       \
    sdpa::tma_attention<D, 4>(p, &mq, &mk, &mvt);                                                               \
  }
STAGE6(64)
STAGE6(128)
