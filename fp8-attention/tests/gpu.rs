// fp8-attention's test binary: the Attention op on device tensors against the lab's own path, bit for bit.
use std::sync::Arc;

use anyhow::{Result, ensure};
use composed::OnDevice;
use fixtures::{Quantized, Raw, Shape, quantize_per_head};
use fp8_attention::{Attention, Config, Fp8, OutDtype, Output, Real};
use half::{bf16, f16};
use lab::cudarc::driver::{CudaSlice, CudaStream};
use lab::{Gpu, Suite};

/// A problem's inputs on the device, as a model would hold them.
struct Inputs {
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    qs: CudaSlice<f32>,
    ks: CudaSlice<f32>,
    vs: CudaSlice<f32>,
}

fn inputs(st: &Arc<CudaStream>, qz: &Quantized) -> Result<Inputs> {
    Ok(Inputs {
        q: st.clone_htod(&qz.q)?,
        k: st.clone_htod(&qz.k)?,
        v: st.clone_htod(&qz.v)?,
        qs: st.clone_htod(&qz.q_scale)?,
        ks: st.clone_htod(&qz.k_scale)?,
        vs: st.clone_htod(&qz.v_scale)?,
    })
}

fn forward(
    op: &mut Attention,
    gpu: &Gpu,
    st: &Arc<CudaStream>,
    s: Shape,
    x: &Inputs,
) -> Result<Output> {
    let f = |codes, scales| Fp8 { codes, scales };
    Ok(op.forward(gpu, st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs))?)
}

/// The lab's own path (upload, launch, download with every element checked written) on the same problem.
fn lab_path(gpu: &Gpu, qz: &Quantized, out: OutDtype) -> Result<fixtures::Attention<f32>> {
    let stage = fp8_attention::fastest_stage(gpu, &qz.shape)?;
    let mut d = OnDevice::upload_as(gpu, qz, out)?;
    d.launch(gpu, stage)?;
    d.download(gpu)
}

fn same_bits(a: &fixtures::Attention<f32>, b: &fixtures::Attention<f32>) -> bool {
    a.o.len() == b.o.len()
        && a.lse.len() == b.lse.len()
        && a.o
            .iter()
            .zip(&b.o)
            .all(|(x, y)| x.to_bits() == y.to_bits())
        && a.lse
            .iter()
            .zip(&b.lse)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

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

/// Ring attention over `world` virtual ranks on one device (`ring_on_one_device`) on shape `s`, against the f64
/// reference of the whole problem, beside stage 7 on the whole problem (the lab's path): the ring's O must be as
/// close to the reference as the dense kernel's (its parts are stage 7's; the merge adds f32 ulps), rel-L2 within
/// 10% + 1e-3 of the dense one's, and its LSE within the dense LSE's max error + 1e-4.
/// `ring_on_one_device` over `world` virtual ranks on `qz` (shape `s`), its ranks' halves joined: O and LSE of the whole.
fn ring_one_device_joined(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    world: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    use fp8_attention::{Shard, ring_on_one_device, zigzag_join, zigzag_split};
    let st = gpu.ctx.new_stream()?;
    let (qd, kd) = ([s.b, s.h, s.sq, s.d], [s.b, s.hkv, s.sk, s.d]);
    let (qs, ks, vs) = (
        zigzag_split(&qz.q, qd, world),
        zigzag_split(&qz.k, kd, world),
        zigzag_split(&qz.v, kd, world),
    );
    let up = |x: &Vec<u8>| st.clone_htod(if x.is_empty() { &[0u8][..] } else { &x[..] });
    let (dq, dk, dv): (Vec<_>, Vec<_>, Vec<_>) = (
        qs.iter()
            .map(|h| Ok([up(&h[0])?, up(&h[1])?]))
            .collect::<Result<Vec<_>>>()?,
        ks.iter()
            .map(|h| Ok([up(&h[0])?, up(&h[1])?]))
            .collect::<Result<Vec<_>>>()?,
        vs.iter()
            .map(|h| Ok([up(&h[0])?, up(&h[1])?]))
            .collect::<Result<Vec<_>>>()?,
    );
    let (sq, sk, sv) = (
        st.clone_htod(&qz.q_scale)?,
        st.clone_htod(&qz.k_scale)?,
        st.clone_htod(&qz.v_scale)?,
    );
    let lens = |r: usize| [0, 1].map(|h| fp8_attention::zigzag_range(s.sq, world, r, h).len());
    fn shard<'a>(
        codes: &'a [lab::cudarc::driver::CudaSlice<u8>; 2],
        scales: &'a lab::cudarc::driver::CudaSlice<f32>,
        lens: [usize; 2],
    ) -> Shard<'a> {
        Shard {
            halves: [
                Fp8 {
                    codes: &codes[0],
                    scales,
                },
                Fp8 {
                    codes: &codes[1],
                    scales,
                },
            ],
            lens,
        }
    }
    let q: Vec<Shard> = (0..world).map(|r| shard(&dq[r], &sq, lens(r))).collect();
    let kv: Vec<(Shard, Shard)> = (0..world)
        .map(|r| (shard(&dk[r], &sk, lens(r)), shard(&dv[r], &sv, lens(r))))
        .collect();
    let outs = ring_on_one_device(gpu, &st, s, &q, &kv)?;
    let mut o_halves = vec![];
    let mut l_halves = vec![];
    for (r, out) in outs.iter().enumerate() {
        let l = lens(r);
        let take = |x: &lab::cudarc::driver::CudaSlice<f32>, n: usize| -> Result<Vec<f32>> {
            Ok(st.clone_dtoh(x)?[..n].to_vec())
        };
        o_halves.push([
            take(&out.o[0], s.heads() * l[0] * s.d)?,
            take(&out.o[1], s.heads() * l[1] * s.d)?,
        ]);
        l_halves.push([
            take(&out.lse[0], s.heads() * l[0])?,
            take(&out.lse[1], s.heads() * l[1])?,
        ]);
    }
    let o = zigzag_join(&o_halves, [s.b, s.h, s.sq, s.d]);
    let lse = zigzag_join(&l_halves, [s.b, s.h, s.sq, 1]);
    Ok((o, lse))
}

