// stage4.cu: stage 3b with the 3-stage K/V ring.
#include "register_softmax.cuh"

extern "C" __global__ void __launch_bounds__(128) stage4_d64(sdpa::Params p) { sdpa::register_softmax<64, 3>(p); }
extern "C" __global__ void __launch_bounds__(128) stage4_d128(sdpa::Params p) { sdpa::register_softmax<128, 3>(p); }
