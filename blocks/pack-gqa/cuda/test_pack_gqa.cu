// test_pack_gqa.cu: every packed row's (head, token) and visible keys, as the device computes them.
#include "pack_gqa.cuh"

// Thread i: row r = rows[i] of case c = cases[i] (group, sq, sk, causal, left, right as six ints at cfg[6c …]) →
// out[4i …] = head, token, lo, hi.
extern "C" __global__ void pack_rows(const int* cfg, const int* cases, const int* rows, int n, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int* c = cfg + 6 * cases[i];
  const pack::Row r = pack::row(rows[i], c[0]);
  const pack::Keys k = pack::keys(r.token, c[1], c[2], c[3] != 0, c[4], c[5]);
  out[4 * i] = r.head;
  out[4 * i + 1] = r.token;
  out[4 * i + 2] = k.lo;
  out[4 * i + 3] = k.hi;
}
