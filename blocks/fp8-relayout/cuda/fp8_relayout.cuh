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
//    B operand of P.V ([d][keys]). 8-bit data has no ldmatrix.trans; each thread moves 8x8-byte blocks through
//    registers with byte permutes (Transpose: offsets computed once, reused every tile; TransposeLean: offsets
//    computed as it goes, for a producer warpgroup's 40 registers).
//    TransposeLdsm: the same transpose, V's keys landing in p_key order, a warp moving 16 keys x 32 channels at a
//    time by ldmatrix.x4.trans (16-bit pairs of channels), four byte permutes and stmatrix.x4: ~8 instructions a
//    512-byte unit a warp, against TransposeLean's ~100 an 8x8-byte block a thread (FlashAttention-3's Transpose_V).
// 3. store_rows: an f32 accumulator (frag::wgmma_d) times `scale` to bf16, f16 or f32 rows in global memory, rows past
//    `valid_rows` skipped; rows evenly spaced (RowPitch) or in groups (GroupedRows: packed grouped-query heads, row r
//    the head r % group of token r / group).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "fp8_codec.cuh"
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

// The key that A slot k (0 .. 31 of a K-step) holds in acc_to_a_e4m3_local's order: thread q of a quad keeps
// its own accumulator pairs, keys 2q, 2q+1, 8+2q, 9+2q in slots 4q .. 4q+3, and 16+2q, 17+2q, 24+2q, 25+2q in
// slots 16+4q .. 16+4q+3. A permutation of the 32 keys of the step; Σ_k P[k]·V[k] does not care, so long as
// V's K-major tile puts key p_key(k) at K position k (Transpose<..., LocalKeys>).
template <class T>
__host__ __device__ constexpr T p_key(T slot) {
  return 32 * (slot / 32) + 16 * (slot % 32 / 16) + 8 * (slot % 4 / 2) + 2 * (slot % 16 / 4) + slot % 2;
}

// acc_to_a_e4m3 without the shuffles, one K-step: the A registers of keys 32s .. 32s + 31 from accumulator
// cells 16s .. 16s + 15, every thread packing its own values in p_key order.
template <int N>
__device__ __forceinline__ void acc_to_a_e4m3_step(const float (&acc)[N / 2], int s, float scale, unsigned (&a)[4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * s + 2 * half;  // pairs j = 0..3 of this row at i + 4j
    a[half] = e4m3x2(acc[i] * scale, acc[i + 1] * scale) | e4m3x2(acc[i + 4] * scale, acc[i + 5] * scale) << 16;
    a[2 + half] = e4m3x2(acc[i + 8] * scale, acc[i + 9] * scale) | e4m3x2(acc[i + 12] * scale, acc[i + 13] * scale) << 16;
  }
}

// acc_to_a_e4m3 without the shuffles: every thread packs its own accumulator values, in p_key order.
template <int N>
__device__ __forceinline__ void acc_to_a_e4m3_local(const float (&acc)[N / 2], float scale, unsigned (&a)[N / 32][4]) {
#pragma unroll
  for (int s = 0; s < N / 32; ++s) acc_to_a_e4m3_step<N>(acc, s, scale, a[s]);
}

// Which source row lands at K position k of a transposed tile: in order, or in acc_to_a_e4m3_local's key order.
struct InOrder {
  __host__ __device__ static constexpr int row(int k) { return k; }
  __host__ __device__ static constexpr unsigned row_u(unsigned k) { return k; }
};
struct LocalKeys {
  __host__ __device__ static constexpr int row(int k) { return p_key(k); }
  // p_key on unsigned operands (shifts and masks).
  __host__ __device__ static constexpr unsigned row_u(unsigned k) { return p_key(k); }
};

// Which 8x8-byte block (rb, cb) = (rows 8rb.., bytes 8cb..) block number n of the tile is, for a tile of NC =
// COLS / 8 block columns (NC divides 16). The 16 blocks of a half-warp (n / 16) lie on a wrapped diagonal of a
// 16-block-row band: 16 different rb, and NC different cb. A 64-bit access's bank depends, inside one swizzle
// atom, on the block column for the loads (all rows of one load share r % 8) and on the block row for the stores:
// with 128-byte-swizzled tiles on both sides (V of D = 128) both are conflict-free (fp8_relayout::
// transpose_conflicts counts them); with a 64-byte-swizzled source (D = 64) the loads are 2-way.
// On int (Transpose) or unsigned (TransposeLean: shifts and masks).
template <class T>
__host__ __device__ constexpr T transpose_rb(T n, T nc) {
  return 16 * (n / 16 / nc) + (n % 16 + n / 16 % nc) % 16;
}
template <class T>
__host__ __device__ constexpr T transpose_cb(T n, T nc) {
  return n % 16 % nc;
}

