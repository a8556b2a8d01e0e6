//! Block `attn-merge`: attention over disjoint key sets merged from its parts' (O, LSE) pairs.
//!
//! A split-KV decode, a split tail and each step of ring attention compute attention over part of the keys; [`merge`]
//! (f64, the model) and `cuda/attn_merge.cuh` (`amerge::weights`, `amerge::merge8`) combine the parts: LSE = ln Σ e^{LSE_j},
//! O = Σ e^{LSE_j − LSE} O_j, against the largest LSE so that nothing overflows, a row no part saw left O = 0,
//! LSE = −inf. [`attend`] is one row's attention over a key set, the test's ground truth. [`Merger`] runs the merge for
//! a library: a part accumulated into a running (O, LSE) in place (its rows into the accumulator's as [`Rows`] places
//! them), and f32 O stored as bf16 or f16 (`cuda/merge.cu`).
mod device;
mod kernels;
mod model;

pub use device::{Half, Merger, Rows};
pub use kernels::{
    ACCUMULATE, HEADERS, KERNELS, LIB_SOURCE, MERGE_PARTS, SOURCE, STORE_BF16, STORE_F16,
};
pub use model::{Part, attend, merge};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
