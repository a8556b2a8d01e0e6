//! The device's SM clock and power while something runs on it (NVML, sampled on a thread).
//!
//! Under its power limit an H100 lowers the SM clock (stage 7 and cuDNN's FP8 SDPA both run at the 700 W cap,
//! 1.4–1.7 GHz of 1.98), so a kernel's time depends on its energy per unit of work as well as its cycles: two
//! timings are comparable only with the clock and power they ran at beside them. Where NVML cannot be loaded (no
//! driver: CI) or does not know the device, there is no telemetry, never an error.
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::{Device, Nvml};
use serde::Serialize;

use crate::Gpu;
use crate::numerics::median;

/// One reading of the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub sm_mhz: u32,
    pub power_w: f64,
    /// The software power cap was holding the clock down.
    pub power_capped: bool,
    /// A thermal or hardware slowdown was.
    pub slowdown: bool,
}

/// Readings over an interval: medians of the clock and the power, and how often each limit held the clock down.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Telemetry {
    pub samples: usize,
    pub sm_mhz_p50: f64,
    pub sm_mhz_min: u32,
    pub sm_mhz_max: u32,
    pub power_w_p50: f64,
    pub power_limit_w: f64,
    /// Share of the samples with the software power cap active (0 to 1).
    pub power_capped: f64,
    /// Share with a thermal or hardware slowdown.
    pub slowdown: f64,
    /// The device's energy over the interval, J (NVML's total-energy counter read at its start and end; None where
    /// NVML does not keep one). Divided by the launches run meanwhile it is the energy of a launch, which sets a
    /// kernel's time at the power cap as much as its cycles do.
    pub energy_j: Option<f64>,
}

impl Telemetry {
    /// The summary of `samples` (None when there are none).
    pub fn summarize(samples: &[Sample], power_limit_w: f64) -> Option<Telemetry> {
        if samples.is_empty() {
            return None;
        }
        let n = samples.len() as f64;
        let share = |f: fn(&Sample) -> bool| samples.iter().filter(|s| f(s)).count() as f64 / n;
        Some(Telemetry {
            samples: samples.len(),
            sm_mhz_p50: median(samples.iter().map(|s| f64::from(s.sm_mhz)).collect()),
            sm_mhz_min: samples.iter().map(|s| s.sm_mhz).min()?,
            sm_mhz_max: samples.iter().map(|s| s.sm_mhz).max()?,
            power_w_p50: median(samples.iter().map(|s| s.power_w).collect()),
            power_limit_w,
            power_capped: share(|s| s.power_capped),
            slowdown: share(|s| s.slowdown),
            energy_j: None,
        })
    }
}

impl std::fmt::Display for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SM {:.0} MHz ({}–{}), {:.0} W of {:.0}, power-capped {:.0}% of {} samples",
            self.sm_mhz_p50,
            self.sm_mhz_min,
            self.sm_mhz_max,
            self.power_w_p50,
            self.power_limit_w,
            100.0 * self.power_capped,
            self.samples
        )?;
        if self.slowdown > 0.0 {
            write!(
                f,
                ", thermal/hardware slowdown {:.0}%",
                100.0 * self.slowdown
            )?;
        }
        Ok(())
    }
}

/// NVML, loaded once per process (None where the library or a device is missing).
fn nvml() -> Option<&'static Nvml> {
    static N: OnceLock<Option<Nvml>> = OnceLock::new();
    N.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// One reading of `device` (None where NVML refuses one of its three queries).
fn read(device: &Device<'_>) -> Option<Sample> {
    let why = device.current_throttle_reasons().ok()?;
    Some(Sample {
        sm_mhz: device.clock_info(Clock::SM).ok()?,
        power_w: f64::from(device.power_usage().ok()?) / 1e3,
        power_capped: why.contains(ThrottleReasons::SW_POWER_CAP),
        slowdown: why.intersects(
            ThrottleReasons::HW_SLOWDOWN
                | ThrottleReasons::SW_THERMAL_SLOWDOWN
                | ThrottleReasons::HW_THERMAL_SLOWDOWN
                | ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        ),
    })
}

