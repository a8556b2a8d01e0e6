// stage7_acc.cu: stage 7 merging each row's result into the f32 (O, LSE) already in its outputs (ring attention's steps).
#include "pingpong_attention.cuh"

// Stage 7's kernels (stage7.cu's tiles and rings) with ACC: O must be f32 and hold, with the LSE, a running result of
// the same rows over other keys; each row becomes the merge of the two (accumulate_rows). A split tail's parts are
// written to their virtual units as stage 7 writes them, and this source's merge kernel merges each split unit's
// running rows with its parts.
#define STAGE7ACC(D, BC, ST)                                                                                   \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                          \
      stage7acc_d##D(sdpa::Params p, const __grid_constant__ tma::Map mq, const __grid_constant__ tma::Map mk,  \
                     const __grid_constant__ tma::Map mvt, const __grid_constant__ tma::Map mo) {               \
    sdpa::pingpong_attention<D, ST, BC, 0, false, false, false, true>(p, &mq, &mk, &mvt, &mo);                \
  }
STAGE7ACC(64, 256, 4)
STAGE7ACC(128, 224, 3)

// The split tail's merge for these kernels (sdpa::merge_split_tail with the running rows first).
SDPA_MERGE_ACC_KERNEL(64)
SDPA_MERGE_ACC_KERNEL(128)
