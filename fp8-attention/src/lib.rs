//! `fp8-attention`: the fused FP8 (E4M3) scaled-dot-product attention forward of the lab, as a library.
//!
//! [`Attention`] is the op a model calls: built once per [`Config`], called many times on E4M3 tensors already on
//! the device ([`Fp8`]: codes and per-head scales; [`Attention::forward`]) or on f32 / f16 / bf16 tensors with any
//! [B, H, S, D] strides ([`Real`]: quantized on the device; [`Attention::forward_real`]), on the caller's stream,
//! returning O and the LSE ([`Output`]) or writing them into the caller's buffers ([`Attention::forward_into`]);
//! every bad input is an [`Error`] naming what is wrong, before any launch. D = 64, 128 or 256 (256: sm_90).
//! [`Attention::with_stage`] picks stage 8 (V read as given: one launch a call), which also reads E4M3 inputs at any
//! strides ([`Attention::forward_strided`]); [`Attention::forward_varlen`] runs a packed (variable-length) batch
//! ([`Packed`]: cu_seqlens on the host, checked by name) on stage 8's packed kernel ([`Attention::forward_varlen_real`]:
//! f32 / f16 / bf16 tokens quantized on the device, a scale a head), and [`Attention::forward_paged`] a packed batch's
//! queries over a paged FP8 KV cache ([`PagedCache`]).
//!
//! Ring attention (a sequence over several GPUs): [`ring_attention_rank`] is one rank's part over an NCCL
//! communicator, on zigzag shards ([`zigzag_split`], [`Shard`]); [`ring_on_one_device`] runs every rank's steps on
//! one device, the arithmetic the ring reproduces.
//!
//! [`Problem`] is the host-side path the lab's tools use. Inputs are E4M3 codes with one dequantization scale per (batch, head) ([`Quantized`]), or real values
//! quantized on the device by a [`Scheme`] ([`Problem::quantize`]). A [`Problem`] holds them on the device; each
//! [`Problem::launch`] runs one [`Stage`] (the fastest the device allows: [`fastest_stage`]); outputs come back
//! checked ([`Problem::download`]: O widened to f32 and the LSE, failing on any element not written).
//!
//! Every bad input is refused with an error naming what is wrong before any launch ([`validate`]).
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use fp8_attention::{Gpu, OutDtype, Raw, Shape, quantize_per_head, run};
//! let gpu = Gpu::get()?;
//! let raw = Raw::random(Shape::new(1, 8, 512, 64), 7, 1.0);
//! let qz = quantize_per_head(&raw);
//! let out = run(&gpu, fp8_attention::fastest_stage(&gpu, &qz.shape)?, &qz, OutDtype::Bf16)?;
//! assert_eq!(out.o.len(), 8 * 512 * 64);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod attention;
mod checks;
mod error;
mod paged_plan;
mod problem;
mod real;
mod ring;
mod ring_comm;
mod ring_nccl;
mod ring_one_device;
mod staging;
mod varlen;
mod varlen_real;
mod warm;

pub use attention::{Attention, Config, Fp8, OutBuf, Output};
pub use checks::{Lengths, check_inputs, check_strides};
pub use composed::bench::Timing;
pub use composed::{Stage, Strides, validate, validate_shape};
pub use error::{Error, Result};
pub use fixtures::{
    Attention as HostOutput, Granularity, OutDtype, Quantized, Raw, Rotate, Scheme, Shape, Window,
    quantize_per_head, quantize_per_tensor,
};
pub use lab::Gpu;
pub use paged_plan::PagedPlan;
pub use real::{Real, RealDtype, RealElem};
pub use ring::{
    HostTimes, RankOutput, Shard, SplitTail, StepTime, zigzag_join, zigzag_range, zigzag_split,
};
pub use ring_comm::RingComm;
pub use ring_nccl::{RingRank, on_ranks, on_ranks_with, on_ranks_with_comms, ring_attention_rank};
pub use ring_one_device::{
    Beside, ring_on_one_device, ring_on_one_device_as, ring_on_one_device_beside,
    ring_on_one_device_timed, ring_rank_on_one_device_beside,
};
pub use varlen::{Packed, PackedOutput, PagedCache, check_packed};

/// Keeps compiled kernels in `dir` across processes (keyed by each kernel's source with its headers, the
/// architecture, the compile options and the NVRTC and headers used), so that a process's first call does not wait
/// for NVRTC; call it once, before the first [`Attention::warm`] or call. Without it kernels are cached in the
/// process only.
pub fn cache_kernels_in(dir: std::path::PathBuf) {
    lab::cache_cubins_in(dir);
}

/// Where a program keeps compiled kernels by default: the environment variable `var` (`off`: nowhere), else
/// $XDG_CACHE_HOME/`subdir`, else ~/.cache/`subdir`.
pub fn default_kernel_cache(var: &str, subdir: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match env(var) {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join(subdir)),
    }
}
pub use problem::{Problem, STAGE8_MAX_KEYS, fastest_stage, run, stage_for, stage_for_shape};
