// The whole-tensor quantizer on the device (cuda/quantize_tensor.cu): amax, scales, codes, bit-exact to the model.
use anyhow::{Context, Result, ensure};
use lab::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::kernels::{TENSOR_AMAX, TENSOR_QUANTIZE, TENSOR_SCALES};

/// One scale per head, or one for the whole tensor (repeated for every head, as the stages take it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Granularity {
    #[default]
    PerHead,
    PerTensor,
}

impl Granularity {
    pub fn name(self) -> &'static str {
        match self {
            Granularity::PerHead => "per-head",
            Granularity::PerTensor => "per-tensor",
        }
    }
}

/// The three kernels of [`TensorQuantizer::run`]; a mutant replaces them together.
#[derive(Debug, Clone, Copy)]
pub struct TensorQuantizer {
    pub amax: KernelSpec,
    pub scales: KernelSpec,
    pub quantize: KernelSpec,
}

impl Default for TensorQuantizer {
    fn default() -> Self {
        TensorQuantizer {
            amax: TENSOR_AMAX,
            scales: TENSOR_SCALES,
            quantize: TENSOR_QUANTIZE,
        }
    }
}

/// Threads a block of every step.
const THREADS: u32 = 256;

impl TensorQuantizer {
    /// The same three kernels with one header edit (a mutation test).
    pub fn mutated(&self, header: &str, from: &str, to: &str) -> Result<Self> {
        Ok(TensorQuantizer {
            amax: self.amax.mutated(header, from, to)?,
            scales: self.scales.mutated(header, from, to)?,
            quantize: self.quantize.mutated(header, from, to)?,
        })
    }

    /// E4M3 codes and per-head scales of `x`, `heads` heads of `head_len` contiguous f32 each, as
    /// [`crate::head_scales`] (or one scale per tensor) and [`crate::quantize`] compute them on the host, bit for
    /// bit. `head_len` must be a multiple of 16 (S·D with D a multiple of 16 is).
    pub fn run(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        heads: usize,
        head_len: usize,
        per: Granularity,
    ) -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
        let n = heads * head_len;
        ensure!(
            head_len.is_multiple_of(16) && head_len > 0 && heads > 0,
            "the device quantizer takes heads of a multiple of 16 elements: {heads} heads of {head_len}"
        );
        ensure!(
            x.len() == n,
            "the device quantizer got {} elements for {heads} heads of {head_len}",
            x.len()
        );
        let st = &gpu.stream;
        let (groups, group_len) = match per {
            Granularity::PerHead => (heads, head_len),
            Granularity::PerTensor => (1, n),
        };
        let len4 = (group_len / 4) as i64;
        // About 16 float4s a thread: enough loads in flight without a second pass.
        let parts = (group_len / 4)
            .div_ceil(THREADS as usize * 16)
            .clamp(1, (i32::MAX as usize / groups).max(1)) as i32;
        ensure!(
            groups * parts as usize <= i32::MAX as usize,
            "{groups} groups are more than one grid holds"
        );
        let mut amax = st.alloc_zeros::<u32>(groups)?;
        let amax_k = gpu.load(&self.amax)?;
        let cfg = |blocks: usize| LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: fp8_tensor_amax(const float4* x[groups·len4], long long len4, int parts, unsigned* amax[groups]),
        // groups × parts blocks; x is a whole allocation (256-byte aligned) of groups·len4 float4s.
        unsafe {
            st.launch_builder(&amax_k.func)
                .arg(x)
                .arg(&len4)
                .arg(&parts)
                .arg(&mut amax)
                .launch(cfg(groups * parts as usize))
        }
        .context("launching fp8_tensor_amax")?;
        let mut scales = st.alloc_zeros::<f32>(heads)?;
        let (heads_i, per_group) = (heads as i64, (heads / groups) as i64);
        let scales_k = gpu.load(&self.scales)?;
        // SAFETY: fp8_tensor_scales(const unsigned* amax[groups], long long heads, long long heads_per_group,
        // float* scales[heads]), grid-stride.
        unsafe {
            st.launch_builder(&scales_k.func)
                .arg(&amax)
                .arg(&heads_i)
                .arg(&per_group)
                .arg(&mut scales)
                .launch(cfg(heads.div_ceil(THREADS as usize).min(1 << 16)))
        }
        .context("launching fp8_tensor_scales")?;
        let mut q = st.alloc_zeros::<u8>(n)?;
        let (n16, head16) = ((n / 16) as i64, (head_len / 16) as i64);
        let quant_k = gpu.load(&self.quantize)?;
        // SAFETY: fp8_tensor_quantize(const float4* x[n/4], long long n16, long long head_len16,
        // const float* scales[heads], uint4* q[n16]), grid-stride; q is a whole allocation of n bytes.
        unsafe {
            st.launch_builder(&quant_k.func)
                .arg(x)
                .arg(&n16)
                .arg(&head16)
                .arg(&scales)
                .arg(&mut q)
                .launch(cfg((n / 16).div_ceil(THREADS as usize).min(1 << 20)))
        }
        .context("launching fp8_tensor_quantize")?;
        Ok((q, scales))
    }
}
