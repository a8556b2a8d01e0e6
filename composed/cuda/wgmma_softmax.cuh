// wgmma_softmax.cuh: the body of stage 5: Q·Kᵀ and P·V on FP8 wgmma (sm_90a), the online softmax on the accumulators.
#pragma once
#include "cp_async_ring.cuh"
#include "fp8_relayout.cuh"
#include "online_softmax.cuh"
#include "sdpa_common.cuh"
#include "wgmma.cuh"

namespace sdpa {

// Ring chunks go straight into the canonical K-major wgmma tile (a 16-byte chunk never straddles a swizzle unit).
template <int ROWS, wgmma::Swizzle SW>
struct WgmmaPlace {
  __device__ static int offset(int r, int b) { return int(wgmma::tile_byte(SW, ROWS, r, b)); }
};

// P is exp2(s·c − m·c + 8) in (0, 256]: E4M3's range is used from 2^-9 · 256 up (FlashAttention-3's Max_offset).
constexpr int kFp8POffset = 8;

// One warpgroup's softmax of key tile tt (BC keys) on its Q·Kᵀ accumulators: the online update, O rescaled,
// P as E4M3 A registers in p_key order (Vᵀ's keys must be in that order).
template <int D, int BC>
__device__ __forceinline__ void softmax_to_p(frag::Regs<frag::WgmmaD<BC>> (&s)[1], int tt, int kv_valid, float c,
                                             osm::RowState& st, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                             unsigned (&a)[BC / 32][4]) {
  float alpha[2];
  osm::step<frag::WgmmaD<BC>, kFp8POffset>(s, tt * BC, kv_valid, c, st, alpha);
  osm::rescale<frag::WgmmaD<D>>(o, alpha);
  relayout::acc_to_a_e4m3_local<BC>(s[0].x, 1.0f, a);
}

// One K-step of softmax_pv_steps, then the next: step K's exponentials, its P packed into a[K], its wgmma
// issued as a group of its own, its cells added to the row sums. The wait_group after each commit never waits
// (at most BC / 32 groups are in flight here); without it ptxas sees a[K + 1] written inside the pipeline stage
// that wgmma K opened and serialises every wgmma of the loop (C7513).
template <int D, int BC, int K>
__device__ __forceinline__ void pv_step(frag::Regs<frag::WgmmaD<BC>> (&s)[1], float c, const float (&bias)[2],
                                        osm::RowSum& sum, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                        unsigned (&a)[BC / 32][4], wgmma::Swizzle sw, unsigned long long db) {
  using SL = frag::WgmmaD<BC>;
  osm::exp_cells<SL, 16 * K, 16 * K + 16>(s[0].x, c, bias);
  relayout::acc_to_a_e4m3_step<BC>(s[0].x, K, 1.0f, a[K]);
  wgmma::fence();
  wg::Mma<D, wg::e4m3, wg::e4m3>::rs(o[0].x, a[K], db + wgmma::step_offset(sw, D, K), 1);
  wgmma::commit();
  wgmma::wait<BC / 32>();
  osm::sum_cells<SL, 16 * K, 16 * K + 16>(s[0].x, sum);
  if constexpr (K + 1 < BC / 32) pv_step<D, BC, K + 1>(s, c, bias, sum, o, a, sw, db);
}

// softmax_to_p, then O += P·V, with P·V issued a K-step (32 keys) at a time: each step's wgmma goes out as soon
// as its P is packed, so the tensor cores work through P·V while the warp's MUFU runs the next step's
// exponentials (ptxas spaces a warp's MUFU.EX2 8 cycles apart, so the exponentials of a 128-key tile hold a
// consumer warp ~512 cycles). Cells 16K .. 16K + 15 of the wgmma accumulator are keys 32K .. 32K + 31
// (frag::WgmmaD), and the sums see the cells in osm::step's order. l's update is left to the caller,
// osm::step_end(sum, alpha, st), which may wait until after its next wgmma issue; with it, the same P, m, l and
// O, bit for bit, as softmax_to_p then mma_rs.
template <int D, int BC>
__device__ __forceinline__ void softmax_pv_steps(frag::Regs<frag::WgmmaD<BC>> (&s)[1], int tt, int kv_valid, float c,
                                                 osm::RowState& st, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                                 unsigned (&a)[BC / 32][4], wgmma::Swizzle sw, const void* vt,
                                                 osm::RowSum& sum, float (&alpha)[2]) {
  float bias[2];
  osm::step_max<frag::WgmmaD<BC>, kFp8POffset>(s, tt * BC, kv_valid, c, st, alpha, bias);
  osm::rescale<frag::WgmmaD<D>>(o, alpha);
  osm::init(sum);
  pv_step<D, BC, 0>(s, c, bias, sum, o, a, sw, wgmma::desc(sw, D, 0, vt));
}

// osm::step_rows on a whole tile, less l's update: the row sums and α stay in `sum` and `alpha` for
// osm::step_end, which the caller runs after its next wgmma issue (the quad shuffles' latency then sits under
// that GEMM). The same P, m and l as step_rows. `c`: one float, or one a row (osm::RowScale: packed heads).
template <int BC, class C>
__device__ __forceinline__ void softmax_defer_l(frag::Regs<frag::WgmmaD<BC>> (&s)[1], int col0, const int (&limit)[2],
                                                C c, osm::RowState& st, float (&alpha)[2], osm::RowSum& sum) {
  using SL = frag::WgmmaD<BC>;
  float bias[2];
  osm::step_max_rows<SL, kFp8POffset>(s, col0, limit, c, st, alpha, bias);
  osm::exp_cells<SL, 0, SL::kElems>(s[0].x, c, bias);
  osm::init(sum);
  osm::sum_cells<SL, 0, SL::kElems>(s[0].x, sum);
}

// The LSE of a warpgroup's 64 rows from row0 (osm::finish's, two rows a lane), one lane a quad: as `epilogue`
// writes it, which keeps its own copy: calling this instead gives stage 6 a new hot-loop schedule (its loop
// fingerprint moves; docs/decisions.md, "Copies kept for the schedule").
__device__ __forceinline__ void store_lse(const Params& p, const float (&lse)[2], int bh, int row0) {
  const int t = threadIdx.x % 128;
  if ((t & 3) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + frag::wgmma_d_row(t, 2 * h);
      if (r < p.sq) p.lse[(long long)bh * p.sq + r] = lse[h];
    }
}

// relayout::store_rows of a warpgroup's O (D columns) at element o0 of O, in the type with_o_type names.
template <int D>
struct StoreRows {
  const float (&acc)[D / 2];
  float scale;
  void* o;
  long long o0;
  int valid_rows;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    relayout::store_rows<T, D>(acc, scale, static_cast<T*>(o) + o0, D, valid_rows);
  }
};

