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
  // Per sequence (null: none), keys its rows also see past its last one: a split-KV chunk's virtual sequence has the
  // keys of the chunks after it there. It moves the causal diagonal: row i sees keys j ≤ i + Sk + past − Sq.
  const int* past = nullptr;
  // Bits of OneScale (composed::OneScale): each set bit's scale is one value for every (sequence, head), read at [0].
  int one_scale = 0;
};

// RaggedArgs::one_scale's bits: Q's, K's and V's scales one for the whole batch (a per-tensor scale).
enum OneScale : int { kOneQ = 1, kOneK = 2, kOneV = 4 };

// The index a scale of (sequence, head) entry i is read at: 0 where `one` has the scale's `bit`.
template <class I>
__device__ __forceinline__ I scale_at(int one, int bit, I i) {
  return one & bit ? I(0) : i;
}

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

// One key tile of a paged cache: its boxes' first pool rows (at most BOXES boxes: BC / 16, pages of 16 rows at least),
// in the producer thread's own shared words (registers held across the producer's waits spill it at 40 registers).
template <int BOXES>
struct PagedTile {
  const int* rows;
  int box;
  template <int BC, int PANEL, int PANELS>
  __device__ __forceinline__ void load(const tma::Map* m, unsigned long long* bar, unsigned char* dst, int, int kv,
                                       int) const {
    for (int j = 0; j * box < BC; ++j)
#pragma unroll
      for (int c = 0; c < PANELS; ++c)
        tma::load_4d(m, bar, dst + c * BC * PANEL + j * box * PANEL, c * PANEL, rows[j], kv, 0);
  }
};

// A paged cache's key rows for sequence `seq` (Sk `sk`): a tile of BC keys as BC / box boxes, each from its page;
// boxes of keys past Sk come from past the pool (zeros: masked keys must be finite, and the table holds no entry for
// them). at<BC>(t) reads tile t's table entries together (in groups of kGroup where a tile has more than kMaxTogether:
// the producer's loading thread has 40 registers), before the waits that come ahead of its loads (the producer's, one
// thread's: produce_k), so that their latency is under those waits; K's loads and V's share them.
struct PagedRows {
  static constexpr int kMinPage = 16;
  static constexpr int kMaxTogether = 12, kGroup = 8;
  paged::Table t;
  int seq, sk, box, oob_row;
  template <int BC>
  __device__ __forceinline__ PagedTile<BC / kMinPage> at(int tile) const {
    constexpr int kN = BC / kMinPage, kG = kN > kMaxTogether ? kGroup : kN;
    __shared__ int rows[kN];
#pragma unroll 1
    for (int g = 0; g < kN && g * box < BC; g += kG) {
#pragma unroll
      for (int i = 0; i < kG; ++i) {
        const int j = g + i, key = tile * BC + j * box;
        if (j * box < BC) rows[j] = key < sk ? int(paged::pool_row(t, seq, key)) : oob_row;
      }
    }
    return PagedTile<BC / kMinPage>{rows, box};
  }
};

// A unit as a consumer needs it: the heads its scales are read at (bh: query; kv: key/value), its first query row
// within its sequence, its key tiles, its sequence's Sq and Sk; for a ragged unit also its sequence, its first row in
// the packed tensors and its valid rows. sq is the causal diagonal's: Sq less the sequence's `past` keys (RaggedArgs);
// rows counts the valid rows.
struct UnitView {
  int bh, kv, q0, tiles, sq, sk;
  int seq, q_row0, rows;
};

// Ragged unit w of the plan: scales per (sequence, head).
__device__ __forceinline__ UnitView ragged_view(const Params& p, const RaggedArgs& rg, int w) {
  const ragged::Unit ru = ragged::unit(rg.table, w);
  const ragged::Coord rc = ragged::coord(rg.cu_q, rg.cu_k, ru, 128);
  const int hkv = rg.heads / p.group;
  const int past = rg.past != nullptr ? rg.past[ru.seq] : 0;
  return UnitView{ru.seq * rg.heads + ru.head, ru.seq * hkv + ru.head / p.group, ru.q0, ru.key_tiles, rc.sq - past,
                  rc.sk, ru.seq, rc.q_row0, rc.rows};
}

