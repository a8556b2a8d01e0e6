//! Block `frag-layout`: which lane holds which (row, col) of every wmma / mma.sync fragment the lab uses.
//!
//! The model ([`LayoutId::coord`]) and the device header (`cuda/frag_layout.cuh`) are one source of truth,
//! checked against each other at compile time ([`header_checks`]) and against the hardware by the probes
//! ([`probe`]). Layouts are data: [`Layout::draw`] for snapshots, [`catalogue`] for JSON, [`svg`] for pictures.
mod catalogue;
mod kernels;
mod model;
pub mod probe;

pub use catalogue::{Record, catalogue, header_checks, svg};
pub use kernels::*;
pub use model::{
    ARCHS, DType, Entry, LAYOUTS, Layout, LayoutId, Major, Op, Operand, PROBED_ARCH,
    QUAD_XOR_MASKS, RowOwners, quad_orbit, row_owners,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
