// Shared test numerics: error statistics against an f64 reference, seeded inputs, and poisoned outputs.
use std::fmt;

use anyhow::{Result, bail};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// Anything a kernel writes that can be compared with an f64 reference.
pub trait AsF64: Copy {
    fn as_f64(self) -> f64;
}
impl AsF64 for f64 {
    fn as_f64(self) -> f64 {
        self
    }
}
impl AsF64 for f32 {
    fn as_f64(self) -> f64 {
        self as f64
    }
}
impl AsF64 for f16 {
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
}
impl AsF64 for bf16 {
    fn as_f64(self) -> f64 {
        self.to_f64()
    }
}

/// How far a result may be from its reference: |got − want| ≤ atol + rtol·|want| per element.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    /// No tolerance: every difference counts as outside (for figures that only report the error).
    pub const fn exact() -> Self {
        Tolerance {
            atol: 0.0,
            rtol: 0.0,
        }
    }
}

/// Error of `got` against `want`: the figures every GPU test reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorStats {
    pub n: usize,
    pub max_abs: f64,
    pub mean_abs: f64,
    /// ‖got − want‖₂ / ‖want‖₂ (or the absolute norm when the reference is all zeros).
    pub rel_l2: f64,
    /// Index of the largest error, to start debugging from.
    pub worst: Option<usize>,
    /// NaN where the reference is not NaN.
    pub nan: usize,
    /// ±Inf where the reference is finite.
    pub inf: usize,
    /// Elements outside the tolerance, NaN and Inf included.
    pub outside: usize,
    pub tol: Tolerance,
}

impl ErrorStats {
    pub fn frac_outside(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.outside as f64 / self.n as f64
        }
    }

    /// Passes when no element is outside the tolerance.
    pub fn check(&self, what: &str) -> Result<()> {
        self.check_frac(what, 0.0)
    }

    /// Passes when at most `max_frac` of the elements are outside the tolerance, and none is NaN or Inf.
    pub fn check_frac(&self, what: &str, max_frac: f64) -> Result<()> {
        if self.nan + self.inf > 0 || self.frac_outside() > max_frac {
            bail!("{what}: {self}");
        }
        Ok(())
    }
}

impl fmt::Display for ErrorStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={} max_abs={:.3e} mean_abs={:.3e} rel_l2={:.3e} outside(atol={:.1e}, rtol={:.1e})={} ({:.3}%) nan={} inf={}",
            self.n,
            self.max_abs,
            self.mean_abs,
            self.rel_l2,
            self.tol.atol,
            self.tol.rtol,
            self.outside,
            100.0 * self.frac_outside(),
            self.nan,
            self.inf
        )?;
        if let Some(w) = self.worst {
            write!(f, " worst@{w}")?;
        }
        Ok(())
    }
}

/// Compares element-wise. NaN and ±Inf are matched exactly where the reference has them.
pub fn error_stats<G: AsF64, W: AsF64>(got: &[G], want: &[W], tol: Tolerance) -> ErrorStats {
    assert_eq!(
        got.len(),
        want.len(),
        "error_stats: got {} elements, reference has {}",
        got.len(),
        want.len()
    );
    let mut s = ErrorStats {
        n: got.len(),
        max_abs: 0.0,
        mean_abs: 0.0,
        rel_l2: 0.0,
        worst: None,
        nan: 0,
        inf: 0,
        outside: 0,
        tol,
    };
    let (mut sum_abs, mut sum_sq_err, mut sum_sq_ref) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.as_f64(), w.as_f64());
        if w.is_nan() || w.is_infinite() {
            let same = (w.is_nan() && g.is_nan()) || g == w;
            if !same {
                s.outside += 1;
                s.nan += g.is_nan() as usize;
                s.inf += g.is_infinite() as usize;
                s.worst.get_or_insert(i);
            }
            continue;
        }
        if g.is_nan() || g.is_infinite() {
            s.nan += g.is_nan() as usize;
            s.inf += g.is_infinite() as usize;
            s.outside += 1;
            s.worst.get_or_insert(i);
            continue;
        }
        let e = (g - w).abs();
        sum_abs += e;
        sum_sq_err += e * e;
        sum_sq_ref += w * w;
        if e > s.max_abs {
            s.max_abs = e;
            s.worst = Some(i);
        }
        if e > tol.atol + tol.rtol * w.abs() {
            s.outside += 1;
        }
    }
    if s.n > 0 {
        s.mean_abs = sum_abs / s.n as f64;
    }
    s.rel_l2 = if sum_sq_ref > 0.0 {
        (sum_sq_err / sum_sq_ref).sqrt()
    } else {
        sum_sq_err.sqrt()
    };
    s
}

/// A value that marks "never written by the kernel". Float poisons are NaNs with a payload a kernel does
/// not produce (computed NaNs are canonical), so an unwritten element is told apart from a computed NaN.
pub trait Poison: Copy + PartialEq {
    const POISON: Self;
    fn is_poison(&self) -> bool;
}

