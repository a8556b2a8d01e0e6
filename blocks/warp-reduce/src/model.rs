// The warp-reduce model: masked row max (exact), row sum in f64, and the device's f32 summation order.
use frag_layout::{DType, LayoutId, Op, Operand};

/// Rows of every accumulator tile (wmma and mma alike).
pub const ROWS: usize = 16;

/// Which accumulator fragments hold the tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frag {
    /// `wmma::fragment<accumulator, 16, 16, 16, float>`: 16 columns, 8 elements per lane.
    WmmaAcc,
    /// `mma.sync` m16n8 C: 8 columns, 4 elements per lane.
    MmaC,
}

impl Frag {
    pub fn layout(self) -> LayoutId {
        let op = if self == Frag::WmmaAcc {
            Op::Wmma16x16x16
        } else {
            Op::Mma16x8x16
        };
        LayoutId {
            op,
            operand: Operand::Acc,
            dtype: DType::F32,
        }
    }
    pub fn cols(self) -> usize {
        self.layout().shape().1 as usize
    }
    pub fn elems(self) -> u32 {
        self.layout().regs()
    }
    pub fn name(self) -> &'static str {
        if self == Frag::WmmaAcc { "wmma" } else { "mma" }
    }
}

/// A 16-row tile held by `wn` warps side by side, each holding `nf` fragments along the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub frag: Frag,
    pub nf: usize,
    pub wn: usize,
}

impl Shape {
    pub const fn new(frag: Frag, nf: usize, wn: usize) -> Self {
        Shape { frag, nf, wn }
    }
    pub fn cols(&self) -> usize {
        self.wn * self.nf * self.frag.cols()
    }
    pub fn kernel(&self) -> String {
        format!("reduce_{}_nf{}_wn{}", self.frag.name(), self.nf, self.wn)
    }
    /// Additions any one element goes through on the device: its lane's serial fold, two quad steps, and the
    /// fold across warps. The f32 error bound of the row sum is γ_k · Σ|x|.
    pub fn sum_depth(&self) -> usize {
        let per_lane = self.nf * self.frag.elems() as usize / 2;
        (per_lane - 1) + 2 + (self.wn - 1)
    }
}

/// The device's max: NaN propagates; otherwise IEEE max with +0 above −0.
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_positive() { a } else { b }
    } else if a > b {
        a
    } else {
        b
    }
}

/// Which columns of each row are real: those below `kv_valid` (a partial K/V tile) and, with a diagonal,
/// also at most `r + diag` in row r (a causal mask: the device's `rows_limited` with limit = min(kv_valid,
/// r + diag + 1)). A plain `usize` is `kv_valid` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mask {
    pub kv_valid: usize,
    pub diag: Option<usize>,
}

impl Mask {
    pub fn limit(&self, r: usize) -> usize {
        self.diag
            .map_or(self.kv_valid, |d| self.kv_valid.min(r + d + 1))
    }
}

impl From<usize> for Mask {
    fn from(kv_valid: usize) -> Mask {
        Mask {
            kv_valid,
            diag: None,
        }
    }
}

fn valid<'a>(
    tile: &'a [f32],
    shape: &Shape,
    r: usize,
    mask: Mask,
) -> impl Iterator<Item = f32> + 'a {
    let cols = shape.cols();
    tile[r * cols..r * cols + mask.limit(r).min(cols)]
        .iter()
        .copied()
}

/// Row max over the valid columns; −inf where there are none. Order-free, so exact.
pub fn row_max(shape: &Shape, tile: &[f32], mask: impl Into<Mask>) -> Vec<f32> {
    let mask = mask.into();
    (0..ROWS)
        .map(|r| valid(tile, shape, r, mask).fold(f32::NEG_INFINITY, max_nan))
        .collect()
}

/// Row sum in f64 of the valid columns: the reference.
pub fn row_sum_exact(shape: &Shape, tile: &[f32], mask: impl Into<Mask>) -> Vec<f64> {
    let mask = mask.into();
    (0..ROWS)
        .map(|r| valid(tile, shape, r, mask).map(f64::from).sum())
        .collect()
}

/// Σ|x| of the valid columns, for the error bound.
pub fn row_abs_sum(shape: &Shape, tile: &[f32], mask: impl Into<Mask>) -> Vec<f64> {
    let mask = mask.into();
    (0..ROWS)
        .map(|r| {
            valid(tile, shape, r, mask)
                .map(|x| f64::from(x).abs())
                .sum()
        })
        .collect()
}

