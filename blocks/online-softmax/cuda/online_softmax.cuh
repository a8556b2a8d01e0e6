// online_softmax.cuh: the FlashAttention-2 per-row update (running max m, running sum l, O rescale) in registers.
//
// Convention: scores S are raw (q·k); the softmax is over scale·S. With c = scale·log2(e):
//   m_new = max(m, rowmax(S))                  (raw units; masked columns count as -inf)
//   m_use = m_new, or 0 when m_new = -inf      (guard: never (-inf) - (-inf))
//   P     = exp2(S·c − m_use·c)                (0 in masked columns)
//   alpha = exp2((m − m_use)·c)                (0 while m = -inf)
//   l     = alpha·l + rowsum(P);  O = alpha·O + P·V;  m = m_new
// finish: O = O / l and LSE = m·scale + ln(l), the natural log of Σ exp(scale·s); a row with no finite
// score ends with O = 0 and LSE = -inf, never NaN.
// Every c and scale below is one float for all rows, or a RowScale: one a row (rows of different query heads in one
// tile, each with its own Q scale: packed grouped-query heads). The arithmetic of a row is the same either way.
// Every a·b + c of these updates is an explicit fmaf: left to contraction, ptxas fuses it in one kernel and rounds a·b
// first in another, and kernels that must agree bit for bit (packed heads and unpacked) differ by an ulp.
#pragma once
#include <mma.h>
#include "frag_layout.cuh"
#include "warp_reduce.cuh"

namespace osm {

// The two rows a lane helps hold: m[h], l[h] for row frag::acc_row(lane, h).
struct RowState {
  float m[2];
  float l[2];
};

// A scale for each of this lane's two rows (frag::acc_row(lane, h)), where a tile's rows have different scales.
struct RowScale {
  float c[2];
};
// Row h's scale: the one float, or RowScale's entry h.
__device__ __forceinline__ float row_c(float c, int) { return c; }
__device__ __forceinline__ float row_c(const RowScale& c, int h) { return c.c[h]; }

__device__ __forceinline__ void init(RowState& st) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.m[h] = wr::neg_inf();
    st.l[h] = 0.0f;
  }
}

// 2^x in one MUFU.EX2. exp2f adds a range test and a square for results below 2^-126 (two extra instructions a
// cell); those flush to 0 here, which no output notices: P below 2^-126 is 0 in f16, bf16 and E4M3, and l ≥ 1.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

namespace detail {
// Masked cells (columns >= limit[h] of row h) become -inf once, in place, so the max, the exponentials and the
// sum after it need no per-cell predicate of their own: a mask kept alive across the three loops cost ~30
// registers (64 predicates packed into words) in the FP8 stages' consumers.
template <class L, int NF, class Frag>
__device__ __forceinline__ void mask_in_place(Frag (&s)[NF], int col0, const int (&limit)[2]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < L::kElems; ++i)
      if (col0 + f * L::kCols + L::col(lane, i) >= limit[frag::acc_half(i)]) s[f].x[i] = wr::neg_inf();
}

// The row max of the (masked) tile and the online update of m: alpha for O and l, and the m the exponentials
// subtract (0 while the row has no finite score: never (-inf) - (-inf)).
template <class L, int NF, class Frag, class C>
__device__ __forceinline__ void update_max(Frag (&s)[NF], int col0, const int (&limit)[2], C c, RowState& st,
                                           float (&alpha)[2], float (&m_use)[2]) {
  float mx[2];
  wr::rows_limited<L, wr::MaxOp, false>(s, col0, limit, wr::MaxOp{}, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = wr::max_nan(st.m[h], mx[h]);
    m_use[h] = m_new == wr::neg_inf() ? 0.0f : m_new;
    alpha[h] = exp2_ftz((st.m[h] - m_use[h]) * row_c(c, h));
    st.m[h] = m_new;
  }
}

template <class L, int P_OFFSET, bool MASKED, int NF, class Frag, class C>
__device__ __forceinline__ void step(Frag (&s)[NF], int col0, const int (&limit)[2], C c, RowState& st, float (&alpha)[2]) {
  if constexpr (MASKED) mask_in_place<L>(s, col0, limit);
  float m_use[2];
  update_max<L>(s, col0, limit, c, st, alpha, m_use);
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < L::kElems; ++i) {
      const int h = frag::acc_half(i);
      const float ch = row_c(c, h);
      // A score of the E4M3 GEMM is finite, so -inf here is a masked cell (and exp2 of -inf·c is 0 only for c > 0).
      const bool valid = !MASKED || s[f].x[i] != wr::neg_inf();
      if constexpr (P_OFFSET == 0) {
        s[f].x[i] = valid ? exp2_ftz(fmaf(s[f].x[i], ch, -m_use[h] * ch)) : 0.0f;
      } else {
        s[f].x[i] = valid ? exp2_ftz(fmaf(s[f].x[i], ch, fmaf(-m_use[h], ch, float(P_OFFSET)))) : 0.0f;
      }
    }
  float ps[2];
  wr::rows_limited<L, wr::SumOp, false>(s, col0, limit, wr::SumOp{}, ps);
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] = fmaf(alpha[h], st.l[h], ps[h]);
}
}  // namespace detail

