// sdpa_common.cuh: what every fused FP8 SDPA stage shares: parameters, tile geometry, Q staging, K/V
// dequantization through the cp.async ring, Q·Kᵀ on the tensor cores, and writing O and LSE.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include "cp_async_ring.cuh"
#include "fp8_codec.cuh"
#include "frag_layout.cuh"

namespace sdpa {
using namespace nvcuda;

// What O is written as (composed::OutDtype mirrors the values).
enum OutDtype : int { kF16 = 0, kBf16 = 1, kF32 = 2 };

// Mirrored field for field by composed::tables::Params (layouts checked by a test).
// E4M3 Q, K, V in [B, H, S, D] with per-(b, h) dequantization scales; O [B, H, Sq, D] in o_dtype, LSE in f32
// [B, H, Sq] (natural log of Σ exp(softmax_scale · q·k), over dequantized q and k). Grid: (B·H, ⌈Sq / rows⌉):
// x takes up to 2^31 − 1 heads, y up to 65535 query tiles (y held B·H before, and stopped at 65535 heads).
struct Params {
  const unsigned char* q;
  const unsigned char* k;
  const unsigned char* v;
  const float* q_scale;
  const float* k_scale;
  const float* v_scale;
  void* o;
  float* lse;
  int sq;
  int sk;
  float softmax_scale;
  int o_dtype;  // OutDtype
  int causal;   // stage 7 only (the host refuses it elsewhere): row i sees keys j <= i + sk - sq
  int group;    // query heads per K/V head (grouped-query attention; > 1 in stage 7 only): K/V head = bh / group
  int q_rows;   // query rows a block (the grid's y tiles): the host's Stage::rows_for
  int q_tiles;  // query tiles of q_rows a head
  int work;     // (head, query tile) units of a persistent grid (stage 7): heads · q_tiles
  int section;  // causal stage 7: heads a section of the schedule (unit_coord; the host gives whole K/V groups)
  // Vᵀ as tile images (stage 7 at D = 128, TmaBlock::kVtImage): tile t of K/V head h is kTile bytes at
  // vt_tiles + (h · ⌈Sk / BC⌉ + t) · kTile, as the tile sits in shared memory (prep.cu's prep_vt_tiles).
  const unsigned char* vt_tiles;
  // Stage 7's schedule buffer (pingpong_schedule.cuh's SplitHead, then the split tail's table): the unit counter a
  // block takes its later units from (its first is blockIdx.x, each later one gridDim.x + a ticket).
  int* sched;
};

// Calls f(T()) with T the type O is written as for `o_dtype` (__half, __nv_bfloat16 or float): the one place the
// output-dtype switch is written. One dtype a launch, so the branch is uniform. f is a function object with a
// `template <class T> __device__ void operator()(T) const` (NVRTC takes no device lambdas).
template <class F>
__device__ __forceinline__ void with_o_type(int o_dtype, const F& f) {
  switch (o_dtype) {
    case kBf16:
      f(__nv_bfloat16());
      break;
    case kF32:
      f(0.0f);
      break;
    default:
      f(__half());
  }
}

// O[i], O[i + 1] = a, b in the caller's dtype (fp8::store2: rounded to nearest even, one store).
struct StoreO2 {
  void* o;
  long long i;
  float a, b;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    fp8::store2(static_cast<T*>(o) + i, a, b);
  }
};
__device__ __forceinline__ void store_o2(const Params& p, long long i, float a, float b) {
  with_o_type(p.o_dtype, StoreO2{p.o, i, a, b});
}

constexpr float kLog2e = 1.4426950408889634f;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// 4 warps of 16 query rows; K/V tiles of BC keys (64 for D = 64, 32 for D = 128, to fit an sm_89 block).
template <int D>
struct Tile {
  static constexpr int kWarps = 4, kThreads = 128, kBQ = 64;
  static constexpr int kBC = D == 64 ? 64 : 32;
  // Row stride of Q, K and V as half in shared memory: one 16-byte access wider than a row, so that the eight
  // rows an ldmatrix phase reads fall in different banks (with D halves they would all hit the same ones).
  static constexpr int kLd = D + 8;
};

