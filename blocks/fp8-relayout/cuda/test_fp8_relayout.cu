// test_fp8_relayout.cu: each relayout alone on host data (bit-exact checks), and P.V through wgmma end to end.
#include "fp8_relayout.cuh"

// in: [64][N] f32 row-major. out[t][s][q]: thread t's A register q of K-step s (LOCAL: in p_key order).
template <int N, bool LOCAL = false>
__device__ void acc_to_a(const float* in, float scale, unsigned* out) {
  const int t = threadIdx.x;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = in[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)];
  unsigned a[N / 32][4];
  if constexpr (LOCAL)
    relayout::acc_to_a_e4m3_local<N>(acc, scale, a);
  else
    relayout::acc_to_a_e4m3<N>(acc, scale, a);
#pragma unroll
  for (int s = 0; s < N / 32; ++s)
#pragma unroll
    for (int q = 0; q < 4; ++q) out[(t * (N / 32) + s) * 4 + q] = a[s][q];
}
extern "C" __global__ void __launch_bounds__(128) acc_to_a_n64(const float* in, float scale, unsigned* out) {
  acc_to_a<64>(in, scale, out);
}
extern "C" __global__ void __launch_bounds__(128) acc_to_a_n128(const float* in, float scale, unsigned* out) {
  acc_to_a<128>(in, scale, out);
}
extern "C" __global__ void __launch_bounds__(128) acc_to_a_n256(const float* in, float scale, unsigned* out) {
  acc_to_a<256>(in, scale, out);
}
extern "C" __global__ void __launch_bounds__(128) acc_to_a_local_n128(const float* in, float scale, unsigned* out) {
  acc_to_a<128, true>(in, scale, out);
}

// in: [ROWS][COLS] bytes row-major; out: the transposed tile's bytes as they sit in shared memory (DST layout).
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, class KEYS = relayout::InOrder>
__device__ void transpose(const unsigned char* in, unsigned char* out) {
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
  relayout::Transpose<ROWS, COLS, SRC, DST, 128, KEYS>(threadIdx.x).run(src, dst);
  __syncthreads();
  for (int i = threadIdx.x; i < int(kDstBytes); i += blockDim.x) out[i] = dst[i];
}
#define LAB_TRANSPOSE(R, C, S, D)                                                                              \
  extern "C" __global__ void __launch_bounds__(128) transpose_r##R##_c##C##_##S##_##D(const unsigned char* in, \
                                                                                       unsigned char* out) {   \
    transpose<R, C, wgmma::Swizzle::S, wgmma::Swizzle::D>(in, out);                                            \
  }
LAB_TRANSPOSE(128, 64, B64, B128)
LAB_TRANSPOSE(128, 128, B128, B128)
LAB_TRANSPOSE(256, 128, B128, B128)
LAB_TRANSPOSE(128, 64, None, B64)
LAB_TRANSPOSE(128, 128, B32, None)
extern "C" __global__ void __launch_bounds__(128) transpose_local_r128_c128_B128_B128(const unsigned char* in,
                                                                                   unsigned char* out) {
  transpose<128, 128, wgmma::Swizzle::B128, wgmma::Swizzle::B128, relayout::LocalKeys>(in, out);
}
// out [64][N] of T from in [64][N] f32 through frag::wgmma_d and store_rows.
template <class T, int N>
__device__ void store(const float* in, float scale, T* out, int valid_rows) {
  const int t = threadIdx.x;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = in[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)];
  relayout::store_rows<T, N>(acc, scale, out, N, valid_rows);
}
extern "C" __global__ void __launch_bounds__(128) store_n128_bf16(const float* in, float scale, __nv_bfloat16* out,
                                                                   int valid_rows) {
  store<__nv_bfloat16, 128>(in, scale, out, valid_rows);
}
extern "C" __global__ void __launch_bounds__(128) store_n64_f16(const float* in, float scale, __half* out,
                                                                int valid_rows) {
  store<__half, 64>(in, scale, out, valid_rows);
}
extern "C" __global__ void __launch_bounds__(128) store_n64_f32(const float* in, float scale, float* out, int valid_rows) {
  store<float, 64>(in, scale, out, valid_rows);
}
// out [ceil(64 / group)][heads][N] of f16 from in [64][N] f32 through store_rows_at with GroupedRows: row r at token
// r / group, head r % group (heads ≥ group: the first K/V head's query heads of an O of `heads` heads).
extern "C" __global__ void __launch_bounds__(128) store_grouped_n64_f16(const float* in, float scale, __half* out,
                                                                        int valid_rows, int group, int heads) {
  constexpr int N = 64;
  const int t = threadIdx.x;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = in[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)];
  relayout::store_rows_at<__half, N>(acc, scale, out, relayout::GroupedRows{group, (long long)heads * N, N}, valid_rows);
}

