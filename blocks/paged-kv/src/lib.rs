//! Block `paged-kv`: block-table addressing of a paged KV cache.
//!
//! A serving engine keeps K and V of every sequence in one pool of pages, `[num_pages, page_size, Hkv, D]`; a block
//! table lists each sequence's pages in order. `cuda/paged_kv.cuh` maps (sequence, key) to its pool row on the
//! device ([`Table`] on the host); [`Pool`] and [`BlockTable`] are the host's description, [`validate`] refuses a
//! bad table by name, and [`pool_row`] / [`gather`] are the model the device is tested against.
mod kernels;
mod model;

pub use kernels::{GATHER, HEADERS, KERNELS, SOURCE};
pub use model::{BlockTable, Pool, Table, gather, pool_row, validate};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
