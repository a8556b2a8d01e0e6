// test_frag_layout.cu: probes of the wmma and f16/bf16 mma.sync fragment layouts, and the header run on the device.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include "frag_layout.cuh"

using namespace nvcuda;

// Accumulators: each lane writes an encoding of (lane, i) into x[i]; the official store says where it sits.
extern "C" __global__ void probe_wmma_acc_f32(float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
#pragma unroll
  for (int i = 0; i < c.num_elements; ++i) c.x[i] = float(threadIdx.x * c.num_elements + i);
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

extern "C" __global__ void probe_wmma_acc_f16(__half* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, __half> c;
#pragma unroll
  for (int i = 0; i < c.num_elements; ++i) c.x[i] = __float2half(float(threadIdx.x * c.num_elements + i));
  wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

// Operands: the tile's cells hold row*16 + col (exact in f16); each lane reports its x[i] and num_elements.
template <typename Use, typename Major>
__device__ void probe_operand(const __half* tile, float* out, int* count) {
  wmma::fragment<Use, 16, 16, 16, __half, Major> f;
  wmma::load_matrix_sync(f, tile, 16);
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i) out[threadIdx.x * 32 + i] = __half2float(f.x[i]);
  if (threadIdx.x == 0) *count = f.num_elements;
}

extern "C" __global__ void probe_wmma_a_row(const __half* t, float* o, int* n) { probe_operand<wmma::matrix_a, wmma::row_major>(t, o, n); }
extern "C" __global__ void probe_wmma_a_col(const __half* t, float* o, int* n) { probe_operand<wmma::matrix_a, wmma::col_major>(t, o, n); }
extern "C" __global__ void probe_wmma_b_row(const __half* t, float* o, int* n) { probe_operand<wmma::matrix_b, wmma::row_major>(t, o, n); }
extern "C" __global__ void probe_wmma_b_col(const __half* t, float* o, int* n) { probe_operand<wmma::matrix_b, wmma::col_major>(t, o, n); }

#include "mma_probe.cuh"

LAB_MMA_PROBE(probe_mma_m16n8k16_f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
LAB_MMA_PROBE(probe_mma_m16n8k16_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")

// The header evaluated on the device: out[((f * 32 + lane) * 16 + i) * 2 + {0: row, 1: col}], f in header order.
#define LAB_HEADER_FN(F, PREFIX, N)                                   \
  _Pragma("unroll") for (int i = 0; i < N; ++i) {                     \
    out[((F * 32 + lane) * 16 + i) * 2 + 0] = frag::PREFIX##_row(lane, i); \
    out[((F * 32 + lane) * 16 + i) * 2 + 1] = frag::PREFIX##_col(lane, i); \
  }

extern "C" __global__ void header_table(int* out) {
  const int lane = threadIdx.x;
  LAB_HEADER_FN(0, wmma_a, 16)
  LAB_HEADER_FN(1, wmma_b, 16)
  LAB_HEADER_FN(2, wmma_acc, 8)
  LAB_HEADER_FN(3, m16n8k16_a, 8)
  LAB_HEADER_FN(4, m16n8k16_b, 4)
  LAB_HEADER_FN(5, m16n8k32_a, 16)
  LAB_HEADER_FN(6, m16n8k32_b, 8)
  LAB_HEADER_FN(7, mma_c, 4)
}

// Row ownership in use: each cell holds row*16 + col, each lane takes the max of its part of a row, and the
// quad shuffle finishes it. out[lane * 2 + half] must be the row's max, row*16 + 15.
extern "C" __global__ void quad_rowmax(float* out) {
  const int lane = threadIdx.x;
  float x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = float(frag::wmma_acc_row(lane, i) * 16 + frag::wmma_acc_col(lane, i));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = fmaxf(fmaxf(x[2 * h], x[2 * h + 1]), fmaxf(x[2 * h + 4], x[2 * h + 5]));
#pragma unroll
    for (int s = 0; s < 2; ++s) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, frag::kQuadXorMasks[s]));
    out[lane * 2 + h] = m;
  }
}
