// The online-softmax model: one-shot softmax·V and the tiled FA-2 update in f64, and an f32 mirror of the device.
use half::f16;

/// One attention row block: `rows` query rows of raw scores `s` [rows][sk] (−inf = masked) and values
/// `v` [sk][d] (each exactly an f16). The softmax is over `scale`·s.
#[derive(Debug, Clone)]
pub struct Problem {
    pub rows: usize,
    pub sk: usize,
    pub d: usize,
    pub s: Vec<f32>,
    pub v: Vec<f32>,
    pub scale: f32,
}

/// O [rows][d] and LSE [rows] (LSE = ln Σ_j exp(scale·s_j); −inf for a row with no finite score).
#[derive(Debug, Clone, PartialEq)]
pub struct Out<T> {
    pub o: Vec<T>,
    pub lse: Vec<T>,
}

impl Problem {
    pub fn max_abs_v(&self) -> f64 {
        self.v
            .iter()
            .fold(0.0f64, |a, &x| a.max(f64::from(x).abs()))
    }
    fn s(&self, r: usize, j: usize) -> f64 {
        f64::from(self.s[r * self.sk + j])
    }
    fn v(&self, j: usize, k: usize) -> f64 {
        f64::from(self.v[j * self.d + k])
    }
}

/// The reference: softmax over all keys at once, in f64.
pub fn one_shot(p: &Problem) -> Out<f64> {
    let sc = f64::from(p.scale);
    let mut out = Out {
        o: vec![0.0; p.rows * p.d],
        lse: vec![f64::NEG_INFINITY; p.rows],
    };
    for r in 0..p.rows {
        let m = (0..p.sk)
            .map(|j| p.s(r, j))
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let e: Vec<f64> = (0..p.sk).map(|j| ((p.s(r, j) - m) * sc).exp()).collect();
        let l: f64 = e.iter().sum();
        for k in 0..p.d {
            out.o[r * p.d + k] = (0..p.sk).map(|j| e[j] * p.v(j, k)).sum::<f64>() / l;
        }
        out.lse[r] = m * sc + l.ln();
    }
    out
}

/// The FA-2 update in f64 over tiles of the given widths (they must add up to `sk`), with the −inf guard.
pub fn online_f64(p: &Problem, tiles: &[usize]) -> Out<f64> {
    assert_eq!(
        tiles.iter().sum::<usize>(),
        p.sk,
        "tiles must cover the keys"
    );
    let sc = f64::from(p.scale);
    let mut out = Out {
        o: vec![0.0; p.rows * p.d],
        lse: vec![f64::NEG_INFINITY; p.rows],
    };
    for r in 0..p.rows {
        let (mut m, mut l) = (f64::NEG_INFINITY, 0.0f64);
        let o = &mut out.o[r * p.d..(r + 1) * p.d];
        let mut j0 = 0;
        for &w in tiles {
            let m_new = (j0..j0 + w).map(|j| p.s(r, j)).fold(m, f64::max);
            let m_use = if m_new == f64::NEG_INFINITY {
                0.0
            } else {
                m_new
            };
            let alpha = ((m - m_use) * sc).exp();
            let pj: Vec<f64> = (j0..j0 + w)
                .map(|j| ((p.s(r, j) - m_use) * sc).exp())
                .collect();
            l = alpha * l + pj.iter().sum::<f64>();
            for (k, ok) in o.iter_mut().enumerate() {
                *ok = alpha * *ok
                    + pj.iter()
                        .enumerate()
                        .map(|(t, &e)| e * p.v(j0 + t, k))
                        .sum::<f64>();
            }
            m = m_new;
            j0 += w;
        }
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        o.iter_mut().for_each(|x| *x *= inv);
        out.lse[r] = if l > 0.0 {
            m * sc + l.ln()
        } else {
            f64::NEG_INFINITY
        };
    }
    out
}

/// The device's arithmetic in f32, tile by tile of `bc` keys: exp2 with the folded scale·log2(e), fma as the
/// device does it, P rounded to f16 for P·V (l sums the unrounded P), f32 accumulation. The emulation that
/// FlashAttention's tolerance rule compares against.
pub fn mirror_f32(p: &Problem, bc: usize) -> Out<f32> {
    mirror_f32_with(p, bc, 0, |e| f16::from_f32(e).to_f32())
}

