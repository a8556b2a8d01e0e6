// split_kv.cu: split-KV for packed batches: each sequence's keys cut into P chunks run as P virtual sequences, then merged.
#include "pingpong_attention.cuh"

// A packed batch of B sequences becomes one of B · P virtual sequences, virtual sequence b · P + c being sequence b's
// queries against chunk c of its keys: keys [start, end) of chunk c are tiles c · per … of `per` key tiles of BC keys
// (per = ⌈T / P⌉ rounded up to a multiple of `align`, T the sequence's key tiles; align makes a chunk start on a page
// of a paged cache). Chunks are consecutive, so the virtual key boundaries are prefix sums over the same K (no copy);
// each virtual sequence has its own copy of its sequence's query rows (Q2, [P · total_q, H, D], sequence b's P copies
// one after another from P · cu_q[b]) and of its scales. Under a causal mask (bottom-right aligned) row i of the
// sequence sees keys j ≤ i + Sk − Sq; so that each chunk's rows see what they see in the whole sequence, virtual
// sequence b · P + c also gets `past`, the sequence's keys after its chunk, and the packed kernel masks its row i at
// chunk keys j ≤ i + (end − start) + past − Sq (RaggedArgs::past). The attention writes f32 parts (O2, LSE2 of the
// virtual batch; a chunk none of a row's keys fall in gives it O = 0, LSE = −inf); split_kv_merge combines each row's
// P parts (attn-merge: chunks are disjoint key sets).
namespace splitkv {

// Keys [start, end) of chunk c of P of a sequence of sq queries and sk keys (mirrors composed::split_kv::chunk).
__device__ __forceinline__ int2 chunk(int sk, int c, int parts, int bc, int align) {
  const int tiles = (sk + bc - 1) / bc;
  int per = (tiles + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  const long long s = (long long)c * per * bc, e = s + (long long)per * bc;
  return make_int2(int(s < sk ? s : sk), int(e < sk ? e : sk));
}

// The sequence holding packed row r of a batch whose row boundaries are scale · cu[0 … B] (binary search).
__device__ __forceinline__ int sequence_of(const int* cu, int batch, long long r, int scale) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if ((long long)cu[mid] * scale <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace splitkv

// The virtual batch: boundaries cu_q2, cu_k2 (B · P + 1), past2 (B · P: each chunk's keys after it), scales (per virtual sequence and head), the block table
// (paged: [B · P][max_pages], chunk c's row from its first page; else not written) and Q2. One thread a virtual
// sequence for the boundaries; the scales, the table's entries and Q2's 16-byte pieces grid-stride over every thread.
// Q at element strides (token ss, head sh), rows of H · D bytes in Q2.
extern "C" __global__ void __launch_bounds__(256) split_kv_prep(
    const int* cu_q, const int* cu_k, int batch, int parts, int bc, int align, int heads, int hkv,
    const float* qs, const float* ks, const float* vs, int one_scale, const int* table, int max_pages, int page_shift,
    const unsigned char* q, long long ss, long long sh, int d, int total_q, int* cu_q2, int* cu_k2, int* past2,
    float* qs2, float* ks2, float* vs2, int* table2, unsigned char* q2) {
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, threads = (long long)gridDim.x * blockDim.x;
  const int virt = batch * parts;
  if (tid <= virt) {
    const int i = int(tid);
    if (i == virt) {
      cu_q2[i] = parts * cu_q[batch];
      cu_k2[i] = cu_k[batch];
    } else {
      const int b = i / parts, c = i % parts;
      const int sq = cu_q[b + 1] - cu_q[b], sk = cu_k[b + 1] - cu_k[b];
      const int2 ch = splitkv::chunk(sk, c, parts, bc, align);
      cu_q2[i] = parts * cu_q[b] + c * sq;
      cu_k2[i] = cu_k[b] + ch.x;
      past2[i] = sk - ch.y;
    }
  }
  // The scales, an entry a thread (grid-stride): virtual sequence i's H query heads', then its Hkv K and V heads' (a
  // scale whose bit is in `one_scale` is one value for the batch: every entry its [0]; the virtual batch's are full).
  // One thread a virtual sequence, its 48 copies in series, took most of the kernel's 6.6 µs at B = 1, H = 32.
  const int per_seq = heads + 2 * hkv;
  for (long long x = tid; x < (long long)virt * per_seq; x += threads) {
    const int i = int(x / per_seq), e = int(x % per_seq), b = i / parts;
    if (e < heads) {
      qs2[(long long)i * heads + e] = qs[sdpa::scale_at(one_scale, sdpa::kOneQ, (long long)b * heads + e)];
    } else {
      const int h = (e - heads) % hkv;
      const bool k = e < heads + hkv;
      const float* from = k ? ks : vs;
      float* to = k ? ks2 : vs2;
      const int bit = k ? sdpa::kOneK : sdpa::kOneV;
      to[(long long)i * hkv + h] = from[sdpa::scale_at(one_scale, bit, (long long)b * hkv + h)];
    }
  }
  // The virtual block table, an entry a thread (grid-stride): virtual sequence i's row from its chunk's first page (a
  // chunk starts on a page: align). One thread a row, 2,048 entries at 131,072 keys in 64-row pages, took ~130 µs.
  if (table != nullptr) {
    const long long entries = (long long)virt * max_pages;
    for (long long x = tid; x < entries; x += threads) {
      const int i = int(x / max_pages), j = int(x % max_pages), b = i / parts, c = i % parts;
      const int2 ch = splitkv::chunk(cu_k[b + 1] - cu_k[b], c, parts, bc, align);
      const int first = ch.x >> page_shift;
      table2[x] = first + j < max_pages ? table[(long long)b * max_pages + first + j] : 0;
    }
  }
  // Q2: row r2 = P · cu_q[b] + c · sq + t is Q's row cu_q[b] + t; 16 bytes a piece, D / 16 pieces a head.
  const int per_row = heads * d / 16;
  const long long pieces = (long long)parts * total_q * per_row;
  for (long long x = tid; x < pieces; x += threads) {
    const long long r2 = x / per_row;
    const int rest = int(x % per_row), h = rest / (d / 16), off = rest % (d / 16) * 16;
    const int b = splitkv::sequence_of(cu_q, batch, r2, parts);
    const int sq = cu_q[b + 1] - cu_q[b];
    const long long t = (r2 - (long long)parts * cu_q[b]) % sq;
    const uint4 v = *reinterpret_cast<const uint4*>(q + (cu_q[b] + t) * ss + h * sh + off);
    *reinterpret_cast<uint4*>(q2 + r2 * heads * d + (long long)h * d + off) = v;
  }
}

namespace splitkv {

// Columns 8c … 8c + 7 of row (token r, head h) merged from its P parts in O2 / LSE2 (f32, the virtual batch's
// [P · total_q, H, D] and [H, P · total_q]) into O ([total_q, H, D], type T) and, for c = 0, the LSE ([H, total_q]).
template <class T, int D>
__device__ __forceinline__ void merge_row(const float* o2, const float* lse2, void* o, float* lse, const int* cu_q,
                                          int batch, int parts, int total_q, int heads, long long r, int h, int c) {
  constexpr int kMax = 16;
  const int b = sequence_of(cu_q, batch, r, 1);
  const int sq = cu_q[b + 1] - cu_q[b];
  const long long t = r - cu_q[b], base = (long long)parts * cu_q[b] + t;
  float l[kMax], v[kMax][8];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    l[j] = amerge::neg_inf();
    if (j < parts) {
      const long long r2 = base + (long long)j * sq;
      l[j] = __ldcg(lse2 + (long long)h * parts * total_q + r2);
      sdpa::load8(o2 + (r2 * heads + h) * D + 8 * c, v[j]);
    }
  }
  const amerge::Weights<kMax> w = amerge::weights(l, parts);
  if (c == 0) lse[(long long)h * total_q + r] = w.lse;
  float x[8];
  amerge::merge8(w, v, parts, x);
  sdpa::store8(static_cast<T*>(o) + (r * heads + h) * D + 8 * c, x);
}

template <int D>
struct MergeRow {
  const float* o2;
  const float* lse2;
  void* o;
  float* lse;
  const int* cu_q;
  int batch, parts, total_q, heads;
  long long r;
  int h, c;
  template <class T>
  __device__ __forceinline__ void operator()(T) const {
    merge_row<T, D>(o2, lse2, o, lse, cu_q, batch, parts, total_q, heads, r, h, c);
  }
};

}  // namespace splitkv

// Every (token, head) row of O and the LSE from its P ≤ 16 parts: a thread 8 columns, D / 8 threads a row.
#define SPLIT_KV_MERGE(D)                                                                                        \
  extern "C" __global__ void __launch_bounds__(128) split_kv_merge_d##D(                                       \
      const float* o2, const float* lse2, void* o, float* lse, int o_dtype, const int* cu_q, int batch, int parts, \
      int total_q, int heads) {                                                                                  \
    const long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x, row = x / (D / 8);                    \
    if (row >= (long long)total_q * heads) return;                                                             \
    const long long r = row / heads;                                                                           \
    const int h = int(row % heads), c = int(x % (D / 8));                                                      \
    sdpa::with_o_type(o_dtype, splitkv::MergeRow<D>{o2, lse2, o, lse, cu_q, batch, parts, total_q, heads, r, h, c}); \
  }
SPLIT_KV_MERGE(64)
SPLIT_KV_MERGE(128)
