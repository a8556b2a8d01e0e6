// test_frag_layout_wgmma.cu: one wgmma.mma_async on registers and shared-memory images the host prepared, for the sm_90a probes.
#include "wgmma_instr.cuh"

// Run r = blockIdx.x. A is four registers per thread (a_words[r][t][4]) or a shared-memory image (a_img[r]);
// B is always an image (b_img[r]). The host encodes each descriptor with the start offset but without the
// tile's address, which only the device knows; images start 1024-byte aligned, as swizzling requires.
template <int N, class T, bool A_REGS>
__device__ void probe(const unsigned* a_words, const unsigned char* a_img, int a_bytes, unsigned long long a_desc,
                      const unsigned char* b_img, int b_bytes, unsigned long long b_desc, float* out) {
  extern __shared__ unsigned char raw[];
  const unsigned raw_addr = static_cast<unsigned>(__cvta_generic_to_shared(raw));
  unsigned char* sa = raw + ((1024 - (raw_addr & 1023)) & 1023);
  unsigned char* sb = sa + a_bytes;  // a_bytes is a multiple of 1024
  const int t = threadIdx.x, r = blockIdx.x;
  for (int i = t; i < a_bytes / 16; i += 128)
    reinterpret_cast<uint4*>(sa)[i] = reinterpret_cast<const uint4*>(a_img + (long long)r * a_bytes)[i];
  for (int i = t; i < b_bytes / 16; i += 128)
    reinterpret_cast<uint4*>(sb)[i] = reinterpret_cast<const uint4*>(b_img + (long long)r * b_bytes)[i];
  // Ordinary stores, read next by the tensor cores (the async proxy).
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  unsigned a[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) a[q] = a_words[((long long)r * 128 + t) * 4 + q];
  const unsigned long long da = a_desc + (static_cast<unsigned>(__cvta_generic_to_shared(sa)) >> 4);
  const unsigned long long db = b_desc + (static_cast<unsigned>(__cvta_generic_to_shared(sb)) >> 4);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  if constexpr (A_REGS) {
    wg::Mma<N, T, T>::rs(d, a, db, 0);
  } else {
    wg::Mma<N, T, T>::ss(d, da, db, 0);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    asm volatile("" : "+f"(d[i])::"memory");  // no read of d moves above the wait
    out[((long long)r * 128 + t) * (N / 2) + i] = d[i];
  }
}

#define LAB_WG_PROBE(T, N, SRC, AREGS)                                                                            \
  extern "C" __global__ void __launch_bounds__(128, 1) probe_wgmma_##T##_n##N##_##SRC(                             \
      const unsigned* a_words, const unsigned char* a_img, int a_bytes, unsigned long long a_desc,                 \
      const unsigned char* b_img, int b_bytes, unsigned long long b_desc, float* out) {                            \
    probe<N, wg::T, AREGS>(a_words, a_img, a_bytes, a_desc, b_img, b_bytes, b_desc, out);                          \
  }

#define LAB_WG_PROBES(T)      \
  LAB_WG_PROBE(T, 64, rs, true)   \
  LAB_WG_PROBE(T, 128, rs, true)  \
  LAB_WG_PROBE(T, 256, rs, true)  \
  LAB_WG_PROBE(T, 64, ss, false)

LAB_WG_PROBES(e4m3)
LAB_WG_PROBES(e5m2)
LAB_WG_PROBES(f16)
LAB_WG_PROBES(bf16)