// 4x4 byte transpose: t[j] byte i = w[i] byte j.
__device__ __forceinline__ void transpose4(const unsigned (&w)[4], unsigned (&t)[4]) {
  const unsigned x0 = __byte_perm(w[0], w[1], 0x5140), x1 = __byte_perm(w[0], w[1], 0x7362);
  const unsigned x2 = __byte_perm(w[2], w[3], 0x5140), x3 = __byte_perm(w[2], w[3], 0x7362);
  t[0] = __byte_perm(x0, x2, 0x5410);
  t[1] = __byte_perm(x0, x2, 0x7632);
  t[2] = __byte_perm(x1, x3, 0x5410);
  t[3] = __byte_perm(x1, x3, 0x7632);
}

// dst[c][k] = src[KEYS::row(k)][c] for a ROWS x COLS byte tile, both in the canonical K-major layout (SRC: ROWS
// rows of COLS bytes; DST: COLS rows of ROWS bytes), by THREADS threads. Built once (the byte offsets of a thread's blocks are
// the same for every tile: a stage builds it before its K/V loop), run once a tile. Each thread moves 8x8-byte
// blocks: eight 64-bit loads (rows 8rb.., bytes 8cb..), 32 byte permutes, eight 64-bit stores (rows 8cb.. of the
// destination, bytes 8rb..); an aligned 8-byte unit never straddles a 16-byte swizzle chunk. The caller publishes
// dst (wgmma::publish_smem) before a wgmma reads it.
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, int THREADS, class KEYS = InOrder>
struct Transpose {
  static_assert(ROWS % 128 == 0 && COLS % 64 == 0 && COLS <= 128, "16-block-row bands of 64 or 128 bytes");
  static constexpr int kNc = COLS / 8, kBlocks = ROWS / 8 * kNc;
  static constexpr int kPer = (kBlocks + THREADS - 1) / THREADS;  // blocks a thread moves
  unsigned src_off[kPer][8], dst_off[kPer][8];
  bool live[kPer];

  __device__ explicit Transpose(int tid) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int n = tid + j * THREADS;
      live[j] = kBlocks % THREADS == 0 || n < kBlocks;
      const int rb = transpose_rb(n, kNc), cb = transpose_cb(n, kNc);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        src_off[j][i] = wgmma::tile_byte(SRC, ROWS, KEYS::row(8 * rb + i), 8 * cb);
        dst_off[j][i] = wgmma::tile_byte(DST, COLS, 8 * cb + i, 8 * rb);
      }
    }
  }

  __device__ void run(const unsigned char* src, unsigned char* dst) const {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (!live[j]) continue;
      unsigned lo[8], hi[8];  // row i of the block: bytes 0..3, 4..7
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint2 v = *reinterpret_cast<const uint2*>(src + src_off[j][i]);
        lo[i] = v.x;
        hi[i] = v.y;
      }
      // Quadrants: out row i < 4 takes (lo of rows 0-3, lo of rows 4-7) transposed; row 4 + i the his.
      unsigned a[4], b[4], c[4], d[4];
      transpose4({lo[0], lo[1], lo[2], lo[3]}, a);
      transpose4({lo[4], lo[5], lo[6], lo[7]}, b);
      transpose4({hi[0], hi[1], hi[2], hi[3]}, c);
      transpose4({hi[4], hi[5], hi[6], hi[7]}, d);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        *reinterpret_cast<uint2*>(dst + dst_off[j][i]) = make_uint2(a[i], b[i]);
        *reinterpret_cast<uint2*>(dst + dst_off[j][4 + i]) = make_uint2(c[i], d[i]);
      }
    }
  }
};

