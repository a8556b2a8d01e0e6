//! Block `pack-gqa`: the query heads that share a K/V head packed into the rows of one tile (FlashAttention-3's
//! PackGQA), and the keys each row sees.
//!
//! [`row`] maps a packed row to its (query head within the group, token), heads minor; [`Visibility::keys`] gives the
//! keys a row sees under causal masking (bottom-right) and a sliding window, as a range; `cuda/pack_gqa.cuh` is the
//! same on the device. [`Visibility::sees`] is the key-by-key definition the range is tested against.
mod kernels;
mod model;

pub use kernels::{HEADERS, KERNELS, PACK_ROWS, SOURCE};
pub use model::{Visibility, row, row_of};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
