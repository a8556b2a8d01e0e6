//! Block `ragged-plan`: the work units of a packed (variable-length) batch, longest first, on the host and the device.
//!
//! [`validate_cu_seqlens`] names what is wrong with a batch's boundaries; [`ragged_plan`] is the model of the plan
//! (every (sequence, head, query tile) with the key tiles it reads, [`key_tiles`], longest first) and [`coord`] each
//! unit's rows in the packed tensors. `cuda/ragged_plan.cuh` is the same on the device: [`Planner`] builds the plan
//! there from boundaries already on the device (a histogram, a scan and a scatter: no host copy), and an attention
//! kernel decodes its units with `ragged::unit` and `ragged::coord`. [`same_plan`] compares a device table with the
//! model up to the order of units of equal length. Packed grouped-query heads ([`ragged_plan_packed`], `group` > 1):
//! a unit is a (sequence, K/V head, tile of packed rows), row r the query head r % group of token r / group
//! ([`coord_packed`]), for decode, where a token's heads of one K/V head then share one pass over its keys.
mod device;
mod kernels;
mod model;

pub use device::{DevicePlan, Planner};
pub use kernels::{DECODE, HEADERS, HISTOGRAM, KERNELS, OFFSETS, SCATTER, SOURCE, TEST_SOURCE};
pub use model::{
    Coord, Geometry, RaggedUnit, coord, coord_packed, key_range, key_tiles, packed_key_tiles,
    ragged_plan, ragged_plan_packed, ragged_plan_windowed, same_plan, validate_cu_seqlens,
};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
