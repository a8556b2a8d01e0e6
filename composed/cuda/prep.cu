// prep.cu: K smoothing and its LSE correction, the steps of OnDevice::prepare that no block owns.
// (Rotation is hadamard's rotate_rows.cu, quantization fp8-codec's quantize_tensor.cu.)

// One block of D threads a head, one thread a channel: mu = the f64 sum over keys in key order / Sk, rounded
// to f32 (fixtures::key_means), then k -= mu. Threads of a block read one key's D channels together: coalesced.
extern "C" __global__ void prep_smooth_k(float* k, int sk, int d, float* mu) {
  const long long head = blockIdx.x;
  const int c = threadIdx.x;
  float* kh = k + head * sk * d + c;
  double s = 0.0;
  for (int j = 0; j < sk; ++j) s += (double)kh[(long long)j * d];
  const float m = (float)(s / (double)sk);
  mu[head * d + c] = m;
  for (int j = 0; j < sk; ++j) kh[(long long)j * d] -= m;
}

// shift[r] = softmax_scale * (q_r . mu_head), the dot product in f64 in channel order (fixtures::lse_shift): a
// thread a query row. Each product of two f32 is exact in f64, so a fused multiply-add changes nothing.
extern "C" __global__ void prep_lse_shift(const float* q, long long rows, int sq, int d, const float* mu,
                                          float softmax_scale, float* shift) {
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    const float* qr = q + r * d;
    const float* m = mu + (r / sq) * d;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += (double)qr[c] * (double)m[c];
    shift[r] = (float)((double)softmax_scale * dot);
  }
}
