//! Block `online-softmax`: the FlashAttention-2 update of (running max m, running sum l, O) per query row.
//!
//! `cuda/online_softmax.cuh` runs it in registers on wmma accumulator fragments with `warp-reduce`'s row
//! reductions. [`one_shot`] and [`online_f64`] are the f64 models, [`mirror_f32`] follows the device's
//! arithmetic, and [`o_bound`] is the stated bound between the two. `mask_below` masks a sliding window's left edge
//! (the right edge is `step_rows`'s limit); [`windowed`] is its model: the scores outside each row's window −inf.
//! Every scale may be one a row (`osm::RowScale`: a tile whose rows are different query heads, each with its own Q
//! scale); [`with_row_scales`] is its model.
mod kernels;
mod model;

pub use kernels::{
    ATTEND_BC16, ATTEND_BC32, ATTEND_PIECES_BC16, ATTEND_ROWS_BC16, ATTEND_ROWS_PIECES_BC16,
    ATTEND_WINDOW_BC16, D, HEADERS, KERNELS, SOURCE,
};
pub use model::{
    Out, Problem, max_abs_diff, mirror_f32, mirror_f32_with, o_bound, one_shot, online_f64,
    windowed, with_row_scales,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
