// A problem on the device, launched by stage; the stage a device and shape call for; one checked run.
use crate::error::{Error, Result};
use composed::bench::Timing;
use composed::{OnDevice, Stage};
use fixtures::{Attention, OutDtype, Quantized, Raw, Scheme, Shape};
use lab::{Arch, Gpu};

/// Inputs resident on one device and the outputs a launch writes: upload once, launch as often as needed.
#[derive(Debug)]
pub struct Problem {
    dev: OnDevice,
}

impl Problem {
    /// Checks `qz` ([`crate::validate`]) and that the device can hold it, then uploads it; O will be written as
    /// `out`, and starts poisoned, so that a download fails on any element no launch wrote.
    pub fn upload(gpu: &Gpu, qz: &Quantized, out: OutDtype) -> Result<Problem> {
        Ok(Problem {
            dev: OnDevice::upload_as(gpu, qz, out)?,
        })
    }

    /// Uploads real-valued inputs and quantizes them on the device by `scheme` (per-head or per-tensor scales,
    /// K smoothing with its LSE shift added back on download, Hadamard rotation).
    pub fn quantize(gpu: &Gpu, raw: &Raw, scheme: Scheme, out: OutDtype) -> Result<Problem> {
        Ok(Problem {
            dev: OnDevice::prepare(gpu, raw, scheme, out)?,
        })
    }

    /// The problem's shape.
    pub fn shape(&self) -> Shape {
        self.dev.shape
    }

    /// Queues one launch of `stage` on the device's stream; refuses by name a stage that lacks what the problem
    /// needs (causal masking, grouped-query heads) before anything runs.
    pub fn launch(&mut self, gpu: &Gpu, stage: Stage) -> Result<()> {
        composed::stage_supports(stage, &self.dev.shape)?;
        Ok(self.dev.launch(gpu, stage)?)
    }

    /// O (widened to f32, exactly) and the LSE; fails if any element was never written.
    pub fn download(&self, gpu: &Gpu) -> Result<Attention<f32>> {
        Ok(self.dev.download(gpu)?)
    }

    /// O and the LSE of the given query rows only (head · Sq + row), for outputs too large to bring back whole.
    pub fn download_rows(&self, gpu: &Gpu, rows: &[usize]) -> Result<Attention<f32>> {
        Ok(self.dev.download_rows(gpu, rows)?)
    }

    /// The E4M3 inputs and scales as the device holds them (after quantization on the device).
    pub fn quantized(&self, gpu: &Gpu) -> Result<Quantized> {
        Ok(self.dev.quantized(gpu)?)
    }

    /// The smoothing's LSE shift of the given rows (zero without K smoothing): what a stage's own LSE lacks.
    pub fn lse_shift_rows(&self, gpu: &Gpu, rows: &[usize]) -> Result<Vec<f32>> {
        Ok(self.dev.lse_shift_rows(gpu, rows)?)
    }

    /// The time of one launch of `stage`: CUDA-graph replays of 20 launches back to back between CUDA events,
    /// after `warmup` replays, up to `iters` of them; p50, p90 and mean per launch, with the SM clock and power they
    /// ran at where NVML answers. Turns off cudarc's cross-stream event tracking for the context.
    pub fn time(&mut self, gpu: &Gpu, stage: Stage, warmup: usize, iters: usize) -> Result<Timing> {
        composed::stage_supports(stage, &self.dev.shape)?;
        Ok(composed::bench::time_stage(
            gpu,
            stage,
            std::slice::from_mut(&mut self.dev),
            warmup,
            iters,
        )?)
    }
}

/// The fastest stage `gpu` runs: stage 7 on Hopper (sm_90: TMA, wgmma, causal, grouped-query heads), stage 4
/// elsewhere (sm_80 / sm_89: mma.sync), which has neither causal masking nor grouped-query heads.
pub fn stage_for(gpu: &Gpu) -> Stage {
    if gpu.arch == Arch::Sm90 || gpu.arch == Arch::Sm90a {
        Stage::S7
    } else {
        Stage::S4
    }
}

/// [`stage_for`] `gpu`, once `s` is checked and the stage can run it (causal masking and grouped-query heads).
pub fn fastest_stage(gpu: &Gpu, s: &Shape) -> Result<Stage> {
    composed::validate_shape(s)?;
    let stage = stage_for(gpu);
    if stage == Stage::S7 {
        return Ok(stage);
    }
    if s.causal || s.group() > 1 {
        return Err(Error::Unsupported(format!(
            "causal masking and grouped-query heads need stage 7, which needs an sm_90 GPU; {} is {}",
            gpu.name, gpu.arch
        )));
    }
    Ok(stage)
}

/// One checked run: `qz` validated and uploaded, `stage` launched, O (written as `out`) and the LSE downloaded.
pub fn run(gpu: &Gpu, stage: Stage, qz: &Quantized, out: OutDtype) -> Result<Attention<f32>> {
    let mut p = Problem::upload(gpu, qz, out)?;
    p.launch(gpu, stage)?;
    p.download(gpu)
}