/// Samples `gpu`'s device on a thread, every `period`, from `start` until `stop`.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(Vec<Sample>, Option<u64>)>,
    power_limit_w: f64,
    /// NVML's total-energy counter at the start, mJ.
    energy_mj: Option<u64>,
}

impl Sampler {
    /// Starts sampling the device of `gpu` (found by its PCI bus id), once right away and then every `period`;
    /// None where NVML cannot read it.
    pub fn start(gpu: &Gpu, period: Duration) -> Option<Sampler> {
        let device = nvml()?.device_by_pci_bus_id(gpu.pci_bus_id().ok()?).ok()?;
        let power_limit_w = f64::from(device.enforced_power_limit().ok()?) / 1e3;
        // The first reading is taken here, before the caller's work starts.
        let mut samples: Vec<Sample> = read(&device).into_iter().collect();
        let energy_mj = device.total_energy_consumption().ok();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                samples.extend(read(&device));
            }
            (samples, device.total_energy_consumption().ok())
        });
        Some(Sampler {
            stop,
            handle,
            power_limit_w,
            energy_mj,
        })
    }

    /// Stops sampling (one last reading is taken) and summarises.
    pub fn stop(self) -> Option<Telemetry> {
        self.stop.store(true, Ordering::Relaxed);
        let (samples, end_mj) = self.handle.join().ok()?;
        let mut t = Telemetry::summarize(&samples, self.power_limit_w)?;
        t.energy_j = energy_between(self.energy_mj, end_mj);
        Some(t)
    }
}

/// The energy between two readings of NVML's total-energy counter (mJ since the driver loaded), J: None where either
/// is missing or the counter went back (a driver reload between them).
fn energy_between(start_mj: Option<u64>, end_mj: Option<u64>) -> Option<f64> {
    let (a, b) = (start_mj?, end_mj?);
    (b >= a).then(|| (b - a) as f64 / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(sm_mhz: u32, power_w: f64, power_capped: bool) -> Sample {
        Sample {
            sm_mhz,
            power_w,
            power_capped,
            slowdown: false,
        }
    }

    #[test]
    fn summary_medians_extremes_and_shares() {
        let t = Telemetry::summarize(
            &[
                s(1600, 700.0, true),
                s(1980, 300.0, false),
                s(1500, 690.0, true),
                s(1700, 698.0, true),
            ],
            700.0,
        )
        .unwrap();
        assert_eq!(t.samples, 4);
        assert_eq!(t.sm_mhz_p50, 1650.0);
        assert_eq!((t.sm_mhz_min, t.sm_mhz_max), (1500, 1980));
        assert_eq!(t.power_w_p50, 694.0);
        assert_eq!(t.power_capped, 0.75);
        assert_eq!(t.slowdown, 0.0);
        let line = t.to_string();
        assert!(
            line.contains("SM 1650 MHz (1500–1980)") && line.contains("power-capped 75% of 4"),
            "{line}"
        );
        assert!(!line.contains("slowdown"), "{line}");
    }

    #[test]
    fn energy_is_the_counters_difference_in_joules() {
        assert_eq!(energy_between(Some(1_000), Some(413_500)), Some(412.5));
        assert_eq!(energy_between(Some(7), Some(7)), Some(0.0));
        // A missing reading, or a counter that went back, gives no energy rather than a wrong one.
        assert_eq!(energy_between(None, Some(5)), None);
        assert_eq!(energy_between(Some(5), None), None);
        assert_eq!(energy_between(Some(9), Some(5)), None);
    }

    #[test]
    fn no_samples_no_summary() {
        assert_eq!(Telemetry::summarize(&[], 700.0), None);
    }

    #[test]
    fn odd_count_median_is_the_middle_reading() {
        let t = Telemetry::summarize(
            &[
                s(1400, 1.0, false),
                s(1900, 3.0, false),
                s(1500, 2.0, false),
            ],
            700.0,
        )
        .unwrap();
        assert_eq!(
            (t.sm_mhz_p50, t.power_w_p50, t.power_capped),
            (1500.0, 2.0, 0.0)
        );
    }
}
