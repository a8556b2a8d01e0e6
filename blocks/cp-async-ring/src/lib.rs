//! Block `cp-async-ring`: an N-stage (2–4) ring of K/V tiles in shared memory, filled with 16-byte cp.async.
//!
//! `cuda/cp_async_ring.cuh` is the device API (issue / wait / release, zero-filled tails, strided rows);
//! [`check`] runs a schedule through the ring's state machine and [`schedule`] is the one the device runs.
mod kernels;
mod model;

pub use kernels::{HEADERS, KERNELS, SHAPES, SOURCE, SWIZZLED, Shape, kernel};
pub use model::{Event, Ring, check, schedule, valid_rows};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.push(SWIZZLED);
    v
}
