//! Block `frag-layout`: which lane holds which (row, col) of every wmma / mma.sync fragment the lab uses.
//!
//! The model ([`LayoutId::coord`]) and the device header (`cuda/frag_layout.cuh`) are one source of truth,
//! checked against each other at compile time ([`header_checks`]) and against the hardware by the probes
//! ([`probe`]). Layouts are data: [`Layout::draw`] for snapshots, [`catalogue`] for JSON, [`svg`] for pictures.
mod catalogue;
mod instr;
mod kernels;
mod model;
pub mod probe;
pub mod probe_wgmma;
mod smem;

pub use catalogue::{Record, SmemRecord, catalogue, header_checks, smem_catalogue, smem_svg, svg};
pub use instr::{INSTR_HEADER_PATH, INSTR_NS, wgmma_instr_header};
pub use kernels::*;
pub use model::{
    ARCHS, DType, Entry, LAYOUTS, Layout, LayoutId, Major, Op, Operand, PROBED_ARCH,
    QUAD_XOR_MASKS, RowOwners, WGMMA_NS, is_probed, quad_orbit, row_owners,
};
pub use smem::{Desc, SmemLayout, SmemLayoutId, SmemOperand, Swizzle, smem_layouts};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.extend_from_slice(WGMMA_PROBES);
    v
}