// TransposeLean's blocks (mirrored by the model's lean_block). With 16 block columns (128 channels) a half-warp
// (h = n / 16) takes the 16 block columns of one 32-key panel's 4 block rows, lane l the column l, and stores its
// 4-channel groups rotated by l % 4: a 32-byte-swizzled destination (Vᵀ of 224 keys) puts a store's bank at the
// channel's row % 4 and the block row % 4, which then differ across the half-warp (no conflict; the loads see 16
// block columns, none either). With 8 block columns it is Transpose's diagonal, unrotated.
// Unsigned, so that the divisions are shifts.
__host__ __device__ constexpr unsigned lean_rb(unsigned n, unsigned nc) {
  return nc == 16 ? 4 * (n / 64) + (n % 16 / 4 + n / 16) % 4 : transpose_rb(n, nc);
}
__host__ __device__ constexpr unsigned lean_cb(unsigned n, unsigned nc) { return nc == 16 ? n % 16 : transpose_cb(n, nc); }
__host__ __device__ constexpr unsigned lean_rot(unsigned n, unsigned nc) { return nc == 16 ? n % 4 : 0; }

// transpose4 with the output rotated: t[j] byte i = w[i] byte (j + rot) % 4, the rotation folded into the first
// permutes' selectors (sel01, sel23: lean_selectors), so it costs no instruction of its own.
__device__ __forceinline__ void transpose4_rot(const unsigned (&w)[4], unsigned sel01, unsigned sel23, unsigned (&t)[4]) {
  const unsigned x0 = __byte_perm(w[0], w[1], sel01), x1 = __byte_perm(w[0], w[1], sel23);
  const unsigned x2 = __byte_perm(w[2], w[3], sel01), x3 = __byte_perm(w[2], w[3], sel23);
  t[0] = __byte_perm(x0, x2, 0x5410);
  t[1] = __byte_perm(x0, x2, 0x7632);
  t[2] = __byte_perm(x1, x3, 0x5410);
  t[3] = __byte_perm(x1, x3, 0x7632);
}
// transpose4's first selectors (0x5140, 0x7362) for bytes rot, rot + 1 and rot + 2, rot + 3 (mod 4).
__host__ __device__ constexpr unsigned lean_selector(int rot, int first) {
  const unsigned a = unsigned(first + rot) % 4u, b = unsigned(first + 1 + rot) % 4u;
  return a | (4u + a) << 4 | b << 8 | (4u + b) << 12;
}

// Transpose for threads with few registers (a producer warpgroup after setmaxnreg): the same dst[c][k] =
// src[KEYS::row(k)][c], 8x8-byte blocks through byte permutes, but each block's offsets are computed as it goes
// (Transpose holds 16 a block) and cheaply: V's rows are one swizzle panel (COLS = the source's swizzle width), so
// a block's 8 source rows are one base plus constants, and its 8 destination rows (channels 8cb + 4g + ρ) one
// base plus a per-thread rotation; offsets_exact checks both against wgmma::tile_byte for every block. ROWS may
// be any multiple of 32 (224 keys: Vᵀ in 32-byte panels). Thread tid of THREADS moves blocks tid, tid + THREADS, …
// in lean_rb / lean_cb's order: ~100 instructions a block. Stage 7 with V transposed by this in its producer
// warpgroup (three warps, a 28 KiB staging tile) measured 11–13% slower than with Vᵀ made beforehand, and is not
// kept (docs/decisions.md, "V transposed in the kernel").
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, int THREADS, class KEYS = InOrder>
struct TransposeLean {
  static constexpr int kNc = COLS / 8, kBlocks = ROWS / 8 * kNc;
  static constexpr unsigned kW = wgmma::row_bytes(SRC), kWd = wgmma::row_bytes(DST);
  static_assert(ROWS % 32 == 0 && (COLS == 128 || (COLS == 64 && ROWS % 128 == 0)),
                "32-key panels of 128 channels, or 128-key bands of 64");
  static_assert(SRC != wgmma::Swizzle::None && DST != wgmma::Swizzle::None && unsigned(COLS) == kW,
                "swizzled tiles, the source's rows one panel");
  static_assert(THREADS % 16 == 0, "a thread's lane in its half-warp is the same for each of its blocks");
  static constexpr int kPer = (kBlocks + THREADS - 1) / THREADS;

