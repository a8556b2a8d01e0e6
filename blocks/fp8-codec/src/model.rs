// The fp8 codec model: E4M3 ("fn") and E5M2 encode / decode as cuda_fp8.h does it, and tensor quantization.
use half::f16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// 4 exponent bits, 3 mantissa bits, bias 7; no infinities; NaN is S.1111.111; max 448.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, bias 15; IEEE-like with ±inf; max 57344.
    E5M2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Saturation {
    /// Out-of-range finite values and ±inf clamp to ±max.
    SatFinite,
    /// Out-of-range values become NaN (E4M3) or ±inf (E5M2).
    NoSat,
}

impl Format {
    pub fn name(self) -> &'static str {
        if self == Format::E4M3 { "e4m3" } else { "e5m2" }
    }
    fn mbits(self) -> u32 {
        if self == Format::E4M3 { 3 } else { 2 }
    }
    fn bias(self) -> i32 {
        if self == Format::E4M3 { 7 } else { 15 }
    }
    pub fn max(self) -> f32 {
        if self == Format::E4M3 { 448.0 } else { 57344.0 }
    }
    fn max_code(self) -> u8 {
        if self == Format::E4M3 { 0x7E } else { 0x7B }
    }
    pub fn is_nan(self, code: u8) -> bool {
        match self {
            Format::E4M3 => code & 0x7F == 0x7F,
            Format::E5M2 => code & 0x7F > 0x7C,
        }
    }
}

/// The value of a code, exactly (every fp8 value is an f32), NaN for NaN codes.
pub fn decode(code: u8, f: Format) -> f32 {
    if f.is_nan(code) {
        return f32::NAN;
    }
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let (m, e) = (
        (code & ((1 << f.mbits()) - 1)) as f32,
        ((code & 0x7F) >> f.mbits()) as i32,
    );
    let scale = (1u32 << f.mbits()) as f32;
    if f == Format::E5M2 && e == 31 {
        return sign * f32::INFINITY;
    }
    sign * if e == 0 {
        m / scale * 2f32.powi(1 - f.bias())
    } else {
        (1.0 + m / scale) * 2f32.powi(e - f.bias())
    }
}

/// A code decoded to f16 bits, as `__nv_cvt_fp8_to_halfraw` gives it: exact, NaN as the canonical 0x7FFF.
pub fn decode_f16_bits(code: u8, f: Format) -> u16 {
    let v = decode(code, f);
    if v.is_nan() {
        0x7FFF
    } else {
        f16::from_f32(v).to_bits()
    }
}

/// Encodes `x` round-to-nearest-even, as `__nv_cvt_float_to_fp8(x, saturation, format)` does on the device.
///
/// The algorithm of cuda_fp8.hpp on the f32 → f64 widened value (exact, so no double rounding): compare the
/// magnitude with the underflow, overflow and normal thresholds, then round the dropped mantissa bits.
pub fn encode(x: f32, sat: Saturation, f: Format) -> u8 {
    let xb = f64::from(x).to_bits();
    let sign = ((xb >> 63) << 7) as u8;
    let abs = xb & 0x7FFF_FFFF_FFFF_FFFF;
    let sig = f.mbits() + 1; // significand bits
    // cuda_fp8.hpp's thresholds, as f64 bit patterns: half the smallest subnormal (ties to 0), the overflow
    // point (E4M3: above 464, the tie that rounds to the even 448; E5M2: from 61440, the tie that rounds to
    // the even side, infinity), and the smallest normal.
    let (min_denorm_half, overflow, min_norm): (u64, u64, u64) = match f {
        Format::E4M3 => (
            0x3F50_0000_0000_0000,
            0x407D_0000_0000_0000,
            0x3F90_0000_0000_0000,
        ),
        Format::E5M2 => (
            0x3EE0_0000_0000_0000,
            0x40EE_0000_0000_0000 - 1,
            0x3F10_0000_0000_0000,
        ),
    };
    let half_ulp_bits: u64 = 1 << (53 - sig - 1);
    let exp = (((xb >> 52) & 0x7FF) as i32 - 1023 + f.bias()) as u8;
    let mant = ((xb >> (53 - sig)) & ((1 << f.mbits()) - 1)) as u8;
    let res = if abs <= min_denorm_half {
        0
    } else if abs > 0x7FF0_0000_0000_0000 {
        // Any NaN becomes the positive 0x7F in both formats, sign and payload dropped: what cuda_fp8.h does on
        // the device (probed on the H100, 2026-11-21), unlike its f64 host path and the float8 crate, which
        // keep them.
        return 0x7F;
    } else if abs > overflow {
        match (sat, f) {
            (Saturation::SatFinite, _) => f.max_code(),
            (Saturation::NoSat, Format::E4M3) => 0x7F,
            (Saturation::NoSat, Format::E5M2) => 0x7C,
        }
    } else if abs >= min_norm {
        let r = (exp << f.mbits()) | mant;
        let round = xb & ((half_ulp_bits << 1) - 1);
        if round > half_ulp_bits || (round == half_ulp_bits && mant & 1 != 0) {
            r + 1
        } else {
            r
        }
    } else {
        let shift = 1u32.wrapping_sub(exp as u32) & 0xFF;
        let m = mant | (1 << f.mbits());
        let r = m >> shift;
        let round = (xb | (1 << 52)) & ((half_ulp_bits << (shift + 1)) - 1);
        let half = half_ulp_bits << shift;
        if round > half || (round == half && r & 1 != 0) {
            r + 1
        } else {
            r
        }
    };
    res | sign
}

