//! Block `wgmma`: Hopper's warpgroup matrix multiply (sm_90a), FP8 and f16/bf16, A from shared memory or registers.
//!
//! `cuda/wgmma.cuh` is the device API: the canonical K-major tiles and their descriptors (checked at compile
//! time against [`frag_layout::Desc`] by [`header_checks`]), the ordering primitives (proxy fence, wgmma
//! fence, commit, wait, operand fence) and tile GEMMs. The instructions are frag-layout's generated
//! `wgmma_instr.cuh`. [`gemm`] is the CPU model the device tests compare with, exactly.
mod kernels;
mod model;

pub use kernels::{HEADERS, K_BYTES, KERNELS, NS, PAIRINGS, Pairing, REUSE, SOURCE};
pub use model::{gemm, header_checks, to_bytes, value_range};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.push(REUSE);
    v
}
