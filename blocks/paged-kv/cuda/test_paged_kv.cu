// test_paged_kv.cu: each sequence's keys gathered through the block table into a dense [B, Hkv, max_len, D] tensor.
#include "paged_kv.cuh"

// Block (b · hkv + h, y) copies keys y · 64 … y · 64 + 63 of head h of sequence b, 16 bytes a thread a step; keys at or
// past the sequence's length are written as zeros. d is a multiple of 16.
extern "C" __global__ void __launch_bounds__(128) gather_paged(const unsigned char* pool, const int* pages,
                                                               const int* seq_lens, int max_pages, int page_shift,
                                                               int hkv, int d, int max_len, unsigned char* out) {
  const int b = blockIdx.x / hkv, h = blockIdx.x % hkv;
  const paged::Table t{pages, max_pages, page_shift};
  const int len = seq_lens[b], chunks = d / 16;
  for (int i = threadIdx.x; i < 64 * chunks; i += blockDim.x) {
    const int key = blockIdx.y * 64 + i / chunks, c = i % chunks;
    if (key >= max_len) continue;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (key < len)
      v = *reinterpret_cast<const uint4*>(pool + paged::head_offset(paged::pool_row(t, b, key), h, hkv, d) + 16 * c);
    *reinterpret_cast<uint4*>(out + (((long long)blockIdx.x * max_len + key) * d) + 16 * c) = v;
  }
}
