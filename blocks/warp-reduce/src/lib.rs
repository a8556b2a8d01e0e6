//! Block `warp-reduce`: row max and row sum over accumulator fragments, with column masks and several warps.
//!
//! The device header `cuda/warp_reduce.cuh` reduces each row through `frag-layout`'s row ownership (the quad
//! shuffle); [`row_max`] is its exact model, [`row_sum_device`] its f32 order, [`row_sum_exact`] the f64
//! reference, and [`gamma`]`(shape.sum_depth())·Σ|x|` the bound the two may differ by.
mod kernels;
mod model;

pub use kernels::{HEADERS, KERNELS, SHAPES, SOURCE, kernel};
pub use model::{
    Frag, Mask, ROWS, SUM_CHAINS, Shape, gamma, max_nan, row_abs_sum, row_max, row_sum_device,
    row_sum_exact,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
