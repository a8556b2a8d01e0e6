// stage5.cu: the first Hopper rung: Q·Kᵀ and P·V on FP8 wgmma (P in E4M3 registers), two consumer warpgroups, K/V by cp.async.
#include "wgmma_softmax.cuh"

extern "C" __global__ void __launch_bounds__(256, 1) stage5_d64(sdpa::Params p) { sdpa::wgmma_attention<64, 2, 2>(p); }
extern "C" __global__ void __launch_bounds__(256, 1) stage5_d128(sdpa::Params p) { sdpa::wgmma_attention<128, 2, 2>(p); }
