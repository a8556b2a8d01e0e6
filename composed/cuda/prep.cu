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

// shift[r] = softmax_scale * (q_r . mu_kv), mu of the row's key/value head (query head / group), the dot
// product in f64 in channel order (fixtures::lse_shift): a thread a query row. Each product of two f32 is exact
// in f64, so a fused multiply-add changes nothing.
extern "C" __global__ void prep_lse_shift(const float* q, long long rows, int sq, int d, int group, const float* mu,
                                          float softmax_scale, float* shift) {
  for (long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
    const float* qr = q + r * d;
    const float* m = mu + (r / sq / group) * d;
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += (double)qr[c] * (double)m[c];
    shift[r] = (float)((double)softmax_scale * dot);
  }
}

// Vᵀ for the TMA stages: vt[head][c][k] = v[head][key(k)][c] for k < sk_pad (a multiple of 32), where key(k)
// is fp8_relayout's p_key order inside each 32-key group (so that P needs no shuffle), and 0 where key(k) >=
// sk (padding must be zeros: 0 x a NaN code would be NaN). A block moves one head's vt_block_keys(D) keys x D
// channels (16 KiB) through shared memory (rows padded by a word, so that the reads below hit 32 banks): coalesced
// 16-byte reads of whole rows; then a thread takes 4 channels of 16 keys as 16 words, transposes them 4 x 4 bytes at
// a time with byte permutes, and writes each channel's 16 keys as one 16-byte store, beside the thread that writes
// the channel's other 16 keys (one 32-byte sector an instruction). Gathered a byte at a time, the transpose was
// compute-bound (ncu: SM 82% busy, DRAM 28%, 54 us at (4,16,4096,128)). Grid (heads, ⌈sk_pad / vt_block_keys(D)⌉),
// 256 threads.
// V is read as a view: head h's key r at v + h · hs + r · rs (contiguous [heads, sk, d]: rs = d, hs = sk · d; both
// multiples of 16 bytes, the host checks).
__device__ __forceinline__ int vt_key(int slot) {
  return 32 * (slot / 32) + 16 * (slot % 32 / 16) + 8 * (slot % 4 / 2) + 2 * (slot % 16 / 4) + slot % 2;
}
// Keys k0 .. k0 + n − 1 of head vh (sk rows of d bytes, row r at vh + r · rs; zeros past sk) into rows[n][d / 4 + 1]
// words, by the block's coalesced 16-byte reads of whole rows (a row padded by a word: the column reads after it hit
// 32 banks). A thread issues kBatch reads before its first shared store: a store between two generic loads orders
// the second after it (the load might read shared memory), one memory round trip a read.
__device__ __forceinline__ void stage_rows(const unsigned char* vh, int sk, int d, long long rs, int k0, int n,
                                           unsigned* rows) {
  constexpr int kBatch = 4;
  const int stride = d / 4 + 1, chunks = d / 16, total = n * chunks;
  for (int base = threadIdx.x; base < total; base += kBatch * blockDim.x) {
    uint4 x[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = base + j * blockDim.x, r = i / chunks;
      x[j] = i < total && k0 + r < sk ? *reinterpret_cast<const uint4*>(vh + (long long)(k0 + r) * rs + 16 * (i % chunks))
                                      : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = base + j * blockDim.x;
      if (i < total) {
        unsigned* row = rows + i / chunks * stride + 4 * (i % chunks);
        row[0] = x[j].x;
        row[1] = x[j].y;
        row[2] = x[j].z;
        row[3] = x[j].w;
      }
    }
  }
}
// w[k]: key k's word of 4 channels (16 keys); out[c][j]: keys 4j … 4j + 3 of channel c, 4 x 4 bytes at a time.
__device__ __forceinline__ void transpose_16x4(const unsigned (&w)[16], unsigned (&out)[4][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned lo01 = __byte_perm(w[4 * j], w[4 * j + 1], 0x5140), hi01 = __byte_perm(w[4 * j], w[4 * j + 1], 0x7362);
    const unsigned lo23 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x5140), hi23 = __byte_perm(w[4 * j + 2], w[4 * j + 3], 0x7362);
    out[0][j] = __byte_perm(lo01, lo23, 0x5410);
    out[1][j] = __byte_perm(lo01, lo23, 0x7632);
    out[2][j] = __byte_perm(hi01, hi23, 0x5410);
    out[3][j] = __byte_perm(hi01, hi23, 0x7632);
  }
}
// Keys a prep_vt block moves: 16 KiB of V a block (32 keys at least), a multiple of 32 (the host's
// composed::prep::vt_block_keys).
__device__ __forceinline__ int vt_block_keys(int d) { return 32 * max(1, 512 / d); }
extern "C" __global__ void prep_vt(const unsigned char* v, int sk, int d, int sk_pad, unsigned char* vt, long long rs,
                                   long long hs) {
  __shared__ __align__(16) unsigned rows[16384 / 4 + 1024];  // vt_block_keys(d) ≤ 1024 keys x (d ≥ 16 bytes + a word)
  const int stride = d / 4 + 1;                              // words a row
  const long long head = blockIdx.x;
  const int k0 = blockIdx.y * vt_block_keys(d), n = min(vt_block_keys(d), sk_pad - k0);  // n: a multiple of 32
  stage_rows(v + head * hs, sk, d, rs, k0, n, rows);
  __syncthreads();
  for (int i = threadIdx.x; i < n / 32 * d / 2; i += blockDim.x) {
    const int cq = i % (d / 2) / 2, seg = i % 2, g = i / (d / 2);  // channels 4cq … 4cq + 3, keys 32g + 16seg …
    unsigned w[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) w[k] = rows[(32 * g + vt_key(16 * seg + k)) * stride + cq];
    unsigned out[4][4];  // [channel][word]: word j holds keys 4j … 4j + 3 of the channel
    transpose_16x4(w, out);
#pragma unroll
    for (int c = 0; c < 4; ++c)
      *reinterpret_cast<uint4*>(vt + (head * d + 4 * cq + c) * sk_pad + k0 + 32 * g + 16 * seg) =
          make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]);
  }
}

