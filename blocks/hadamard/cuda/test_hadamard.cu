// test_hadamard.cu: the bare transform twice in registers (H * H = D * I, exact on small integers).
#include "hadamard.cuh"

// One warp a row: y = FWHT(FWHT(x)), no scaling, no memory round trip between the two.
#define FWHT_TWICE(D)                                                                         \
  extern "C" __global__ void fwht_twice_d##D(const float* x, float* y, long long rows) {     \
    constexpr int E = D / 32;                                                                 \
    const long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;        \
    if (r >= rows) return;                                                                    \
    float v[E];                                                                               \
    had::load_row<E>(x + r * D + (threadIdx.x & 31) * E, v);                                  \
    had::fwht<D>(v);                                                                          \
    had::fwht<D>(v);                                                                          \
    had::store_row<E>(y + r * D + (threadIdx.x & 31) * E, v);                                 \
  }
FWHT_TWICE(32)
FWHT_TWICE(64)
FWHT_TWICE(128)
FWHT_TWICE(256)
