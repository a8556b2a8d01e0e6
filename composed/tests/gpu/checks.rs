// How a stage's output is judged: FlashAttention's rule against the f64 reference and the emulation, and helpers.
use crate::prelude::*;

pub fn max_abs(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            if x as f64 == y {
                0.0
            } else {
                (x as f64 - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// Per query row, a bound on how far the scores' accumulation moves its LSE. The f16 stages accumulate in IEEE
/// f32, as the emulation does: 0. The FP8 wgmma stage's tensor cores keep fewer bits (wgmma's measured
/// `FP8_ACCUMULATION_EPS` of Σ|q·k|), and LSE is 1-Lipschitz in the largest score change, so the bound is
/// scale · ε · ‖q_i‖ · max_j ‖k_j‖ (Cauchy–Schwarz on the codes).
pub fn score_error_bounds(stage: Stage, qz: &Quantized) -> Vec<f64> {
    let s = qz.shape;
    let rows = s.heads() * s.sq;
    if !stage.fp8_p() {
        return vec![0.0; rows];
    }
    let dec = |c: u8| f64::from(fp8_codec::decode(c, fp8_codec::Format::E4M3));
    let norm = |v: &[u8]| v.iter().map(|&c| dec(c) * dec(c)).sum::<f64>().sqrt();
    let mut out = Vec::with_capacity(rows);
    for h in 0..s.heads() {
        let g = s.kv_head(h);
        let kmax = (0..s.sk)
            .map(|j| norm(&qz.k[(g * s.sk + j) * s.d..(g * s.sk + j + 1) * s.d]))
            .fold(0.0, f64::max);
        let scale =
            f64::from(qz.softmax_scale) * f64::from(qz.q_scale[h]) * f64::from(qz.k_scale[g]);
        for i in 0..s.sq {
            let q = norm(&qz.q[(h * s.sq + i) * s.d..(h * s.sq + i + 1) * s.d]);
            out.push(scale * wgmma::FP8_ACCUMULATION_EPS * q * kmax);
        }
    }
    out
}

/// FlashAttention's rule: error against the f64 reference at most 2× the emulation's, plus the noise floor.
pub fn check(stage: Stage, case: &Case, p: &Prepared, dev: &Attention<f32>) -> Result<()> {
    let emulation = p.emulation_for(stage);
    rule(
        stage,
        &p.qz,
        &p.reference,
        emulation,
        dev,
        &case.name,
        |stats, e_emu| {
            let unq = reference_unquantized(&p.raw, p.qz.softmax_scale);
            let info = error_stats(
                &dev.o,
                &unq.o,
                Tolerance {
                    atol: 0.0,
                    rtol: 0.0,
                },
            );
            eprintln!(
                "{} {}: vs f64(dequantized) max_abs={:.3e} mean_abs={:.3e} rel_l2={:.3e} | emulation max_abs={e_emu:.3e} | vs unquantized max_abs={:.3e} rel_l2={:.3e}",
                stage.name(),
                case.name,
                stats.max_abs,
                stats.mean_abs,
                stats.rel_l2,
                info.max_abs,
                info.rel_l2
            );
        },
    )
}

/// FlashAttention's rule on `dev` against the f64 reference `r` of `qz`: O within 2 × the emulation's max error
/// plus 2⁻²⁰·max|V|, with no NaN or Inf; every LSE within 2 × the emulation's plus 8·2⁻²⁴·(1 + |LSE|) plus the
/// stage's score-accumulation bound. `report` sees O's stats and the emulation's error before the verdict.
pub fn rule(
    stage: Stage,
    qz: &Quantized,
    r: &Attention<f64>,
    emulation: &Attention<f32>,
    dev: &Attention<f32>,
    what: &str,
    report: impl FnOnce(&lab::numerics::ErrorStats, f64),
) -> Result<()> {
    let vmax = qz.v.iter().zip(0..).map(|(&c, i)| {
        let h = i / (qz.shape.sk * qz.shape.d);
        (fp8_codec::decode(c, fp8_codec::Format::E4M3) * qz.v_scale[h]).abs() as f64
    });
    let floor = 2f64.powi(-20) * vmax.fold(0.0, f64::max);
    let (e_dev, e_emu) = (max_abs(&dev.o, &r.o), max_abs(&emulation.o, &r.o));
    let stats = error_stats(
        &dev.o,
        &r.o,
        Tolerance {
            atol: 2.0 * e_emu + floor,
            rtol: 0.0,
        },
    );
    report(&stats, e_emu);
    ensure!(
        stats.nan + stats.inf == 0,
        "{what}: {} NaN / {} Inf in O",
        stats.nan,
        stats.inf
    );
    ensure!(
        e_dev <= 2.0 * e_emu + floor,
        "{what}: O error {e_dev:.3e} > 2 × emulation's {e_emu:.3e} + {floor:.1e}: {stats}"
    );
    let e_emu_lse = max_abs(&emulation.lse, &r.lse);
    let score_err = score_error_bounds(stage, qz);
    for (i, (&got, &want)) in dev.lse.iter().zip(&r.lse).enumerate() {
        let tol = 2.0 * e_emu_lse + 8.0 * 2f64.powi(-24) * (1.0 + want.abs()) + score_err[i];
        // A row that sees no key (causal, Sq > Sk) must give exactly −inf, as the reference does.
        ensure!(
            got as f64 == want || (got as f64 - want).abs() <= tol,
            "{what}: LSE[{i}] = {got} vs {want} (tolerance {tol:.2e})"
        );
    }
    Ok(())
}

/// Q, K and V of more than 2^31 elements each (B·H = 524,800 heads of 32 rows, D = 128), made straight as E4M3
/// codes (a hash of the index, finite, |x| ≤ 15), once per process: 6.4 GB on the host.
pub fn huge() -> &'static Quantized {
    static Q: OnceLock<Quantized> = OnceLock::new();
    Q.get_or_init(|| {
        let shape = Shape::new(4, 131_200, 32, 128);
        let n = shape.heads() * shape.sq * shape.d;
        assert!(n > 1 << 31);
        let codes = |salt: u64| -> Vec<u8> {
            let mut v = vec![0u8; n];
            let chunk = n.div_ceil(16);
            std::thread::scope(|sc| {
                for (c, part) in v.chunks_mut(chunk).enumerate() {
                    sc.spawn(move || {
                        for (i, x) in part.iter_mut().enumerate() {
                            let mut h =
                                ((c * chunk + i) as u64 ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                            h ^= h >> 29;
                            // Magnitude codes 0..0x57 (|x| ≤ 15), either sign: never the NaN codes.
                            *x = (h % 0x58) as u8 | ((h >> 40) as u8 & 0x80);
                        }
                    });
                }
            });
            v
        };
        let heads = shape.heads();
        Quantized {
            shape,
            q: codes(1),
            k: codes(2),
            v: codes(3),
            q_scale: vec![0.0625; heads],
            k_scale: vec![0.125; heads],
            v_scale: vec![0.25; heads],
            softmax_scale: 1.0 / (shape.d as f32).sqrt(),
        }
    })
}

/// The heads `heads` of `qz` as a problem of their own (B = 1, H = heads.len()).
pub fn subset(qz: &Quantized, heads: &[usize]) -> Quantized {
    let s = qz.shape;
    let take = |x: &[u8], rows: usize| -> Vec<u8> {
        heads
            .iter()
            .flat_map(|&h| x[h * rows * s.d..(h + 1) * rows * s.d].iter().copied())
            .collect()
    };
    let pick = |x: &[f32]| -> Vec<f32> { heads.iter().map(|&h| x[h]).collect() };
    Quantized {
        shape: Shape::cross(1, heads.len(), s.sq, s.sk, s.d),
        q: take(&qz.q, s.sq),
        k: take(&qz.k, s.sk),
        v: take(&qz.v, s.sk),
        q_scale: pick(&qz.q_scale),
        k_scale: pick(&qz.k_scale),
        v_scale: pick(&qz.v_scale),
        softmax_scale: qz.softmax_scale,
    }
}

/// One checked run of `stage` on `qz`: uploaded, launched, downloaded (every element written), O written as `out`.
pub fn run_as(gpu: &Gpu, stage: Stage, qz: &Quantized, out: OutDtype) -> Result<Attention<f32>> {
    let mut d = OnDevice::upload_as(gpu, qz, out)?;
    d.launch(gpu, stage)?;
    d.download(gpu)
}

/// As `run_as`, every unit whole (no split tail, no fanned plan): the bits a packed batch's unit has.
pub fn run_whole(gpu: &Gpu, stage: Stage, qz: &Quantized, out: OutDtype) -> Result<Attention<f32>> {
    let mut d = OnDevice::upload_as(gpu, qz, out)?;
    d.use_split_tail(false);
    d.launch(gpu, stage)?;
    d.download(gpu)
}
