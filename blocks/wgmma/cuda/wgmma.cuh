// wgmma.cuh: Hopper's warpgroup MMA on sm_90a: shared-memory descriptors, the canonical K-major tiles, fences, commit, wait.
//
// One source of truth with blocks/frag-layout/src/smem.rs (frag_layout::Desc): the tile functions below are
// static_asserted against the Rust model at compile time (wgmma::header_checks()), and the model is probed on
// the H100. The instructions themselves are frag-layout's generated wgmma_instr.cuh (wg::Mma<N, TA, TB>).
//
// The life of one asynchronous GEMM, as every user writes it:
//   write A/B tiles with ordinary stores   -> wgmma::publish_smem()   (fence.proxy.async + barrier)
//   wgmma::fence()                          (before the first wgmma that touches these accumulators)
//   wgmma::mma_ss / mma_rs ... per K-step   (asynchronous: returns at once; mma_rs_first: the first steps only)
//   wgmma::commit()                          (closes a group)
//   wgmma::wait<N>()                         (at most N groups still in flight; 0 = all done)
//   wgmma::fence_operand(d)                  (no compiler-moved read of d above the wait)
// Overwriting a tile that an in-flight wgmma reads, or reading d before the wait, is a silent wrong answer.
#pragma once
#include "wgmma_instr.cuh"

