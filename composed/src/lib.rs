//! `composed`: the fused FP8 SDPA forward, stages 1 → 8, each a short kernel source composing block headers, with
//! the launch plans that run them.
//!
//! [`Stage`] lists them; [`validate`] checks inputs (a clear error, no launch); [`OnDevice`] keeps a problem on the
//! device and launches a stage on it ([`OnDevice::prepare`] quantizes real-valued inputs there, by a
//! [`fixtures::Scheme`]), with the lab's knobs (kernel variants, block counts, schedule sections); [`plan`]'s
//! [`grid`] and [`SplitPlan`] say how a launch covers the work; [`tables`] are the typed host→device tables;
//! [`bench`] times a stage, [`trace`] puts stage 7's warps on a timeline. The user-facing API is the
//! `fp8-attention` crate, built on this one; references live in `fixtures`.
pub mod bench;
mod device;
mod launch;
mod packed;
pub mod plan;
mod prep;
pub use ragged_plan as ragged;
pub mod split_kv;
mod stages;
mod strides;
pub mod tables;
pub mod trace;
mod validate;
mod varlen;
mod workspace;

pub use device::OnDevice;
pub use fixtures::OutDtype;
pub use packed::{OneScale, PagedKv, VarlenShape, VarlenTensors};
pub use plan::{SECTION_KV_BYTES, SplitPlan, blocks_leaving, grid, schedule_section};
pub use prep::{
    LSE_SHIFT, PREP, PREP_KERNELS, Prep, SMOOTH_K, TRANSPOSE_V, VT_TILES, transpose_v_model,
    transpose_v_with, vt_keys, vt_tiles_bytes, vt_tiles_model, vt_tiles_with,
};
pub use stages::{
    DIMS, FP8_P_OFFSET, HEADERS, KERNELS, STAGE1, STAGE2, STAGE3A, STAGE3B, STAGE4, STAGE5, STAGE6,
    STAGE7, STAGE7_ACC, STAGE8, STAGE8_VARLEN, STAGE8_VARLEN_PACK, STAGE8_WINDOW, Stage, bc,
};
pub use strides::{FlatHeads, Strides};
pub use validate::{index_text, validate, validate_shape};
pub use varlen::{Varlen, packs_heads, varlen_kernel, varlen_kernel_for, varlen_pack_kernel};
pub use workspace::{Tensors, Workspace, stage_supports};

/// Every kernel of the composed stages, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.extend_from_slice(PREP_KERNELS);
    v.push(tables::LAYOUTS);
    v
}
