// pingpong_schedule.cuh: stage 7's and 8's units as the producer and consumers see them: windows, key tiles, the split tail's table.
#pragma once
#include "ragged_units.cuh"
#include "tma_attention.cuh"

namespace sdpa {

// Query rows of a unit (a block's two consumer warpgroups, 64 each).
constexpr int kUnitRows = 128;

// A sliding window (stage 8's windowed kernels), bottom-right aligned as the causal mask: row i sees keys
// i + Sk − Sq − left ≤ j ≤ i + Sk − Sq + right; a side < 0 is unbounded, and causal masking makes the right side 0.
struct Window {
  int left, right;
  // Row `row`'s first visible key, and one past its last (an empty window: end ≤ first); in 64 bits, so that any side
  // the host passes (up to 2^31 − 1) cannot overflow.
  __device__ int first_key(int row, int sq, int sk) const {
    if (left < 0) return 0;
    const long long f = (long long)row + sk - sq - left;
    return f <= 0 ? 0 : int(f);
  }
  __device__ int key_end(int row, int sq, int sk, bool causal) const {
    const int r = causal ? 0 : right;
    if (r < 0) return sk;
    const long long e = (long long)row + sk - sq + r + 1;
    return e <= 0 ? 0 : e < sk ? int(e) : sk;
  }
  // The unit at query row q0 of a sequence of sq queries and sk keys: its first key tile (its first row's), and its
  // key tiles from there to its last row's last visible key (at least one; ragged-plan's key_range, which the plan's
  // table holds for a packed batch's units).
  template <int BC>
  __device__ int2 tiles(int q0, int sq, int sk, bool causal) const {
    const int first = first_key(q0, sq, sk) / BC;
    const int end = key_end(min(q0 + kUnitRows, sq) - 1, sq, sk, causal);
    return make_int2(first, max(1, (end + BC - 1) / BC - first));
  }
};
constexpr Window kNoWindow{-1, -1};

// Key tiles of the unit at query row q0: those up to its last visible key (at least one).
template <int BC>
__device__ __forceinline__ int key_tiles(const Params& p, int q0) {
  const int visible = p.causal ? min(p.sk, max(0, min(q0 + kUnitRows, p.sq) + p.sk - p.sq)) : p.sk;
  return max(1, (visible + BC - 1) / BC);
}

// Half of each unit's key tiles in a halved launch (SplitPlan::halved: never causal nor windowed, so every unit has
// the same even number of tiles), consumer 1's first.
template <int BC>
__device__ __forceinline__ int halved_half(const Params& p) {
  return key_tiles<BC>(p, 0) / 2;
}

// Unit w of the dense schedule as a consumer sees it (a split tail's part: kt >= 0 key tiles; WIN: the window's).
template <int BC, bool WIN = false>
__device__ __forceinline__ UnitView dense_view(const Params& p, int w, int kt, const Window& win) {
  const TileCoord u = unit_coord(p, w);
  const int q0 = u.qt * kUnitRows;
  if constexpr (WIN) {
    return UnitView{u.bh, u.bh / p.group, q0, win.tiles<BC>(q0, p.sq, p.sk, p.causal != 0).y, p.sq, p.sk, 0, 0, 0};
  }
  return UnitView{u.bh, u.bh / p.group, q0, kt < 0 ? key_tiles<BC>(p, q0) : kt, p.sq, p.sk, 0, 0, 0};
}
template <bool VARLEN, int BC, bool WIN = false, bool PACK = false>
__device__ __forceinline__ UnitView unit_view(const Params& p, const RaggedArgs& rg, int w, int kt,
                                              const Window& win = kNoWindow) {
  if constexpr (PACK) {
    return packed_view(p, rg, w);
  } else if constexpr (VARLEN) {
    return ragged_view(p, rg, w);
  } else {
    return dense_view<BC, WIN>(p, w, kt, win);
  }
}

// Stage 7's schedule buffer (Params::sched), mirrored field for field by composed::tables (SplitHead, SplitPart,
// MergeList; their layouts checked against these by a test). The head: the persistent grid's unit counter and count of
// blocks done with it (zero before a launch, zeroed again by the last block done), then the split tail's plan (the
// host's SplitPlan): its first unit, its pieces (one a block after its whole units; 0: no split), the word offsets of
// the parts and the merge lists, and whether the pieces are taken from the counter after the whole units (`taken`,
// 1) or dealt, piece b to block b (0). The pieces' first parts follow the head. The plan is a table in this buffer, not
// fields of Params: two fields more in Params moved ptxas's schedule of the hot loop.
struct SplitHead {
  int counter, done, split, pieces, parts_at, merged_at, taken, reserved;
};
// Key tiles k0 .. k0 + tiles − 1 of a unit, its O and LSE to virtual unit dst (tiles, dst < 0: the whole unit, to its
// own rows). Read as one int4.
struct SplitPart {
  int unit, k0, tiles, dst;
};
static_assert(sizeof(SplitPart) == sizeof(int4), "a part is one 16-byte load");
// A split unit's parts (0: it ran whole, nothing to merge) and their virtual units, in piece order.
struct MergeList {
  int parts, dst[7];
};
// The table as the producer (which walks a piece's parts from it: computing them with divisions moved the consumers'
// loop) and the merge kernel read it.
struct SplitTable {
  static constexpr int kHeadWords = sizeof(SplitHead) / sizeof(int);
  const int* s;
  __device__ explicit SplitTable(const Params& p) : s(p.sched) {}
  __device__ const SplitHead& head() const { return *reinterpret_cast<const SplitHead*>(s); }
  __device__ int split() const { return head().split; }
  __device__ int pieces() const { return head().pieces; }
  __device__ bool taken() const { return head().taken != 0; }
  // Piece q's parts are parts first(q) .. first(q + 1) − 1.
  __device__ int first(int q) const { return s[kHeadWords + q]; }
  __device__ int4 part(int i) const { return reinterpret_cast<const int4*>(s + head().parts_at)[i]; }
  // Split unit split() + r's merge list.
  __device__ const MergeList& merged(int r) const {
    return reinterpret_cast<const MergeList*>(s + head().merged_at)[r];
  }
};

// A block's share of one unit: unit u's key tiles k0 .. k0 + kt − 1 (kt < 0: all of them, key_tiles), its O and LSE
// to virtual unit dst (dst < 0: its own rows).
struct Seg {
  int u, k0, kt, dst;
};

}  // namespace sdpa