// out: the 8 KiB shared-memory panel P of in [64][N] f32 (through frag::wgmma_d) as stage_panel writes it, bytes
// as they sit in shared memory (the image a TMA store with a 128-byte swizzle reads); rows 8..15 of every 16 at
// half the scale.
template <class T, int N, int P>
__device__ void stage(const float* in, float scale, unsigned char* out) {
  __shared__ __align__(1024) unsigned char panel[64 * 128];
  const int t = threadIdx.x;
  for (int i = t; i < 64 * 128 / 4; i += 128) reinterpret_cast<unsigned*>(panel)[i] = 0xFFFFFFFFu;
  __syncthreads();
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = in[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)];
  const float rows[2] = {scale, 0.5f * scale};  // a factor per row half (rows r and r + 8 of a quad)
  relayout::stage_panel<T, N, P>(acc, rows, panel);
  __syncthreads();
  for (int i = t; i < 64 * 128 / 4; i += 128) reinterpret_cast<unsigned*>(out)[i] = reinterpret_cast<unsigned*>(panel)[i];
}
extern "C" __global__ void __launch_bounds__(128) stage_n128_p1_bf16(const float* in, float scale, unsigned char* out) {
  stage<__nv_bfloat16, 128, 1>(in, scale, out);
}
extern "C" __global__ void __launch_bounds__(128) stage_n64_p0_f16(const float* in, float scale, unsigned char* out) {
  stage<__half, 64, 0>(in, scale, out);
}

// O[64][D] = P[64][KEYS] V[KEYS][D]: P (f32, as a Q.K^T accumulator) through acc_to_a_e4m3, V (E4M3 rows, as a
// TMA tile would hold them: canonical [KEYS][D] tile) through transpose_tile into the K-major B operand, one
// wgmma per 32 keys, O through store_rows. Every step is a block of this lab; the product is exact for the
// integer inputs the host picks.
template <bool LOCAL>
struct KeysFor {
  using T = relayout::InOrder;
};
template <>
struct KeysFor<true> {
  using T = relayout::LocalKeys;
};
template <int KEYS, int D, wgmma::Swizzle VSW, wgmma::Swizzle BSW, class T, bool LOCAL = false>
__device__ void pv(const float* p, const unsigned char* v, T* o) {
  extern __shared__ unsigned char raw[];
  unsigned char* vs = raw + ((1024 - (wgmma::smem_addr(raw) & 1023)) & 1023);
  unsigned char* bt = vs + (wgmma::tile_bytes(VSW, KEYS, D) + 1023) / 1024 * 1024;
  const int t = threadIdx.x;
  for (int i = t; i < KEYS * D / 4; i += 128) {
    const int r = i / (D / 4), c = i % (D / 4) * 4;
    *reinterpret_cast<unsigned*>(vs + wgmma::tile_byte(VSW, KEYS, r, c)) =
        *reinterpret_cast<const unsigned*>(v + r * D + c);
  }
  __syncthreads();
  relayout::Transpose<KEYS, D, VSW, BSW, 128, typename KeysFor<LOCAL>::T>(t).run(vs, bt);
  wgmma::publish_smem();
  float s[KEYS / 2];
#pragma unroll
  for (int i = 0; i < KEYS / 2; ++i) s[i] = p[frag::wgmma_d_row(t, i) * KEYS + frag::wgmma_d_col(t, i)];
  unsigned a[KEYS / 32][4];
  if constexpr (LOCAL)
    relayout::acc_to_a_e4m3_local<KEYS>(s, 1.0f, a);
  else
    relayout::acc_to_a_e4m3<KEYS>(s, 1.0f, a);
  float acc[D / 2];
  wgmma::gemm_rs_sync<D, wg::e4m3, wg::e4m3, KEYS / 32>(acc, a, BSW, bt);
  relayout::store_rows<T, D>(acc, 1.0f, o, D, 64);
}
extern "C" __global__ void __launch_bounds__(128, 1) pv_k128_d64_f16(const float* p, const unsigned char* v, __half* o) {
  pv<128, 64, wgmma::Swizzle::B64, wgmma::Swizzle::B128, __half>(p, v, o);
}
extern "C" __global__ void __launch_bounds__(128, 1) pv_k128_d128_bf16(const float* p, const unsigned char* v,
                                                                       __nv_bfloat16* o) {
  pv<128, 128, wgmma::Swizzle::B128, wgmma::Swizzle::B128, __nv_bfloat16>(p, v, o);
}
// The pairing stage 5 uses: P in its own accumulator order, V's keys permuted to match (p_key).
extern "C" __global__ void __launch_bounds__(128, 1) pv_local_k128_d128_bf16(const float* p, const unsigned char* v,
                                                                             __nv_bfloat16* o) {
  pv<128, 128, wgmma::Swizzle::B128, wgmma::Swizzle::B128, __nv_bfloat16, true>(p, v, o);
}
extern "C" __global__ void __launch_bounds__(128, 1) pv_local_k128_d64_f16(const float* p, const unsigned char* v,
                                                                           __half* o) {
  pv<128, 64, wgmma::Swizzle::B64, wgmma::Swizzle::B128, __half, true>(p, v, o);
}
