// pack_gqa.cuh: the query heads that share a K/V head packed into one tile's rows (FA3's PackGQA), and each row's keys.
//
// A (sequence, K/V head) of grouped-query attention has `group` query heads (H / Hkv) and Sq query tokens: group·Sq
// rows that all read the same keys. Packed, row r is token r / group of query head kv·group + r % group (heads
// minor: in a [B, S, H, D] tensor a token's heads of one group are adjacent, so the packed rows are one TMA box of
// group heads × Sq tokens), and one pass over a K/V tile serves all of them. Decode (Sq = 1…16) is where it pays:
// without it each query head's tile holds Sq rows.
//
// Row r's query sits at key position i = Sk − Sq + token (bottom-right aligned: the new tokens are the last of the
// sequence). It sees keys j in [lo, hi): without a mask every key; causal, j ≤ i; a sliding window (left, right),
// i − left ≤ j ≤ i + right (a negative side is unbounded); both, the intersection. lo may reach hi: a row with no key.
#pragma once

namespace pack {

struct Row {
  int head;   // the query head within the group, 0 … group − 1 (the head is kv · group + head)
  int token;  // the query token, 0 … Sq − 1
};

__host__ __device__ __forceinline__ Row row(int r, int group) { return Row{r % group, r / group}; }

// The keys row `token` sees, [lo, hi) within 0 … sk: `causal`, and a window of `left` keys before and `right` after
// its position (negative: no bound on that side).
struct Keys {
  int lo, hi;
};
__host__ __device__ __forceinline__ Keys keys(int token, int sq, int sk, bool causal, int left, int right) {
  const long long i = (long long)sk - sq + token;
  long long lo = 0, hi = sk;
  if (causal) hi = i + 1 < hi ? i + 1 : hi;
  if (right >= 0) hi = i + right + 1 < hi ? i + right + 1 : hi;
  if (left >= 0) lo = i - left > lo ? i - left : lo;
  if (hi < 0) hi = 0;
  if (lo > hi) lo = hi;
  return Keys{int(lo), int(hi)};
}

}  // namespace pack
