// test_transpose_lean.cu: TransposeLean alone on host data, as a producer warpgroup would run it (bit-exact checks).
// Its own source: TransposeLean's static check of its offsets would reject test_fp8_relayout.cu's p_key mutant at
// compile time, before that mutant's P·V could show it wrong.
#include "fp8_relayout.cuh"

// in: [ROWS][COLS] bytes row-major; out: the transposed tile's bytes as they sit in shared memory (DST layout), keys
// in p_key order, moved by the first 96 threads (a producer warpgroup's three transposing warps).
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST>
__device__ void transpose_lean(const unsigned char* in, unsigned char* out) {
  extern __shared__ unsigned char raw[];
  unsigned char* src = raw + ((1024 - (wgmma::smem_addr(raw) & 1023)) & 1023);
  constexpr unsigned kSrcBytes = wgmma::tile_bytes(SRC, ROWS, COLS);
  unsigned char* dst = src + (kSrcBytes + 1023) / 1024 * 1024;
  constexpr unsigned kDstBytes = wgmma::tile_bytes(DST, COLS, ROWS);
  for (int i = threadIdx.x; i < ROWS * COLS / 4; i += blockDim.x) {
    const int r = i / (COLS / 4), c = i % (COLS / 4) * 4;
    *reinterpret_cast<unsigned*>(src + wgmma::tile_byte(SRC, ROWS, r, c)) =
        *reinterpret_cast<const unsigned*>(in + r * COLS + c);
  }
  for (int i = threadIdx.x; i < int(kDstBytes); i += blockDim.x) dst[i] = 0xCD;
  __syncthreads();
  if (threadIdx.x < 96) relayout::TransposeLean<ROWS, COLS, SRC, DST, 96, relayout::LocalKeys>::run(src, dst, threadIdx.x);
  __syncthreads();
  for (int i = threadIdx.x; i < int(kDstBytes); i += blockDim.x) out[i] = dst[i];
}

// The transposes a producer-side V transpose in stage 7 takes (tried and not kept: docs/decisions.md, "V transposed in the kernel"): V's 224 keys (D = 128) into seven 32-byte panels, 128 keys (D = 64) into one
// 128-byte panel, keys in p_key order.
#define LAB_TRANSPOSE_LEAN(R, C, S, D)                                                                              \
  extern "C" __global__ void __launch_bounds__(128) transpose_lean_r##R##_c##C##_##S##_##D(const unsigned char* in, \
                                                                                         unsigned char* out) {   \
    transpose_lean<R, C, wgmma::Swizzle::S, wgmma::Swizzle::D>(in, out);                                         \
  }
LAB_TRANSPOSE_LEAN(224, 128, B128, B32)
LAB_TRANSPOSE_LEAN(128, 64, B64, B128)
LAB_TRANSPOSE_LEAN(128, 128, B128, B128)
