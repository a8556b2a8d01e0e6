//! `composed`: the fused FP8 SDPA forward, stages 1 → 5, each a kernel source built from block headers.
//!
//! [`Stage`] lists them; [`run`] checks the inputs ([`validate`]: a clear error, no launch) and runs one;
//! [`OnDevice`] keeps a problem on the device for timing; [`OnDevice::prepare`] quantizes real-valued inputs
//! there, by a [`fixtures::Scheme`]. References live in the `fixtures` crate.
pub mod app;
pub mod bench;
pub mod cli;
mod prep;
mod run;
mod stages;
pub mod trace;

pub use fixtures::OutDtype;
pub use prep::{
    LSE_SHIFT, PREP, PREP_KERNELS, Prep, SMOOTH_K, TRANSPOSE_V, VT_TILES, transpose_v_model,
    transpose_v_with, vt_keys, vt_tiles_bytes, vt_tiles_model, vt_tiles_with,
};
pub use run::{
    OnDevice, SECTION_KV_BYTES, SplitPlan, grid, run, run_as, schedule_section, validate,
    validate_shape,
};
pub use stages::{
    DIMS, FP8_P_OFFSET, HEADERS, KERNELS, STAGE1, STAGE2, STAGE3A, STAGE3B, STAGE4, STAGE5, STAGE6,
    Stage, bc,
};

/// Every kernel of the composed stages, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.extend_from_slice(PREP_KERNELS);
    v
}