namespace wgmma {

// The lab's numbering, equal to CUtensorMapSwizzle (CU_TENSOR_MAP_SWIZZLE_NONE .. _128B), so a TMA map and a
// descriptor are made from the same value.
enum class Swizzle : int { None = 0, B32 = 1, B64 = 2, B128 = 3 };

__host__ __device__ constexpr unsigned row_bytes(Swizzle s) {
  return s == Swizzle::None ? 16u : s == Swizzle::B32 ? 32u : s == Swizzle::B64 ? 64u : 128u;
}
// The descriptor's bits 62-63: none 0, 128B 1, 64B 2, 32B 3.
__host__ __device__ constexpr unsigned long long mode_bits(Swizzle s) {
  return s == Swizzle::None ? 0ull : s == Swizzle::B128 ? 1ull : s == Swizzle::B64 ? 2ull : 3ull;
}
__host__ __device__ constexpr unsigned xor_bits(Swizzle s) {
  return s == Swizzle::None ? 0u : s == Swizzle::B32 ? 1u : s == Swizzle::B64 ? 2u : 3u;
}
// Address bits [4, 4+B) ^= bits [7, 7+B): on absolute shared-memory addresses, so tiles start 1024-aligned.
__host__ __device__ constexpr unsigned swizzle(Swizzle s, unsigned addr) {
  return addr ^ (((addr >> 7) & ((1u << xor_bits(s)) - 1u)) << 4);
}

struct TileDesc {
  unsigned start, lbo, sbo;
  Swizzle sw;
};

// The canonical K-major tile of `rows` rows at K-step `step` (32 bytes of K per wgmma), as
// frag_layout::Desc::k_major: swizzled rows are row_bytes apart, 8-row groups 8*row_bytes apart (SBO), and K
// beyond the swizzle width continues in further rows*row_bytes panels; without swizzle, 8x16-byte core
// matrices, K-adjacent ones rows/8*128 bytes apart (LBO), row-adjacent ones 128 apart (SBO).
__host__ __device__ constexpr TileDesc k_major(Swizzle s, int rows, int step) {
  if (s == Swizzle::None) {
    const unsigned lbo = unsigned(rows) / 8u * 128u;
    return TileDesc{unsigned(step) * 2u * lbo, lbo, 128u, s};
  }
  const unsigned w = row_bytes(s), per_panel = w / 32u;
  return TileDesc{unsigned(step) / per_panel * unsigned(rows) * w + unsigned(step) % per_panel * 32u, 16u, 8u * w, s};
}

// Bytes the canonical tile of `rows` rows and `k_bytes` bytes of K occupies.
__host__ __device__ constexpr unsigned tile_bytes(Swizzle s, int rows, int k_bytes) {
  return s == Swizzle::None ? unsigned(rows * k_bytes)
                            : unsigned(rows) * row_bytes(s) * ((unsigned(k_bytes) + row_bytes(s) - 1u) / row_bytes(s));
}

// The byte the instruction reads for (row, byte kb < 32 of this K-step).
__host__ __device__ constexpr unsigned byte_of(TileDesc d, int row, int kb) {
  return d.sw == Swizzle::None
             ? d.start + unsigned(row / 8) * d.sbo + unsigned(kb / 16) * d.lbo + unsigned(row % 8) * 16u + unsigned(kb % 16)
             : swizzle(d.sw, d.start + unsigned(row / 8) * d.sbo + unsigned(row % 8) * row_bytes(d.sw) + unsigned(kb));
}

// Where byte kb (any K) of row `row` goes when the tile is written with ordinary stores.
__host__ __device__ constexpr unsigned tile_byte(Swizzle s, int rows, int row, int kb) {
  return byte_of(k_major(s, rows, kb / 32), row, kb % 32);
}

// The 64-bit matrix descriptor for a tile based at shared-memory address `base` (PTX ISA "Matrix Descriptor
// Format": start >> 4 in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 0, swizzle in 62-63).
__host__ __device__ constexpr unsigned long long encode(TileDesc d, unsigned base) {
  return (unsigned long long)(((base + d.start) & 0x3FFFFu) >> 4) |
         (unsigned long long)((d.lbo >> 4) & 0x3FFFu) << 16 | (unsigned long long)((d.sbo >> 4) & 0x3FFFu) << 32 |
         mode_bits(d.sw) << 62;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The descriptor of K-step `step` of the canonical tile at `tile` (1024-byte aligned).
__device__ __forceinline__ unsigned long long desc(Swizzle s, int rows, int step, const void* tile) {
  return encode(k_major(s, rows, step), smem_addr(tile));
}

// What K-step `step` adds to the descriptor of step 0: its start offset in the 16-byte units of bits 0-13. The
// tile GEMMs below build one descriptor per operand and add this a step, rather than rebuilding each step's
// from the address (ptxas kept ~9 uniform-datapath instructions a K-step for that). Exact because a
// shared-memory address plus a tile's extent stays below 2^18 (a block has at most 227 KiB on sm_90), so the
// 14-bit start field never carries into LBO.
__host__ __device__ constexpr unsigned long long step_offset(Swizzle s, int rows, int step) {
  return k_major(s, rows, step).start >> 4;
}

// ---- ordering ----
// Ordinary stores to shared memory become visible to wgmma / TMA (the async proxy) only after this, in each
// writing thread, before the barrier that orders them.
__device__ __forceinline__ void proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void publish_smem() {
  proxy_fence();
  __syncthreads();
}
// wgmma.fence: orders earlier register writes (accumulators, register A) before the next wgmma reads them.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins each accumulator register at this point, so the compiler moves no access of d across a wait.
template <int R>
__device__ __forceinline__ void fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- one tile GEMM: D[64 x N] (+)= A[64 x K] B[N x K]^T over STEPS K-steps ----
// Issues the K-steps as one group; the first overwrites D unless `accumulate`. mma_ss_desc takes the tiles'
// step-0 descriptors (desc(sa, 64, 0, a), desc(sb, N, 0, b)), for a loop that builds them once: a tile 1024·k
// bytes further on is the descriptor plus k·64 (the start field counts 16-byte units); mma_ss builds them.
template <int N, class TA, class TB, int STEPS>
__device__ __forceinline__ void mma_ss_desc(float (&d)[N / 2], Swizzle sa, unsigned long long da, Swizzle sb,
                                            unsigned long long db, bool accumulate) {
#pragma unroll
  for (int s = 0; s < STEPS; ++s)
    wg::Mma<N, TA, TB>::ss(d, da + step_offset(sa, 64, s), db + step_offset(sb, N, s), (s > 0 || accumulate) ? 1 : 0);
}
template <int N, class TA, class TB, int STEPS>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], Swizzle sa, const void* a, Swizzle sb, const void* b,
                                       bool accumulate) {
  mma_ss_desc<N, TA, TB, STEPS>(d, sa, desc(sa, 64, 0, a), sb, desc(sb, N, 0, b), accumulate);
}
// A from registers: a[s] holds K-step s as frag::wgmma_a_k32 / _k16 lays it out.
template <int N, class TA, class TB, int STEPS>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const unsigned (&a)[STEPS][4], Swizzle sb, const void* b,
                                       bool accumulate) {
  const unsigned long long db = desc(sb, N, 0, b);
#pragma unroll
  for (int s = 0; s < STEPS; ++s)
    wg::Mma<N, TA, TB>::rs(d, a[s], db + step_offset(sb, N, s), (s > 0 || accumulate) ? 1 : 0);
}
// mma_rs's first `steps` K-steps only (0 < steps <= STEPS, the same in every thread of the warpgroup): where A is
// zero past them (P past a key tile's last valid key), the same D for less tensor-core work. Each count is its own
// branch of straight-line wgmmas: a guard on each instruction made ptxas fence and complete them one by one.
template <int N, class TA, class TB, int STEPS, int K = STEPS>
__device__ __forceinline__ void mma_rs_first(float (&d)[N / 2], const unsigned (&a)[STEPS][4], Swizzle sb,
                                             const void* b, bool accumulate, int steps) {
  if constexpr (K > 1) {
    if (steps < K) return mma_rs_first<N, TA, TB, STEPS, K - 1>(d, a, sb, b, accumulate, steps);
  }
  const unsigned long long db = desc(sb, N, 0, b);
#pragma unroll
  for (int s = 0; s < K; ++s)
    wg::Mma<N, TA, TB>::rs(d, a[s], db + step_offset(sb, N, s), (s > 0 || accumulate) ? 1 : 0);
}

// The synchronous tile GEMM: fence, the K-steps, commit, wait for all, pin d. What a test (or a first stage)
// calls when it has nothing to overlap.
template <int N, class TA, class TB, int STEPS>
__device__ __forceinline__ void gemm_ss_sync(float (&d)[N / 2], Swizzle sa, const void* a, Swizzle sb, const void* b,
                                             bool accumulate = false) {
  fence_operand(d);
  fence();
  mma_ss<N, TA, TB, STEPS>(d, sa, a, sb, b, accumulate);
  commit();
  wait<0>();
  fence_operand(d);
}
template <int N, class TA, class TB, int STEPS>
__device__ __forceinline__ void gemm_rs_sync(float (&d)[N / 2], const unsigned (&a)[STEPS][4], Swizzle sb, const void* b,
                                             bool accumulate = false) {
  fence_operand(d);
  fence();
  mma_rs<N, TA, TB, STEPS>(d, a, sb, b, accumulate);
  commit();
  wait<0>();
  fence_operand(d);
}

}  // namespace wgmma
