// test_transpose_ldsm.cu: TransposeLdsm alone on host data, as a producer warpgroup's warps would run it (bit-exact checks).
#include "fp8_relayout.cuh"

// in: [ROWS][COLS] bytes row-major, laid into V's tile (SRC); out: Vᵀ's bytes as they sit in shared memory (DST
// layout), keys in p_key order, moved by the first WARPS warps; bytes no unit writes stay 0xCD.
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, int WARPS>
__device__ void transpose_ldsm(const unsigned char* in, unsigned char* out) {
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
  if (int(threadIdx.x) < 32 * WARPS)
    relayout::TransposeLdsm<ROWS, COLS, SRC, DST>::template run<WARPS>(src, dst, threadIdx.x / 32, threadIdx.x % 32);
  __syncthreads();
  for (int i = threadIdx.x; i < int(kDstBytes); i += blockDim.x) out[i] = dst[i];
}

// Stage 8's V tiles (192 keys at D = 128 into three 64-byte Vᵀ panels, by three warps as its producer warpgroup's
// warps 1–3 move them; 256 keys at D = 64 into 128-byte panels), 224 keys at D = 128 into seven 32-byte panels and
// 128-key tiles at D = 64, 128 and 256 by a warpgroup's four warps, and 32 keys by three (units that do not divide).
#define LAB_TRANSPOSE_LDSM(R, C, S, D, W)                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                               \
      transpose_ldsm_r##R##_c##C##_##S##_##D##_w##W(const unsigned char* in, unsigned char* out) {                \
    transpose_ldsm<R, C, wgmma::Swizzle::S, wgmma::Swizzle::D, W>(in, out);                                        \
  }
LAB_TRANSPOSE_LDSM(224, 128, B128, B32, 4)
LAB_TRANSPOSE_LDSM(128, 64, B64, B128, 4)
LAB_TRANSPOSE_LDSM(128, 256, B128, B128, 4)
LAB_TRANSPOSE_LDSM(128, 128, B128, B128, 4)
LAB_TRANSPOSE_LDSM(32, 128, B128, B32, 3)
LAB_TRANSPOSE_LDSM(256, 64, B64, B128, 4)
LAB_TRANSPOSE_LDSM(192, 128, B128, B64, 3)