  // The swizzle's XOR (in 16-byte units) of source row r and of destination row c.
  __host__ __device__ static constexpr unsigned src_sw(unsigned r) {
    return (r * kW >> 7) & ((1u << wgmma::xor_bits(SRC)) - 1u);
  }
  __host__ __device__ static constexpr unsigned dst_sw(unsigned c) {
    return (c * kWd >> 7) & ((1u << wgmma::xor_bits(DST)) - 1u);
  }
  __host__ __device__ static constexpr unsigned src_off(unsigned rb, unsigned cb, unsigned i) {
    const unsigned r0 = KEYS::row_u(8 * rb), ri = KEYS::row_u(i);
    return r0 * kW + ri * kW + ((8 * cb ^ src_sw(r0) << 4) ^ src_sw(ri) << 4);
  }
  __host__ __device__ static constexpr unsigned dst_off(unsigned rb, unsigned cb, unsigned c4) {
    const unsigned s = 8 * rb;
    return s / kWd * unsigned(COLS) * kWd + 8 * cb * kWd + c4 * kWd + ((s % kWd) ^ dst_sw(c4) << 4);
  }
  __host__ __device__ static constexpr bool offsets_exact() {
    for (unsigned rb = 0; rb < unsigned(ROWS / 8); ++rb)
      for (unsigned cb = 0; cb < unsigned(kNc); ++cb)
        for (unsigned i = 0; i < 8; ++i)
          if (KEYS::row_u(8 * rb + i) != unsigned(KEYS::row(int(8 * rb + i))) ||
              src_off(rb, cb, i) != wgmma::tile_byte(SRC, ROWS, KEYS::row(int(8 * rb + i)), int(8 * cb)) ||
              dst_off(rb, cb, i) != wgmma::tile_byte(DST, COLS, int(8 * cb + i), int(8 * rb)))
            return false;
    return true;
  }
  static_assert(offsets_exact(), "the block offsets must be wgmma::tile_byte's");

  __device__ static void run(const unsigned char* src, unsigned char* dst, int tid) {
    const unsigned rot = lean_rot(unsigned(tid), kNc);  // n % 16 == tid % 16 for each of the thread's blocks
    const unsigned sel01 = lean_selector(int(rot), 0), sel23 = lean_selector(int(rot), 2);
#pragma unroll 1
    for (int j = 0; j < kPer; ++j) {
      const unsigned n = unsigned(tid + j * THREADS);
      if (kBlocks % THREADS != 0 && n >= unsigned(kBlocks)) break;
      const unsigned rb = lean_rb(n, kNc), cb = lean_cb(n, kNc);
      const unsigned r0 = KEYS::row_u(8 * rb);
      const unsigned char* a = src + r0 * kW;
      const unsigned x = 8 * cb ^ src_sw(r0) << 4;
      unsigned w[2][8];  // row i of the block: bytes 0..3, 4..7
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const unsigned ri = KEYS::row_u(unsigned(i));
        const uint2 v = *reinterpret_cast<const uint2*>(a + ri * kW + (x ^ src_sw(ri) << 4));
        w[0][i] = v.x;
        w[1][i] = v.y;
      }
      const unsigned s = 8 * rb;
      unsigned char* d = dst + s / kWd * unsigned(COLS) * kWd + 8 * cb * kWd;
      // Channels 4g .. 4g + 3 of the block (g = 0: bytes 0..3 of each row), rotated: lo[i], hi[i] hold channel
      // 4g + (i + rot) % 4, keys 0..3 and 4..7.
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        unsigned lo[4], hi[4];
        transpose4_rot({w[g][0], w[g][1], w[g][2], w[g][3]}, sel01, sel23, lo);
        transpose4_rot({w[g][4], w[g][5], w[g][6], w[g][7]}, sel01, sel23, hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const unsigned c4 = 4 * g + (i + rot) % 4;
          *reinterpret_cast<uint2*>(d + c4 * kWd + ((s % kWd) ^ dst_sw(c4) << 4)) = make_uint2(lo[i], hi[i]);
        }
      }
    }
  }
};

