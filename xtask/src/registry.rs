// Every kernel of the workspace, for `ptxas`: adding a block adds one line here.
use lab::KernelSpec;

pub fn all_kernels() -> Vec<KernelSpec> {
    let mut v = lab::kernels();
    v.extend(frag_layout::kernels());
    v.extend(warp_reduce::kernels());
    v.extend(online_softmax::kernels());
    v.extend(fp8_codec::kernels());
    v.extend(hadamard::kernels());
    v.extend(cp_async_ring::kernels());
    v.extend(paged_kv::kernels());
    v.extend(ring_schedule::kernels());
    v.extend(pack_gqa::kernels());
    v.extend(attn_merge::kernels());
    v.extend(ragged_plan::kernels());
    v.extend(wgmma::kernels());
    v.extend(tma_ring::kernels());
    v.extend(fp8_relayout::kernels());
    v.extend(composed::kernels());
    v
}