fn check_ring(gpu: &Gpu, s: Shape, world: usize) -> Result<()> {
    use lab::numerics::{Tolerance, error_stats};
    let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
    let (o, lse) = ring_one_device_joined(gpu, &qz, s, world)?;
    let want = fixtures::reference(&qz);
    let dense = lab_path(gpu, &qz, OutDtype::F32)?;
    let tol = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    let (ring_e, dense_e) = (
        error_stats(&o, &want.o, tol),
        error_stats(&dense.o, &want.o, tol),
    );
    let lse_err = |x: &[f32]| {
        x.iter()
            .zip(&want.lse)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max)
    };
    let (ring_l, dense_l) = (lse_err(&lse), lse_err(&dense.lse));
    eprintln!(
        "ring W = {world} {s:?}: O vs f64 max_abs={:.3e} mean_abs={:.3e} rel_l2={:.3e} (dense stage 7: rel_l2={:.3e}); LSE max abs {ring_l:.3e} (dense {dense_l:.3e})",
        ring_e.max_abs, ring_e.mean_abs, ring_e.rel_l2, dense_e.rel_l2
    );
    ensure!(
        ring_e.nan == 0 && ring_e.inf == 0,
        "ring W = {world}: NaN or Inf in O"
    );
    ensure!(
        ring_e.rel_l2 <= 1.1 * dense_e.rel_l2 + 1e-3,
        "ring W = {world}: rel-L2 {:.3e} against the dense kernel's {:.3e}",
        ring_e.rel_l2,
        dense_e.rel_l2
    );
    ensure!(
        ring_l <= dense_l + 1e-4,
        "ring W = {world}: LSE error {ring_l:.3e} against the dense kernel's {dense_l:.3e}"
    );
    Ok(())
}

