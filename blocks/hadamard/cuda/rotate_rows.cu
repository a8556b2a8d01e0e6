// rotate_rows.cu: the block's library kernels, rows of D floats rotated in place (hadamard::Rotation::apply).
#include "hadamard.cuh"

#define ROTATE_ROWS(D)                                                                                          \
  extern "C" __global__ void hadamard_rows_d##D(float* x, long long rows, const float* signs, float norm,      \
                                                int inverse) {                                                \
    had::rotate_rows<D>(x, rows, signs, norm, inverse != 0);                                                  \
  }
ROTATE_ROWS(32)
ROTATE_ROWS(64)
ROTATE_ROWS(128)
ROTATE_ROWS(256)
