// paged_kv.cuh: block-table addressing of a paged KV cache: (sequence, key) to its row in the shared pool of pages.
//
// The pool is [num_pages, page_size, Hkv, D]: page p's rows are p · page_size … p · page_size + page_size − 1, each
// Hkv heads of D elements. Sequence b's key k sits in page pages[b · max_pages + k / page_size], at row k % page_size
// of it. page_size is a power of two (16 to 256), so the division is a shift and the remainder a mask. The host checks
// every entry a sequence's length reaches (paged_kv::validate) before any launch: a kernel reads no entry past it.
#pragma once

namespace paged {

// A block table as kernels read it.
struct Table {
  const int* pages;  // [B][max_pages]
  int max_pages;
  int page_shift;  // log2(page_size)
};

// The pool row of key `key` of sequence `b`.
__device__ __forceinline__ long long pool_row(const Table& t, int b, int key) {
  const int page = t.pages[(long long)b * t.max_pages + (key >> t.page_shift)];
  return ((long long)page << t.page_shift) + (key & ((1 << t.page_shift) - 1));
}

// The byte offset of head h of pool row `row`, rows of hkv heads × `head_bytes` bytes.
__device__ __forceinline__ long long head_offset(long long row, int h, int hkv, int head_bytes) {
  return (row * hkv + h) * (long long)head_bytes;
}

}  // namespace paged
