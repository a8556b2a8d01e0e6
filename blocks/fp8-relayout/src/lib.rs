//! Block `fp8-relayout`: the moves between wgmma layouts an FP8 attention stage needs, bit-exact.
//!
//! `cuda/fp8_relayout.cuh`: the Q·Kᵀ accumulator to the E4M3 register A operand of P·V (convert, shuffle, byte
//! permute), an 8-bit tile transpose between canonical K-major tiles (V rows to the K-major B operand), and
//! the f32 accumulator to bf16 / f16 rows, in global memory or as a TMA store's swizzled panel in shared memory. [`a_words`] and [`transposed`] are what they must produce, from the
//! probed frag-layout tables and the fp8-codec model.
mod kernels;
mod ldsm;
mod model;

pub use kernels::{
    ACC_TO_A, ACC_TO_A_LOCAL, HEADERS, PV, SOURCE, STAGE_PANEL, STORE_BF16, STORE_F16, STORE_F32,
    STORE_GROUPED_F16, TRANSPOSE_LOCAL, TRANSPOSES, TRANSPOSES_LDSM, TRANSPOSES_LEAN,
};
pub use ldsm::{LdsmTile, byte_perm, ldsm_expected, ldsm_selectors};
pub use model::{
    KeyOrder, a_words, a_words_in, lean_block, lean_conflicts, staged_panel, transpose_block,
    transpose_conflicts, transposed, transposed_in,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    kernels::all()
}
