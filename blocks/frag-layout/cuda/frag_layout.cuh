// frag_layout.cuh: row and column of fragment element x[i] of lane l, for each wmma / mma.sync layout the lab uses.
//
// One source of truth with blocks/frag-layout/src/model.rs: the tests compile static_asserts generated from
// the Rust model against these functions, and probe the hardware on the device. Every function is constexpr
// and takes the element index as a value: call it with compile-time `i` (an unrolled loop) so that no
// register array is ever indexed at run time.
#pragma once

namespace frag {

__host__ __device__ constexpr int group_of(int lane) { return lane >> 2; }  // PTX "groupID"
__host__ __device__ constexpr int thread_in_group(int lane) { return lane & 3; }

// ---- mma.sync.m16n8k16 (f16 / bf16 in): PTX ISA "Matrix Fragments for mma.m16n8k16" ----
__host__ __device__ constexpr int m16n8k16_a_row(int lane, int i) { return group_of(lane) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int m16n8k16_a_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2); }
__host__ __device__ constexpr int m16n8k16_b_row(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 1); }
__host__ __device__ constexpr int m16n8k16_b_col(int lane, int) { return group_of(lane); }

// ---- mma.sync.m16n8k32 (e4m3 / e5m2 in, sm_89+): PTX ISA "Matrix Fragments for mma.m16n8k32" ----
__host__ __device__ constexpr int m16n8k32_a_row(int lane, int i) { return group_of(lane) + 8 * ((i >> 2) & 1); }
__host__ __device__ constexpr int m16n8k32_a_col(int lane, int i) { return 4 * thread_in_group(lane) + (i & 3) + 16 * (i >> 3); }
__host__ __device__ constexpr int m16n8k32_b_row(int lane, int i) { return 4 * thread_in_group(lane) + (i & 3) + 16 * (i >> 2); }
__host__ __device__ constexpr int m16n8k32_b_col(int lane, int) { return group_of(lane); }

// ---- mma.sync m16n8 accumulator C / D (f32), the same for k16 and k32 ----
__host__ __device__ constexpr int mma_c_row(int lane, int i) { return group_of(lane) + 8 * (i >> 1); }
__host__ __device__ constexpr int mma_c_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1); }

// ---- wmma m16n16k16, probed on sm_90: two m16n8k16 tiles side by side ----
// Accumulator (f32 and f16 alike): x[0..4) is the left n8 tile's C, x[4..8) the right one's.
__host__ __device__ constexpr int wmma_acc_row(int lane, int i) { return group_of(lane) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int wmma_acc_col(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * (i >> 2); }
// matrix_a / matrix_b (f16, row- or col-major in memory): 16 elements, x[i + 8] holds the same cell as x[i].
__host__ __device__ constexpr int wmma_a_row(int lane, int i) { return m16n8k16_a_row(lane, i & 7); }
__host__ __device__ constexpr int wmma_a_col(int lane, int i) { return m16n8k16_a_col(lane, i & 7); }
__host__ __device__ constexpr int wmma_b_row(int lane, int i) { return 2 * thread_in_group(lane) + (i & 1) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int wmma_b_col(int lane, int i) { return group_of(lane) + 8 * ((i >> 2) & 1); }

// ---- wgmma.mma_async m64nNkK (sm_90a), probed on the H100: t = thread of the warpgroup (0..127) ----
// Warp w = t / 32 holds rows 16w .. 16w + 15, laid out like an m16 mma.sync fragment of that warp.
// D (f32, N/2 elements per thread, any N): x[i] with i / 4 = the 8-column group.
__host__ __device__ constexpr int wgmma_d_row(int t, int i) { return 16 * (t >> 5) + group_of(t & 31) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int wgmma_d_col(int t, int i) { return 8 * (i >> 2) + 2 * thread_in_group(t) + (i & 1); }
// A from registers, k32 (e4m3 / e5m2): 16 bytes per thread in 4 registers, byte i = element x[i].
__host__ __device__ constexpr int wgmma_a_k32_row(int t, int i) { return 16 * (t >> 5) + group_of(t & 31) + 8 * ((i >> 2) & 1); }
__host__ __device__ constexpr int wgmma_a_k32_col(int t, int i) { return 4 * thread_in_group(t) + (i & 3) + 16 * (i >> 3); }
// A from registers, k16 (f16 / bf16): 8 halves per thread in 4 registers.
__host__ __device__ constexpr int wgmma_a_k16_row(int t, int i) { return 16 * (t >> 5) + group_of(t & 31) + 8 * ((i >> 1) & 1); }
__host__ __device__ constexpr int wgmma_a_k16_col(int t, int i) { return 2 * thread_in_group(t) + (i & 1) + 8 * (i >> 2); }
// Row r of a wgmma D is held by the quad of lanes wgmma_quad_base(r) .. + 3 (the same xor-1, xor-2 shuffle).
__host__ __device__ constexpr int wgmma_quad_base(int row) { return 32 * (row >> 4) + 4 * (row & 7); }

// ---- Row ownership of an accumulator (wmma 16x16 and mma m16n8 alike) ----
// Row r is held by the quad of lanes 4*(r % 8) .. 4*(r % 8) + 3, in the elements i with acc_half(i) == r / 8.
__host__ __device__ constexpr int acc_quad_base(int row) { return 4 * (row & 7); }
__host__ __device__ constexpr int acc_half(int i) { return (i >> 1) & 1; }
__host__ __device__ constexpr int acc_row(int lane, int half) { return group_of(lane) + 8 * half; }
// __shfl_xor_sync with these masks, in order, reduces a value across the quad that owns a row.
constexpr int kQuadXorMasks[2] = {1, 2};

// Accumulator layouts as types, so row-wise code is written once for both: kElems elements per lane covering
// a 16 x kCols tile.
struct WmmaAcc {
  static constexpr int kElems = 8;
  static constexpr int kCols = 16;
  __host__ __device__ static constexpr int row(int lane, int i) { return wmma_acc_row(lane, i); }
  __host__ __device__ static constexpr int col(int lane, int i) { return wmma_acc_col(lane, i); }
};
struct MmaC {
  static constexpr int kElems = 4;
  static constexpr int kCols = 8;
  __host__ __device__ static constexpr int row(int lane, int i) { return mma_c_row(lane, i); }
  __host__ __device__ static constexpr int col(int lane, int i) { return mma_c_col(lane, i); }
};
// A wgmma D of N columns as a layout type, for the row-wise code above (warp-reduce, online-softmax): a thread
// holds N/2 elements of two rows; col() depends on the lane's quad position only.
template <int N>
struct WgmmaD {
  static constexpr int kElems = N / 2;
  static constexpr int kCols = N;
  __host__ __device__ static constexpr int row(int t, int i) { return wgmma_d_row(t, i); }
  __host__ __device__ static constexpr int col(int t, int i) { return wgmma_d_col(t, i); }
};
// Registers of one mma C fragment; a wmma accumulator fragment has the same `.x[]` shape.
template <class L>
struct Regs {
  float x[L::kElems];
};

}  // namespace frag
