// The online-softmax test kernels (one warp, 16 query rows, D = 64, K/V tiles of 16 or 32 keys) and budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "online_softmax.cuh",
    code: include_str!("../cuda/online_softmax.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_online_softmax.cu",
    code: include_str!("../cuda/test_online_softmax.cu"),
    headers: &[frag_layout::HEADERS, warp_reduce::HEADERS, HEADERS],
};

/// D of the test kernels.
pub const D: usize = 64;

const fn k(name: &'static str) -> KernelSpec {
    // O is 4 accumulator fragments (32 registers) plus the score tile: 128 registers leaves no reason to spill.
    KernelSpec {
        block: "online-softmax",
        name,
        source: &SOURCE,
        budget: Budget::new(128, 0),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

pub const ATTEND_BC16: KernelSpec = k("attend_bc16");
pub const ATTEND_BC32: KernelSpec = k("attend_bc32");
/// attend_bc16 with `step` in its pieces (`step_max`, `exp_cells`, `sum_cells`, `step_end`).
pub const ATTEND_PIECES_BC16: KernelSpec = k("attend_pieces_bc16");
/// attend_bc16 with a window per row: row r over columns lo[r] .. hi[r] − 1 (`mask_below`, then `step_rows`).
pub const ATTEND_WINDOW_BC16: KernelSpec = k("attend_window_bc16");
/// attend_bc16 with a scale per row (`osm::RowScale`): row r's softmax over row_scale[r]·S.
pub const ATTEND_ROWS_BC16: KernelSpec = k("attend_rows_bc16");
/// attend_rows_bc16 with `step` in its pieces.
pub const ATTEND_ROWS_PIECES_BC16: KernelSpec = k("attend_rows_pieces_bc16");
pub const KERNELS: &[KernelSpec] = &[
    ATTEND_BC16,
    ATTEND_BC32,
    ATTEND_PIECES_BC16,
    ATTEND_WINDOW_BC16,
    ATTEND_ROWS_BC16,
    ATTEND_ROWS_PIECES_BC16,
];
