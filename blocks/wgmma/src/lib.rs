//! Block `wgmma`: Hopper's warpgroup matrix multiply (sm_90a), FP8 and f16/bf16, A from shared memory or registers.
//!
//! `cuda/wgmma.cuh` is the device API: the canonical K-major tiles and their descriptors (checked at compile
//! time against [`frag_layout::Desc`] by [`header_checks`]), the ordering primitives (proxy fence, wgmma
//! fence, commit, wait, operand fence) and tile GEMMs. The instructions are frag-layout's generated
//! `wgmma_instr.cuh`. [`gemm`] is the CPU model the device tests compare with, exactly.
mod kernels;
mod model;

pub use kernels::{FIRST_STEPS, HEADERS, K_BYTES, KERNELS, NS, PAIRINGS, Pairing, REUSE, SOURCE};
pub use model::{gemm, header_checks, to_bytes, value_range};

/// The FP8 wgmma's accumulation error bound, relative to Σ|a·b| of the cell: Hopper's tensor cores do not
/// accumulate FP8 products in IEEE f32. Measured on the H100 (2026-11-22, K = 128, arbitrary E4M3 values,
/// 8 seeds): at most 2^-11.7; `gpu::fp8_accumulation_error_is_bounded` holds the device to this bound, and
/// the FP8 attention stages' score tolerances are built on it.
pub const FP8_ACCUMULATION_EPS: f64 = 1.0 / 2048.0;

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.push(REUSE);
    v.push(FIRST_STEPS);
    v
}
