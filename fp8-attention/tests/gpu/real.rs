// The Attention op on real-valued inputs (f32, f16, bf16 views with strides), quantized on the device.
use anyhow::{Result, ensure};
use fixtures::{Raw, Shape, quantize_per_head};
use fp8_attention::{Attention, Config, OutDtype, Real};
use half::{bf16, f16};
use lab::cudarc::driver::{CudaSlice, CudaStream};
use lab::{Gpu, Suite};
use std::sync::Arc;

use crate::{lab_path, same_bits};

/// `raw` rounded to T, laid out as `layout` says: "bhsd" (contiguous), "bshd" ([B, S, H, D]) or "fused" (q, k and v
/// interleaved as a [B, S, 3, H, D] projection, Hkv = H); the device buffers, the offsets and strides of q, k, v, and
/// the problem the rounded values make.
#[allow(clippy::type_complexity)]
fn real_inputs<T: fp8_attention::RealElem + Copy>(
    st: &Arc<CudaStream>,
    raw: &Raw,
    layout: &str,
    to: impl Fn(f32) -> T,
    from: impl Fn(T) -> f32,
) -> Result<(Vec<CudaSlice<T>>, [(usize, Option<[usize; 3]>); 3], Raw)> {
    let s = raw.shape;
    let round = |x: &[f32]| x.iter().map(|&v| from(to(v))).collect::<Vec<f32>>();
    let rounded = Raw {
        shape: s,
        q: round(&raw.q),
        k: round(&raw.k),
        v: round(&raw.v),
    };
    // Element (b, h, r, d) of a contiguous [B, heads, rows, D] tensor.
    let at = |heads: usize, rows: usize, b: usize, h: usize, r: usize| {
        ((b * heads + h) * rows + r) * s.d
    };
    let bshd = |x: &[f32], heads: usize, rows: usize| {
        let mut out = vec![T::default_zero(); x.len()];
        for b in 0..s.b {
            for h in 0..heads {
                for r in 0..rows {
                    let src = at(heads, rows, b, h, r);
                    let dst = ((b * rows + r) * heads + h) * s.d;
                    for d in 0..s.d {
                        out[dst + d] = to(x[src + d]);
                    }
                }
            }
        }
        out
    };
    match layout {
        "bhsd" => {
            let up = |x: &[f32]| st.clone_htod(&x.iter().map(|&v| to(v)).collect::<Vec<T>>());
            Ok((
                vec![up(&raw.q)?, up(&raw.k)?, up(&raw.v)?],
                [(0, None); 3],
                rounded,
            ))
        }
        "bshd" => {
            let kv = s.kv_heads() / s.b;
            let strides = |heads: usize, rows: usize| Some([rows * heads * s.d, s.d, heads * s.d]);
            Ok((
                vec![
                    st.clone_htod(&bshd(&raw.q, s.h, s.sq))?,
                    st.clone_htod(&bshd(&raw.k, kv, s.sk))?,
                    st.clone_htod(&bshd(&raw.v, kv, s.sk))?,
                ],
                [
                    (0, strides(s.h, s.sq)),
                    (0, strides(kv, s.sk)),
                    (0, strides(kv, s.sk)),
                ],
                rounded,
            ))
        }
        _ => {
            ensure!(
                s.hkv == s.h && s.sq == s.sk,
                "a fused projection has Hkv = H and Sq = Sk"
            );
            let (h, n) = (s.h, s.sq);
            let mut out = vec![T::default_zero(); 3 * raw.q.len()];
            for (i, x) in [&raw.q, &raw.k, &raw.v].into_iter().enumerate() {
                for b in 0..s.b {
                    for hh in 0..h {
                        for r in 0..n {
                            let src = at(h, n, b, hh, r);
                            let dst = (((b * n + r) * 3 + i) * h + hh) * s.d;
                            for d in 0..s.d {
                                out[dst + d] = to(x[src + d]);
                            }
                        }
                    }
                }
            }
            let strides = Some([n * 3 * h * s.d, s.d, 3 * h * s.d]);
            Ok((
                vec![st.clone_htod(&out)?],
                [(0, strides), (h * s.d, strides), (2 * h * s.d, strides)],
                rounded,
            ))
        }
    }
}

/// A zero of T, to fill a host buffer.
trait DefaultZero {
    fn default_zero() -> Self;
}
impl<T: fp8_attention::RealElem + Copy> DefaultZero for T {
    fn default_zero() -> Self {
        // SAFETY: f32, f16 and bf16 (the only RealElem types) are all-zero-bits valid (+0).
        unsafe { std::mem::zeroed() }
    }
}

