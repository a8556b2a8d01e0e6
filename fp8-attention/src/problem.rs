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

/// Keys up to which a call on Hopper runs stage 8 (V read as the caller has it: one launch) rather than stage 7 with
/// V's transpose before it. Measured on an H100 (2026-11-27, docs/ladder.md), every kernel of a call counted: stage 8
/// faster at the mission shape (8.3 against 9.7 µs), at (1, 8, 2048, 64) (20.0 / 21.5) and at (8, 16, 2048, 128)
/// (+3%), level at causal (4, 16, 4096, 128) (+1%), slower from (4, 16, 4096, ·) on (−4% at D = 64, −5% at 128) and
/// at S ≥ 8192 (−8 to −10%).
pub const STAGE8_MAX_KEYS: usize = 2048;

/// The stage a call of shape `s` runs where the device runs `base` ([`stage_for`]): on Hopper stage 8 up to
/// [`STAGE8_MAX_KEYS`] keys at the head dimensions it is built for (64, 128), and at any length under a sliding
/// window (stage 8's alone), stage 7 past them and at D = 256; `base` elsewhere.
pub fn stage_for_shape(base: Stage, s: &Shape) -> Stage {
    if base == Stage::S7
        && Stage::S8.dims().contains(&s.d)
        && (s.sk <= STAGE8_MAX_KEYS || s.window.is_bounded())
    {
        Stage::S8
    } else {
        base
    }
}

/// The stage a call on `s` runs on `gpu` ([`stage_for_shape`]), once `s` is checked and the stage can run it (causal
/// masking and grouped-query heads).
pub fn fastest_stage(gpu: &Gpu, s: &Shape) -> Result<Stage> {
    composed::validate_shape(s)?;
    let stage = stage_for(gpu);
    if stage == Stage::S7 {
        return Ok(stage_for_shape(stage, s));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hopper_runs_stage8_up_to_its_key_limit_at_the_dims_it_is_built_for() {
        let s = |sk, d| Shape::cross(1, 8, 512, sk, d);
        assert_eq!(
            stage_for_shape(Stage::S7, &s(512, 64)),
            Stage::S8,
            "the mission shape"
        );
        assert_eq!(
            stage_for_shape(Stage::S7, &s(STAGE8_MAX_KEYS, 128)),
            Stage::S8
        );
        assert_eq!(
            stage_for_shape(Stage::S7, &s(STAGE8_MAX_KEYS + 1, 128)),
            Stage::S7
        );
        assert_eq!(stage_for_shape(Stage::S7, &s(4096, 64)), Stage::S7);
        assert_eq!(
            stage_for_shape(Stage::S7, &s(512, 256)),
            Stage::S7,
            "stage 8 has no D = 256"
        );
        assert_eq!(
            stage_for_shape(Stage::S4, &s(512, 64)),
            Stage::S4,
            "not Hopper: its stage"
        );
        let windowed = s(65536, 128).with_window(fixtures::Window {
            left: Some(1024),
            right: None,
        });
        assert_eq!(
            stage_for_shape(Stage::S7, &windowed),
            Stage::S8,
            "a window: stage 8's alone"
        );
        // Whatever it picks runs the shape's head dimension.
        for d in composed::DIMS {
            for sk in [1, 512, STAGE8_MAX_KEYS, STAGE8_MAX_KEYS + 1, 65536] {
                assert!(
                    stage_for_shape(Stage::S7, &s(sk, d)).dims().contains(&d),
                    "D = {d}, Sk = {sk}"
                );
            }
        }
    }
}