/// The scale that maps a tensor's largest magnitude onto E4M3's 448; 1 for an all-zero tensor, whose codes
/// are then all zero (a zero scale would make x / scale NaN).
pub fn scale_from_amax(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / 448.0
    } else {
        1.0
    }
}

/// Largest |x|, NaN-blind (quantized inputs are checked finite before this is called).
pub fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// Per-head scales of a [B, H, S, D] tensor: `heads` = B·H groups of `per_head` = S·D contiguous elements.
pub fn head_scales(x: &[f32], per_head: usize) -> Vec<f32> {
    x.chunks(per_head)
        .map(|h| scale_from_amax(amax(h)))
        .collect()
}

/// q = E4M3(x / scale), saturating: the quantizer of every Q, K, V in the lab. Element i uses
/// `scales[i / per_head]` (one scale with per_head = len is the per-tensor case).
pub fn quantize(x: &[f32], scales: &[f32], per_head: usize) -> Vec<u8> {
    // Element-wise and pure: split over the cores (a CLI quantizes tensors of 10^8 elements and more).
    let mut out = vec![0u8; x.len()];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let chunk = x.len().div_ceil(threads).max(1 << 16);
    std::thread::scope(|sc| {
        for (c, (dst, src)) in out.chunks_mut(chunk).zip(x.chunks(chunk)).enumerate() {
            sc.spawn(move || {
                for (j, (d, &v)) in dst.iter_mut().zip(src).enumerate() {
                    let i = c * chunk + j;
                    *d = encode(
                        v / scales[i / per_head],
                        Saturation::SatFinite,
                        Format::E4M3,
                    );
                }
            });
        }
    });
    out
}

/// Codes and per-head scales of `x` (heads of `head_len` elements): one scale a head, or one for the tensor
/// repeated for every head. What [`crate::TensorQuantizer::run`] computes on the device.
pub fn quantize_tensor(x: &[f32], head_len: usize, per: crate::Granularity) -> (Vec<u8>, Vec<f32>) {
    let heads = x.len() / head_len;
    let scales = match per {
        crate::Granularity::PerHead => head_scales(x, head_len),
        crate::Granularity::PerTensor => vec![scale_from_amax(amax(x)); heads],
    };
    (quantize(x, &scales, head_len), scales)
}

/// x ≈ decode(q) · scale, in f32 (one rounding: the product).
pub fn dequantize(q: &[u8], scales: &[f32], per_head: usize) -> Vec<f32> {
    q.iter()
        .enumerate()
        .map(|(i, &c)| decode(c, Format::E4M3) * scales[i / per_head])
        .collect()
}

