// Timing a stage with CUDA events: warm-up, then many launches over rotating input sets; p50 and p90.
use anyhow::Result;
use fixtures::{Raw, Shape, quantize_per_head};
use lab::Gpu;
use lab::cudarc::driver::sys::CUevent_flags;

use crate::{OnDevice, Stage};

/// Latency of one launch, over `iters` launches.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub p50_us: f64,
    pub p90_us: f64,
    pub iters: usize,
}

impl Timing {
    pub fn tflops(&self, shape: &Shape) -> f64 {
        shape.flops() / (self.p50_us * 1e-6) / 1e12
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

/// `warmup` untimed launches, then `iters` launches each between two events; the distribution of their
/// elapsed times. Each launch is timed alone, so one slow launch cannot hide in an average.
pub fn time_stage(
    gpu: &Gpu,
    stage: Stage,
    sets: &mut [OnDevice],
    warmup: usize,
    iters: usize,
) -> Result<Timing> {
    let n = sets.len();
    for i in 0..warmup {
        sets[i % n].launch(gpu, stage)?;
    }
    let st = &gpu.stream;
    let mut events = Vec::with_capacity(iters);
    for i in 0..iters {
        let start = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        sets[i % n].launch(gpu, stage)?;
        let end = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        events.push((start, end));
    }
    st.synchronize()?;
    let mut us: Vec<f64> = events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) * 1e3))
        .collect::<Result<_, _>>()?;
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    Ok(Timing {
        p50_us: at(0.5),
        p90_us: at(0.9),
        iters,
    })
}
