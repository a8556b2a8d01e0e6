// What a call's inputs must be, checked before any launch: element and scale counts, shapes, strides; named errors.
use composed::Strides;
use fixtures::Shape;

use crate::error::{Error, Result};

/// The element and scale counts of one call's inputs, as [`check_inputs`] takes them (no device needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lengths {
    /// Elements of Q.
    pub q: usize,
    /// Elements of K.
    pub k: usize,
    /// Elements of V.
    pub v: usize,
    /// Q's scales.
    pub q_scales: usize,
    /// K's scales.
    pub k_scales: usize,
    /// V's scales.
    pub v_scales: usize,
}

impl Lengths {
    /// The counts of contiguous inputs of shape `s`: [B, H, Sq, D] and [B, Hkv, Sk, D] codes, one scale a head.
    pub fn of(s: &Shape) -> Lengths {
        let (q, kv) = (s.heads() * s.sq * s.d, s.kv_heads() * s.sk * s.d);
        Lengths {
            q,
            k: kv,
            v: kv,
            q_scales: s.heads(),
            k_scales: s.kv_heads(),
            v_scales: s.kv_heads(),
        }
    }
}

/// Why `s` with inputs of `lens` cannot run: the first thing wrong, named; nothing is launched. `s.hkv` is the
/// key/value heads (grouped-query attention when fewer than `s.h`).
pub fn check_inputs(s: &Shape, lens: &Lengths, softmax_scale: f32) -> Result<()> {
    for (what, got) in [
        ("B", s.b),
        ("H", s.h),
        ("Hkv", s.hkv),
        ("Sq", s.sq),
        ("Sk", s.sk),
    ] {
        if got == 0 {
            return Err(Error::Empty { what, got });
        }
    }
    if !composed::DIMS.contains(&s.d) {
        return Err(Error::HeadDim(s.d));
    }
    if !s.h.is_multiple_of(s.hkv) {
        return Err(Error::HeadRatio { h: s.h, hkv: s.hkv });
    }
    for (tensor, got, heads, rows) in [
        ("q", lens.q, s.h, s.sq),
        ("k", lens.k, s.hkv, s.sk),
        ("v", lens.v, s.hkv, s.sk),
    ] {
        let want = s.b * heads * rows * s.d;
        if got != want {
            return Err(Error::Length {
                tensor,
                got,
                want,
                dims: [s.b, heads, rows, s.d],
            });
        }
    }
    for (tensor, got, want) in [
        ("q scales", lens.q_scales, s.heads()),
        ("k scales", lens.k_scales, s.kv_heads()),
        ("v scales", lens.v_scales, s.kv_heads()),
    ] {
        if got != want {
            return Err(Error::Scales { tensor, got, want });
        }
    }
    if !(softmax_scale.is_finite() && softmax_scale > 0.0) {
        return Err(Error::SoftmaxScale(softmax_scale));
    }
    Ok(())
}

/// Why E4M3 inputs of shape `s` at `strides` cannot be read from buffers of `lens` elements (Q, K, V): a stride that
/// is not a positive multiple of 16 bytes (TMA's rule), or a buffer that ends before its view's last element; named.
pub fn check_strides(s: &Shape, lens: [usize; 3], strides: &Strides) -> Result<()> {
    let views = [
        ("q", [s.b, s.h, s.sq, s.d], strides.q),
        ("k", [s.b, s.hkv, s.sk, s.d], strides.k),
        ("v", [s.b, s.hkv, s.sk, s.d], strides.v),
    ];
    for ((tensor, dims, st), got) in views.into_iter().zip(lens) {
        for (what, x) in ["S", "H", "B"].into_iter().zip(st) {
            if x == 0 || !x.is_multiple_of(16) {
                return Err(Error::Layout {
                    tensor,
                    why: format!(
                        "its stride of {what} is {x} elements (bytes): TMA reads strides that are positive multiples of 16"
                    ),
                });
            }
        }
        let want = Strides::extent(dims, st);
        if got < want {
            return Err(Error::Length {
                tensor,
                got,
                want,
                dims,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_strides_are_named() {
        let s = Shape::cross(2, 8, 100, 300, 128).with_kv_heads(2).unwrap();
        let bshd = Strides::bshd(&s);
        let n = |h: usize, rows: usize| 2 * h * rows * 128;
        assert!(check_strides(&s, [n(8, 100), n(2, 300), n(2, 300)], &bshd).is_ok());
        let e = check_strides(&s, [n(8, 100), n(2, 300) - 1, n(2, 300)], &bshd)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`k` holds 153599 elements") && e.contains("needs 153600"),
            "{e}"
        );
        let odd = Strides {
            v: [2 * 128, 120, 300 * 2 * 128],
            ..bshd
        };
        let e = check_strides(&s, [n(8, 100), n(2, 300), n(2, 300)], &odd)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`v`: its stride of H is 120 elements"), "{e}");
        // The heads of a fused [B, S, 3, H, D] projection: q's view ends inside the fused buffer's first third.
        let fused = Strides {
            q: [3 * 8 * 128, 128, 100 * 3 * 8 * 128],
            ..bshd
        };
        assert!(check_strides(&s, [2 * 100 * 3 * 8 * 128, n(2, 300), n(2, 300)], &fused).is_ok());
    }

    #[test]
    fn every_bad_input_is_named() {
        let s = Shape::cross(2, 8, 100, 300, 128).with_kv_heads(2).unwrap();
        assert!(check_inputs(&s, &Lengths::of(&s), 0.1).is_ok());
        let msg = |s: &Shape, l: &Lengths, x: f32| check_inputs(s, l, x).unwrap_err().to_string();
        let e = msg(&Shape { d: 96, ..s }, &Lengths::of(&s), 0.1);
        assert!(e.contains("D = 96 is not supported"), "{e}");
        let e = msg(&Shape { sq: 0, ..s }, &Lengths::of(&s), 0.1);
        assert!(e.contains("Sq = 0"), "{e}");
        let e = msg(&Shape { hkv: 3, ..s }, &Lengths::of(&s), 0.1);
        assert!(e.contains("H = 8") && e.contains("Hkv = 3"), "{e}");
        let e = msg(
            &s,
            &Lengths {
                k: 7,
                ..Lengths::of(&s)
            },
            0.1,
        );
        assert!(
            e.contains("`k` holds 7 elements") && e.contains("[2, 2, 300, 128]"),
            "{e}"
        );
        let e = msg(
            &s,
            &Lengths {
                v_scales: 16,
                ..Lengths::of(&s)
            },
            0.1,
        );
        assert!(
            e.contains("`v scales` holds 16 scales") && e.contains("needs 4"),
            "{e}"
        );
        let e = msg(&s, &Lengths::of(&s), f32::NAN);
        assert!(e.contains("softmax scale NaN"), "{e}");
    }
}
