//! Block `tma-ring`: an N-stage ring of TMA tile loads completing on mbarriers, from a producer warp to consumer
//! warpgroups, with the warp-specialisation helpers (setmaxnreg per role, named barriers) it runs under.
//!
//! `cuda/tma_ring.cuh` is the device API (mbarriers, `cp.async.bulk.tensor`, `Ring`, `Tile`); `cuda/warp_roles.cuh`
//! the role helpers; `store_4d` takes a box the other way, shared memory to global. [`MapSpec`] builds the host's tensor map with each of the driver's rules checked by name.
//! [`check`] runs the ring's protocol through the mbarrier parity rule under any interleaving; [`Shape::tile_byte`]
//! is where each byte of a tile lands (the canonical wgmma tile of frag-layout's model); [`cursor_at`] is where a
//! consumer's `tma::Cursor` stands at each tile.
mod kernels;
mod map;
mod model;

pub use kernels::{
    BULK_RING, CLUSTER_RING, CURSOR_WALKS, HEADERS, KERNELS, ROLES_CLAIM, SHAPES, SOURCE,
    SPLIT_WALKS, STORE_BOX, kernel,
};
pub use map::{Elem, MapSpec, TensorMap};
pub use model::{CursorAt, Mbarrier, Shape, check, cursor_at, phase, source_byte, stage};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    let mut v = KERNELS.to_vec();
    v.push(ROLES_CLAIM);
    v.push(BULK_RING);
    v.push(CLUSTER_RING);
    v.push(STORE_BOX);
    v.extend_from_slice(CURSOR_WALKS);
    v.extend_from_slice(SPLIT_WALKS);
    v
}