// As step, with a column limit per row (this lane's two rows): columns >= limit[h] of row h are masked. A
// causal mask is limit = min(Sk, row + Sk - Sq + 1). A row with no column left keeps m = -inf and l = 0: its O
// is 0 and its LSE -inf (finish).
template <class L, int P_OFFSET = 0, int NF, class Frag, class C>
__device__ __forceinline__ void step_rows(Frag (&s)[NF], int col0, const int (&limit)[2], C c, RowState& st,
                                          float (&alpha)[2]) {
  if (col0 + NF * L::kCols <= min(limit[0], limit[1]))
    detail::step<L, P_OFFSET, false>(s, col0, limit, c, st, alpha);
  else
    detail::step<L, P_OFFSET, true>(s, col0, limit, c, st, alpha);
}

// A sliding window's left edge: columns col0 + … < lo[h] of row h (this lane's two rows) set to -inf in place, the
// rest of the tile as it is. A caller applies it to a tile that reaches below a row's first visible key, before
// step_rows / step_max_rows (which mask the right edge, limit): a -inf cell is left out of the max, becomes P = 0
// and adds 0 to l on either of their paths (for c > 0), and a row with no cell left keeps m = -inf as step_rows says.
template <class L, int NF, class Frag>
__device__ __forceinline__ void mask_below(Frag (&s)[NF], int col0, const int (&lo)[2]) {
  if (col0 >= max(lo[0], lo[1])) return;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int f = 0; f < NF; ++f)
#pragma unroll
    for (int i = 0; i < L::kElems; ++i)
      if (col0 + f * L::kCols + L::col(lane, i) < lo[frag::acc_half(i)]) s[f].x[i] = wr::neg_inf();
}

// One K/V tile: turns the score fragments S into P in place, updates m and l, and returns the factor O must
// be rescaled by before P·V is added. Columns col0 + ... >= kv_valid are masked. P_OFFSET (log2 units) scales
// every P by 2^P_OFFSET, so that P in (0, 2^P_OFFSET] uses FP8's range (FlashAttention-3's Max_offset); l
// carries the same factor, so O / l is unchanged and finish<L, P_OFFSET> takes it out of the LSE. A tile with
// every column valid (all but the last, warp-uniformly) takes the path without per-cell compares.
template <class L, int P_OFFSET = 0, int NF, class Frag, class C>
__device__ __forceinline__ void step(Frag (&s)[NF], int col0, int kv_valid, C c, RowState& st, float (&alpha)[2]) {
  const int limit[2] = {kv_valid, kv_valid};
  step_rows<L, P_OFFSET>(s, col0, limit, c, st, alpha);
}

// ---- step in pieces: for a caller that issues P·V a K-step at a time while the next step's exponentials run ----
// step_max, then exp_cells and sum_cells over consecutive cell ranges from 0 to L::kElems, then step_end: the
// same arithmetic in the same order as step, so the same bits, for c > 0 (the hosts refuse any other scale): a
// masked cell is -inf in place, and exp2(-inf·c + bias) is 0. One fragment (a wgmma accumulator row block).

// The masking (columns >= limit[h] of row h, as step_rows), the row max and the online update of m: alpha for
// O and l, and each row's exponent bias P_OFFSET − m·c for exp_cells.
template <class L, int P_OFFSET = 0, class Frag, class C>
__device__ __forceinline__ void step_max_rows(Frag (&s)[1], int col0, const int (&limit)[2], C c, RowState& st,
                                              float (&alpha)[2], float (&bias)[2]) {
  if (col0 + L::kCols > min(limit[0], limit[1])) {
    detail::mask_in_place<L>(s, col0, limit);
  }
  float m_use[2];
  detail::update_max<L>(s, col0, limit, c, st, alpha, m_use);
#pragma unroll
  for (int h = 0; h < 2; ++h) bias[h] = fmaf(-m_use[h], row_c(c, h), float(P_OFFSET));
}
// Both rows with the same limit: columns >= kv_valid are masked.
template <class L, int P_OFFSET = 0, class Frag, class C>
__device__ __forceinline__ void step_max(Frag (&s)[1], int col0, int kv_valid, C c, RowState& st, float (&alpha)[2],
                                         float (&bias)[2]) {
  const int limit[2] = {kv_valid, kv_valid};
  step_max_rows<L, P_OFFSET>(s, col0, limit, c, st, alpha, bias);
}

// P = exp2(s·c + bias) in place for cells [LO, HI) of a lane's fragment.
template <class L, int LO, int HI, class C>
__device__ __forceinline__ void exp_cells(float (&x)[L::kElems], C c, const float (&bias)[2]) {
#pragma unroll
  for (int i = LO; i < HI; ++i) x[i] = exp2_ftz(fmaf(x[i], row_c(c, frag::acc_half(i)), bias[frag::acc_half(i)]));
}