/// `mirror_f32` with P scaled by 2^`p_offset` (the device's `step<L, P_OFFSET>`: exp2(s·c + (offset − m·c)))
/// and rounded by `round` for P·V (f16 for the WMMA stages, E4M3 for the FP8 wgmma ones); l sums the unrounded
/// P, and the LSE takes the offset back out.
pub fn mirror_f32_with(
    p: &Problem,
    bc: usize,
    p_offset: i32,
    round: impl Fn(f32) -> f32,
) -> Out<f32> {
    let off = p_offset as f32;
    let c = p.scale * std::f32::consts::LOG2_E; // the device's 1.4426950408889634f, rounded to f32 alike
    let mut out = Out {
        o: vec![0.0f32; p.rows * p.d],
        lse: vec![f32::NEG_INFINITY; p.rows],
    };
    for r in 0..p.rows {
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        let o = &mut out.o[r * p.d..(r + 1) * p.d];
        for j0 in (0..p.sk).step_by(bc) {
            let js = j0..(j0 + bc).min(p.sk);
            let mx = js
                .clone()
                .map(|j| p.s[r * p.sk + j])
                .fold(f32::NEG_INFINITY, f32::max);
            let m_new = m.max(mx);
            let m_use = if m_new == f32::NEG_INFINITY {
                0.0
            } else {
                m_new
            };
            let alpha = ((m - m_use) * c).exp2();
            let pj: Vec<f32> = js
                .clone()
                .map(|j| {
                    let bias = if p_offset == 0 {
                        -m_use * c
                    } else {
                        off - m_use * c
                    };
                    p.s[r * p.sk + j].mul_add(c, bias).exp2()
                })
                .collect();
            l = alpha * l + pj.iter().sum::<f32>();
            for (k, ok) in o.iter_mut().enumerate() {
                let mut acc = alpha * *ok;
                for (t, &e) in pj.iter().enumerate() {
                    acc = round(e).mul_add(p.v[(j0 + t) * p.d + k], acc);
                }
                *ok = acc;
            }
            m = m_new;
        }
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        o.iter_mut().for_each(|x| *x *= inv);
        out.lse[r] = if l > 0.0 {
            if p_offset == 0 {
                m * p.scale + l.ln()
            } else {
                m * p.scale + (l.ln() - off * std::f32::consts::LN_2)
            }
        } else {
            f32::NEG_INFINITY
        };
    }
    out
}

/// `p` with a window per row: row r keeps its scores at columns `lo[r] .. hi[r]` and the rest become −inf (masked),
/// which is what a sliding window leaves a row (an empty range: a row with nothing to attend to).
pub fn windowed(p: &Problem, lo: &[usize], hi: &[usize]) -> Problem {
    let mut w = p.clone();
    for r in 0..p.rows {
        for j in 0..p.sk {
            if j < lo[r] || j >= hi[r] {
                w.s[r * p.sk + j] = f32::NEG_INFINITY;
            }
        }
    }
    w
}

/// What `f` (a model: `one_shot`, `mirror_f32`, ...) gives `p` with a softmax scale per row: row r over
/// `scales[r]`·s, as the device's `osm::RowScale` computes it (rows are independent: each is `f` of `p` at its scale).
pub fn with_row_scales<T: Clone>(
    p: &Problem,
    scales: &[f32],
    f: impl Fn(&Problem) -> Out<T>,
) -> Out<T> {
    assert_eq!(scales.len(), p.rows, "one scale a row");
    let mut out = f(p);
    for (r, &scale) in scales.iter().enumerate() {
        let row = f(&Problem { scale, ..p.clone() });
        out.o[r * p.d..(r + 1) * p.d].clone_from_slice(&row.o[r * p.d..(r + 1) * p.d]);
        out.lse[r] = row.lse[r].clone();
    }
    out
}

/// The stated bound on |O_f32 − O_f64| for the device's arithmetic: P rounded to f16 moves each weight by at
/// most 2⁻¹¹ relative (2⁻²⁵ absolute below f16's normal range) and O is a convex combination of V's rows, so
/// 2⁻¹¹·max|V|; the f32 exp2, the running sums and the rescales add at most 4 roundings per key.
pub fn o_bound(p: &Problem) -> f64 {
    (2f64.powi(-11) + p.sk as f64 * (2f64.powi(-25) + 4.0 * 2f64.powi(-24))) * p.max_abs_v()
}

