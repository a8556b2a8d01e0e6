// The attn-merge test kernel (rows merged from up to four parts) and its budget.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "attn_merge.cuh",
    code: include_str!("../cuda/attn_merge.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_attn_merge.cu",
    code: include_str!("../cuda/test_attn_merge.cu"),
    headers: &[HEADERS],
};

/// `merge_parts(o, lse, n, rows, d, out_o, out_lse)`: n ≤ 4 parts' f32 O ([n][rows][d]) and LSE ([n][rows]) merged into
/// out_o and out_lse; a thread 8 columns of a row, grid-stride.
pub const MERGE_PARTS: KernelSpec = KernelSpec {
    block: "attn-merge",
    name: "merge_parts",
    source: &SOURCE,
    // Four parts' eight values and weights in registers; no shared memory.
    budget: Budget::new(96, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};

pub const KERNELS: &[KernelSpec] = &[MERGE_PARTS];
