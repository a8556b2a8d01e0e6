//! Block `hadamard`: the fast Walsh–Hadamard transform of rows of D floats, one warp a row, D/32 a lane.
//!
//! [`Rotation`] is the orthonormal x → x·diag(s)·H/√D (seeded signs s, or none) and its inverse: on the host
//! ([`Rotation::rows`], the model) and on the device ([`Rotation::apply`], `cuda/rotate_rows.cu` over
//! `cuda/hadamard.cuh`), bit for bit the same. The FP8 SDPA rotates Q and K by the same one before
//! quantizing: Q·Kᵀ is unchanged while outlier channels are spread over all D (FlashAttention-3's incoherent
//! processing).
mod device;
mod kernels;
mod model;

pub use kernels::{HEADERS, KERNELS, ROWS, ROWS_SOURCE, SOURCE, TWICE, for_dim};
pub use model::{DIMS, Rotation, check_dim, fwht, norm, signs};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