/// The op on real-valued inputs in `layout`, against the lab's path on the same values rounded to T: bit for bit.
fn check_real<T: fp8_attention::RealElem + Copy>(
    gpu: &Gpu,
    s: Shape,
    layout: &str,
    to: impl Fn(f32) -> T,
    from: impl Fn(T) -> f32,
) -> Result<()> {
    let st = gpu.ctx.new_stream()?;
    let raw = Raw::random(s, 23, 2.0);
    let (bufs, views, rounded) = real_inputs(&st, &raw, layout, to, from)?;
    let view = |i: usize| {
        let buf = &bufs[i.min(bufs.len() - 1)];
        match views[i].1 {
            None => Real::contiguous(buf),
            Some(strides) => Real::strided(buf, views[i].0, strides),
        }
    };
    let mut op = Attention::new(
        gpu,
        Config {
            causal: s.causal,
            ..Config::default()
        },
    )?;
    let got = op
        .forward_real(gpu, &st, s, view(0), view(1), view(2))?
        .to_host(&st)?;
    let want = lab_path(gpu, &quantize_per_head(&rounded), OutDtype::Bf16)?;
    ensure!(
        same_bits(&got, &want),
        "{layout}: O or the LSE differ from the lab's path"
    );
    // Again with other values in the same buffers' shapes: the op's staging is reused.
    let got2 = op
        .forward_real(gpu, &st, s, view(0), view(1), view(2))?
        .to_host(&st)?;
    ensure!(same_bits(&got2, &want), "{layout}: a second call differs");
    eprintln!(
        "real inputs, {layout}: {} O elements bit-identical to the lab's path on the rounded values, twice",
        got.o.len()
    );
    Ok(())
}

/// The real-valued input tests.
pub fn add(t: &mut Suite) {
    t.gpu(
        "forward_real::bf16_bshd_gqa_causal::bits_of_the_lab_path",
        |gpu| {
            let s = Shape::cross(2, 8, 200, 333, 128)
                .with_kv_heads(2)?
                .with_causal(true);
            check_real(gpu, s, "bshd", bf16::from_f32, |x: bf16| x.to_f32())
        },
    );
    t.gpu(
        "forward_real::bf16_fused_projection::bits_of_the_lab_path",
        |gpu| {
            check_real(
                gpu,
                Shape::new(2, 4, 256, 64),
                "fused",
                bf16::from_f32,
                |x: bf16| x.to_f32(),
            )
        },
    );
    t.gpu(
        "forward_real::f16_and_f32_contiguous::bits_of_the_lab_path",
        |gpu| {
            let s = Shape::new(1, 4, 300, 128);
            check_real(gpu, s, "bhsd", f16::from_f32, |x: f16| x.to_f32())?;
            check_real(gpu, s, "bhsd", |x| x, |x: f32| x)
        },
    );
    t.gpu(
        "forward_real::bad_views_are_refused_before_any_launch",
        |gpu| {
            let s = Shape::new(1, 2, 64, 64);
            let st = gpu.stream.clone();
            let buf = st.alloc_zeros::<bf16>(2 * 64 * 64 + 64)?;
            let short = st.alloc_zeros::<bf16>(2 * 64 * 64 - 1)?;
            let mut op = Attention::new(gpu, Config::default())?;
            let ok = Real::contiguous(&buf);
            let e = op
                .forward_real(gpu, &st, s, ok, Real::contiguous(&short), ok)
                .unwrap_err()
                .to_string();
            ensure!(e.contains("`k`") && e.contains("past the 8191"), "{e}");
            let e = op
                .forward_real(
                    gpu,
                    &st,
                    s,
                    ok,
                    ok,
                    Real::strided(&buf, 0, [8192, 4096, 60]),
                )
                .unwrap_err()
                .to_string();
            ensure!(e.contains("`v`") && e.contains("S stride"), "{e}");
            let e = op
                .forward_real(
                    gpu,
                    &st,
                    s,
                    Real::strided(&buf, 3, [8192, 4096, 64]),
                    ok,
                    ok,
                )
                .unwrap_err()
                .to_string();
            ensure!(
                e.contains("`q`") && e.contains("aligned to 16 bytes"),
                "{e}"
            );
            Ok(())
        },
    );
}
