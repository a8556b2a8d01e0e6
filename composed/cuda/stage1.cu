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
  float* s_scores = reinterpret_cast<float*>(sm.rest);
  RowStats st{s_scores + BQ * BC, s_scores + BQ * BC + BQ, s_scores + BQ * BC + 2 * BQ};
  const int bh = blockIdx.y, q0 = blockIdx.x * BQ, w = threadIdx.x >> 5;
  const int row = threadIdx.x / 2, col0 = (threadIdx.x % 2) * H;
  const float scale = p.softmax_scale * p.q_scale[bh] * p.k_scale[bh], c = scale * kLog2e;
  const KV<D, 2> kv(p, sm, bh);
  kv.prologue();
  load_q<D>(p, bh, q0, sm.q);
  st.init();
  float o[H];
#pragma unroll
  for (int d = 0; d < H; ++d) o[d] = 0.0f;
  for (int t = 0; t < kv.tiles(); ++t) {
    kv.next(t, sm);
    Acc s[BC / 16];
    qk<D>(sm.q, sm.k, s);
#pragma unroll
    for (int j = 0; j < BC / 16; ++j) wmma::store_matrix_sync(s_scores + w * 16 * BC + 16 * j, s[j], BC, wmma::mem_row_major);
    __syncthreads();
    // P stays f32, in place of the scores: the scalar P·V needs no f16 operand.
    softmax_rows<BC>(s_scores, BC, p.sk - t * BC, c, st, [&](int r, int j, float pv) { s_scores[r * BC + j] = pv; });
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
  const int r = q0 + row;
  if (r < p.sq) {
    const float f = inv_l(st, row) * p.v_scale[bh];
#pragma unroll
    for (int d = 0; d < H; d += 2)
      *reinterpret_cast<__half2*>(p.o + ((long long)bh * p.sq + r) * D + col0 + d) = __floats2half2_rn(o[d] * f, o[d + 1] * f);
    if (col0 == 0) p.lse[(long long)bh * p.sq + r] = row_lse(st, row, scale);
  }
}

}  // namespace sdpa

extern "C" __global__ void __launch_bounds__(128) stage1_d64(sdpa::Params p) { sdpa::stage1<64>(p); }
extern "C" __global__ void __launch_bounds__(128) stage1_d128(sdpa::Params p) { sdpa::stage1<128>(p); }
