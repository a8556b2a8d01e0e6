// The warp-reduce test kernels: one per (fragment kind, fragments per warp, warps) shape, and their budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

use crate::model::{Frag, Shape};

pub const HEADERS: &[Header] = &[Header {
    name: "warp_reduce.cuh",
    code: include_str!("../cuda/warp_reduce.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_warp_reduce.cu",
    code: include_str!("../cuda/test_warp_reduce.cu"),
    headers: &[frag_layout::HEADERS, HEADERS],
};

/// The shapes the test kernels instantiate: narrow and wide rows, one to four warps.
pub const SHAPES: &[Shape] = &[
    Shape::new(Frag::WmmaAcc, 1, 1),
    Shape::new(Frag::WmmaAcc, 2, 1),
    Shape::new(Frag::WmmaAcc, 4, 1),
    Shape::new(Frag::WmmaAcc, 1, 2),
    Shape::new(Frag::WmmaAcc, 2, 4),
    Shape::new(Frag::MmaC, 1, 1),
    Shape::new(Frag::MmaC, 2, 1),
    Shape::new(Frag::MmaC, 8, 1),
    Shape::new(Frag::MmaC, 2, 2),
    Shape::new(Frag::MmaC, 4, 4),
];

const fn k(name: &'static str) -> KernelSpec {
    // A tile of up to 8 fragments a warp (32 cells), reduced on two paths (one limit for both rows, or a limit
    // per row) with 4 max and 2 sum partials: 80 registers; smem is WN*16 floats.
    KernelSpec {
        block: "warp-reduce",
        name,
        source: &SOURCE,
        budget: Budget::new(80, 256),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

pub const KERNELS: &[KernelSpec] = &[
    k("reduce_wmma_nf1_wn1"),
    k("reduce_wmma_nf2_wn1"),
    k("reduce_wmma_nf4_wn1"),
    k("reduce_wmma_nf1_wn2"),
    k("reduce_wmma_nf2_wn4"),
    k("reduce_mma_nf1_wn1"),
    k("reduce_mma_nf2_wn1"),
    k("reduce_mma_nf8_wn1"),
    k("reduce_mma_nf2_wn2"),
    k("reduce_mma_nf4_wn4"),
];

/// The kernel of a shape.
pub fn kernel(shape: &Shape) -> KernelSpec {
    KernelSpec::find(KERNELS, &shape.kernel())
}