// Shared memory common to all stages, at the front of the dynamic buffer: the fp8 K and V rings, then Q, K
// and V as half. The stage's own buffers follow at `rest`.
template <int D, int STAGES>
struct Smem {
  static constexpr int kBC = Tile<D>::kBC, kBQ = Tile<D>::kBQ;
  using Ring = ring::Ring<STAGES, kBC, D, 1, Tile<D>::kThreads>;
  static constexpr int kLd = Tile<D>::kLd;
  static constexpr int kBytes = 2 * Ring::kBytes + (kBQ + 2 * kBC) * kLd * 2;
  unsigned char* ring_k;
  unsigned char* ring_v;
  __half* q;
  __half* k;
  __half* v;
  unsigned char* rest;
  __device__ explicit Smem(unsigned char* base)
      : ring_k(base),
        ring_v(base + Ring::kBytes),
        q(reinterpret_cast<__half*>(base + 2 * Ring::kBytes)),
        k(q + kBQ * kLd),
        v(k + kBC * kLd),
        rest(base + kBytes) {}
};

// 16 E4M3 codes from a 16-byte load to 16 halves (two 16-byte stores), exactly.
__device__ __forceinline__ void store16(__half* dst, uint4 codes) {
  __half2 h[8];
  fp8::decode16(codes, h);
  reinterpret_cast<uint4*>(dst)[0] = *reinterpret_cast<const uint4*>(&h[0]);
  reinterpret_cast<uint4*>(dst)[1] = *reinterpret_cast<const uint4*>(&h[4]);
}

// Q rows [q0, q0 + 64) of head bh into sQ as half (unscaled codes); rows past Sq are zero.
template <int D>
__device__ void load_q(const Params& p, int bh, int q0, __half* sq) {
  const unsigned char* q = p.q + (long long)bh * p.sq * D;
  for (int c = threadIdx.x; c < Tile<D>::kBQ * D / 16; c += Tile<D>::kThreads) {
    const int r = c / (D / 16), k = c % (D / 16);
    const uint4 codes = q0 + r < p.sq ? *reinterpret_cast<const uint4*>(q + (long long)(q0 + r) * D + 16 * k) : make_uint4(0, 0, 0, 0);
    store16(sq + r * Tile<D>::kLd + 16 * k, codes);
  }
}

// A landed fp8 tile [BC][D] to half [BC][kLd] (unscaled: K's scale folds into the softmax scale, V's into O).
template <int D>
__device__ void dequant_tile(const unsigned char* src, __half* dst) {
  for (int c = threadIdx.x; c < Tile<D>::kBC * D / 16; c += Tile<D>::kThreads)
    store16(dst + (c / (D / 16)) * Tile<D>::kLd + 16 * (c % (D / 16)), reinterpret_cast<const uint4*>(src)[c]);
}

// The (head, query tile) of this block in a grid of (heads, query tiles), numbered so that query tiles run
// fastest in launch order: the blocks resident at once then share a few heads, whose K and V stay in L2
// (with heads fastest, 132 resident blocks read 64+ different heads' K and V, more than L2 holds at S = 4096).
struct TileCoord {
  int bh, qt;
};
__device__ __forceinline__ TileCoord tile_coord() {
  const long long lin = (long long)blockIdx.y * gridDim.x + blockIdx.x;
  return {int(lin / gridDim.y), int(lin % gridDim.y)};
}

// Unit w of stage 7's schedule. Without a mask every unit has the same key tiles: the same numbering as tile_coord,
// query tiles fastest. Causal units differ in length, and blocks take them in schedule order as they free up
// (pingpong_attention): longest first balances the SMs, within sections of p.section heads whose K and V fit in L2
// together (longest first across all heads had every head's K and V in flight at once), heads fastest.
__device__ __forceinline__ TileCoord unit_coord(const Params& p, int w) {
  if (!p.causal) return {w / p.q_tiles, w % p.q_tiles};
  const int per = p.section * p.q_tiles, sec = w / per, r = w % per;
  const int heads = min(p.section, p.work / p.q_tiles - sec * p.section);
  return {sec * p.section + r % heads, p.q_tiles - 1 - r / heads};
}

