// The pack-gqa test kernel (every packed row's head, token and keys) and its budget.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "pack_gqa.cuh",
    code: include_str!("../cuda/pack_gqa.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_pack_gqa.cu",
    code: include_str!("../cuda/test_pack_gqa.cu"),
    headers: &[HEADERS],
};

/// `pack_rows(cfg, cases, rows, n, out)`: thread i writes row rows[i] of case cases[i] (six ints of cfg: group, Sq,
/// Sk, causal, left, right; −1 an open side) as head, token, lo, hi at out[4·i …].
pub const PACK_ROWS: KernelSpec = KernelSpec {
    block: "pack-gqa",
    name: "pack_rows",
    source: &SOURCE,
    // Integer arithmetic only; no shared memory.
    budget: Budget::new(32, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};

pub const KERNELS: &[KernelSpec] = &[PACK_ROWS];