// Vᵀ as stage 7's tiles at D = 128 sit in shared memory (TmaBlock::kVtImage), so that one bulk copy loads a tile:
// tile t of head h is the bc × d bytes at out + (h · tiles + t) · bc · d, holding key t·bc + key(k) of channel c at
// (k / 32) · 32d + 32c + ((k % 32 / 16) ^ (c / 4 % 2)) · 16 + k % 16 — the K-major layout of 32-byte swizzled
// panels (wgmma::tile_byte), keys in p_key order, zeros past sk. A block moves one tile through shared memory as
// prep_vt does (coalesced 16-byte reads of whole rows, rows padded by a word), then a thread takes 4 channels of 16
// keys as 16 words, transposes them with byte permutes and writes each channel's 16 keys as one 16-byte store,
// beside the thread that writes the channel's other 16 keys of the panel (one 32-byte sector an instruction).
// Grid (heads, tiles), 256 threads; bc a multiple of 32 up to 224, d a multiple of 16 up to 128; V read as prep_vt
// reads it (rs, hs).
extern "C" __global__ void prep_vt_tiles(const unsigned char* v, int sk, int d, int bc, unsigned char* out, long long rs,
                                         long long hs) {
  __shared__ __align__(16) unsigned rows[224 * (128 / 4 + 1)];  // bc keys x (d bytes + a word)
  const int stride = d / 4 + 1;
  const long long head = blockIdx.x, tile = blockIdx.y;
  const int k0 = int(tile) * bc;
  unsigned char* img = out + (head * gridDim.y + tile) * (long long)(bc * d);
  stage_rows(v + head * hs, sk, d, rs, k0, bc, rows);
  __syncthreads();
  for (int i = threadIdx.x; i < bc / 32 * d / 2; i += blockDim.x) {
    const int seg = i % 2, cq = i / 2 % (d / 4), panel = i / 2 / (d / 4);  // keys 32·panel + 16·seg …, channels 4cq …
    unsigned w[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) w[k] = rows[(32 * panel + vt_key(16 * seg + k)) * stride + cq];
    unsigned o4[4][4];  // [channel][word]: word j holds keys 4j … 4j + 3 of the channel
    transpose_16x4(w, o4);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int ch = 4 * cq + c;
      *reinterpret_cast<uint4*>(img + panel * 32 * d + 32 * ch + ((seg ^ (ch / 4 % 2)) * 16)) =
          make_uint4(o4[c][0], o4[c][1], o4[c][2], o4[c][3]);
    }
  }
}
