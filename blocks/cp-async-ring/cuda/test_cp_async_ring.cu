// test_cp_async_ring.cu: copies each head's [S, D] rows through the ring and writes every tile back out.
#include "cp_async_ring.cuh"

// Block b copies the sequence at src + b * head_stride (rows `stride` bytes apart) and writes tile t's whole
// stage to out[b][t] and its valid row count to valid[b][t].
// The 128-byte swizzle of a wgmma operand tile with 128-byte rows: 16-byte chunk c of row r lands in chunk
// c ^ (r % 8) (frag_layout's model of Swizzle::B128 for a K-major tile; the host checks it byte by byte).
struct Sw128 {
  __device__ static int offset(int r, int b) { return r * 128 + (b ^ ((r & 7) << 4)); }
};

template <int STAGES, int ROWS, int COLS, int ELEM, class PLACE = ring::RowMajor<COLS * ELEM>>
__device__ void copy(const unsigned char* src, long long stride, long long head_stride, int rows, unsigned char* out,
                     int* valid, int max_tiles) {
  constexpr int THREADS = 128;
  using R = ring::Ring<STAGES, ROWS, COLS, ELEM, THREADS, PLACE>;
  extern __shared__ __align__(16) unsigned char smem[];
  // The stages start poisoned, so that zero-filled rows are seen to be written, not assumed.
  for (int i = threadIdx.x; i < R::kBytes; i += THREADS) smem[i] = 0xAB;
  __syncthreads();
  const R r{smem, src + blockIdx.x * head_stride, stride, rows};
  unsigned char* o = out + (long long)blockIdx.x * max_tiles * R::kTileBytes;
  for (int t = 0; t < STAGES - 1; ++t) r.issue(t);
  for (int t = 0; t < r.tiles(); ++t) {
    r.issue(t + STAGES - 1);
    const unsigned char* tile = r.wait(t);
    for (int i = threadIdx.x; i < R::kTileBytes / 16; i += THREADS)
      reinterpret_cast<uint4*>(o + (long long)t * R::kTileBytes)[i] = reinterpret_cast<const uint4*>(tile)[i];
    if (threadIdx.x == 0) valid[blockIdx.x * max_tiles + t] = r.valid_rows(t);
    r.release(t);
  }
}

#define LAB_RING(N, ROWS, COLS, ELEM)                                                                              \
  extern "C" __global__ void __launch_bounds__(128) ring_n##N##_r##ROWS##_c##COLS##_e##ELEM(                       \
      const unsigned char* src, long long stride, long long head_stride, int rows, unsigned char* out, int* valid, \
      int max_tiles) {                                                                                             \
    copy<N, ROWS, COLS, ELEM>(src, stride, head_stride, rows, out, valid, max_tiles);                              \
  }

LAB_RING(2, 16, 64, 1)
LAB_RING(2, 32, 128, 1)
LAB_RING(2, 64, 128, 2)
LAB_RING(3, 64, 64, 1)
LAB_RING(3, 32, 64, 2)
LAB_RING(3, 16, 128, 2)
LAB_RING(4, 16, 128, 2)
LAB_RING(4, 32, 64, 1)

// Swizzled placement: rows of 128 bytes into wgmma's 128-byte-swizzled K-major tile.
extern "C" __global__ void __launch_bounds__(128) ring_n2_r64_c128_e1_sw128(const unsigned char* src, long long stride,
                                                                           long long head_stride, int rows,
                                                                           unsigned char* out, int* valid, int max_tiles) {
  copy<2, 64, 128, 1, Sw128>(src, stride, head_stride, rows, out, valid, max_tiles);
}
