// The paged-kv test kernel (a gather of each sequence's keys through the block table) and its budget.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "paged_kv.cuh",
    code: include_str!("../cuda/paged_kv.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_paged_kv.cu",
    code: include_str!("../cuda/test_paged_kv.cu"),
    headers: &[HEADERS],
};

/// `gather_paged(pool, pages, seq_lens, max_pages, page_shift, hkv, d, max_len, out)`: every sequence's keys as a
/// dense [B, Hkv, max_len, D] tensor, zeros past each length; grid (B·Hkv, ⌈max_len / 64⌉), 128 threads.
pub const GATHER: KernelSpec = KernelSpec {
    block: "paged-kv",
    name: "gather_paged",
    source: &SOURCE,
    // Address arithmetic and 16-byte copies only; no shared memory.
    budget: Budget::new(48, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};

pub const KERNELS: &[KernelSpec] = &[GATHER];
