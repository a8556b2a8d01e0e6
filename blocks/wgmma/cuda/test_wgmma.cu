// test_wgmma.cu: one warpgroup computes D[64 x N] = A[64 x K] B[N x K]^T from global memory, for every swizzle and A source.
#include "frag_layout.cuh"
#include "wgmma.cuh"

constexpr int kKBytes = 128;  // four K-steps of 32 bytes: every swizzle's panels and start offsets are crossed
constexpr int kSteps = kKBytes / 32;

// a: [64][kKBytes] and b: [N][kKBytes] bytes, K contiguous; d: [64][N] f32 row-major. `swz` is the
// wgmma::Swizzle of both tiles (a run-time value, as a TMA map's would be).
// Both tiles into dynamic shared memory, `sw`-swizzled; the B tile's address.
__device__ unsigned char* load_tiles(const unsigned char* a, const unsigned char* b, int n, wgmma::Swizzle sw,
                                     unsigned char** sa_out) {
  extern __shared__ unsigned char raw[];
  const unsigned addr = wgmma::smem_addr(raw);
  unsigned char* sa = raw + ((1024 - (addr & 1023)) & 1023);
  unsigned char* sb = sa + 64 * kKBytes;  // every swizzle's tile of 128 bytes of K is rows * 128 bytes
  const int t = threadIdx.x;
  // 4-byte words: a word never straddles a 16-byte chunk, the unit every swizzle permutes.
  for (int i = t; i < 64 * kKBytes / 4; i += 128) {
    const int row = i / (kKBytes / 4), kb = i % (kKBytes / 4) * 4;
    *reinterpret_cast<unsigned*>(sa + wgmma::tile_byte(sw, 64, row, kb)) =
        *reinterpret_cast<const unsigned*>(a + row * kKBytes + kb);
  }
  for (int i = t; i < n * kKBytes / 4; i += 128) {
    const int row = i / (kKBytes / 4), kb = i % (kKBytes / 4) * 4;
    *reinterpret_cast<unsigned*>(sb + wgmma::tile_byte(sw, n, row, kb)) =
        *reinterpret_cast<const unsigned*>(b + row * kKBytes + kb);
  }
  wgmma::publish_smem();
  *sa_out = sa;
  return sb;
}

// A [64][kKBytes] in the A-operand registers of thread t, K-step by K-step.
template <class TA, class TB, int N>
__device__ void a_registers(const unsigned char* a, int t, unsigned (&ar)[kSteps][4]) {
  constexpr int kElem = wg::Mma<N, TA, TB>::kK == 32 ? 1 : 2;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      unsigned w = 0;
#pragma unroll
      for (int j = 0; j < 4 / kElem; ++j) {
        const int e = q * (4 / kElem) + j;
        const int row = kElem == 1 ? frag::wgmma_a_k32_row(t, e) : frag::wgmma_a_k16_row(t, e);
        const int col = kElem == 1 ? frag::wgmma_a_k32_col(t, e) : frag::wgmma_a_k16_col(t, e);
        const unsigned char* p = a + row * kKBytes + s * 32 + col * kElem;
        const unsigned v = kElem == 1 ? unsigned(p[0]) : unsigned(p[0]) | unsigned(p[1]) << 8;
        w |= v << (8 * kElem * j);
      }
      ar[s][q] = w;
    }
  }
}

// a: [64][kKBytes] and b: [N][kKBytes] bytes, K contiguous; d: [64][N] f32 row-major. `swz` is the
// wgmma::Swizzle of both tiles (a run-time value, as a TMA map's would be).
// FIRST (A from registers): through mma_rs_first, only the first `steps` K-steps of A and B.
template <class TA, class TB, int N, bool A_REGS, bool FIRST = false>
__device__ void gemm(const unsigned char* a, const unsigned char* b, int swz, float* d_out, int steps = kSteps) {
  const wgmma::Swizzle sw = static_cast<wgmma::Swizzle>(swz);
  const int t = threadIdx.x;
  unsigned char* sa;
  unsigned char* sb = load_tiles(a, b, N, sw, &sa);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = -1.0f;  // overwritten: the first K-step does not accumulate
  if constexpr (A_REGS) {
    unsigned ar[kSteps][4];
    a_registers<TA, TB, N>(a, t, ar);
    if constexpr (FIRST) {
      wgmma::fence_operand(d);
      wgmma::fence();
      wgmma::mma_rs_first<N, TA, TB, kSteps>(d, ar, sw, sb, false, steps);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operand(d);
    } else {
      wgmma::gemm_rs_sync<N, TA, TB, kSteps>(d, ar, sw, sb);
    }
  } else {
    wgmma::gemm_ss_sync<N, TA, TB, kSteps>(d, sw, sa, sw, sb);
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d_out[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)] = d[i];
}