/// A rank's O halves and LSE halves, on the host.
type RankHalves = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Ring attention over NCCL on `world` GPUs (one thread and communicator a rank, `ring_attention_rank`) on shape `s`:
/// the whole problem's O and LSE, joined from every rank's halves, must equal ring_on_one_device's on device 0 bit
/// for bit (the same kernels and merges in the same order, on GPUs of one model), which check_ring holds against the
/// f64 reference.
fn check_ring_nccl(gpus: &[&'static Gpu], s: Shape) -> Result<()> {
    use fp8_attention::zigzag_join;
    let world = gpus.len();
    let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
    let results = ring_nccl_run(gpus, &qz, None);
    let mut o_h = vec![];
    let mut l_h = vec![];
    for (r, res) in results.into_iter().enumerate() {
        let (o0, o1, l0, l1) = res.map_err(|e| e.context(format!("rank {r}")))?;
        o_h.push([o0, o1]);
        l_h.push([l0, l1]);
    }
    let o = zigzag_join(&o_h, [s.b, s.h, s.sq, s.d]);
    let lse = zigzag_join(&l_h, [s.b, s.h, s.sq, 1]);
    let (one_o, one_l) = ring_one_device_joined(gpus[0], &qz, s, world)?;
    ensure!(
        o.iter()
            .zip(&one_o)
            .all(|(a, b)| a.to_bits() == b.to_bits())
            && lse
                .iter()
                .zip(&one_l)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        "ring over NCCL on {world} GPUs differs from the same ring on one device"
    );
    eprintln!(
        "ring over NCCL, {world} GPUs, {s:?}: O and LSE bit-identical to the ring on one device"
    );
    Ok(())
}

/// Every rank of a ring over NCCL on `gpus` on `qz` (its shape's whole sequence), one thread and communicator a rank;
/// rank `bad`, if any, passes halves one token short. Each rank's O halves and LSE halves, or its error.
fn ring_nccl_run(
    gpus: &[&'static Gpu],
    qz: &Quantized,
    bad: Option<usize>,
) -> Vec<Result<RankHalves>> {
    use fp8_attention::{Shard, ring_attention_rank, zigzag_range, zigzag_split};
    use lab::cudarc::nccl::{Comm, Id};
    let world = gpus.len();
    let s = qz.shape;
    let (qd, kd) = ([s.b, s.h, s.sq, s.d], [s.b, s.hkv, s.sk, s.d]);
    let (qs, ks, vs) = (
        zigzag_split(&qz.q, qd, world),
        zigzag_split(&qz.k, kd, world),
        zigzag_split(&qz.v, kd, world),
    );
    let id = match Id::new() {
        Ok(id) => id,
        Err(e) => return vec![Err(anyhow::anyhow!("ncclGetUniqueId: {e:?}"))],
    };
    let lens = move |r: usize| [0, 1].map(|h| zigzag_range(s.sq, world, r, h).len());
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let (gpu, qs, ks, vs) = (gpus[r], &qs[r], &ks[r], &vs[r]);
                sc.spawn(move || -> Result<RankHalves> {
                    let st = gpu.ctx.new_stream()?;
                    let comm = Comm::from_rank(st.clone(), r, world, id)
                        .map_err(|e| anyhow::anyhow!("ncclCommInitRank on rank {r}: {e:?}"))?;
                    let up =
                        |x: &Vec<u8>| st.clone_htod(if x.is_empty() { &[0u8][..] } else { &x[..] });
                    let (dq, dk, dv) = (
                        [up(&qs[0])?, up(&qs[1])?],
                        [up(&ks[0])?, up(&ks[1])?],
                        [up(&vs[0])?, up(&vs[1])?],
                    );
                    let (sq, sk, sv) = (
                        st.clone_htod(&qz.q_scale)?,
                        st.clone_htod(&qz.k_scale)?,
                        st.clone_htod(&qz.v_scale)?,
                    );
                    fn halves<'a>(
                        c: &'a [lab::cudarc::driver::CudaSlice<u8>; 2],
                        sc: &'a lab::cudarc::driver::CudaSlice<f32>,
                    ) -> [Fp8<'a>; 2] {
                        [
                            Fp8 {
                                codes: &c[0],
                                scales: sc,
                            },
                            Fp8 {
                                codes: &c[1],
                                scales: sc,
                            },
                        ]
                    }
                    let l = lens(r);
                    let claimed = if bad == Some(r) {
                        [l[0], l[1].saturating_sub(1)]
                    } else {
                        l
                    };
                    let out = ring_attention_rank(
                        gpu,
                        &comm,
                        s,
                        Shard {
                            halves: halves(&dq, &sq),
                            lens: claimed,
                        },
                        Shard {
                            halves: halves(&dk, &sk),
                            lens: l,
                        },
                        Shard {
                            halves: halves(&dv, &sv),
                            lens: l,
                        },
                        std::time::Duration::from_secs(60),
                    )?;
                    let take =
                        |x: &lab::cudarc::driver::CudaSlice<f32>, n: usize| -> Result<Vec<f32>> {
                            Ok(st.clone_dtoh(x)?[..n].to_vec())
                        };
                    Ok((
                        take(&out.o[0], s.heads() * l[0] * s.d)?,
                        take(&out.o[1], s.heads() * l[1] * s.d)?,
                        take(&out.lse[0], s.heads() * l[0])?,
                        take(&out.lse[1], s.heads() * l[1])?,
                    ))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    })
}

fn main() {
    let mut t = Suite::new();
    // The mission shape; causal grouped-query heads at D = 128; a split tail (256 units on the H100's 132 SMs, 5
    // key tiles each); f32 O at D = 64 with Sq ≠ Sk; causal grouped-query heads at D = 256.
    let cases: [(&str, Shape, usize, bool, OutDtype); 5] = [
        (
            "mission_1x8x512x64",
            Shape::new(1, 8, 512, 64),
            8,
            false,
            OutDtype::Bf16,
        ),
        (
            "causal_gqa_2x8q2kv_300x700x128",
            Shape::cross(2, 8, 300, 700, 128),
            2,
            true,
            OutDtype::F16,
        ),
        (
            "split_tail_2x16x1024x128",
            Shape::new(2, 16, 1024, 128),
            16,
            false,
            OutDtype::Bf16,
        ),
        (
            "f32_1x4_100x333x64",
            Shape::cross(1, 4, 100, 333, 64),
            4,
            false,
            OutDtype::F32,
        ),
        (
            "causal_gqa_1x8q2kv_300x500x256",
            Shape::cross(1, 8, 300, 500, 256),
            2,
            true,
            OutDtype::Bf16,
        ),
    ];
    for (name, shape, hkv, causal, out) in cases {
        t.gpu(&format!("forward::{name}::bits_of_the_lab_path"), move |gpu| {
            let s = shape.with_kv_heads(hkv)?.with_causal(causal);
            let qz = quantize_per_head(&Raw::random(s, 17, 1.0));
            // On a stream of the caller's own, not the device's default one.
            let st = gpu.ctx.new_stream()?;
            let x = inputs(&st, &qz)?;
            let mut op = Attention::new(
                gpu,
                Config {
                    causal,
                    out_dtype: out,
                    softmax_scale: None,
                },
            )?;
            op.warm(gpu, s.d)?;
            let got = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            let want = lab_path(gpu, &qz, out)?;
            ensure!(
                same_bits(&got, &want),
                "{name}: O or the LSE differ from the lab's path"
            );
            // The same op again on the same buffers: the same bits (the schedule's counters were left at zero).
            let again = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            ensure!(same_bits(&again, &want), "{name}: a second call differs");
            eprintln!(
                "{name}: {} O elements and {} LSE values bit-identical to the lab's path, twice",
                got.o.len(),
                got.lse.len()
            );
            Ok(())
        });
    }
    t.gpu("forward::new_values_in_the_same_v_buffer_are_read", |gpu| {
        // A model reuses its activation buffers: V rewritten in place must give the new problem's O (V's
        // transposed copy made again), not the old one's.
        let s = Shape::new(1, 4, 256, 128);
        let (a, b) = (
            quantize_per_head(&Raw::random(s, 1, 1.0)),
            quantize_per_head(&Raw::random(s, 2, 1.0)),
        );
        let st = gpu.stream.clone();
        let mut x = inputs(&st, &a)?;
        let mut op = Attention::new(gpu, Config::default())?;
        let first = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
        ensure!(
            same_bits(&first, &lab_path(gpu, &a, OutDtype::Bf16)?),
            "the first problem differs"
        );
        st.memcpy_htod(&b.v, &mut x.v)?;
        st.memcpy_htod(&b.v_scale, &mut x.vs)?;
        let mixed = Quantized {
            v: b.v.clone(),
            v_scale: b.v_scale.clone(),
            ..a.clone()
        };
        let second = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
        ensure!(
            same_bits(&second, &lab_path(gpu, &mixed, OutDtype::Bf16)?),
            "V rewritten in place: O is not the new problem's"
        );
        Ok(())
    });
    t.gpu("forward::bad_inputs_are_refused_before_any_launch", |gpu| {
        let s = Shape::new(1, 2, 64, 64);
        let qz = quantize_per_head(&Raw::random(s, 3, 1.0));
        let st = gpu.stream.clone();
        let x = inputs(&st, &qz)?;
        let mut op = Attention::new(gpu, Config::default())?;
        let e = forward(&mut op, gpu, &st, Shape { sq: 65, ..s }, &x)
            .unwrap_err()
            .to_string();
        ensure!(
            e.contains("`q` holds 8192 elements") && e.contains("needs 8320"),
            "{e}"
        );
        let e = forward(&mut op, gpu, &st, Shape { d: 80, ..s }, &x)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("D = 80"), "{e}");
        let bad = Attention::new(
            gpu,
            Config {
                softmax_scale: Some(-1.0),
                ..Config::default()
            },
        )
        .unwrap_err();
        ensure!(bad.to_string().contains("softmax scale -1"), "{bad}");
        Ok(())
    });
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
    t.gpu("forward_into::caller_outputs_get_the_same_bits", |gpu| {
        let s = Shape::cross(2, 8, 300, 700, 128).with_kv_heads(2)?.with_causal(true);
        let qz = quantize_per_head(&Raw::random(s, 29, 1.0));
        let st = gpu.ctx.new_stream()?;
        let x = inputs(&st, &qz)?;
        let cfg = Config {
            causal: true,
            out_dtype: OutDtype::F16,
            softmax_scale: None,
        };
        let mut op = Attention::new(gpu, cfg)?;
        let f = |codes, scales| Fp8 { codes, scales };
        let mut out = op.alloc_output(gpu, &st, &s)?;
        for _ in 0..2 {
            op.forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut out)?;
        }
        let want = lab_path(gpu, &qz, OutDtype::F16)?;
        ensure!(same_bits(&out.to_host(&st)?, &want), "forward_into differs from the lab's path");
        let mut other = Attention::new(gpu, Config { out_dtype: OutDtype::Bf16, ..cfg })?;
        let e = other
            .forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut out)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("O is F16") && e.contains("writes Bf16"), "{e}");
        let mut small = op.alloc_output(gpu, &st, &Shape { sq: 100, ..s })?;
        let e = op
            .forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut small)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("this call needs") && e.contains("output_rows"), "{e}");
        eprintln!("forward_into: caller-provided O and LSE bit-identical to the lab's path; wrong dtype and short buffers named");
        Ok(())
    });
    for (name, shape, worlds) in [
        (
            "1x4x1000x128",
            Shape::new(1, 4, 1000, 128),
            &[2usize, 3, 4][..],
        ),
        (
            "1x4x1000x128_causal",
            Shape::new(1, 4, 1000, 128).with_causal(true),
            &[2, 3, 4][..],
        ),
        (
            "2x8q2kv_777x64_causal",
            Shape::new(2, 8, 777, 64)
                .with_kv_heads(2)
                .expect("8 / 2")
                .with_causal(true),
            &[2, 4][..],
        ),
        (
            "1x2x5x64_causal_empty_chunks",
            Shape::new(1, 2, 5, 64).with_causal(true),
            &[4][..],
        ),
    ] {
        t.gpu(&format!("ring::on_one_device::{name}"), move |gpu| {
            for &w in worlds {
                check_ring(gpu, shape, w)?;
            }
            Ok(())
        });
    }
    for (world, name, shape) in [
        (
            2,
            "1x4x1000x128_causal",
            Shape::new(1, 4, 1000, 128).with_causal(true),
        ),
        (
            2,
            "2x8q2kv_777x64",
            Shape::new(2, 8, 777, 64).with_kv_heads(2).expect("8 / 2"),
        ),
        (
            4,
            "1x4x1001x128_causal",
            Shape::new(1, 4, 1001, 128).with_causal(true),
        ),
    ] {
        t.gpus(
            world,
            &format!("ring::nccl::{world}_gpus::{name}"),
            move |gpus| check_ring_nccl(gpus, shape),
        );
    }
    t.gpus(
        2,
        "ring::nccl::2_gpus::a_rank_refusing_its_inputs_ends_every_rank",
        |gpus| {
            // Rank 1 claims its second half one token short: it fails by name, and rank 0 learns it from the ranks' check
            // before anything is sent, with an error naming rank 1; neither waits out its timeout.
            let s = Shape::new(1, 2, 300, 64).with_causal(true);
            let qz = quantize_per_head(&Raw::random(s, 5, 1.0));
            let t0 = std::time::Instant::now();
            let res = ring_nccl_run(gpus, &qz, Some(1));
            let e: Vec<String> = res
                .into_iter()
                .map(|r| r.err().map(|e| format!("{e:#}")).unwrap_or_default())
                .collect();
            ensure!(
                e[1].contains("rank 1 of 2") && e[1].contains("q halves hold"),
                "rank 1: {}",
                e[1]
            );
            ensure!(
                e[0].contains("rank 1 refused its inputs"),
                "rank 0: {}",
                e[0]
            );
            ensure!(
                t0.elapsed().as_secs() < 30,
                "the ranks took {:?} to fail",
                t0.elapsed()
            );
            eprintln!(
                "a rank refusing its inputs: rank 0 `{}`; rank 1 `{}`",
                e[0], e[1]
            );
            Ok(())
        },
    );
    t.run()
}
