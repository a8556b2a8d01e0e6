// hello.cu: the harness's proof-of-loop kernel, y = a*x + y over n elements, through a shared-memory stage.
#include "lab/lab.cuh"

// The shared stage exists so that the ptxas report has shared memory and a barrier to parse.
extern "C" __global__ void hello_axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float stage[256];
  const long long i = lab::global_index();
  stage[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  // Reads a neighbour's slot, so the barrier is load-bearing, not decorative.
  const long long j = i ^ 1;
  if (j < n) y[j] = fmaf(a, stage[threadIdx.x ^ 1u], y[j]);
}