macro_rules! poison_bits {
    ($t:ty, $bits:expr, $from:path, $to:ident) => {
        impl Poison for $t {
            const POISON: Self = $from($bits);
            fn is_poison(&self) -> bool {
                self.$to() == $bits
            }
        }
    };
}
poison_bits!(f32, 0x7FC0_DEADu32, f32::from_bits, to_bits);
poison_bits!(f64, 0x7FF8_0000_DEAD_BEEFu64, f64::from_bits, to_bits);
poison_bits!(f16, 0x7E5Au16, f16::from_bits, to_bits);
poison_bits!(bf16, 0x7FDAu16, bf16::from_bits, to_bits);

macro_rules! poison_int {
    ($t:ty, $v:expr) => {
        impl Poison for $t {
            const POISON: Self = $v;
            fn is_poison(&self) -> bool {
                *self == $v
            }
        }
    };
}
poison_int!(u32, 0xDEAD_BEEF);
poison_int!(i32, 0x5EAD_BEEF);
poison_int!(u16, 0xDEAD);

/// A host buffer full of poison, to copy to the device before a launch.
pub fn poisoned<T: Poison>(n: usize) -> Vec<T> {
    vec![T::POISON; n]
}

/// Fails when any element still holds the poison, naming how many and the first.
pub fn check_written<T: Poison>(out: &[T], what: &str) -> Result<()> {
    let mut first = None;
    let mut count = 0usize;
    for (i, v) in out.iter().enumerate() {
        if v.is_poison() {
            count += 1;
            first.get_or_insert(i);
        }
    }
    if let Some(i) = first {
        bail!(
            "{what}: {count} of {} elements never written by the kernel (first at index {i})",
            out.len()
        );
    }
    Ok(())
}

/// Seeded generators: every random input in the lab comes from one of these, so a failure is replayable.
#[derive(Debug, Clone)]
pub struct Inputs(ChaCha8Rng);

impl Inputs {
    pub fn seeded(seed: u64) -> Self {
        Inputs(ChaCha8Rng::seed_from_u64(seed))
    }

    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.0.random_range(lo..hi)).collect()
    }

    pub fn normal(&mut self, n: usize, mean: f32, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let z: f32 = StandardNormal.sample(&mut self.0);
                mean + std * z
            })
            .collect()
    }

    /// Integer-valued floats in [lo, hi]: sums of these are exact in fp32 while below 2^24.
    pub fn integers(&mut self, n: usize, lo: i32, hi: i32) -> Vec<f32> {
        (0..n)
            .map(|_| self.0.random_range(lo..=hi) as f32)
            .collect()
    }

    pub fn bits_u32(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.0.random()).collect()
    }
}

/// The median (the mean of the middle two for an even count; NaN for none): of timings, clocks, ratios.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerance = Tolerance {
        atol: 1e-3,
        rtol: 0.0,
    };

    #[test]
    fn stats_of_a_known_error() {
        let want = [1.0f64, 2.0, 3.0, 4.0];
        let got = [1.0f32, 2.0, 3.5, 4.0];
        let s = error_stats(&got, &want, TOL);
        assert_eq!(s.max_abs, 0.5);
        assert_eq!(s.mean_abs, 0.125);
        assert!((s.rel_l2 - 0.5 / 30f64.sqrt()).abs() < 1e-12);
        assert_eq!((s.outside, s.worst), (1, Some(2)));
        assert!(s.check("x").is_err());
        assert!(s.check_frac("x", 0.25).is_ok());
    }

    #[test]
    fn nan_and_inf_are_counted_unless_expected() {
        let want = [f64::NAN, f64::INFINITY, 1.0, 1.0];
        let got = [f32::NAN, f32::INFINITY, f32::NAN, f32::NEG_INFINITY];
        let s = error_stats(&got, &want, TOL);
        assert_eq!((s.nan, s.inf, s.outside), (1, 1, 2));
        assert!(s.check_frac("x", 1.0).is_err(), "NaN never passes");
    }

    #[test]
    fn poison_is_told_apart_from_computed_nan() {
        let mut out = poisoned::<f32>(8);
        assert!(
            check_written(&out, "o")
                .unwrap_err()
                .to_string()
                .contains("8 of 8")
        );
        for (i, v) in out.iter_mut().enumerate().skip(1) {
            *v = if i == 3 { f32::NAN } else { i as f32 };
        }
        let e = check_written(&out, "o").unwrap_err().to_string();
        assert!(e.contains("1 of 8") && e.contains("index 0"), "{e}");
        out[0] = 0.0;
        check_written(&out, "o").unwrap();
        assert!(!f16::NAN.is_poison() && f16::POISON.is_nan());
    }

    #[test]
    fn inputs_are_reproducible() {
        assert_eq!(
            Inputs::seeded(7).normal(16, 0.0, 1.0),
            Inputs::seeded(7).normal(16, 0.0, 1.0)
        );
        assert_ne!(
            Inputs::seeded(7).uniform(16, 0.0, 1.0),
            Inputs::seeded(8).uniform(16, 0.0, 1.0)
        );
        assert!(
            Inputs::seeded(1)
                .integers(100, -3, 3)
                .iter()
                .all(|v| v.fract() == 0.0 && v.abs() <= 3.0)
        );
    }
}