// Which head and query rows this block owns, and the softmax scale folded for the raw fp8 codes: scores are
// q·k of the unscaled codes, so scale = softmax_scale · q_scale · k_scale; c = scale · log2(e) feeds exp2.
struct Block {
  int bh, q0;
  float scale, c;
  __device__ Block(const Params& p, int bq)
      : bh(blockIdx.x),
        q0(blockIdx.y * bq),
        scale(p.softmax_scale * p.q_scale[blockIdx.x] * p.k_scale[blockIdx.x]),
        c(scale * kLog2e) {}
};

// The K/V pipeline of one block: both rings fill tile t in one cp.async group.
template <int D, int STAGES>
struct KV {
  typename Smem<D, STAGES>::Ring k, v;
  __device__ KV(const Params& p, const Smem<D, STAGES>& s, int bh)
      : k{s.ring_k, p.k + (long long)bh * p.sk * D, D, p.sk}, v{s.ring_v, p.v + (long long)bh * p.sk * D, D, p.sk} {}
  __device__ int tiles() const { return k.tiles(); }
  __device__ void issue(int t) const {
    k.copy(t);
    v.copy(t);
    ring::commit();
  }
  // The ring's prologue, with Q staged while those tiles are in flight.
  __device__ void begin(const Params& p, const Smem<D, STAGES>& s, const Block& b) const {
    for (int t = 0; t < STAGES - 1; ++t) issue(t);
    load_q<D>(p, b.bh, b.q0, s.q);
  }
  // Refills the stage released last, waits for tile t, dequantizes it into sK and sV, releases its stage.
  // On return tile t is in sK / sV for every thread; they stay valid until the next call.
  __device__ void next(int t, const Smem<D, STAGES>& s) const {
    issue(t + STAGES - 1);
    dequant_tile<D>(k.wait(t), s.k);
    dequant_tile<D>(v.tile_ptr(t), s.v);
    k.release(t);
  }
};

// S = Q·Kᵀ for this warp's 16 query rows against the tile's BC keys, on the tensor cores.
template <int D>
__device__ __forceinline__ void qk(const __half* sq, const __half* sk, Acc (&s)[Tile<D>::kBC / 16]) {
  constexpr int NF = Tile<D>::kBC / 16;
  const int w = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < NF; ++j) wmma::fill_fragment(s[j], 0.0f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::load_matrix_sync(a, sq + w * 16 * Tile<D>::kLd + kk * 16, Tile<D>::kLd);
#pragma unroll
    for (int j = 0; j < NF; ++j) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
      wmma::load_matrix_sync(b, sk + j * 16 * Tile<D>::kLd + kk * 16, Tile<D>::kLd);
      wmma::mma_sync(s[j], a, b, s[j]);
    }
  }
}

// O += P·V for this warp's rows: P as matrix_a (row-major, leading dimension ldp), V [BC][D] from sV.
template <int D, class PFrag>
__device__ __forceinline__ void pv_tile(const PFrag& pa, int kk, const __half* sv, Acc (&o)[D / 16]) {
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::load_matrix_sync(b, sv + kk * 16 * Tile<D>::kLd + j * 16, Tile<D>::kLd);
    wmma::mma_sync(o[j], pa, b, o[j]);
  }
}

// Writes this warp's O fragments (already divided by l) times v_scale in O's dtype, and the LSE of its rows.
template <int D>
__device__ void store_o(const Params& p, int bh, int q0, const Acc (&o)[D / 16], const float (&lse)[2]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const float vs = p.v_scale[bh];
#pragma unroll
  for (int j = 0; j < D / 16; ++j)
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const int r = q0 + w * 16 + frag::wmma_acc_row(lane, i), c = 16 * j + frag::wmma_acc_col(lane, i);
      if (r < p.sq)
        store_o2(p, ((long long)bh * p.sq + r) * D + c, o[j].x[i] * vs, o[j].x[i + 1] * vs);
    }
  if (frag::thread_in_group(lane) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = q0 + w * 16 + frag::acc_row(lane, h);
      if (r < p.sq) p.lse[(long long)bh * p.sq + r] = lse[h];
    }
}

}  // namespace sdpa
