// pingpong_epilogue.cuh: a consumer's epilogue: O through shared memory and TMA stores, or merged into a running (O, LSE).
#pragma once
#include "attn_merge.cuh"
#include "pingpong_schedule.cuh"

namespace sdpa {

// One 64-column panel P of a consumer's O, times its rows' factors `f`, through its staging panel `so` and a TMA
// store (epilogue_staged).
template <class T, int D, int P>
__device__ __forceinline__ void store_o_panel(const float (&o)[D / 2], const float (&f)[2], int bh, int row0, int wg,
                                              const tma::Map* mo, unsigned char* so) {
  const bool issuer = threadIdx.x % 128 == 0;
  if (issuer) tma::store_wait_read<0>();  // the panel before has been read out of `so`
  roles::sync(3 + wg, 128);
  relayout::stage_panel<T, D, P>(o, f, so);
  wgmma::proxy_fence();
  roles::sync(3 + wg, 128);
  if (issuer) {
    tma::store_4d(mo, so, 64 * P, row0, bh, 0);
    tma::store_commit();
  }
  if constexpr (P + 1 < D / 64) store_o_panel<T, D, P + 1>(o, f, bh, row0, wg, mo, so);
}

// O's 16-bit panels through store_o_panel, in the type with_o_type names (f32 O takes direct stores instead).
template <int D>
struct StagePanels {
  const float (&o)[D / 2];
  const float (&f)[2];
  int bh, row0, wg;
  const tma::Map* mo;
  unsigned char* so;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    if constexpr (sizeof(T) == 2) store_o_panel<T, D, 0>(o, f, bh, row0, wg, mo, so);
  }
};

// Consumer warpgroup wg's epilogue for its 64 rows from row0, O as 16-bit rows through shared memory and TMA
// stores (`mo`: O's map, boxes of 64 rows × 64 columns with a 128-byte swizzle; rows past Sq are not written):
// per 64-column panel, each thread writes its pairs into the consumer's 8 KiB staging panel `so`
// (relayout::stage_panel: no bank conflicts) and one thread stores it, asynchronously; the next panel waits until
// the TMA has read it out (two staging panels a consumer do not fit beside the ring at D = 128). Direct global
// stores of the accumulator's pairs (epilogue: 32 4-byte stores a thread at D = 128, each warp's touching 8 rows)
// cost stage 7 7% at (4, 16, 4096, 128) (docs/decisions.md, "O through shared-memory panels"). f32 O keeps the
// direct stores. `inv`: the
// rows' 1/l (osm::finish_rows, with the LSE, before the last P·V's wait), applied with V's scale as O is staged.
template <int D>
__device__ __forceinline__ void epilogue_staged(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                                const float (&inv)[2], float vs, int bh, int row0, int wg,
                                                const tma::Map* mo, unsigned char* so) {
  const float f[2] = {inv[0] * vs, inv[1] * vs};
  if (p.o_dtype == kF32) {
    // Every warp of the warpgroup has read the unit's destination (QBarriers::dest, read by consume_unit before the
    // epilogue) before any goes on to its next unit, whose first thread overwrites it; the 16-bit path's panel
    // barrier (store_o_panel) orders the same.
    roles::sync(3 + wg, 128);  // dest read by all
    // store_rows scales every row alike: 1/l first, as osm::finish does, then V's scale.
    osm::rescale<frag::WgmmaD<D>>(o, inv);
    relayout::store_rows<float, D>(o[0].x, vs, static_cast<float*>(p.o) + ((long long)bh * p.sq + row0) * D, D,
                                   p.sq - row0);
  } else {
    with_o_type(p.o_dtype, StagePanels<D>{o[0].x, f, bh, row0, wg, mo, so});
  }
}

// Consumer warpgroup wg's 64 rows from row0 of head bh merged into O and the LSE already there (f32 O: ring
// attention's running result; the ACC kernels), instead of written: the rows' part is O·(1/l)·V's scale, as
// epilogue_staged's f32 stores make it, and its LSE `lse`; each row's (O, LSE) becomes attn-merge's merge of the two,
// accumulated first (the attn-merge kernel's arithmetic: the same bits as writing the part and merging it after).
// Every load of the running rows (their LSEs and O's pairs, D / 2 registers a thread) is issued before the first
// store: stores between them would order each load after the store before it (ptxas cannot tell the addresses
// apart), one memory round trip a pair. A row's quad reads its LSE before the quad's first lane writes the merged one.
template <int D>
__device__ __forceinline__ void accumulate_rows(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                                const float (&inv)[2], float vs, const float (&lse)[2], int bh,
                                                int row0, int wg) {
  roles::sync(3 + wg, 128);  // QBarriers::dest read by all (epilogue_staged's f32 path)
  const int t = threadIdx.x % 128;
  float* out = static_cast<float*>(p.o) + ((long long)bh * p.sq + row0) * D;
  float* lacc = p.lse + (long long)bh * p.sq + row0;
  float lrun[2];
  float2 run[D / 4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = frag::wgmma_d_row(t, 2 * h);
    lrun[h] = row0 + r < p.sq ? lacc[r] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < D / 2; i += 2) {
    const int row = frag::wgmma_d_row(t, i), col = frag::wgmma_d_col(t, i);
    run[i / 2] = row0 + row < p.sq ? *reinterpret_cast<const float2*>(out + (long long)row * D + col)
                                   : make_float2(0.0f, 0.0f);
  }
  amerge::Weights<2> w[2];
  float winv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l[2] = {lrun[h], lse[h]};
    w[h] = amerge::weights(l, 2);
    winv[h] = amerge::inv_sum(w[h]);
  }
  __syncwarp();
  if ((t & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = frag::wgmma_d_row(t, 2 * h);
      if (row0 + r < p.sq) lacc[r] = w[h].lse;
    }
  }
  osm::rescale<frag::WgmmaD<D>>(o, inv);