// ldmatrix.x4.trans of 16-bit elements: lane 8m + i gives the address of row i (16 bytes) of matrix m; lane 4c + w
// receives, for each matrix j, (row 2w, column c) | (row 2w + 1, column c) << 16 in r[j].
__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// stmatrix.x4 of 16-bit elements: lane 8m + i gives the address of row i of matrix m; lane 4r + w's r[j] is word w
// (bytes 4w .. 4w + 3) of row r of matrix j.
__device__ __forceinline__ void stsm_x4(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// dst[c][k] = src[p_key(k)][c] for a ROWS-key x COLS-channel V tile (SRC: the canonical K-major layout of ROWS rows
// of COLS bytes, as TMA boxes lay V down; DST: COLS rows of ROWS bytes), the keys in acc_to_a_e4m3_local's order, by
// warps that each move *units* of 16 keys x 32 channels (the model, fp8_relayout::LdsmTile, emulates every
// instruction; the mapping is explained there). In a unit, lane 8m + i points ldmatrix at key 8(m % 2) + i, channels
// 16(m / 2) .. + 15; after the transposing load lane 4c + w holds channels 2c, 2c + 1 of keys 2w, 2w + 1 (words 0, 2)
// and 8 + 2w, 9 + 2w (words 1, 3): the even bytes of words 0 and 1 are channel 2c's A slots 4w .. 4w + 3 in p_key
// order, the odd bytes channel 2c + 1's. stmatrix's matrix 2h + p row r is channel 16h + 2r + (p ^ r / 4): lanes of
// rows 4–7 swap their permutes' selectors, so that each matrix's 8 rows fall in 8 bank groups of Vᵀ (32- or 128-byte
// rows): no bank conflicts on either side (LdsmTile::conflicts). Every lane of a warp takes part (the matrix
// instructions are warp-wide). The caller publishes dst (wgmma::proxy_fence) before a wgmma reads it.
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST>
struct TransposeLdsm {
  static_assert(ROWS % 16 == 0 && COLS % 32 == 0, "units of 16 keys x 32 channels");
  static_assert(SRC != wgmma::Swizzle::None && DST != wgmma::Swizzle::None, "swizzled tiles");
  static constexpr int kDb = COLS / 32, kUnits = ROWS / 16 * kDb;
  __host__ __device__ static constexpr int channel(int m, int i) { return 16 * (m / 2) + 2 * i + ((m % 2) ^ (i / 4)); }
  // Where lane `lane`'s row starts: in V for ldmatrix, in Vᵀ for stmatrix, for unit (kb, db).
  __host__ __device__ static constexpr unsigned src_byte(int lane, int kb, int db) {
    return wgmma::tile_byte(SRC, ROWS, 16 * kb + 8 * (lane / 8 % 2) + lane % 8, 32 * db + 16 * (lane / 16));
  }
  __host__ __device__ static constexpr unsigned dst_byte(int lane, int kb, int db) {
    return wgmma::tile_byte(DST, COLS, 32 * db + channel(lane / 8, lane % 8), 16 * kb);
  }
  // The same offsets as run computes them: a lane constant, plus per key block kb a term of kb alone, plus per channel
  // block db an immediate (and, in V, an XOR of the lane's chunk by db's). The swizzles' XOR terms do not move with kb
  // (16 keys are 16 rows: bits >= 10 of V's offset) nor with db (32 channels are 32 rows of Vᵀ: bits >= 10).
  static constexpr unsigned kW = wgmma::row_bytes(SRC), kWd = wgmma::row_bytes(DST);
  static_assert(COLS % kW == 0 || COLS == int(kW) / 2, "V's rows whole swizzle panels");
  static constexpr unsigned kDbPanel = kW / 32u;  // channel blocks in one 128- or 64-byte panel of V
  __host__ __device__ static constexpr unsigned src_lane(unsigned lane) {
    const unsigned key = 8u * (lane / 8u % 2u) + lane % 8u;
    const unsigned x = (key * kW >> 7) & ((1u << wgmma::xor_bits(SRC)) - 1u);
    return key * kW + (((lane / 16u) ^ x) << 4);
  }
  __host__ __device__ static constexpr unsigned src_fast(unsigned lane, unsigned kb, unsigned db) {
    return kb * 16u * kW + db / kDbPanel * unsigned(ROWS) * kW + (src_lane(lane) ^ (db % kDbPanel) << 5);
  }
  __host__ __device__ static constexpr unsigned dst_x(unsigned lane) {
    return (unsigned(channel(int(lane / 8), int(lane % 8))) * kWd >> 7) & ((1u << wgmma::xor_bits(DST)) - 1u);
  }
  __host__ __device__ static constexpr unsigned dst_kb(unsigned lane, unsigned kb) {
    return kb / (kWd / 16u) * unsigned(COLS) * kWd + unsigned(channel(int(lane / 8), int(lane % 8))) * kWd +
           (((kb % (kWd / 16u)) ^ dst_x(lane)) << 4);
  }
  __host__ __device__ static constexpr unsigned dst_fast(unsigned lane, unsigned kb, unsigned db) {
    return dst_kb(lane, kb) + db * 32u * kWd;
  }
  __host__ __device__ static constexpr bool offsets_exact() {
    for (unsigned lane = 0; lane < 32; ++lane)
      for (int kb = 0; kb < ROWS / 16; ++kb)
        for (int db = 0; db < kDb; ++db)
          if (src_fast(lane, kb, db) != src_byte(int(lane), kb, db) || dst_fast(lane, kb, db) != dst_byte(int(lane), kb, db))
            return false;
    return true;
  }
  static_assert(offsets_exact(), "run's offsets must be wgmma::tile_byte's");

  // Units whose loads are issued back to back before their permutes and stores: ldmatrix and stmatrix are ordered
  // asm (memory clobbers), so a unit's store would otherwise wait for its own load and the next load for that store —
  // one shared-memory latency a unit. kBatch · 4 registers stay live (16 at D ≥ 128).
  static constexpr int kBatch = kDb < 4 ? kDb : 4;
  static_assert(kDb % kBatch == 0, "channel blocks a whole number of batches");

  // Key blocks warp, warp + WARPS, … (each with its kDb channel blocks) by the calling warp; `lane` its lane.
  // Per unit: an address add, ldmatrix, four byte permutes, stmatrix (its channel block an immediate offset); the
  // loads of kBatch units first, then their permutes and stores.
  template <int WARPS>
  __device__ static void run(const unsigned char* src, unsigned char* dst, int warp, int lane) {
    const unsigned l = unsigned(lane);
    const unsigned sel0 = lane < 16 ? 0x6420u : 0x7531u, sel1 = sel0 ^ 0x1111u;
    const unsigned sa = wgmma::smem_addr(src), da = wgmma::smem_addr(dst);
    const unsigned sl = src_lane(l), dl = unsigned(channel(lane / 8, lane % 8)) * kWd, dx = dst_x(l);
#pragma unroll 1
    for (int kb = warp; kb < ROWS / 16; kb += WARPS) {
      const unsigned k = unsigned(kb);
      const unsigned s0 = sa + k * 16u * kW;
      const unsigned d0 = da + k / (kWd / 16u) * unsigned(COLS) * kWd + dl + (((k % (kWd / 16u)) ^ dx) << 4);
#pragma unroll
      for (int d0b = 0; d0b < kDb; d0b += kBatch) {
        unsigned r[kBatch][4];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const unsigned db = unsigned(d0b + j);
          ldsm_x4_trans(s0 + db / kDbPanel * unsigned(ROWS) * kW + (sl ^ (db % kDbPanel) << 5), r[j]);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          unsigned w[4];
          w[0] = __byte_perm(r[j][0], r[j][1], sel0);
          w[1] = __byte_perm(r[j][0], r[j][1], sel1);
          w[2] = __byte_perm(r[j][2], r[j][3], sel0);
          w[3] = __byte_perm(r[j][2], r[j][3], sel1);
          stsm_x4(d0 + unsigned(d0b + j) * 32u * kWd, w);
        }
      }
    }
  }
};

