// layouts.cu: every host→device table's size and field offsets as the device compiler lays them out (composed::tables).
#include "pingpong_attention.cuh"

// x's field F: its byte offset from x (folded to a constant: no memory is touched).
#define LAB_OFFSET(F) int(reinterpret_cast<const char*>(&x.F) - reinterpret_cast<const char*>(&x))

// out: per table, in composed::tables::layouts()'s order, its size and then each field's offset.
extern "C" __global__ void sdpa_layouts(int* out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int n = 0;
  {
    const sdpa::Params x{};
    for (int v : {int(sizeof(x)), LAB_OFFSET(q), LAB_OFFSET(k), LAB_OFFSET(v), LAB_OFFSET(q_scale),
                  LAB_OFFSET(k_scale), LAB_OFFSET(v_scale), LAB_OFFSET(o), LAB_OFFSET(lse), LAB_OFFSET(sq),
                  LAB_OFFSET(sk), LAB_OFFSET(softmax_scale), LAB_OFFSET(o_dtype), LAB_OFFSET(causal), LAB_OFFSET(group),
                  LAB_OFFSET(q_rows), LAB_OFFSET(q_tiles), LAB_OFFSET(work), LAB_OFFSET(section), LAB_OFFSET(vt_tiles),
                  LAB_OFFSET(sched)})
      out[n++] = v;
  }
  {
    const sdpa::SplitHead x{};
    for (int v : {int(sizeof(x)), LAB_OFFSET(counter), LAB_OFFSET(done), LAB_OFFSET(split), LAB_OFFSET(pieces),
                  LAB_OFFSET(parts_at), LAB_OFFSET(merged_at), LAB_OFFSET(taken), LAB_OFFSET(reserved)})
      out[n++] = v;
  }
  {
    const sdpa::SplitPart x{};
    for (int v : {int(sizeof(x)), LAB_OFFSET(unit), LAB_OFFSET(k0), LAB_OFFSET(tiles), LAB_OFFSET(dst)}) out[n++] = v;
  }
  {
    const sdpa::MergeList x{};
    for (int v : {int(sizeof(x)), LAB_OFFSET(parts), LAB_OFFSET(dst)}) out[n++] = v;
  }
}
