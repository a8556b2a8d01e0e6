// fp8_relayout.cuh: moves between wgmma layouts for FP8 attention: S accumulator -> E4M3 A registers, V -> K-major, O -> rows.
//
// 1. acc_to_a_e4m3: the f32 accumulator of Q.K^T (frag::wgmma_d, N key columns) becomes the register A operand
//    of the P.V wgmma (frag::wgmma_a_k32), one set of four registers per 32 keys, each value times `scale` and
//    rounded to E4M3 (round to nearest even, saturating). A thread holds keys 8j + 2q, 8j + 2q + 1 (q = lane % 4)
//    of its two rows; A wants keys 4q .. 4q + 3 and 16 + 4q .. 16 + 4q + 3. Both live in the same quad of lanes:
//    two shuffles per register from lanes 2(q % 2) and 2(q % 2) + 1 of the quad, and a byte permute that keeps
//    the half (keys 8j .. 8j + 7 of j = q / 2) the register needs.
// 2. transpose_tile: a [ROWS x COLS] byte tile in the canonical K-major wgmma layout (wgmma::tile_byte) becomes
//    its transpose, [COLS x ROWS], in the same kind of layout: V as TMA delivers it ([keys][d]) into the K-major
//    B operand of P.V ([d][keys]). 8-bit data has no ldmatrix.trans; each thread moves 4x4-byte blocks through
//    registers with byte permutes.
// 3. store_rows: an f32 accumulator (frag::wgmma_d) times `scale` to bf16 or f16 rows in global memory, rows past
//    `valid_rows` skipped.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "frag_layout.cuh"
#include "wgmma.cuh"

namespace relayout {

// Two floats as E4M3 codes in 16 bits, `lo` in the low byte.
__device__ __forceinline__ unsigned e4m3x2(float lo, float hi) {
  return unsigned(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// acc: N/2 floats of frag::wgmma_d; a[s]: the A registers of keys 32s .. 32s + 31. Every lane of the warpgroup
// takes part (shuffles), so call it from warp-uniform code.
template <int N>
__device__ __forceinline__ void acc_to_a_e4m3(const float (&acc)[N / 2], float scale, unsigned (&a)[N / 32][4]) {
  const int lane = threadIdx.x & 31, q = lane & 3, base = lane & ~3;
  const int src0 = base + 2 * (q & 1), src1 = src0 + 1;
  const unsigned sel = (q >> 1) ? 0x7632u : 0x5410u;  // the high or the low 16 bits of each source word
#pragma unroll
  for (int s = 0; s < N / 32; ++s) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // This thread's keys of row g + 8*half in K-step s: pairs j = 0..3 at accumulator elements 16s + 4j + 2half.
      unsigned p[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 16 * s + 4 * j + 2 * half;
        p[j] = e4m3x2(acc[i] * scale, acc[i + 1] * scale);
      }
      const unsigned lo = p[0] | p[1] << 16, hi = p[2] | p[3] << 16;  // keys 0..15 and 16..31 of the step
      const unsigned lo0 = __shfl_sync(0xffffffffu, lo, src0), lo1 = __shfl_sync(0xffffffffu, lo, src1);
      const unsigned hi0 = __shfl_sync(0xffffffffu, hi, src0), hi1 = __shfl_sync(0xffffffffu, hi, src1);
      a[s][half] = __byte_perm(lo0, lo1, sel);
      a[s][2 + half] = __byte_perm(hi0, hi1, sel);
    }
  }
}

// Which 4x4-byte block (rb, cb) = (rows 4rb.., bytes 4cb..) lane l moves in task k: rb = l, cb = (l >> 1) ^ (k % 16),
// plus 16 (k / 16). For 128-byte-swizzled tiles on both sides (V of D = 128 into Vᵀ of 128 keys) the warp's
// loads see 32 different (cb % 16, row parity) and its stores 32 different (rb % 16, rb / 16 ^ cb % 2): every
// access hits 32 banks (fp8_relayout::transpose_conflicts counts them). A task covers 32 block rows x 16 block
// columns; the tasks of a tile cover each block once.
__host__ __device__ constexpr int transpose_rb(int l) { return l; }
__host__ __device__ constexpr int transpose_cb(int l, int k) { return ((l >> 1) ^ (k % 16)) + 16 * (k / 16); }

// dst[c][r] = src[r][c] for a ROWS x COLS byte tile, both in the canonical K-major layout (SRC: ROWS rows of COLS
// bytes; DST: COLS rows of ROWS bytes), by THREADS threads (tid = 0 .. THREADS-1). The caller publishes dst
// (wgmma::publish_smem) before a wgmma reads it.
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, int THREADS>
__device__ __forceinline__ void transpose_tile(const unsigned char* src, unsigned char* dst, int tid) {
  static_assert(ROWS % 128 == 0 && COLS % 64 == 0, "tasks of 128 rows x 64 bytes");
  constexpr int kTasks = (ROWS / 128) * (COLS / 64) * 16, kWarps = THREADS / 32;
  const int lane = tid & 31;
  for (int task = tid / 32; task < kTasks; task += kWarps) {
    const int k = task % (COLS / 64 * 16), rtask = task / (COLS / 64 * 16);
    const int r0 = 4 * (transpose_rb(lane) + 32 * rtask), c0 = 4 * transpose_cb(lane, k);
    unsigned w[4];  // w[i]: row r0 + i, bytes c0 .. c0 + 3
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = *reinterpret_cast<const unsigned*>(src + wgmma::tile_byte(SRC, ROWS, r0 + i, c0));
    // 4x4 byte transpose: t[j] byte i = w[i] byte j.
    const unsigned x0 = __byte_perm(w[0], w[1], 0x5140), x1 = __byte_perm(w[0], w[1], 0x7362);
    const unsigned x2 = __byte_perm(w[2], w[3], 0x5140), x3 = __byte_perm(w[2], w[3], 0x7362);
    const unsigned t0 = __byte_perm(x0, x2, 0x5410), t1 = __byte_perm(x0, x2, 0x7632);
    const unsigned t2 = __byte_perm(x1, x3, 0x5410), t3 = __byte_perm(x1, x3, 0x7632);
    *reinterpret_cast<unsigned*>(dst + wgmma::tile_byte(DST, COLS, c0 + 0, r0)) = t0;
    *reinterpret_cast<unsigned*>(dst + wgmma::tile_byte(DST, COLS, c0 + 1, r0)) = t1;
    *reinterpret_cast<unsigned*>(dst + wgmma::tile_byte(DST, COLS, c0 + 2, r0)) = t2;
    *reinterpret_cast<unsigned*>(dst + wgmma::tile_byte(DST, COLS, c0 + 3, r0)) = t3;
  }
}

template <class T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&v);
}
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&v);
}

// out[row][col] = T(acc * scale) for the 64 x N tile at out (ld elements per row); rows >= valid_rows untouched.
template <class T, int N>
__device__ __forceinline__ void store_rows(const float (&acc)[N / 2], float scale, T* out, long long ld,
                                           int valid_rows) {
  const int t = threadIdx.x & 127;
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int row = frag::wgmma_d_row(t, i), col = frag::wgmma_d_col(t, i);
    if (row < valid_rows)
      *reinterpret_cast<unsigned*>(out + row * ld + col) = pack2<T>(acc[i] * scale, acc[i + 1] * scale);
  }
}

}  // namespace relayout
