// The merge on the device for a library (cuda/merge.cu): parts accumulated into a running (O, LSE), O stored as 16-bit.
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use lab::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::kernels::{ACCUMULATE, STORE_BF16, STORE_F16};

/// The library kernels; a mutant replaces one.
#[derive(Debug, Clone, Copy)]
pub struct Merger {
    pub accumulate: KernelSpec,
    pub store_bf16: KernelSpec,
    pub store_f16: KernelSpec,
}

impl Default for Merger {
    fn default() -> Self {
        Merger {
            accumulate: ACCUMULATE,
            store_bf16: STORE_BF16,
            store_f16: STORE_F16,
        }
    }
}

/// A 16-bit type O can be stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    F16,
    Bf16,
}

const THREADS: u32 = 128;

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Merger {
    /// Queues acc ← merge(acc, part) on `stream`: `rows` rows of `d` f32 (O) and one f32 (LSE) each, at the device
    /// addresses given. An accumulator starts as a part, or as O = 0, LSE = −inf.
    ///
    /// # Safety
    /// The four addresses must hold `rows`·`d` and `rows` f32 of `gpu`'s context (16-byte aligned O), alive until the
    /// kernel has run; acc must not overlap the part.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn accumulate(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        o_acc: u64,
        lse_acc: u64,
        o_part: u64,
        lse_part: u64,
        rows: usize,
        d: usize,
    ) -> Result<()> {
        ensure!(
            [64, 128, 256].contains(&d),
            "the merge takes D = 64, 128 or 256 (whole rows a block of {THREADS} threads), not {d}"
        );
        let k = gpu.load(&self.accumulate)?;
        let (r, dd) = (rows as i64, d as i32);
        // SAFETY: amerge_accumulate(float* o_acc, float* lse_acc, const float* o_part, const float* lse_part,
        // long long rows, int d); the caller vouches for the addresses; grid-stride, whole rows a block.
        unsafe {
            stream
                .launch_builder(&k.func)
                .arg(&o_acc)
                .arg(&lse_acc)
                .arg(&o_part)
                .arg(&lse_part)
                .arg(&r)
                .arg(&dd)
                .launch(grid(rows * d / 8))
        }
        .context("launching amerge_accumulate")?;
        Ok(())
    }

    /// Queues `n` f32 at `x` stored as `to` at `out`, rounded to nearest even (`n` even).
    ///
    /// # Safety
    /// `x` and `out` must hold `n` f32 and `n` 16-bit values of `gpu`'s context, 8- and 4-byte aligned, alive until
    /// the kernel has run.
    pub unsafe fn store(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        x: u64,
        n: usize,
        to: Half,
        out: u64,
    ) -> Result<()> {
        ensure!(n.is_multiple_of(2), "the store takes pairs: {n} values");
        let spec = match to {
            Half::Bf16 => &self.store_bf16,
            Half::F16 => &self.store_f16,
        };
        let k = gpu.load(spec)?;
        let n2 = (n / 2) as i64;
        // SAFETY: amerge_store_T(const float2* x, long long n2, T2* out); the caller vouches for the addresses.
        unsafe {
            stream
                .launch_builder(&k.func)
                .arg(&x)
                .arg(&n2)
                .arg(&out)
                .launch(grid(n / 2))
        }
        .with_context(|| format!("launching {}", spec.name))?;
        Ok(())
    }
}
