//! Block `fp8-codec`: E4M3 ("fn") and E5M2 as `cuda_fp8.h` converts them, and the lab's tensor quantizer.
//!
//! [`encode`] / [`decode`] are bit-exact to the device (checked there on every code and every rounding
//! boundary); [`quantize`] / [`dequantize`] with [`head_scales`] are the per-head (and per-tensor) scheme
//! that `cuda/fp8_codec.cuh` runs on the device; [`TensorQuantizer`] quantizes whole tensors on the device
//! (amax, scales, codes: `cuda/quantize_tensor.cu`), bit for bit as [`quantize_tensor`] does on the host;
//! [`ViewQuantizer`] does the same for strided [B, H, S, D] views of f32, f16 or bf16 (a model's own tensors).
mod device;
mod kernels;
mod model;
mod view;

pub use device::{Granularity, TensorQuantizer};
pub use kernels::*;
pub use model::{
    Format, Saturation, amax, boundary_inputs, decode, decode_f16_bits, dequantize, encode,
    head_scales, quantize, quantize_tensor, scale_from_amax,
};
pub use view::{Real, View, ViewOut, ViewQuantizer};

/// Every kernel of this block, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<lab::KernelSpec> {
    KERNELS.to_vec()
}