// Unit w of a plan of packed heads (ragged-plan's group = p.group, its head a K/V head; pack-gqa): packed row r is query
// head r % group of token r / group. bh: the group's first query head (sequence · heads + K/V head · group; row r's is
// bh + r % group); kv: its K/V head; q0 and rows: packed rows; q_row0: the token of the unit's first row.
__device__ __forceinline__ UnitView packed_view(const Params& p, const RaggedArgs& rg, int w) {
  const ragged::Unit ru = ragged::unit(rg.table, w);
  const ragged::Coord rc = ragged::coord_packed(rg.cu_q, rg.cu_k, ru, 128, p.group);
  const int hkv = rg.heads / p.group;
  const int past = rg.past != nullptr ? rg.past[ru.seq] : 0;
  return UnitView{ru.seq * rg.heads + ru.head * p.group, ru.seq * hkv + ru.head, ru.q0, ru.key_tiles, rc.sq - past,
                  rc.sk, ru.seq, rc.q_row0, rc.rows};
}

// The softmax scale of a unit's rows (the problem's, Q's and K's scales): one float, or with packed heads one a row of
// this thread's two (osm::RowScale), each its query head's. `one`: RaggedArgs::one_scale.
template <bool PACK>
struct UnitScale {
  using T = float;
  __device__ static float of(const Params& p, const UnitView& u, int, int one = 0) {
    return p.softmax_scale * p.q_scale[scale_at(one, kOneQ, u.bh)] * p.k_scale[scale_at(one, kOneK, u.kv)];
  }
};
template <>
struct UnitScale<true> {
  using T = osm::RowScale;
  __device__ static osm::RowScale of(const Params& p, const UnitView& u, int wg, int one = 0) {
    osm::RowScale s;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = u.q0 + 64 * wg + frag::wgmma_d_row(int(threadIdx.x) % 128, 2 * h);
      s.c[h] = p.softmax_scale * p.q_scale[scale_at(one, kOneQ, u.bh + row % p.group)] *
               p.k_scale[scale_at(one, kOneK, u.kv)];
    }
    return s;
  }
};
__device__ __forceinline__ float times(float x, float f) { return x * f; }
__device__ __forceinline__ osm::RowScale times(const osm::RowScale& x, float f) {
  return osm::RowScale{{x.c[0] * f, x.c[1] * f}};
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

// The LSE of a consumer's 64 packed rows (row r: head r % group, token r / group) at `at` (its first row's head and
// token in an LSE of [heads, tokens]: heads `head_stride` apart), rows < valid.
__device__ __forceinline__ void store_lse_grouped(float* at, const float (&lse)[2], int valid, int group,
                                                  long long head_stride) {
  const int t = threadIdx.x % 128;
  if ((t & 3) == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = frag::wgmma_d_row(t, 2 * h);
      if (r < valid) at[(r % group) * head_stride + r / group] = lse[h];
    }
}

// relayout::store_rows_at of a warpgroup's O with its rows placed by `rows` (relayout::RowPitch, GroupedRows), in the
// type with_o_type names.
template <int D, class Rows>
struct StoreRowsAt {
  const float (&acc)[D / 2];
  float scale;
  void* o;
  long long o0;
  Rows rows;
  int valid_rows;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    relayout::store_rows_at<T, D>(acc, scale, static_cast<T*>(o) + o0, rows, valid_rows);
  }
};

// A consumer's O (its rows' 1/l `inv` and V's scale `vs`) by direct stores at element o0 of O, rows `ld` apart,
// rows < valid: a packed batch's outputs, whose last tile of a sequence must not touch the next sequence's rows (a TMA
// box would). Rounded as the dense epilogue rounds (epilogue_staged): 16-bit O times inv · vs in one product, f32 O
// times inv, then vs. Every warp of the warpgroup has read the unit's slots before the next unit's first thread
// writes them.
// `rows`: where each of the 64 rows starts from o0 (relayout::RowPitch{ld}: rows ld apart; GroupedRows: packed heads).
template <int D, class Rows>
__device__ __forceinline__ void epilogue_rows(const Params& p, frag::Regs<frag::WgmmaD<D>> (&o)[1],
                                              const float (&inv)[2], float vs, long long o0, const Rows& rows,
                                              int valid, int wg) {
  roles::sync(3 + wg, 128);
  if (p.o_dtype == kF32) {
    osm::rescale<frag::WgmmaD<D>>(o, inv);
    with_o_type(p.o_dtype, StoreRowsAt<D, Rows>{o[0].x, vs, p.o, o0, rows, valid});
  } else {
    const float f[2] = {inv[0] * vs, inv[1] * vs};
    osm::rescale<frag::WgmmaD<D>>(o, f);
    with_o_type(p.o_dtype, StoreRowsAt<D, Rows>{o[0].x, 1.0f, p.o, o0, rows, valid});
  }
}

}  // namespace sdpa