/// The f32 inputs that pin the encoder down: every representable value, every rounding midpoint, one ulp
/// either side of each, the overflow and underflow edges, ±0, ±inf, NaNs with payloads, f32 subnormals.
pub fn boundary_inputs(f: Format) -> Vec<f32> {
    let mut vals: Vec<f32> = Vec::new();
    let finite: Vec<f32> = (0u8..=0x7F)
        .map(|c| decode(c, f))
        .filter(|v| v.is_finite())
        .collect();
    for w in finite.windows(2) {
        vals.push(w[0]);
        vals.push((w[0] + w[1]) / 2.0); // exact in f32: fp8 midpoints need at most 5 significand bits
    }
    let max = f.max();
    let top = max + (max - finite[finite.len() - 2]) / 2.0; // the overflow midpoint
    vals.extend([max, top, 2.0 * max, f32::MAX]);
    vals.push(finite[1] / 2.0); // half the smallest subnormal: ties to zero
    vals.push(finite[1] / 4.0);
    let mut out = Vec::new();
    for v in vals {
        for w in [v, -v] {
            out.extend([
                w,
                f32::from_bits(w.to_bits().wrapping_add(1)),
                f32::from_bits(w.to_bits().wrapping_sub(1)),
            ]);
        }
    }
    out.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ]);
    out.extend([
        f32::from_bits(0x7FC0_1234),
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC0_0000),
    ]);
    out.extend([
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
    ]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_knows_the_formats() {
        assert_eq!(decode(0x7E, Format::E4M3), 448.0);
        assert!(decode(0x7F, Format::E4M3).is_nan() && decode(0xFF, Format::E4M3).is_nan());
        assert_eq!(decode(0x01, Format::E4M3), 2f32.powi(-9));
        assert_eq!(decode(0x7B, Format::E5M2), 57344.0);
        assert_eq!(decode(0x7C, Format::E5M2), f32::INFINITY);
        assert!(decode(0x7D, Format::E5M2).is_nan());
        assert_eq!(decode(0x01, Format::E5M2), 2f32.powi(-16));
        assert_eq!(decode(0x80, Format::E4M3).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for f in [Format::E4M3, Format::E5M2] {
            for c in 0u8..=255 {
                let v = decode(c, f);
                if v.is_finite() {
                    for sat in [Saturation::SatFinite, Saturation::NoSat] {
                        assert_eq!(encode(v, sat, f), c, "{} code {c:#04x} = {v}", f.name());
                    }
                }
            }
        }
    }

    #[test]
    fn ties_go_to_even_and_overflow_follows_the_mode() {
        let (s, n) = (Saturation::SatFinite, Saturation::NoSat);
        assert_eq!(
            encode(464.0, n, Format::E4M3),
            0x7E,
            "464 ties to the even 448"
        );
        assert_eq!(
            encode(464.00003, n, Format::E4M3),
            0x7F,
            "past the tie: NaN without saturation"
        );
        assert_eq!(encode(464.00003, s, Format::E4M3), 0x7E);
        assert_eq!(encode(f32::INFINITY, s, Format::E4M3), 0x7E);
        assert_eq!(encode(-1e9, n, Format::E5M2), 0xFC);
        assert_eq!(
            encode(61440.0, n, Format::E5M2),
            0x7C,
            "61440 ties to the even side, infinity"
        );
        assert_eq!(encode(61439.996, n, Format::E5M2), 0x7B);
        assert_eq!(
            encode(1.0625, n, Format::E4M3),
            0x38,
            "1 + 1/16 ties to the even 1.0"
        );
        assert_eq!(
            encode(1.1875, n, Format::E4M3),
            0x3A,
            "1 + 3/16 ties to the even 1.25"
        );
        assert_eq!(
            encode(2f32.powi(-10), n, Format::E4M3),
            0x00,
            "half the smallest subnormal ties to 0"
        );
        assert_eq!(
            encode(-f32::NAN, s, Format::E5M2),
            0x7F,
            "NaN: canonical, positive"
        );
    }

    #[test]
    fn agrees_with_the_float8_crate_in_satfinite_mode() {
        let mut inputs = boundary_inputs(Format::E4M3);
        inputs.extend(boundary_inputs(Format::E5M2));
        inputs.extend(
            lab::numerics::Inputs::seeded(1)
                .bits_u32(20_000)
                .into_iter()
                .map(f32::from_bits),
        );
        // NaN excepted: the crate keeps its sign and payload, the device gives 0x7F (see `encode`).
        for x in inputs.into_iter().filter(|x| !x.is_nan()) {
            assert_eq!(
                encode(x, Saturation::SatFinite, Format::E4M3),
                float8::F8E4M3::from_f32(x).to_bits(),
                "e4m3 {x:e}"
            );
            assert_eq!(
                encode(x, Saturation::SatFinite, Format::E5M2),
                float8::F8E5M2::from_f32(x).to_bits(),
                "e5m2 {x:e}"
            );
        }
    }

    #[test]
    fn quantization_guards_zero_heads_and_hits_448() {
        let x = vec![0.0, 0.0, 1.0, -3.5];
        let s = head_scales(&x, 2);
        assert_eq!(s, vec![1.0, 3.5 / 448.0]);
        let q = quantize(&x, &s, 2);
        assert_eq!(q[..2], [0, 0]);
        assert_eq!(q[3], 0xFE, "the head's amax maps to -448");
        assert_eq!(dequantize(&q, &s, 2)[3], -3.5);
    }
}