// One-off form of Transpose (builds the plan and runs it).
template <int ROWS, int COLS, wgmma::Swizzle SRC, wgmma::Swizzle DST, int THREADS>
__device__ __forceinline__ void transpose_tile(const unsigned char* src, unsigned char* dst, int tid) {
  Transpose<ROWS, COLS, SRC, DST, THREADS>(tid).run(src, dst);
}

// Stores of O go through fp8-codec's conversion (fp8::store2: a pair rounded to nearest even, one store).
using fp8::store2;

// Where row r of a 64-row tile starts, in elements from the tile's first: r · ld. `of_thread(t)`: the same, for the
// rows thread t holds.
struct RowPitch {
  long long ld;
  __device__ __forceinline__ long long operator()(int r) const { return r * ld; }
  __device__ __forceinline__ RowPitch of_thread(int) const { return *this; }
};
// Rows in groups of `group`: row r is member r % group of group r / group, at (r / group) · ld_outer + (r % group) ·
// ld_inner. Packed grouped-query heads (pack-gqa) in an O of [tokens, H, D]: member = query head within its K/V
// head's group, group = token, ld_outer = H·D, ld_inner = D (the tile's first row a token's first head).
// `of_thread(t)`: thread t's two rows' places, each divided out once (frag::wgmma_d: a thread holds rows g and g + 8).
struct GroupedRows {
  int group;
  long long ld_outer, ld_inner;
  __device__ __forceinline__ long long operator()(int r) const { return (r / group) * ld_outer + (r % group) * ld_inner; }
  struct TwoRows {
    int r0;
    long long at[2];
    __device__ __forceinline__ long long operator()(int r) const { return at[r != r0]; }
  };
  __device__ __forceinline__ TwoRows of_thread(int t) const {
    const int r0 = frag::wgmma_d_row(t, 0), r1 = frag::wgmma_d_row(t, 2);
    return TwoRows{r0, {(*this)(r0), (*this)(r1)}};
  }
};

