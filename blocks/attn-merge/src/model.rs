// The merge of partial attention results on the host, in f64: the model the device is tested against.

/// One part's rows: O (`rows` × `d`, normalised over the part's keys) and its LSE (natural log; −inf: no key).
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

/// The merged rows of `parts` (each `rows` × `d`), in f64: LSE = ln Σ_j e^{LSE_j}, O = Σ_j e^{LSE_j − LSE} O_j,
/// computed against the largest LSE; a row no part saw is O = 0, LSE = −inf.
pub fn merge(parts: &[Part], rows: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0.0f64; rows * d];
    let mut lse = vec![f64::NEG_INFINITY; rows];
    for r in 0..rows {
        let m = parts
            .iter()
            .map(|p| f64::from(p.lse[r]))
            .fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let w: Vec<f64> = parts
            .iter()
            .map(|p| (f64::from(p.lse[r]) - m).exp())
            .collect();
        let sum: f64 = w.iter().sum();
        lse[r] = m + sum.ln();
        for c in 0..d {
            o[r * d + c] = parts
                .iter()
                .zip(&w)
                .map(|(p, w)| w * f64::from(p.o[r * d + c]))
                .sum::<f64>()
                / sum;
        }
    }
    (o, lse)
}

/// Attention of one query row over keys `keys` (scores `s`, values rows of `v`, `d` wide), in f64: O and LSE — what a
/// part holds. No key: O = 0, LSE = −inf.
pub fn attend(s: &[f64], v: &[f64], d: usize, keys: &[usize]) -> (Vec<f64>, f64) {
    if keys.is_empty() {
        return (vec![0.0; d], f64::NEG_INFINITY);
    }
    let m = keys.iter().map(|&k| s[k]).fold(f64::NEG_INFINITY, f64::max);
    let l: f64 = keys.iter().map(|&k| (s[k] - m).exp()).sum();
    let mut o = vec![0.0; d];
    for &k in keys {
        let p = (s[k] - m).exp() / l;
        for c in 0..d {
            o[c] += p * v[k * d + c];
        }
    }
    (o, m + l.ln())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn merged_parts_are_the_whole(
            n_keys in 1usize..60, parts in 1usize..5, seed in 0u64..1000, scale in 0.1f64..40.0,
        ) {
            // Keys dealt to `parts` disjoint sets (some possibly empty): merging the parts' (O, LSE) must give
            // attention over all keys.
            let d = 8;
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = || { x ^= x << 13; x ^= x >> 7; x ^= x << 17; (x % 2001) as f64 / 1000.0 - 1.0 };
            let s: Vec<f64> = (0..n_keys).map(|_| rnd() * scale).collect();
            let v: Vec<f64> = (0..n_keys * d).map(|_| rnd()).collect();
            let sets: Vec<Vec<usize>> = (0..parts).map(|j| (0..n_keys).filter(|k| (k * 7 + j) % parts == 0 && k % (j + 2) != 1).collect()).collect();
            let covered: Vec<usize> = { let mut c: Vec<usize> = sets.concat(); c.sort(); c };
            let ps: Vec<Part> = sets.iter().map(|ks| {
                let (o, l) = attend(&s, &v, d, ks);
                Part { o: o.iter().map(|&x| x as f32).collect(), lse: vec![l as f32] }
            }).collect();
            let (o, lse) = merge(&ps, 1, d);
            let (want, wl) = attend(&s, &v, d, &covered);
            if covered.is_empty() {
                prop_assert!(lse[0] == f64::NEG_INFINITY && o.iter().all(|&x| x == 0.0));
            } else {
                // The parts were rounded to f32: the merge is exact in f64 up to that rounding. An LSE of magnitude L
                // rounds by up to L·2^-24, which moves its part's weight by as much relatively, and O (|O| ≤ 1) by
                // twice that at most; O's own rounding adds 2^-24.
                let big = ps.iter().map(|p| f64::from(p.lse[0]).abs()).filter(|x| x.is_finite()).fold(1.0, f64::max);
                let ulp = 2f64.powi(-24);
                prop_assert!((lse[0] - wl).abs() <= 2.0 * ulp * big, "{} {}", lse[0], wl);
                for c in 0..d {
                    prop_assert!((o[c] - want[c]).abs() <= 4.0 * ulp * big + ulp, "col {}: {} {}", c, o[c], want[c]);
                }
            }
        }
    }

    #[test]
    fn huge_scores_do_not_overflow_and_empty_rows_stay_empty() {
        let part = |o: f32, l: f32| Part {
            o: vec![o; 8],
            lse: vec![l],
        };
        let (o, l) = merge(&[part(1.0, 10000.0), part(3.0, 10000.0)], 1, 8);
        assert_eq!((o[0], l[0]), (2.0, 10000.0 + 2f64.ln()));
        let (o, l) = merge(&[part(0.0, f32::NEG_INFINITY), part(5.0, -3.0)], 1, 8);
        assert_eq!((o[0], l[0]), (5.0, -3.0));
        let (o, l) = merge(
            &[part(0.0, f32::NEG_INFINITY), part(0.0, f32::NEG_INFINITY)],
            1,
            8,
        );
        assert_eq!((o[0], l[0]), (0.0, f64::NEG_INFINITY));
    }
}
