// stage3b.cu: softmax entirely in registers on the accumulator fragments (frag-layout, warp-reduce,
// online-softmax), no score buffer; K/V ring N = 2. The stage the earlier attempt could not make correct.
#include "register_softmax.cuh"

extern "C" __global__ void __launch_bounds__(128) stage3b_d64(sdpa::Params p) { sdpa::register_softmax<64, 2>(p); }
extern "C" __global__ void __launch_bounds__(128) stage3b_d128(sdpa::Params p) { sdpa::register_softmax<128, 2>(p); }