// out[rows(row) + col] = T(acc * scale) for the 64 x N tile at out; rows >= valid_rows untouched.
template <class T, int N, class Rows>
__device__ __forceinline__ void store_rows_at(const float (&acc)[N / 2], float scale, T* out, const Rows& rows,
                                              int valid_rows) {
  const int t = threadIdx.x & 127;
  const auto at = rows.of_thread(t);
#pragma unroll
  for (int i = 0; i < N / 2; i += 2) {
    const int row = frag::wgmma_d_row(t, i), col = frag::wgmma_d_col(t, i);
    if (row < valid_rows) store2(out + at(row) + col, acc[i] * scale, acc[i + 1] * scale);
  }
}

// out[row][col] = T(acc * scale) for the 64 x N tile at out (ld elements per row); rows >= valid_rows untouched.
template <class T, int N>
__device__ __forceinline__ void store_rows(const float (&acc)[N / 2], float scale, T* out, long long ld,
                                           int valid_rows) {
  store_rows_at<T, N>(acc, scale, out, RowPitch{ld}, valid_rows);
}

// Columns 64·P .. 64·P + 63 of 64 rows of an f32 accumulator (frag::wgmma_d, N columns: cells 32·P .. 32·P +
// 31 of each thread) times `scale` as 16-bit T (bf16, f16) into a shared-memory panel of 64 rows × 128 bytes
// laid out as a TMA box with a 128-byte swizzle: row r's 16-byte chunk c at r · 128 + (c ^ r % 8) · 16
// (staged_byte). A warp's store of one register pair then writes 8 rows × 16 bytes into 32 distinct banks.
// `panel` 1024-byte aligned.
__host__ __device__ constexpr unsigned staged_byte(int row, int col_byte) {
  return unsigned(row * 128 + ((col_byte / 16) ^ (row % 8)) * 16 + col_byte % 16);
}
// scale[h]: the factor of the thread's rows of half h (frag::acc_half: rows r and r + 8 of its quad), so that a
// softmax's 1/l can ride along with V's scale.
template <class T, int N, int P>
__device__ __forceinline__ void stage_panel(const float (&acc)[N / 2], const float (&scale)[2], unsigned char* panel) {
  static_assert(sizeof(T) == 2 && N % 64 == 0 && P < N / 64, "16-bit elements, a whole 64-column panel");
  const int t = threadIdx.x & 127;
#pragma unroll
  for (int i = 32 * P; i < 32 * P + 32; i += 2) {
    const int row = frag::wgmma_d_row(t, i), col = frag::wgmma_d_col(t, i) - 64 * P;
    const float f = scale[frag::acc_half(i)];
    store2(reinterpret_cast<T*>(panel + staged_byte(row, 2 * col)), acc[i] * f, acc[i + 1] * f);
  }
}

}  // namespace relayout