// The row sums' partials (wr::SumOp's chains, per row), filled cell range by cell range.
struct RowSum {
  float v[2][wr::SumOp::kChains];
};
__device__ __forceinline__ void init(RowSum& r) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 0; k < wr::SumOp::kChains; ++k) r.v[h][k] = 0.0f;
}
// Cell i's place among its row's cells in a lane's fragment, which wr::rows_limited folds into partial
// place % kChains: rows alternate in pairs of cells (frag::acc_half), so the closed form holds for every layout.
__host__ __device__ constexpr int row_ordinal(int i) { return (i >> 2) * 2 + (i & 1); }
namespace detail {
__host__ __device__ constexpr bool row_ordinal_counts() {
  for (int i = 0; i < 256; ++i) {
    int n = 0;
    for (int j = 0; j < i; ++j) n += frag::acc_half(j) == frag::acc_half(i);
    if (n != row_ordinal(i)) return false;
  }
  return true;
}
static_assert(row_ordinal_counts(), "row_ordinal must count the cells of its row before it");
}  // namespace detail
template <class L, int LO, int HI>
__device__ __forceinline__ void sum_cells(const float (&x)[L::kElems], RowSum& r) {
#pragma unroll
  for (int i = LO; i < HI; ++i) {
    float& v = r.v[frag::acc_half(i)][row_ordinal(i) % wr::SumOp::kChains];
    v = v + x[i];
  }
}

// The partials combined in order, the quad's sum, and l = alpha·l + rowsum(P).
__device__ __forceinline__ void step_end(const RowSum& r, const float (&alpha)[2], RowState& st) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v = r.v[h][0];
#pragma unroll
    for (int k = 1; k < wr::SumOp::kChains; ++k) v = v + r.v[h][k];
    st.l[h] = fmaf(alpha[h], st.l[h], wr::quad(v, wr::SumOp{}));
  }
}

// O = alpha·O, row by row.
template <class L, int NO, class Frag>
__device__ __forceinline__ void rescale(Frag (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
  for (int f = 0; f < NO; ++f)
#pragma unroll
    for (int i = 0; i < L::kElems; ++i) o[f].x[i] *= alpha[frag::acc_half(i)];
}

// The rows' 1/l (0 where l = 0) and LSE (less the 2^P_OFFSET that step<L, P_OFFSET> put into l): finish without
// touching O, for a caller that scales O later (or while O's last GEMM still runs).
template <int P_OFFSET = 0, class C>
__device__ __forceinline__ void finish_rows(const RowState& st, C scale, float (&inv)[2], float (&lse)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    inv[h] = st.l[h] > 0.0f ? 1.0f / st.l[h] : 0.0f;
    if constexpr (P_OFFSET == 0) {
      lse[h] = st.l[h] > 0.0f ? fmaf(st.m[h], row_c(scale, h), logf(st.l[h])) : wr::neg_inf();
    } else {
      lse[h] = st.l[h] > 0.0f
                   ? fmaf(st.m[h], row_c(scale, h), logf(st.l[h]) - float(P_OFFSET) * 0.6931471805599453f)
                   : wr::neg_inf();
    }
  }
}

// O = O / l (0 where l = 0) and the rows' LSE (less the 2^P_OFFSET that step<L, P_OFFSET> put into l).
template <class L, int P_OFFSET = 0, int NO, class Frag, class C>
__device__ __forceinline__ void finish(Frag (&o)[NO], const RowState& st, C scale, float (&lse)[2]) {
  float inv[2];
  finish_rows<P_OFFSET>(st, scale, inv, lse);
#pragma unroll
  for (int f = 0; f < NO; ++f)
#pragma unroll
    for (int i = 0; i < L::kElems; ++i) o[f].x[i] *= inv[frag::acc_half(i)];
}

// A wmma accumulator's cells as a matrix_a operand, with no trip through shared memory. Exact because, as
// probed on sm_90 and asserted below, accumulator x[i] and matrix_a x[i] and x[i + 8] hold the same cell.
template <class Acc, class A>
__device__ __forceinline__ void acc_to_matrix_a(const Acc& acc, A& a) {
#pragma unroll
  for (int i = 0; i < 8; ++i) a.x[i] = a.x[i + 8] = __float2half(acc.x[i]);
}

namespace detail {
__host__ __device__ constexpr bool acc_is_matrix_a() {
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 16; ++i)
      if (frag::wmma_a_row(l, i) != frag::wmma_acc_row(l, i & 7) || frag::wmma_a_col(l, i) != frag::wmma_acc_col(l, i & 7))
        return false;
  return true;
}
static_assert(acc_is_matrix_a(), "acc_to_matrix_a needs the accumulator and matrix_a layouts to coincide");
}  // namespace detail

}  // namespace osm
