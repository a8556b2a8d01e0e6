// The Hadamard model: the FWHT in the device's order, seeded signs, and the rotation of rows, on the host.
use anyhow::{Result, ensure};

/// The row lengths the block is built for: a power of two, one to eight floats a lane of a warp.
pub const DIMS: [usize; 4] = [32, 64, 128, 256];

/// Fails, naming D, for a row length the transform is not built for.
pub fn check_dim(d: usize) -> Result<()> {
    ensure!(
        DIMS.contains(&d),
        "a Hadamard rotation needs D a power of two from 32 to 256 ({DIMS:?}); D = {d}"
    );
    Ok(())
}

/// The f32 nearest 1/√D, the scaling every rotated value gets (exact for D = 64 and 256).
pub fn norm(d: usize) -> f32 {
    (1.0 / (d as f64).sqrt()) as f32
}

/// The unnormalised Walsh–Hadamard transform in place: strides 1, 2, … D/2, each butterfly (a, b) → (a + b,
/// a − b) with a the lower element. The device runs the same operations on the same values (hadamard.cuh).
pub fn fwht(v: &mut [f32]) {
    let n = v.len();
    let mut h = 1;
    while h < n {
        for block in v.chunks_exact_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (a, b) in lo.iter_mut().zip(hi) {
                let (x, y) = (*a, *b);
                *a = x + y;
                *b = x - y;
            }
        }
        h *= 2;
    }
}

/// D seeded signs, each ±1.
pub fn signs(d: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..d)
        .map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 })
        .collect()
}

/// The orthonormal rotation of rows of D: x → x·diag(s)·H/√D (s the seeded signs, or all +1), and its inverse
/// y → y·H/√D·diag(s). Q and K rotated by the same one keep Q·Kᵀ: R·Rᵀ = I.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    pub d: usize,
    pub signs: Option<Vec<f32>>,
}

impl Rotation {
    /// The rotation for rows of `d`, with signs seeded by `seed` (None: no sign flips).
    pub fn new(d: usize, seed: Option<u64>) -> Result<Rotation> {
        check_dim(d)?;
        Ok(Rotation {
            d,
            signs: seed.map(|s| signs(d, s)),
        })
    }

    /// One row, as the device does it: signs (forward), FWHT, × norm, signs (inverse).
    pub fn row(&self, v: &mut [f32], inverse: bool) {
        let flip = |v: &mut [f32]| {
            if let Some(s) = &self.signs {
                v.iter_mut().zip(s).for_each(|(x, s)| *x *= s);
            }
        };
        if !inverse {
            flip(v);
        }
        fwht(v);
        let c = norm(self.d);
        v.iter_mut().for_each(|x| *x *= c);
        if inverse {
            flip(v);
        }
    }

    /// Every row of `x` (a multiple of D long), on all cores.
    pub fn rows(&self, x: &mut [f32], inverse: bool) {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let chunk = (x.len() / self.d).div_ceil(threads).max(1024) * self.d;
        std::thread::scope(|sc| {
            for part in x.chunks_mut(chunk) {
                sc.spawn(move || {
                    part.chunks_exact_mut(self.d)
                        .for_each(|r| self.row(r, inverse))
                });
            }
        });
    }

    /// The D × D matrix R (row-major, f64) of the exact rotation: R[i][j] = s_i · H[i][j] / √D.
    pub fn matrix(&self) -> Vec<f64> {
        let d = self.d;
        let mut m = vec![0.0; d * d];
        for i in 0..d {
            for j in 0..d {
                let h = if (i & j).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                let s = self.signs.as_ref().map_or(1.0, |s| f64::from(s[i]));
                m[i * d + j] = s * h / (d as f64).sqrt();
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unsupported_dims_are_named() {
        let e = Rotation::new(96, None).unwrap_err().to_string();
        assert!(e.contains("D = 96") && e.contains("power of two"), "{e}");
        assert!(Rotation::new(16, Some(1)).is_err());
        assert!(Rotation::new(512, None).is_err());
    }

    #[test]
    fn signs_are_seeded_and_mixed() {
        let s = signs(128, 7);
        assert_eq!(s, signs(128, 7));
        assert_ne!(s, signs(128, 8));
        let plus = s.iter().filter(|&&x| x == 1.0).count();
        assert!(s.iter().all(|&x| x == 1.0 || x == -1.0) && (32..96).contains(&plus));
    }

    proptest! {
        /// The fast transform is the matrix product by H / √D (with signs), up to f32 rounding.
        #[test]
        fn rotation_is_the_matrix_product(seed in 0u64..1000, di in 0usize..4, signed: bool) {
            let d = DIMS[di];
            let r = Rotation::new(d, signed.then_some(seed)).unwrap();
            let x = lab::numerics::Inputs::seeded(seed).normal(d, 0.0, 1.0);
            let mut y = x.clone();
            r.row(&mut y, false);
            let m = r.matrix();
            for j in 0..d {
                let want: f64 = (0..d).map(|i| f64::from(x[i]) * m[i * d + j]).sum();
                prop_assert!((f64::from(y[j]) - want).abs() < 1e-5 * (d as f64).sqrt(), "d {d} col {j}: {} vs {want}", y[j]);
            }
            let mut back = y.clone();
            r.row(&mut back, true);
            for (a, b) in x.iter().zip(&back) {
                prop_assert!((a - b).abs() < 1e-5, "inverse: {a} vs {b}");
            }
        }
    }

    #[test]
    fn twice_unnormalised_is_d_times_the_identity_exactly_on_integers() {
        let x: Vec<f32> = (0..128).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let mut y = x.clone();
        fwht(&mut y);
        fwht(&mut y);
        assert!(x.iter().zip(&y).all(|(a, b)| 128.0 * a == *b));
    }
}