/// Largest |a − b| over finite pairs; a NaN, or an infinity on one side only, counts as infinite.
pub fn max_abs_diff<A: Copy + Into<f64>>(a: &[A], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |acc, (&x, &y)| {
        let x: f64 = x.into();
        if x == y {
            acc
        } else if x.is_finite() && y.is_finite() {
            acc.max((x - y).abs())
        } else {
            f64::INFINITY
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lab::numerics::Inputs;
    use proptest::prelude::*;

    pub fn problem(seed: u64, sk: usize, spread: f32) -> Problem {
        let mut inp = Inputs::seeded(seed);
        let v = inp
            .normal(sk * 16, 0.0, 1.0)
            .into_iter()
            .map(|x| f16::from_f32(x).to_f32())
            .collect();
        Problem {
            rows: 4,
            sk,
            d: 16,
            s: inp.normal(4 * sk, 0.0, spread),
            v,
            scale: 0.125,
        }
    }

    #[test]
    fn row_scales_are_each_row_at_its_own_scale() {
        let p = problem(3, 37, 3.0);
        // One scale for every row: the problem itself.
        assert_eq!(with_row_scales(&p, &[p.scale; 4], one_shot), one_shot(&p));
        // Row 2 at twice the scale: its softmax is that of its scores doubled; the other rows unchanged.
        let got = with_row_scales(&p, &[p.scale, p.scale, 2.0 * p.scale, p.scale], one_shot);
        let mut doubled = p.clone();
        for x in &mut doubled.s[2 * p.sk..3 * p.sk] {
            *x *= 2.0;
        }
        let want = one_shot(&doubled);
        assert!(max_abs_diff(&got.o, &want.o) < 1e-12);
        assert!(max_abs_diff(&got.lse, &want.lse) < 1e-12);
        assert_ne!(got.o[2 * p.d..3 * p.d], one_shot(&p).o[2 * p.d..3 * p.d]);
    }

    /// Tile widths from cut points: any split of 0..sk.
    fn split(sk: usize, cuts: &[usize]) -> Vec<usize> {
        let mut c: Vec<usize> = cuts.iter().map(|x| x % sk).filter(|&x| x > 0).collect();
        c.push(0);
        c.push(sk);
        c.sort();
        c.dedup();
        c.windows(2).map(|w| w[1] - w[0]).collect()
    }

    proptest! {
        #[test]
        fn any_split_gives_the_one_shot_softmax(seed in 0u64..500, sk in 1usize..120, cuts in proptest::collection::vec(0usize..1000, 0..8)) {
            let p = problem(seed, sk, 8.0);
            let (a, b) = (one_shot(&p), online_f64(&p, &split(sk, &cuts)));
            // f64 arithmetic over ≤ 120 keys: far below 1e-12 relative to max|V|.
            prop_assert!(max_abs_diff(&b.o, &a.o) <= 1e-12 * p.max_abs_v());
            prop_assert!(max_abs_diff(&b.lse, &a.lse) <= 1e-12);
        }

        #[test]
        fn where_tiles_break_does_not_matter(seed in 0u64..500, sk in 2usize..120, c1 in 1usize..1000, c2 in 1usize..1000) {
            let p = problem(seed, sk, 30.0);
            let (a, b) = (online_f64(&p, &split(sk, &[c1])), online_f64(&p, &split(sk, &[c2, c1 / 2])));
            prop_assert!(max_abs_diff(&a.o, &b.o) <= 1e-12 * p.max_abs_v());
        }

        #[test]
        fn the_f32_mirror_is_within_the_stated_bound(seed in 0u64..500, sk in 1usize..300, bc in prop::sample::select(vec![16usize, 32, 64])) {
            let p = problem(seed, sk, 20.0);
            let (a, b) = (one_shot(&p), mirror_f32(&p, bc));
            prop_assert!(max_abs_diff(&b.o, &a.o) <= o_bound(&p));
        }
    }

    #[test]
    fn a_window_leaves_its_columns_and_the_online_update_agrees() {
        let p = problem(3, 50, 2.0);
        let (lo, hi): (Vec<usize>, Vec<usize>) = (0..p.rows).map(|r| (r * 3, 10 + r * 4)).unzip();
        let w = windowed(&p, &lo, &hi);
        for r in 0..p.rows {
            for j in 0..p.sk {
                let kept = w.s[r * p.sk + j] != f32::NEG_INFINITY;
                assert_eq!(kept, (lo[r]..hi[r]).contains(&j), "row {r}, column {j}");
            }
        }
        // Empty windows (lo ≥ hi, or past Sk) leave the row with nothing: O = 0, LSE = −inf.
        let empty = windowed(&p, &vec![40; p.rows], &vec![40; p.rows]);
        let o = one_shot(&empty);
        assert!(o.lse.iter().all(|&x| x == f64::NEG_INFINITY) && o.o.iter().all(|&x| x == 0.0));
        let a = one_shot(&w);
        let b = online_f64(&w, &split(p.sk, &[7, 30]));
        assert!(max_abs_diff(&b.o, &a.o) < 1e-12);
    }

    #[test]
    fn fully_and_partly_masked_rows() {
        let mut p = problem(1, 40, 4.0);
        p.s[..40].fill(f32::NEG_INFINITY); // row 0: nothing to attend to
        p.s[40..40 + 20].fill(f32::NEG_INFINITY); // row 1: first tiles masked, then finite
        for out in [online_f64(&p, &[16, 16, 8]), one_shot(&p)] {
            assert!(out.o[..16].iter().all(|&x| x == 0.0) && out.lse[0] == f64::NEG_INFINITY);
            assert!(out.o.iter().all(|x| !x.is_nan()) && out.lse[1].is_finite());
        }
        let m = mirror_f32(&p, 16);
        assert!(m.o[..16].iter().all(|&x| x == 0.0) && m.lse[0] == f32::NEG_INFINITY);
        assert!(max_abs_diff(&online_f64(&p, &[16, 16, 8]).o, &one_shot(&p).o) < 1e-12);
    }
}
