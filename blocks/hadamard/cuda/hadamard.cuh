// hadamard.cuh: the fast Walsh-Hadamard transform of a row of D floats held by one warp, D/32 per lane.
#pragma once

namespace had {

// Lane l holds elements l*E .. l*E + E - 1 of the row, E = D / 32 (consecutive, so a row loads as one vector
// per lane). Stages run from stride 1 up to D / 2, each butterfly (a, b) -> (a + b, a - b) with a the lower
// element, exactly as the host model orders them: every output is one f32 add or subtract of the same two
// values, so the device and the model agree bit for bit.
template <int D>
__device__ __forceinline__ void fwht(float (&v)[D / 32]) {
  constexpr int E = D / 32;
  static_assert(D >= 32 && D <= 256 && (D & (D - 1)) == 0, "D: a power of two from 32 to 256");
#pragma unroll
  for (int h = 1; h < E; h <<= 1) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
  // Stride E * m lives across lanes l and l ^ m: the lower lane keeps a + b, the upper one a - b, where a is
  // the lower lane's value.
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = upper ? o - v[i] : v[i] + o;
    }
  }
}

// The orthonormal rotation x -> (x * diag(s)) * H / sqrt(D) of a row (row-vector convention), and its
// inverse y -> (y * H / sqrt(D)) * diag(s). s is +-1 per channel (nullptr: all +1); norm is the f32 nearest
// 1 / sqrt(D), as the model takes it. Multiplying by +-1 is exact, so only the FWHT's adds and the one scaling
// round.
template <int D>
__device__ __forceinline__ void rotate(float (&v)[D / 32], const float* signs, float norm, bool inverse) {
  constexpr int E = D / 32;
  const int base = (threadIdx.x & 31) * E;
  if (signs != nullptr && !inverse) {
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] *= signs[base + i];
  }
  fwht<D>(v);
#pragma unroll
  for (int i = 0; i < E; ++i) v[i] *= norm;
  if (signs != nullptr && inverse) {
#pragma unroll
    for (int i = 0; i < E; ++i) v[i] *= signs[base + i];
  }
}

// E consecutive floats at p (E = 1, 2, 4 or 8; p aligned to E floats), in one or two vector accesses.
template <int E>
__device__ __forceinline__ void load_row(const float* p, float (&v)[E]) {
  if constexpr (E == 1) {
    v[0] = p[0];
  } else if constexpr (E == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    v[0] = a.x, v[1] = a.y;
  } else {
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
      const float4 a = reinterpret_cast<const float4*>(p)[j];
      v[4 * j] = a.x, v[4 * j + 1] = a.y, v[4 * j + 2] = a.z, v[4 * j + 3] = a.w;
    }
  }
}

template <int E>
__device__ __forceinline__ void store_row(float* p, const float (&v)[E]) {
  if constexpr (E == 1) {
    p[0] = v[0];
  } else if constexpr (E == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
#pragma unroll
    for (int j = 0; j < E / 4; ++j)
      reinterpret_cast<float4*>(p)[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
  }
}

// Rotates `rows` rows of D floats in place, a warp a row, grid-stride: the body of the library kernels.
template <int D>
__device__ __forceinline__ void rotate_rows(float* x, long long rows, const float* signs, float norm, bool inverse) {
  constexpr int E = D / 32;
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    float* p = x + r * D + (threadIdx.x & 31) * E;
    float v[E];
    load_row<E>(p, v);
    rotate<D>(v, signs, norm, inverse);
    store_row<E>(p, v);
  }
}

}  // namespace had
