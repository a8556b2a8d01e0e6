// Timing a stage: CUDA-graph replays between CUDA events, after warm-up, over rotating input sets; p50, p90, mean.
use anyhow::{Context, Result};
use fixtures::{Raw, Shape, quantize_per_head};
use lab::Gpu;
use lab::cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};

use crate::{OnDevice, Stage};

/// Latency of one launch, over `iters` launches.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub p50_us: f64,
    pub p90_us: f64,
    /// The mean: where the replays' times are bimodal (stage 7 at (4,16,4096,128)), p50 alone can hide a slower
    /// average.
    pub mean_us: f64,
    pub iters: usize,
    /// The SM clock and power over the timed replays (NVML; None where it cannot be read): the device is
    /// power-capped under these kernels, so a figure means little without the clock it ran at.
    pub telemetry: Option<lab::Telemetry>,
}

/// How often the clock and power are read during a timing.
pub const TELEMETRY_PERIOD: std::time::Duration = std::time::Duration::from_millis(10);

impl Timing {
    pub fn tflops(&self, shape: &Shape) -> f64 {
        shape.flops() / (self.p50_us * 1e-6) / 1e12
    }

    /// The energy of one launch, mJ: the device's energy over the timed replays divided by the launches they ran
    /// (`iters` replays of [`BACK_TO_BACK`]); None where NVML keeps no energy counter.
    pub fn mj_per_launch(&self) -> Option<f64> {
        Some(self.telemetry?.energy_j? * 1e3 / (self.iters * BACK_TO_BACK) as f64)
    }
}

/// Input sets of `shape`, uploaded once; launches rotate among them, so that repeated runs do not time a
/// warm L2 holding the one input.
pub fn input_sets(gpu: &Gpu, shape: Shape, sets: usize) -> Result<Vec<OnDevice>> {
    (0..sets)
        .map(|i| {
            OnDevice::upload(
                gpu,
                &quantize_per_head(&Raw::random(shape, 1000 + i as u64, 1.0)),
            )
        })
        .collect()
}

/// `iters` graph replays of `stage` over the sets, timed between two events: the total device time. For
/// criterion's `iter_custom`, which wants the sum over `iters` runs.
pub fn total_time(
    gpu: &Gpu,
    stage: Stage,
    sets: &mut [OnDevice],
    iters: u64,
) -> Result<std::time::Duration> {
    let t = time_stage(
        gpu,
        stage,
        sets,
        3,
        (iters as usize).div_ceil(BACK_TO_BACK).max(1),
    )?;
    // The median × iters: criterion then reports the typical replay, not one outlier's share.
    Ok(std::time::Duration::from_secs_f64(
        t.p50_us * 1e-6 * iters as f64,
    ))
}

/// Launches captured back to back in one CUDA graph: the per-launch time of a graph replay over this many is
/// what a model's kernels see in a stream. One launch per replay would add the graph's own launch cost to
/// every figure and hide kernel differences at small shapes.
pub const BACK_TO_BACK: usize = 20;

/// The stage captured `BACK_TO_BACK` times per input set into a CUDA graph; `warmup` untimed replays, then
/// up to `iters` replays (fewer for long kernels: about 1.5 s of timed work, at least 10), each between two
/// events (rotating over the sets); the distribution of elapsed time / `BACK_TO_BACK`, the per-launch time.
/// Graph replays keep the host's per-launch work out of the interval, so that short kernels are timed, not
/// their launch path; each replay is timed alone, so a slow one cannot hide.
///
/// Switches off cudarc's cross-stream event tracking for the context: only for a process, like the ladder,
/// that does nothing else on the device meanwhile.
pub fn time_stage(
    gpu: &Gpu,
    stage: Stage,
    sets: &mut [OnDevice],
    warmup: usize,
    iters: usize,
) -> Result<Timing> {
    // SAFETY: every use below is ordered by explicit synchronisation on one stream.
    unsafe { gpu.ctx.disable_event_tracking() };
    gpu.stream.synchronize()?;
    let st = gpu.ctx.new_stream()?;
    let mut graphs = Vec::with_capacity(sets.len());
    for set in sets.iter_mut() {
        set.launch_on(gpu, stage, &st)?; // loads the module and sets its attributes outside the capture
        st.synchronize()?;
        st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        for _ in 0..BACK_TO_BACK {
            set.launch_on(gpu, stage, &st)?;
        }
        let g = st
            .end_capture(CUgraphInstantiate_flags(0))?
            .context("the capture made no graph")?;
        g.upload()?;
        graphs.push(g);
    }
    let n = graphs.len();
    for i in 0..warmup.max(1) {
        graphs[i % n].launch()?;
    }
    // One timed replay sizes the run.
    let (a, b) = (
        st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
    );
    st.synchronize()?;
    let first = {
        let s0 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graphs[0].launch()?;
        let s1 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        st.synchronize()?;
        f64::from(s0.elapsed_ms(&s1)?) * 1e3
    };
    drop((a, b));
    let iters = iters.min(((1.5e6 / first.max(1.0)) as usize).max(10));
    let mut events = Vec::with_capacity(iters);
    let sampler = lab::Sampler::start(gpu, TELEMETRY_PERIOD);
    for i in 0..iters {
        let start = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graphs[i % n].launch()?;
        let end = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    st.synchronize()?;
    let telemetry = sampler.and_then(lab::Sampler::stop);
    let mut us: Vec<f64> = events
        .iter()
        .map(|(a, b)| {
            a.elapsed_ms(b)
                .map(|ms| f64::from(ms) * 1e3 / BACK_TO_BACK as f64)
        })
        .collect::<Result<_, _>>()?;
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    Ok(Timing {
        p50_us: at(0.5),
        p90_us: at(0.9),
        mean_us: us.iter().sum::<f64>() / us.len() as f64,
        iters,
        telemetry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(iters: usize, energy_j: Option<f64>) -> Timing {
        let mut t = lab::Telemetry::summarize(
            &[lab::telemetry::Sample {
                sm_mhz: 1600,
                power_w: 690.0,
                power_capped: true,
                slowdown: false,
            }],
            700.0,
        );
        if let Some(t) = t.as_mut() {
            t.energy_j = energy_j;
        }
        Timing {
            p50_us: 600.0,
            p90_us: 610.0,
            mean_us: 605.0,
            iters,
            telemetry: t,
        }
    }

    #[test]
    fn a_launchs_energy_is_the_replays_energy_over_their_launches() {
        // 100 replays of 20 launches in 840 J: 420 mJ a launch.
        let mj = timing(100, Some(840.0)).mj_per_launch().unwrap();
        assert!((mj - 420.0).abs() < 1e-9, "{mj}");
        assert_eq!(timing(100, None).mj_per_launch(), None);
    }
}
