// warp_roles.cuh: warp specialisation: warpgroup roles, setmaxnreg per role (sm_90a), named barriers among a role's threads.
//
// setmaxnreg only takes effect when the kernel has a register cap at entry (__launch_bounds__(threads, 1)) and
// each warpgroup's role is one branch of one if/else; otherwise ptxas ignores it (C7508), which the lab's
// compile tests turn into a failure. Counts are multiples of 8 in 24..256, and the block's total must fit
// the 64K-register file: e.g. one producer at 40 and two consumers at 232 (128*40 + 256*232 = 64512).
#pragma once

namespace roles {

// Uniform across the warp, so the compiler knows every branch on it is warp-uniform.
__device__ __forceinline__ int warpgroup() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }
__device__ __forceinline__ int thread_in_group() { return int(threadIdx.x) % 128; }
__device__ __forceinline__ int lane() { return int(threadIdx.x) % 32; }

template <int REGS>
__device__ __forceinline__ void release_registers() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes multiples of 8 in 24..256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void claim_registers() {
  static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes multiples of 8 in 24..256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Named barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32): lets one role
// synchronise without stalling the others.
__device__ __forceinline__ void sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace roles