// Two GEMMs through one B tile: D1 = kRepeat * A B1^T (kRepeat passes over the tile, so that the first GEMM is
// long), then B2 is written over B1 and D2 = A B2^T. The wait between them is all that keeps B2's stores, which
// go out last K-step first and from registers loaded beforehand, from racing the first GEMM's reads (ptxas waits
// before accumulator reads on its own, never before shared-memory stores). d: [2][64][N].
constexpr int kRepeat = 8;
template <class TA, class TB, int N>
__device__ void reuse(const unsigned char* a, const unsigned char* b1, const unsigned char* b2, float* d_out) {
  extern __shared__ unsigned char raw[];
  const unsigned addr = wgmma::smem_addr(raw);
  unsigned char* sa = raw + ((1024 - (addr & 1023)) & 1023);
  unsigned char* sb = sa + 64 * kKBytes;
  constexpr wgmma::Swizzle sw = wgmma::Swizzle::B128;
  constexpr int kWords = N * kKBytes / 4 / 128;  // B2 words per thread
  const int t = threadIdx.x;
  for (int i = t; i < 64 * kKBytes / 4; i += 128) {
    const int row = i / (kKBytes / 4), kb = i % (kKBytes / 4) * 4;
    *reinterpret_cast<unsigned*>(sa + wgmma::tile_byte(sw, 64, row, kb)) =
        *reinterpret_cast<const unsigned*>(a + row * kKBytes + kb);
  }
  for (int i = t; i < N * kKBytes / 4; i += 128) {
    const int row = i / (kKBytes / 4), kb = i % (kKBytes / 4) * 4;
    *reinterpret_cast<unsigned*>(sb + wgmma::tile_byte(sw, N, row, kb)) =
        *reinterpret_cast<const unsigned*>(b1 + row * kKBytes + kb);
  }
  unsigned w2[kWords];  // word j: row (t + 128 j) % N, bytes from the end of K backwards
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const int i = t + 128 * j, row = i % N, kb = kKBytes - 4 - i / N * 4;
    w2[j] = *reinterpret_cast<const unsigned*>(b2 + row * kKBytes + kb);
  }
  wgmma::publish_smem();
  float d1[N / 2], d2[N / 2];
  wgmma::fence();
#pragma unroll
  for (int r = 0; r < kRepeat; ++r) wgmma::mma_ss<N, TA, TB, kSteps>(d1, sw, sa, sw, sb, r > 0);
  wgmma::commit();
  wgmma::wait<0>();  // the first GEMM has read B1
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    const int i = t + 128 * j, row = i % N, kb = kKBytes - 4 - i / N * 4;
    *reinterpret_cast<unsigned*>(sb + wgmma::tile_byte(sw, N, row, kb)) = w2[j];
  }
  wgmma::publish_smem();
  wgmma::fence();
  wgmma::mma_ss<N, TA, TB, kSteps>(d2, sw, sa, sw, sb, false);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operand(d1);
  wgmma::fence_operand(d2);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    d_out[frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)] = d1[i];
    d_out[64 * N + frag::wgmma_d_row(t, i) * N + frag::wgmma_d_col(t, i)] = d2[i];
  }
}

extern "C" __global__ void __launch_bounds__(128, 1)
    reuse_e4m3_e4m3_n128(const unsigned char* a, const unsigned char* b1, const unsigned char* b2, float* d) {
  reuse<wg::e4m3, wg::e4m3, 128>(a, b1, b2, d);
}

// gemm's FP8 N = 128 GEMM with A from registers, through mma_rs_first: its first `steps` K-steps only.
extern "C" __global__ void __launch_bounds__(128, 1)
    first_steps_e4m3_e4m3_n128(const unsigned char* a, const unsigned char* b, int swz, int steps, float* d) {
  gemm<wg::e4m3, wg::e4m3, 128, true, true>(a, b, swz, d, steps);
}

#define LAB_WGMMA_GEMM(TA, TB, N, SRC, AREGS)                                                              \
  extern "C" __global__ void __launch_bounds__(128, 1)                                                     \
      gemm_##TA##_##TB##_n##N##_##SRC(const unsigned char* a, const unsigned char* b, int swz, float* d) { \
    gemm<wg::TA, wg::TB, N, AREGS>(a, b, swz, d);                                                          \
  }
#define LAB_WGMMA_GEMMS(TA, TB)               \
  LAB_WGMMA_GEMM(TA, TB, 64, ss, false)       \
  LAB_WGMMA_GEMM(TA, TB, 64, rs, true)        \
  LAB_WGMMA_GEMM(TA, TB, 128, ss, false)      \
  LAB_WGMMA_GEMM(TA, TB, 128, rs, true)       \
  LAB_WGMMA_GEMM(TA, TB, 256, ss, false)      \
  LAB_WGMMA_GEMM(TA, TB, 256, rs, true)

LAB_WGMMA_GEMMS(e4m3, e4m3)
LAB_WGMMA_GEMMS(e4m3, e5m2)
LAB_WGMMA_GEMMS(e5m2, e4m3)
LAB_WGMMA_GEMMS(e5m2, e5m2)
LAB_WGMMA_GEMMS(f16, f16)
LAB_WGMMA_GEMMS(bf16, bf16)
