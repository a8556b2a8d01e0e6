// ragged_units.cuh: a unit as a consumer sees it, dense (unit_coord) or ragged (a packed batch's plan), and packed outputs.
#pragma once
#include "paged_kv.cuh"
#include "ragged_plan.cuh"
#include "tma_attention.cuh"

namespace sdpa {

// Where a packed batch's units and boundaries are (stage 8 varlen): the plan's table (ragged-plan, built on the
// device), cu_seqlens_q and cu_seqlens_k (B + 1 each), the packed query rows and the query heads.
struct RaggedArgs {
  const int* table = nullptr;
  const int* cu_q = nullptr;
  const int* cu_k = nullptr;
  int total_q = 0;
  int heads = 0;
};

// A paged KV cache (`pages.pages` set; the producer's only): K and V are a pool of pages ([num_pages · page_size, Hkv,
// D]) whose rows a sequence's keys reach through its block table (paged-kv); `box`: rows a TMA box of K or V (gcd(BC,
// page_size), so that no box crosses a page), `oob_row` a row past the pool (a box there comes back zeros). Apart from
// RaggedArgs, which the consumers take, and passed by pointer: a larger struct there, or a defaulted one beside it, moved
// stage 7's schedule.
struct PagedArgs {
  paged::Table pages = {nullptr, 0, 0};
  int box = 0;
  int oob_row = 0;
};

// A paged cache's key rows for sequence `seq` (Sk `sk`): a tile of BC keys as BC / box boxes, each from its page;
// boxes of keys past Sk come from past the pool (zeros: masked keys must be finite, and the table holds no entry for
// them).
struct PagedRows {
  paged::Table t;
  int seq, sk, box, oob_row;
  template <int BC, int PANEL, int PANELS>
  __device__ __forceinline__ void load(const tma::Map* m, unsigned long long* bar, unsigned char* dst, int tile, int kv,
                                       int) const {
    for (int j = 0; j * box < BC; ++j) {
      const int key = tile * BC + j * box;
      const int row = key < sk ? int(paged::pool_row(t, seq, key)) : oob_row;
#pragma unroll
      for (int c = 0; c < PANELS; ++c)
        tma::load_4d(m, bar, dst + c * BC * PANEL + j * box * PANEL, c * PANEL, row, kv, 0);
    }
  }
};

// A unit as a consumer needs it: the heads its scales are read at (bh: query; kv: key/value), its first query row
// within its sequence, its key tiles, its sequence's Sq and Sk; for a ragged unit also its sequence, its first row in
// the packed tensors and its valid rows.
struct UnitView {
  int bh, kv, q0, tiles, sq, sk;
  int seq, q_row0, rows;
};

// Ragged unit w of the plan: scales per (sequence, head).
__device__ __forceinline__ UnitView ragged_view(const Params& p, const RaggedArgs& rg, int w) {
  const ragged::Unit ru = ragged::unit(rg.table, w);
  const ragged::Coord rc = ragged::coord(rg.cu_q, rg.cu_k, ru, 128);
  const int hkv = rg.heads / p.group;
  return UnitView{ru.seq * rg.heads + ru.head, ru.seq * hkv + ru.head / p.group, ru.q0, ru.key_tiles, rc.sq, rc.sk,
                  ru.seq, rc.q_row0, rc.rows};
}

// The LSE of a consumer's 64 rows at `at` (consecutive rows), rows < valid.
__device__ __forceinline__ void store_lse_rows(float* at, const float (&lse)[2], int valid) {
  const int t = threadIdx.x % 128;
  if ((t & 3) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = frag::wgmma_d_row(t, 2 * h);
      if (r < valid) at[r] = lse[h];
    }
}

// relayout::store_rows of a warpgroup's O with a row pitch of `ld` elements, in the type with_o_type names.
template <int D>
struct StoreRowsLd {
  const float (&acc)[D / 2];
  float scale;
  void* o;
  long long o0, ld;
  int valid_rows;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    relayout::store_rows<T, D>(acc, scale, static_cast<T*>(o) + o0, ld, valid_rows);
  }
};

// A consumer's O (its rows' 1/l `inv` and V's scale `vs`) by direct stores at element o0 of O, rows `ld` apart,
// rows < valid: a packed batch's outputs, whose last tile of a sequence must not touch the next sequence's rows (a TMA
// box would). Rounded as the dense epilogue rounds (epilogue_staged): 16-bit O times inv · vs in one product, f32 O
// times inv, then vs. Every warp of the warpgroup has read the unit's slots before the next unit's first thread
// writes them.
template <int D>
__device__ __forceinline__ void epilogue_rows(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                              const float (&inv)[2], float vs, long long o0, long long ld, int valid,
                                              int wg) {
  roles::sync(3 + wg, 128);
  if (p.o_dtype == kF32) {
    osm::rescale<frag::WgmmaD<D>>(o, inv);
    with_o_type(p.o_dtype, StoreRowsLd<D>{o[0].x, vs, p.o, o0, ld, valid});
  } else {
    const float f[2] = {inv[0] * vs, inv[1] * vs};
    osm::rescale<frag::WgmmaD<D>>(o, f);
    with_o_type(p.o_dtype, StoreRowsLd<D>{o[0].x, 1.0f, p.o, o0, ld, valid});
  }
}

}  // namespace sdpa
