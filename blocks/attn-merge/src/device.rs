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

/// Where a part's rows go in the accumulator: the part's `n` rows in groups of `per`, group g's into accumulator rows
/// g·`stride` + `off` … (a Q half's rows inside a shard's heads of both halves). `Rows::all(n)`: row r into row r.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub n: usize,
    pub per: usize,
    pub stride: usize,
    pub off: usize,
}

impl Rows {
    /// `n` rows, each into the accumulator's row of the same index.
    pub fn all(n: usize) -> Rows {
        Rows {
            n,
            per: n.max(1),
            stride: 0,
            off: 0,
        }
    }

    /// Why the merge cannot place these rows (groups that overlap, or groups of no rows), named; Ok where it can.
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.per >= 1 && (self.n <= self.per || self.stride >= self.off + self.per),
            "the merge's rows: groups of {} rows at a stride of {} from row {} overlap",
            self.per,
            self.stride,
            self.off
        );
        Ok(())
    }

    /// Rows the accumulator must hold: one past the last it is written at.
    pub fn acc_rows(&self) -> usize {
        if self.n == 0 {
            0
        } else {
            (self.n - 1) / self.per * self.stride + self.off + (self.n - 1) % self.per + 1
        }
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
        // SAFETY: as the caller vouches, with every part row into the accumulator row of its index.
        unsafe {
            self.accumulate_rows(
                gpu,
                stream,
                (o_acc, lse_acc),
                (o_part, lse_part),
                Rows::all(rows),
                d,
            )
        }
    }

    /// As [`Merger::accumulate`], the part's rows into the accumulator's rows as `rows` places them.
    ///
    /// # Safety
    /// The part's addresses must hold `rows.n`·`d` and `rows.n` f32, the accumulator's `rows.acc_rows()`·`d` and
    /// `rows.acc_rows()` (16-byte aligned O), of `gpu`'s context, alive until the kernel has run; acc must not
    /// overlap the part.
    pub unsafe fn accumulate_rows(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        (o_acc, lse_acc): (u64, u64),
        (o_part, lse_part): (u64, u64),
        rows: Rows,
        d: usize,
    ) -> Result<()> {
        ensure!(
            [64, 128, 256].contains(&d),
            "the merge takes D = 64, 128 or 256 (whole rows a block of {THREADS} threads), not {d}"
        );
        rows.check()?;
        if rows.n == 0 {
            return Ok(());
        }
        let k = gpu.load(&self.accumulate)?;
        let (r, dd) = (rows.n as i64, d as i32);
        let (per, stride, off) = (rows.per as i64, rows.stride as i64, rows.off as i64);
        // SAFETY: amerge_accumulate(float* o_acc, float* lse_acc, const float* o_part, const float* lse_part,
        // long long rows, int d, long long per, long long stride, long long off); the caller vouches for the
        // addresses; grid-stride, whole rows a block.
        unsafe {
            stream
                .launch_builder(&k.func)
                .arg(&o_acc)
                .arg(&lse_acc)
                .arg(&o_part)
                .arg(&lse_part)
                .arg(&r)
                .arg(&dd)
                .arg(&per)
                .arg(&stride)
                .arg(&off)
                .launch(grid(rows.n * d / 8))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_reach_and_overlap() {
        // A ring rank's second half: 10 heads of 40 rows, into heads of 100 from row 60.
        let half = Rows {
            n: 400,
            per: 40,
            stride: 100,
            off: 60,
        };
        half.check().unwrap();
        assert_eq!(half.acc_rows(), 9 * 100 + 60 + 40);
        assert_eq!(Rows::all(7).acc_rows(), 7);
        assert_eq!(Rows::all(0).acc_rows(), 0);
        Rows::all(0).check().unwrap();
        // Groups of 40 from row 61 run into the next group's rows.
        let e = Rows { off: 61, ..half }.check().unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
    }
}
