// The attn-merge kernels: the test kernel (rows merged from up to four parts) and the library's, with their budgets.
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

pub const KERNELS: &[KernelSpec] = &[MERGE_PARTS, ACCUMULATE, STORE_BF16, STORE_F16];

/// The library kernels of [`crate::Merger`]: a part merged into a running (O, LSE), and f32 O stored as 16-bit.
pub const LIB_SOURCE: Source = Source {
    file: "merge.cu",
    code: include_str!("../cuda/merge.cu"),
    headers: &[HEADERS],
};

const fn lib(name: &'static str) -> KernelSpec {
    KernelSpec {
        source: &LIB_SOURCE,
        name,
        ..MERGE_PARTS
    }
}

/// `amerge_accumulate(o_acc, lse_acc, o_part, lse_part, rows, d, per, stride, off)`: acc ← merge(acc, part) in place,
/// part row r into acc row (r / per)·stride + off + r % per; 128 threads a block (whole rows a block for d = 64, 128,
/// 256), grid-stride.
pub const ACCUMULATE: KernelSpec = lib("amerge_accumulate");
/// `amerge_store_bf16(x, n2, out)` / `amerge_store_f16`: f32 pairs stored rounded to nearest even.
pub const STORE_BF16: KernelSpec = lib("amerge_store_bf16");
pub const STORE_F16: KernelSpec = lib("amerge_store_f16");
