//! The lab harness: everything a block needs to compile, resource-check and test a CUDA kernel.
//!
//! - [`compile`]: NVRTC straight to cubin for an explicit [`Arch`], with block headers embedded in the binary.
//! - [`Resources`] / [`Budget`]: the ptxas report of each kernel, as a typed value, and its limits.
//! - [`toolchain()`]: finds CUDA headers and NVRTC, installing NVIDIA's pip wheels when nothing else exists.
//! - [`Gpu`] / [`gate`]: whether a device is usable, decided once; GPU tests skip or fail without one.
//! - [`numerics`]: error statistics against f64 references, seeded inputs, poisoned outputs.
//! - [`Suite`]: the test binary each block builds its model, compile and GPU tests into.
//! - [`tree_root`]: the source tree at run time, for tests that read committed files.
//! - [`telemetry`]: the device's SM clock and power while something runs (NVML), for timings that say what
//!   clock they ran at.
mod checks;
mod compile;
mod gpu;
pub mod hello;
mod launch;
pub mod numerics;
mod resources;
pub mod sass;
pub mod telemetry;
mod testing;
mod toolchain;
mod tree;

pub use compile::{
    Arch, CompileError, Cubin, Header, KernelSpec, Source, cache_cubins_in, compile, options,
};
pub use cudarc;
pub use gpu::{
    Gate, Gpu, GpuStatus, Kernel, MAX_DEVICES, device_count, gate, require_gpu_from_env, status,
};
pub use launch::{Args, Order, launch_ex};
pub use resources::{Budget, Resources, parse_ptxas_log};
pub use telemetry::{Sampler, Telemetry};
pub use testing::{COMPILE, GPU, MODEL, Suite};
pub use toolchain::{
    Probe, Toolchain, WHEELS, default_local_dir, discover, install_wheels, toolchain,
};
pub use tree::{tree_root, workspace_above};

/// Headers every block may include: `#include "lab/lab.cuh"`.
pub const HEADERS: &[Header] = &[Header {
    name: "lab/lab.cuh",
    code: include_str!("../cuda/lab.cuh"),
}];

/// The harness's own kernels, for `cargo xtask ptxas`.
pub fn kernels() -> Vec<KernelSpec> {
    hello::KERNELS.to_vec()
}