// One warpgroup's 64 rows from row0: O normalised and scaled by V's scale in the caller's dtype, and the LSE.
template <int D>
__device__ __forceinline__ void epilogue(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                         const osm::RowState& st, float scale, int bh, int row0) {
  using OL = frag::WgmmaD<D>;
  const int t = threadIdx.x % 128;
  float lse[2];
  osm::finish<OL, kFp8POffset>(o, st, scale, lse);
  const long long o0 = ((long long)bh * p.sq + row0) * D;
  const float vs = p.v_scale[bh / p.group];
  with_o_type(p.o_dtype, StoreRows<D>{o[0].x, vs, p.o, o0, p.sq - row0});
  if ((t & 3) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + frag::wgmma_d_row(t, 2 * h);
      if (r < p.sq) p.lse[(long long)bh * p.sq + r] = lse[h];
    }
}

// WGS consumer warpgroups of 64 query rows each share K/V tiles of 128 keys, which the cp.async ring (STAGES
// deep) lands as swizzled K-major tiles. Per tile: S = Q·Kᵀ on wgmma (Q and K from shared memory) is issued,
// and while it runs V is transposed into the K-major B operand of P·V (fp8-relayout); then osm::step on S in
// registers, P to E4M3 A registers (fp8-relayout), O += P·V on wgmma, left running into the next tile (Vᵀ is
// double-buffered for it). The Q, K, V scales fold into the exponent and the epilogue.
template <int D, int WGS, int STAGES>
__device__ void wgmma_attention(const Params& p) {
  constexpr int BC = 128, BQ = 64 * WGS, THREADS = 128 * WGS;
  constexpr wgmma::Swizzle SW = D == 64 ? wgmma::Swizzle::B64 : wgmma::Swizzle::B128;  // rows of D bytes
  constexpr wgmma::Swizzle SWT = wgmma::Swizzle::B128;                                 // Vᵀ rows of BC bytes
  using Ring = ring::Ring<STAGES, BC, D, 1, THREADS, WgmmaPlace<BC, SW>>;
  using SL = frag::WgmmaD<BC>;
  using OL = frag::WgmmaD<D>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sq = smem_raw + ((1024 - (wgmma::smem_addr(smem_raw) & 1023)) & 1023);
  unsigned char* ring_k = sq + BQ * D;
  unsigned char* ring_v = ring_k + Ring::kBytes;
  unsigned char* vt0 = ring_v + Ring::kBytes;  // Vᵀ, two buffers: P·V of tile t reads one while t + 1 fills the other
  constexpr int kVtBytes = D * BC;
  const TileCoord tc = tile_coord();
  const int bh = tc.bh, q0 = tc.qt * BQ, wg = threadIdx.x / 128;
  const float scale = p.softmax_scale * p.q_scale[bh] * p.k_scale[bh], c = scale * kLog2e;
  const Ring rk{ring_k, p.k + (long long)bh * p.sk * D, D, p.sk};
  const Ring rv{ring_v, p.v + (long long)bh * p.sk * D, D, p.sk};
  for (int s = 0; s < STAGES - 1; ++s) {
    rk.copy(s);
    rv.copy(s);
    ring::commit();
  }
  // Q: each warpgroup's 64 rows as its own canonical tile; rows past Sq are zeros. Published with the first tile.
  const unsigned char* q = p.q + (long long)bh * p.sq * D;
  for (int i = threadIdx.x; i < BQ * D / 16; i += THREADS) {
    const int row = i / (D / 16), ch = i % (D / 16);
    const uint4 v = q0 + row < p.sq ? *reinterpret_cast<const uint4*>(q + (long long)(q0 + row) * D + 16 * ch)
                                    : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(sq + row / 64 * 64 * D + wgmma::tile_byte(SW, 64, row % 64, 16 * ch)) = v;
  }
  // Vᵀ's keys in P's own accumulator order (p_key), so that P becomes A registers with no shuffle.
  const relayout::Transpose<BC, D, SW, SWT, THREADS, relayout::LocalKeys> vt_plan(threadIdx.x);
  osm::RowState st;
  osm::init(st);
  frag::Regs<OL> o[1];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[0].x[i] = 0.0f;
  // P's A registers are read by P·V of tile t until the wait in tile t + 1; the PTX ISA makes touching them
  // earlier undefined, so they outlive the iteration and are written again only after that wait.
  unsigned a[BC / 32][4];
  for (int tt = 0; tt < rk.tiles(); ++tt) {
    rk.copy(tt + STAGES - 1);
    rv.copy(tt + STAGES - 1);
    ring::commit();
    // Tile t has landed (this thread's copies), and is published to the tensor cores with Q (the first time).
    ring::wait_group<STAGES - 1>();
    wgmma::proxy_fence();
    __syncthreads();
    const unsigned char* kt = rk.tile_ptr(tt);
    // S = Q·Kᵀ goes out asynchronously, behind P·V of the tile before (still running); V's transpose runs on
    // the load/store units meanwhile, into the Vᵀ buffer that P·V is not reading.
    unsigned char* vt = vt0 + (tt & 1) * kVtBytes;
    frag::Regs<SL> s[1];
    wgmma::fence_operand(s[0].x);
    wgmma::fence();
    wgmma::mma_ss<BC, wg::e4m3, wg::e4m3, D / 32>(s[0].x, SW, sq + wg * 64 * D, SW, kt, false);
    wgmma::commit();
    vt_plan.run(rv.tile_ptr(tt), vt);
    wgmma::publish_smem();  // Vᵀ for the tensor cores
    wgmma::wait<0>();       // Q·Kᵀ of this tile, and (groups retire in order) P·V of the one before
    wgmma::fence_operand(s[0].x);
    wgmma::fence_operand(o[0].x);
    softmax_to_p<D, BC>(s, tt, p.sk, c, st, o, a);
    // O += P·V, not waited for here: it runs under the next tile's barrier, copies and Q·Kᵀ issue.
    wgmma::fence();
    wgmma::mma_rs<D, wg::e4m3, wg::e4m3, BC / 32>(o[0].x, a, SWT, vt, true);
    wgmma::commit();
    rk.release(tt);  // every warpgroup is done with K and V of this tile (Vᵀ stays with P·V)
  }
  wgmma::wait<0>();
  wgmma::fence_operand(o[0].x);
  epilogue<D>(p, o, st, scale, bh, q0 + 64 * wg);
}

}  // namespace sdpa