/// γ_k = k·u / (1 − k·u) with u = 2⁻²⁴: any summation in which each element passes through k roundings.
pub fn gamma(k: usize) -> f64 {
    let ku = k as f64 * 2f64.powi(-24);
    ku / (1.0 - ku)
}

/// The row sum as `warp_reduce.cuh` computes it in f32: each lane folds its cells in (fragment, element)
/// order from 0, the quad adds (s0 + s1) + (s2 + s3), and warps' partials are added in warp order.
/// The partial sums a lane keeps (`SumOp::kChains` in warp_reduce.cuh): cell k of its row goes into k % 2.
pub const SUM_CHAINS: usize = 2;

pub fn row_sum_device(shape: &Shape, tile: &[f32], mask: impl Into<Mask>) -> Vec<f32> {
    let mask = mask.into();
    let (cols, fc, l) = (shape.cols(), shape.frag.cols(), shape.frag.layout());
    (0..ROWS)
        .map(|r| {
            let half = (r / 8) as u32;
            let warp_partial = |w: usize| {
                let s: Vec<f32> = (0..4u32)
                    .map(|t| {
                        let lane = 4 * (r as u32 % 8) + t;
                        // The lane's cells round robin into SUM_CHAINS partials, then folded in order.
                        let mut s = [0.0f32; SUM_CHAINS];
                        let mut k = 0;
                        for f in 0..shape.nf {
                            for i in (0..l.regs()).filter(|i| (i >> 1) & 1 == half) {
                                let c = (w * shape.nf + f) * fc + l.coord(lane, i).1 as usize;
                                s[k % SUM_CHAINS] += if c < mask.limit(r) {
                                    tile[r * cols + c]
                                } else {
                                    0.0
                                };
                                k += 1;
                            }
                        }
                        s[1..].iter().fold(s[0], |a, &x| a + x)
                    })
                    .collect();
                (s[0] + s[1]) + (s[2] + s[3])
            };
            (1..shape.wn).fold(warp_partial(0), |acc, w| acc + warp_partial(w))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lab::numerics::Inputs;
    use proptest::prelude::*;

    const SHAPES: [Shape; 4] = [
        Shape::new(Frag::WmmaAcc, 1, 1),
        Shape::new(Frag::WmmaAcc, 2, 4),
        Shape::new(Frag::MmaC, 8, 1),
        Shape::new(Frag::MmaC, 4, 4),
    ];

    #[test]
    fn device_order_is_exact_on_integers() {
        for s in SHAPES {
            let tile = Inputs::seeded(3).integers(ROWS * s.cols(), -1000, 1000);
            let exact = row_sum_exact(&s, &tile, s.cols());
            let dev = row_sum_device(&s, &tile, s.cols());
            assert!(
                exact.iter().zip(&dev).all(|(e, d)| *e == f64::from(*d)),
                "{s:?}"
            );
        }
    }

    #[test]
    fn masks_empty_rows_and_nan_policy() {
        let s = Shape::new(Frag::MmaC, 2, 1);
        let mut tile = vec![1.0f32; ROWS * s.cols()];
        tile[3 * s.cols()] = f32::NAN; // valid: propagates
        tile[5 * s.cols() + s.cols() - 1] = f32::NAN; // masked below: ignored
        let kv = s.cols() - 1;
        let (mx, sm) = (row_max(&s, &tile, kv), row_sum_device(&s, &tile, kv));
        assert!(mx[3].is_nan() && sm[3].is_nan());
        assert_eq!((mx[5], sm[5]), (1.0, kv as f32));
        assert!(
            row_max(&s, &tile, 0)
                .iter()
                .all(|m| *m == f32::NEG_INFINITY)
        );
        assert!(
            row_sum_device(&s, &tile, 0)
                .iter()
                .all(|m| *m == 0.0 && m.is_sign_positive())
        );
        assert_eq!(max_nan(-0.0, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(max_nan(0.0, -0.0).to_bits(), 0.0f32.to_bits());
    }

    proptest! {
        #[test]
        fn device_order_sum_is_within_the_stated_bound(seed in 0u64..1000, which in 0usize..4, kv in 0usize..=128) {
            let s = SHAPES[which];
            let kv = kv.min(s.cols());
            let tile = Inputs::seeded(seed).normal(ROWS * s.cols(), 0.0, 10.0);
            let (exact, abs, dev) = (row_sum_exact(&s, &tile, kv), row_abs_sum(&s, &tile, kv), row_sum_device(&s, &tile, kv));
            for r in 0..ROWS {
                prop_assert!((f64::from(dev[r]) - exact[r]).abs() <= gamma(s.sum_depth()) * abs[r]);
            }
        }
    }
}