#pragma unroll
  for (int i = 0; i < D / 2; i += 2) {
    const int row = frag::wgmma_d_row(t, i), col = frag::wgmma_d_col(t, i), h = frag::acc_half(i);
    if (row0 + row < p.sq) {
      const float2 a = run[i / 2];
      const float v0[2] = {a.x, o[0].x[i] * vs}, v1[2] = {a.y, o[0].x[i + 1] * vs};
      *reinterpret_cast<float2*>(out + (long long)row * D + col) =
          make_float2(amerge::merge1(w[h], v0, 2, winv[h]), amerge::merge1(w[h], v1, 2, winv[h]));
    }
  }
}

// A unit's rows at its end: written (epilogue_staged; the LSE was stored before), or, in the ACC kernels, merged into
// the running result there (accumulate_rows) — but a split tail's part (dst >= 0: rows obh, orow of a virtual unit)
// is written with its LSE in either, for the split tail's merge kernel (the ACC kernels' own merges the running rows
// in with the parts).
template <int D, bool ACC>
__device__ __forceinline__ void store_or_accumulate(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                                    const float (&inv)[2], float vs, const float (&lse)[2], int dst,
                                                    int obh, int orow, int wg, const tma::Map* mo,
                                                    unsigned char* so) {
  if constexpr (ACC) {
    if (dst < 0) {
      accumulate_rows<D>(p, o, inv, vs, lse, obh, orow, wg);
      return;
    }
    store_lse(p, lse, obh, orow);
  }
  epilogue_staged<D>(p, o, inv, vs, obh, orow, wg, mo, so);
}

// A halved unit's block (HALF): consumer wg's (O, LSE) over its half of the keys, on the same 64 rows from row0 as the
// other consumer's. Consumer 1 stashes its part — O·(1/l)·V's scale, element i of thread t at [i][t], in the K and Vᵀ
// tiles of its own first ring stage (read no more once its last P·V retired; consumer 0's tiles are other stages), its
// LSE in Q's second buffer — and consumer 0, after a barrier of both, merges each element with its own by attn-merge's
// combine (the same thread holds the same row and column in both) and stores the rows as epilogue_staged does.
template <int D, class Block>
__device__ __forceinline__ void merge_halves(const Params& p, const Block& blk, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                             const float (&inv)[2], float vs, const float (&lse)[2], int wg, int bh,
                                             int row0, const tma::Map* mo, unsigned char* so) {
  constexpr int kN = D / 2, kHalf = kN / 2;
  static_assert(kHalf * 128 * 4 <= int(Block::kTile), "half a part fits a K or a Vt tile");
  const int t = threadIdx.x % 128;
  const int stage = (key_tiles<Block::kBc>(p, 0) / 2) % Block::kStages;
  float* lo = reinterpret_cast<float*>(blk.sk + stage * Block::kTile);
  float* hi = reinterpret_cast<float*>(blk.svt + stage * Block::kTile);
  float* ls = reinterpret_cast<float*>(blk.sq + Block::kQ);
  if (wg == 1) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float x = o[0].x[i] * inv[frag::acc_half(i)] * vs;
      if (i < kHalf) lo[i * 128 + t] = x;
      else hi[(i - kHalf) * 128 + t] = x;
    }
    ls[t] = lse[0];
    ls[128 + t] = lse[1];
  }
  roles::sync(5, 256);  // the stash written (one barrier instruction for both consumers: synccheck's rule)
  if (wg == 1) return;
  amerge::Weights<2> w[2];
  float winv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l2[2] = {lse[h], ls[128 * h + t]};
    w[h] = amerge::weights(l2, 2);
    winv[h] = amerge::inv_sum(w[h]);
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const int h = frag::acc_half(i);
    const float v[2] = {o[0].x[i] * inv[h] * vs, i < kHalf ? lo[i * 128 + t] : hi[(i - kHalf) * 128 + t]};
    o[0].x[i] = amerge::merge1(w[h], v, 2, winv[h]);
  }
  const float merged[2] = {w[0].lse, w[1].lse};
  store_lse(p, merged, bh, row0);
  const float one[2] = {1.0f, 1.0f};
  epilogue_staged<D>(p, o, one, 1.0f, bh, row0, 0, mo, so);
}

}  // namespace sdpa
