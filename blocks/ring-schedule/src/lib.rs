//! Block `ring-schedule`: ring attention's schedule over W ranks (context parallelism).
//!
//! A sequence is cut into 2W chunks, rank r holding chunks r and 2W − 1 − r (zigzag), so that a causal mask gives
//! every rank the same work. K/V shards pass to the next rank each step; [`source`] says whose shard a rank holds at
//! a step and [`blocks`] which (Q half, K/V half, mask) blocks it computes with it; `cuda/ring_schedule.cuh` is the
//! same on the device. [`check_coverage`] proves that the schedule computes every visible pair exactly once.
mod kernels;
mod model;

pub use kernels::{HEADERS, KERNELS, SCHEDULE, SOURCE};
pub use model::{
    Block, Launch, Mask, blocks, check_coverage, check_launch_coverage, chunk_begin, launches,
    shard, source, work,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
