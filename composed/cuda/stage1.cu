// stage1.cu: K/V double-buffered with cp.async (ring N = 2), Q·Kᵀ on the tensor cores, softmax in shared
// memory, P·V scalar on the CUDA cores.
#include "smem_softmax.cuh"

namespace sdpa {

// O lives in registers: thread t owns row t / 2, columns (t % 2)·D/2 .. + D/2.
template <int D>
__device__ void stage1(const Params& p) {
  constexpr int BC = Tile<D>::kBC, BQ = Tile<D>::kBQ, H = D / 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const Smem<D, 2> sm(smem_raw);
  const ScoreBuf<BC> sb(sm.rest);
  RowStats st = sb.st;
  float* s_scores = sb.s;
  const Block b(p, BQ);
  const int row = threadIdx.x / 2, col0 = (threadIdx.x % 2) * H;
  const KV<D, 2> kv(p, sm, b.bh);
  kv.begin(p, sm, b);
  st.init();
  float o[H];
#pragma unroll
  for (int d = 0; d < H; ++d) o[d] = 0.0f;
  for (int t = 0; t < kv.tiles(); ++t) {
    kv.next(t, sm);
    Acc s[BC / 16];
    qk<D>(sm.q, sm.k, s);
    sb.store(s);
    // P stays f32, in place of the scores: the scalar P·V needs no f16 operand.
    softmax_rows<BC>(s_scores, BC, p.sk - t * BC, b.c, st, [&](int r, int j, float pv) { s_scores[r * BC + j] = pv; });
    __syncthreads();
    const float a = st.alpha[row];
#pragma unroll
    for (int d = 0; d < H; ++d) o[d] *= a;
    for (int j = 0; j < BC; ++j) {
      const float pj = s_scores[row * BC + j];
#pragma unroll
      for (int d = 0; d < H; ++d) o[d] = fmaf(pj, __half2float(sm.v[j * Tile<D>::kLd + col0 + d]), o[d]);
    }
  }
  const int r = b.q0 + row;
  if (r < p.sq) {
    const float f = inv_l(st, row) * p.v_scale[b.bh];
#pragma unroll
    for (int d = 0; d < H; d += 2)
      store_o2(p, ((long long)b.bh * p.sq + r) * D + col0 + d, o[d] * f, o[d + 1] * f);
    if (col0 == 0) p.lse[(long long)b.bh * p.sq + r] = row_lse(st, row, b.scale);
  }
}

}  // namespace sdpa

extern "C" __global__ void __launch_bounds__(128) stage1_d64(sdpa::Params p) { sdpa::stage1<64>(p); }
extern "C" __global__ void __launch_bounds__(128) stage1_d128(sdpa::Params p) { sdpa::stage1<128>(p); }
