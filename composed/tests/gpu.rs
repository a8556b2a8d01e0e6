// composed's test binary: every stage against the f64 reference over the correctness matrix, and determinism.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use composed::{OnDevice, OutDtype, Stage, bc, run_as};
use fixtures::{
    Attention, Quantized, Raw, Shape, emulate, emulate_fp8p, quantize_per_head,
    quantize_per_tensor, reference, reference_unquantized,
};
use lab::numerics::{Tolerance, error_stats};
use lab::{Gpu, Suite};

/// One row of the matrix: a name and how to make its inputs.
#[derive(Clone)]
struct Case {
    name: String,
    make: fn(Shape, u64) -> Raw,
    shape: Shape,
    seed: u64,
    /// One scale per tensor instead of one per (b, h).
    per_tensor: bool,
    /// What the stage writes O as.
    out: OutDtype,
}

fn normal(shape: Shape, seed: u64) -> Raw {
    Raw::random(shape, seed, 1.0)
}
fn equal_scores(shape: Shape, seed: u64) -> Raw {
    let mut r = Raw::random(shape, seed, 1.0);
    r.q.fill(0.0); // every score 0: softmax uniform, O the mean of V
    r
}
fn tiny_values(shape: Shape, seed: u64) -> Raw {
    // Q, K, V × 1e-6: the codes are the same after per-head scaling, O is ~1e-7 (subnormal in f16).
    let mut r = Raw::random(shape, seed, 1e-6);
    r.v.iter_mut().for_each(|x| *x *= 1e-6);
    r
}
fn large_logits(shape: Shape, seed: u64) -> Raw {
    Raw::random(shape, seed, 6.0) // |scale·q·k| up to the hundreds
}
fn e4m3_limits(shape: Shape, seed: u64) -> Raw {
    // Every finite E4M3 value, ±448 and the subnormals included, with amax 448 so that the scale is 1.
    let mut r = Raw::random(shape, seed, 1.0);
    let vals: Vec<f32> = (0u8..=255)
        .map(|c| fp8_codec::decode(c, fp8_codec::Format::E4M3))
        .filter(|v| v.is_finite())
        .collect();
    for (i, x) in
        r.q.iter_mut()
            .chain(r.k.iter_mut())
            .chain(r.v.iter_mut())
            .enumerate()
    {
        *x = if i % 97 == 0 {
            448.0
        } else {
            vals[(x.to_bits() as usize ^ i) % vals.len()]
        };
    }
    r
}

fn matrix() -> Vec<Case> {
    let mut v = Vec::new();
    let mut add = |name: &str, make: fn(Shape, u64) -> Raw, shape: Shape, seed: u64| {
        v.push(Case {
            name: format!("{name}_s{seed}"),
            make,
            shape,
            seed,
            per_tensor: false,
            out: OutDtype::F16,
        })
    };
    for seed in 0..3 {
        add("small_1x1x32x64", normal, Shape::new(1, 1, 32, 64), seed);
        add(
            "mission_1x8x512x64",
            normal,
            Shape::new(1, 8, 512, 64),
            seed,
        );
        add("long_1x8x2048x64", normal, Shape::new(1, 8, 2048, 64), seed);
        add("batch_2x8x256x64", normal, Shape::new(2, 8, 256, 64), seed);
    }
    for s in [1, 17, 63, 65, 1000] {
        add(
            &format!("S{s}_1x2x{s}x64"),
            normal,
            Shape::new(1, 2, s, 64),
            7,
        );
    }
    add(
        "cross_sq100_sk300",
        normal,
        Shape::cross(1, 2, 100, 300, 64),
        8,
    );
    add(
        "cross_sq300_sk77",
        normal,
        Shape::cross(1, 2, 300, 77, 64),
        9,
    );
    add(
        "cross_sq1_sk1000",
        normal,
        Shape::cross(1, 2, 1, 1000, 64),
        10,
    );
    add("d128_1x4x256x128", normal, Shape::new(1, 4, 256, 128), 11);
    // More heads than a grid's y dimension holds (65535): B·H goes in x.
    add(
        "many_heads_2x35000x3x64",
        normal,
        Shape::new(2, 35000, 3, 64),
        19,
    );
    add("d128_S65_1x2x65x128", normal, Shape::new(1, 2, 65, 128), 12);
    // Key-tile edges of the widths the FP8 stages use (128, 192, 224): one key past two 192-key tiles (three of
    // 128), and exactly one 192-key tile (one and a half of 128).
    add(
        "tile_edges_1x2x385x128",
        normal,
        Shape::new(1, 2, 385, 128),
        23,
    );
    add(
        "tile_edges_cross_sq64_sk192",
        normal,
        Shape::cross(1, 2, 64, 192, 64),
        24,
    );
    // Exactly one 224-key tile (stage 7 at D = 128: Vᵀ in seven 32-byte panels), and one key past it.
    add(
        "tile_edges_cross_sq64_sk224_d128",
        normal,
        Shape::cross(1, 2, 64, 224, 128),
        25,
    );
    add(
        "tile_edges_cross_sq70_sk225_d128",
        normal,
        Shape::cross(1, 2, 70, 225, 128),
        26,
    );
    // 64 keys past one 224-key tile (stage 7's last tile at (·, ·, 4096, 128) has 64 keys), and one more.
    add(
        "tile_edges_cross_sq100_sk288_d128",
        normal,
        Shape::cross(1, 2, 100, 288, 128),
        27,
    );
    add(
        "tile_edges_cross_sq100_sk289_d128",
        normal,
        Shape::cross(1, 2, 100, 289, 128),
        28,
    );
    add(
        "d128_cross_sq33_sk100",
        normal,
        Shape::cross(1, 2, 33, 100, 128),
        13,
    );
    add(
        "equal_scores_1x2x130x64",
        equal_scores,
        Shape::new(1, 2, 130, 64),
        14,
    );
    add(
        "large_logits_1x2x200x64",
        large_logits,
        Shape::new(1, 2, 200, 64),
        15,
    );
    add(
        "e4m3_limits_1x2x150x64",
        e4m3_limits,
        Shape::new(1, 2, 150, 64),
        16,
    );
    add(
        "e4m3_limits_d128_1x2x70x128",
        e4m3_limits,
        Shape::new(1, 2, 70, 128),
        17,
    );
    v.push(Case {
        name: "per_tensor_scales_2x4x200x64_s18".into(),
        make: normal,
        shape: Shape::new(2, 4, 200, 64),
        seed: 18,
        per_tensor: true,
        out: OutDtype::F16,
    });
    // O as bf16 and as f32, and the small-value case that needs bf16 (f16 flushes it: see out_dtype_tiny).
    for (name, make, shape, seed, out) in [
        (
            "out_bf16_1x4x300x128",
            normal as fn(Shape, u64) -> Raw,
            Shape::new(1, 4, 300, 128),
            20,
            OutDtype::Bf16,
        ),
        (
            "out_f32_1x4x300x64",
            normal,
            Shape::new(1, 4, 300, 64),
            21,
            OutDtype::F32,
        ),
        (
            "out_bf16_tiny_1x2x200x64",
            tiny_values,
            Shape::new(1, 2, 200, 64),
            22,
            OutDtype::Bf16,
        ),
    ] {
        v.push(Case {
            name: format!("{name}_s{seed}"),
            make,
            shape,
            seed,
            per_tensor: false,
            out,
        });
    }
    v
}

/// Inputs and references of a case, computed once per process and shared by the five stages' tests.
struct Prepared {
    raw: Raw,
    qz: Quantized,
    reference: Attention<f64>,
    /// The f16-P stages' rounding points (tiles of `bc(d)` keys).
    emulation: Attention<f32>,
    /// The FP8 wgmma stages': P × 2^8 rounded to E4M3, one per key-tile width (`FP8_TILES`: the online
    /// softmax rounds at tile boundaries, so stages with different tiles round differently); made on first use.
    emulation_fp8: [OnceLock<Attention<f32>>; FP8_TILES.len()],
    out: OutDtype,
}

impl Prepared {
    fn emulation_for(&self, stage: Stage) -> &Attention<f32> {
        if stage.fp8_p() {
            let bc = stage.bc(self.qz.shape.d);
            let i = FP8_TILES.iter().position(|&t| t == bc).unwrap_or_else(|| {
                panic!("{}: a key tile of {bc} is not in FP8_TILES", stage.name())
            });
            self.emulation_fp8[i].get_or_init(|| emulation_of(stage, &self.qz, self.out))
        } else {
            &self.emulation
        }
    }
}

/// The key-tile widths of the FP8 wgmma stages (`Stage::bc`).
const FP8_TILES: [usize; 3] = [128, 192, 224];

/// The stage's rounding points on `qz` (P in f16 over `bc(d)`-key tiles, or P × 2⁸ in E4M3 over `bc(d)`-key tiles
/// for the FP8 wgmma stage), O rounded to `out`.
fn emulation_of(stage: Stage, qz: &Quantized, out: OutDtype) -> Attention<f32> {
    let bc = stage.bc(qz.shape.d);
    if stage.fp8_p() {
        emulate_fp8p(qz, bc, composed::FP8_P_OFFSET, out)
    } else {
        emulate(qz, bc, out)
    }
}

/// Case name → its inputs and references, filled by whichever stage's test gets there first.
type Cache = Mutex<HashMap<String, Arc<OnceLock<Arc<Prepared>>>>>;

fn prepared(case: &Case) -> Arc<Prepared> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let slot = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(case.name.clone())
        .or_default()
        .clone();
    slot.get_or_init(|| {
        let raw = (case.make)(case.shape, case.seed);
        let qz = if case.per_tensor {
            quantize_per_tensor(&raw)
        } else {
            quantize_per_head(&raw)
        };
        let (reference, emulation) = (reference(&qz), emulate(&qz, bc(case.shape.d), case.out));
        Arc::new(Prepared {
            raw,
            qz,
            reference,
            emulation,
            emulation_fp8: Default::default(),
            out: case.out,
        })
    })
    .clone()
}

/// Every stage without the option (`takes` false) refuses a problem of `shape` by its own name, saying what it
/// lacks and that stage 7 has it.
fn refused_by_the_others(
    gpu: &Gpu,
    shape: Shape,
    takes: fn(Stage) -> bool,
    lacks: &str,
) -> Result<()> {
    let qz = quantize_per_head(&normal(shape, 1));
    for stage in Stage::ALL.into_iter().filter(|s| !takes(*s)) {
        let e = format!("{:#}", run_as(gpu, stage, &qz, OutDtype::F16).unwrap_err());
        ensure!(
            e.contains(&format!("{} {lacks}", stage.name())) && e.contains("stage7"),
            "{e}"
        );
    }
    Ok(())
}

/// Grouped-query cases for the stages that take it (`Stage::gqa`): 4 query heads a K/V head, multi-query (one K/V head), grouping with the
/// causal mask and Sq ≠ Sk, D = 64 and 128.
fn gqa_shapes() -> Vec<(String, Shape)> {
    grouped(vec![
        (Shape::new(1, 8, 256, 128), 2, false),
        (Shape::cross(2, 4, 130, 200, 64), 1, false),
        (Shape::new(1, 8, 300, 128), 4, true),
        (Shape::cross(2, 6, 77, 129, 64), 3, true),
    ])
}

/// Stage 7's persistent cases (both head dimensions, `Stage::persistent`): several units a block at small block
/// counts, units of different key-tile counts (causal, Sq ≠ Sk) taken longest first, grouped-query heads, partial
/// query and key tiles; causal ones also in schedule sections of one and of three heads (`OnDevice::use_section`).
fn persistent_shapes() -> Vec<(String, Shape)> {
    grouped(vec![
        (Shape::cross(1, 3, 700, 900, 64), 3, true),
        (Shape::cross(2, 4, 600, 450, 64), 2, false),
        (Shape::cross(1, 2, 520, 300, 64), 1, true),
        (Shape::new(1, 4, 1000, 64), 4, false),
        (Shape::new(2, 2, 384, 64), 2, true),
        (Shape::cross(1, 4, 700, 1000, 128), 2, true),
        (Shape::cross(2, 3, 600, 450, 128), 3, false),
        (Shape::new(1, 2, 900, 128), 1, true),
    ])
}

/// Stage 7's split-tail cases: (name, shape, blocks, O's dtype), each a plan that splits (the test checks), at both
/// head dimensions, Sk a multiple of the key tile and not, pieces of under and over a unit, grouped-query heads.
fn split_cases() -> Vec<(String, Shape, usize, OutDtype)> {
    [
        (Shape::new(1, 4, 1000, 128), 5, OutDtype::F16),
        (Shape::cross(2, 3, 600, 900, 128), 4, OutDtype::Bf16),
        (Shape::cross(1, 3, 520, 448, 128), 7, OutDtype::F32),
        (Shape::cross(1, 2, 1000, 2000, 64), 3, OutDtype::F16),
        (Shape::cross(2, 2, 300, 1024, 64), 5, OutDtype::F32),
        (
            Shape::new(1, 8, 700, 128).with_kv_heads(2).expect("8 / 2"),
            5,
            OutDtype::F16,
        ),
    ]
    .into_iter()
    .map(|(s, blocks, out)| {
        let name = format!(
            "{}x{}q{}kv_{}x{}x{}_{blocks}blocks_{out:?}",
            s.b, s.h, s.hkv, s.sq, s.sk, s.d
        );
        (name, s, blocks, out)
    })
    .collect()
}

/// (shape, K/V heads, causal) cases, named BxHqHKVkv_SqxSkxD[_causal].
fn grouped(cases: Vec<(Shape, usize, bool)>) -> Vec<(String, Shape)> {
    cases
        .into_iter()
        .map(|(s, hkv, causal)| {
            let mask = if causal { "_causal" } else { "" };
            let name = format!("{}x{}q{hkv}kv_{}x{}x{}{mask}", s.b, s.h, s.sq, s.sk, s.d);
            (
                name,
                s.with_kv_heads(hkv).expect("divides").with_causal(causal),
            )
        })
        .collect()
}

/// O and the LSE bit for bit the same.
fn bit_identical(a: &Attention<f32>, b: &Attention<f32>) -> bool {
    a.o.len() == b.o.len()
        && a.o
            .iter()
            .zip(&b.o)
            .all(|(x, y)| x.to_bits() == y.to_bits())
        && a.lse
            .iter()
            .zip(&b.lse)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `qz` with every K/V head (codes and scales) repeated for each query head that reads it: the same problem
/// as ordinary attention.
fn expand_kv(qz: &Quantized) -> Quantized {
    let s = qz.shape;
    let per = s.sk * s.d;
    let rep = |x: &[u8]| -> Vec<u8> {
        (0..s.heads())
            .flat_map(|h| x[s.kv_head(h) * per..(s.kv_head(h) + 1) * per].to_vec())
            .collect()
    };
    let rep_s = |x: &[f32]| -> Vec<f32> { (0..s.heads()).map(|h| x[s.kv_head(h)]).collect() };
    Quantized {
        shape: Shape { hkv: s.h, ..s },
        k: rep(&qz.k),
        v: rep(&qz.v),
        k_scale: rep_s(&qz.k_scale),
        v_scale: rep_s(&qz.v_scale),
        ..qz.clone()
    }
}

/// Causal cases for the stages that take it (`Stage::causal`): Sq = Sk, Sq < Sk, Sq > Sk (rows that see no key), S = 1, partial tiles, D = 64
/// and 128, several heads, and the mission shape; at D = 128 (224-key tiles in stage 7) a diagonal that crosses
/// key tiles inside 128-row blocks, and Sq > Sk with one key tile and a bit.
fn causal_shapes() -> Vec<(String, Shape)> {
    [
        Shape::new(1, 2, 256, 64),
        Shape::cross(1, 2, 100, 300, 128),
        Shape::cross(1, 2, 300, 100, 64),
        Shape::new(1, 2, 400, 128),
        Shape::cross(1, 2, 450, 250, 128),
        Shape::new(1, 1, 1, 128),
        Shape::new(2, 3, 129, 128),
        Shape::cross(1, 1, 77, 1000, 64),
        Shape::new(1, 8, 512, 64),
    ]
    .into_iter()
    .map(|s| {
        (
            format!("{}x{}x{}x{}x{}", s.b, s.h, s.sq, s.sk, s.d),
            s.with_causal(true),
        )
    })
    .collect()
}

fn max_abs(a: &[f32], b: &[f64]) -> f64 {
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
fn score_error_bounds(stage: Stage, qz: &Quantized) -> Vec<f64> {
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
fn check(stage: Stage, case: &Case, p: &Prepared, dev: &Attention<f32>) -> Result<()> {
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
fn rule(
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
fn huge() -> &'static Quantized {
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
fn subset(qz: &Quantized, heads: &[usize]) -> Quantized {
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

fn main() {
    let mut t = Suite::new();
    t.kernels(composed::KERNELS);
    t.kernels(composed::PREP_KERNELS);
    lab::sass_snapshots!(t, composed::KERNELS);
    t.model(
        "launch_grid_puts_heads_in_x_and_refuses_what_does_not_fit",
        || {
            let g = composed::grid(Stage::S3b, &Shape::new(2, 35000, 3, 64), 64, 132, None)?;
            ensure!(g == (70000, 1, 1), "{g:?}");
            ensure!(
                composed::grid(Stage::S5, &Shape::new(1, 1, 1 << 20, 64), 128, 132, None)?.1
                    == 8192
            );
            let e = format!(
                "{:#}",
                composed::grid(
                    Stage::S3b,
                    &Shape::new(1, 1, 65536 * 64 + 1, 64),
                    64,
                    132,
                    None
                )
                .unwrap_err()
            );
            ensure!(e.contains("query tiles") && e.contains("65535"), "{e}");
            let e = format!(
                "{:#}",
                composed::grid(Stage::S6, &Shape::new(1, 1, 128, 64), 64, 132, Some(8))
                    .unwrap_err()
            );
            ensure!(e.contains("not persistent") && e.contains("stage7"), "{e}");
            Ok(())
        },
    );
    t.model(
        "stage7_is_persistent_one_block_an_sm_at_most_one_a_unit",
        || {
            let big = Shape::new(4, 16, 4096, 64);
            let g = composed::grid(Stage::S7, &big, 128, 132, None)?;
            ensure!(g == (132, 1, 1), "{g:?}");
            ensure!(composed::grid(Stage::S7, &big, 128, 132, Some(2048 + 5))? == (2048, 1, 1));
            ensure!(composed::grid(Stage::S7, &big, 128, 132, Some(7))? == (7, 1, 1));
            // D = 128 too.
            let d128 = Shape::new(4, 16, 4096, 128);
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, None)? == (132, 1, 1));
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, Some(usize::MAX))? == (2048, 1, 1));
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, Some(7))? == (7, 1, 1));
            // The mission shape: 8 heads × 4 query tiles, fewer units than SMs.
            ensure!(
                composed::grid(Stage::S7, &Shape::new(1, 8, 512, 64), 128, 132, None)?
                    == (32, 1, 1)
            );
            // Sq far past a 2-D grid's 65535 tiles is one more unit count in x.
            ensure!(
                composed::grid(
                    Stage::S7,
                    &Shape::new(1, 1, 128 * 70000, 64),
                    128,
                    132,
                    None
                )?
                .0 == 132
            );
            let e = format!(
                "{:#}",
                composed::grid(Stage::S7, &Shape::new(1, 1, 128, 64), 128, 132, Some(0))
                    .unwrap_err()
            );
            ensure!(e.contains("0 blocks"), "{e}");
            Ok(())
        },
    );
    t.model(
        "schedule_sections_hold_16_mib_of_k_and_v_in_whole_groups",
        || {
            // 2·Sk·D bytes of K and V a K/V head: 1 MiB at (Sk, D) = (4096, 128), so 16 K/V heads a section.
            let s = |b, h, sk, d| Shape::new(b, h, sk, d);
            ensure!(composed::schedule_section(&s(4, 16, 4096, 128)) == 16);
            ensure!(composed::schedule_section(&s(4, 32, 4096, 128).with_kv_heads(8)?) == 64);
            ensure!(composed::schedule_section(&s(1, 16, 16384, 128)) == 4);
            ensure!(composed::schedule_section(&s(4, 16, 4096, 64)) == 32);
            // One group at least, however long the keys; every head at most.
            ensure!(composed::schedule_section(&s(1, 8, 1 << 20, 128).with_kv_heads(2)?) == 4);
            ensure!(composed::schedule_section(&s(1, 8, 512, 64)) == 8);
            Ok(())
        },
    );
    t.model(
        "stage6_halves_its_blocks_only_when_they_would_leave_half_the_sms_idle",
        || {
            let rows = |stage: Stage, b, h, sq| stage.rows_for(&Shape::new(b, h, sq, 64), 132);
            // The mission shape: 8 heads × 4 tiles of 128 = 32 blocks on 132 SMs → 64 blocks of 64 rows.
            ensure!(rows(Stage::S6, 1, 8, 512) == 64);
            // 66 blocks of 128 fill exactly half: halved; 67 do not.
            ensure!(rows(Stage::S6, 1, 66, 128) == 64 && rows(Stage::S6, 1, 67, 128) == 128);
            ensure!(rows(Stage::S6, 4, 16, 4096) == 128);
            // Stage 7's pingpong needs both consumers; stage 5 has no producer to spare them.
            ensure!(rows(Stage::S7, 1, 8, 512) == 128 && rows(Stage::S5, 1, 8, 512) == 128);
            Ok(())
        },
    );
    t.model("hopper_stages_elsewhere_are_refused_by_name", || {
        // An sm_90a stage on an sm_80 / sm_89 device: a clear error before any launch, not a launch failure.
        for stage in [Stage::S5, Stage::S6, Stage::S7] {
            for arch in [lab::Arch::Sm80, lab::Arch::Sm89] {
                let e = format!("{:#}", stage.kernel(64).target_for(arch).unwrap_err());
                ensure!(
                    e.contains(&format!("{}_d64", stage.name())) && e.contains("sm_90a"),
                    "{arch}: {e}"
                );
            }
            ensure!(stage.kernel(128).target_for(lab::Arch::Sm90)? == lab::Arch::Sm90a);
            ensure!(stage.needs().starts_with("sm_90a"), "{}", stage.needs());
        }
        Ok(())
    });
    t.compile("trace::stage7_traced_build_keeps_its_budget", || {
        // The timeline's marks (a pointer and a count in registers, a store a mark) must not change the kind of
        // code traced: no spills, no serialised wgmma, stage 7's own budget.
        for d in composed::DIMS {
            let spec = composed::trace::traced_kernel(d)?;
            let (cubin, r) = spec.compile(lab::Arch::Sm90a)?;
            let v = spec.violations(&cubin, &r)?;
            ensure!(v.is_empty(), "traced stage7_d{d}: {}", v.join("; "));
        }
        Ok(())
    });
    t.compile("hopper_gemms_run_on_qgmma_and_loads_on_tma", || {
        // Q·Kᵀ is D/32 QGMMA a tile and P·V bc/32: exactly those, and no HMMA (no f16 fallback); stage 6 loads
        // Q, K and Vᵀ with UTMALDG (Q's two boxes, K, Vᵀ) and reads nothing else from global memory but the
        // three scales (LDG); stage 7 also reads its split tail's table (sdpa::SplitTable: split, pieces, its piece's
        // bounds and parts, and where they are: 6 LDG in its producer), and stores O with UTMASTG.
        for stage in [Stage::S5, Stage::S6, Stage::S7] {
            for d in composed::DIMS {
                let spec = stage.kernel(d);
                let (cubin, _) = spec.compile(lab::Arch::Sm90a)?;
                let h = lab::sass::histogram(&cubin, spec.name)?;
                // Stage 7 peels its first and last turns: each GEMM appears twice in its code.
                let want = (d / 32 + stage.bc(d) / 32) * if stage == Stage::S7 { 2 } else { 1 };
                ensure!(
                    h.get("QGMMA") == Some(&want) && !h.contains_key("HMMA"),
                    "{}: QGMMA {:?} (want {want}), HMMA {:?}",
                    spec.name,
                    h.get("QGMMA"),
                    h.get("HMMA")
                );
                if stage.tma() {
                    ensure!(
                        h.get("UTMALDG").is_some_and(|&n| n >= 3)
                            && !h.contains_key("LDGSTS")
                            && h.get("LDG")
                                .is_none_or(|&n| n <= if stage == Stage::S7 { 9 } else { 3 }),
                        "{}: UTMALDG {:?}, LDGSTS {:?}, LDG {:?}",
                        spec.name,
                        h.get("UTMALDG"),
                        h.get("LDGSTS"),
                        h.get("LDG")
                    );
                }
                if stage.tma_store() {
                    // O (bf16, f16) leaves by TMA stores, a 64-column panel each; only f32 O and the LSE by STG.
                    ensure!(
                        h.get("UTMASTG").is_some_and(|&n| n >= 1),
                        "{}: UTMASTG {:?}",
                        spec.name,
                        h.get("UTMASTG")
                    );
                }
            }
        }
        Ok(())
    });
    for (sq, sk, d) in [(5, 77, 64), (130, 300, 128), (1, 1, 128), (64, 4096, 64)] {
        t.gpu(&format!("transpose_v::sk{sk}_d{d}"), move |gpu| {
            check_transpose_v(gpu, &composed::TRANSPOSE_V, Shape::cross(2, 3, sq, sk, d))
        });
    }
    for (sk, d) in [(77, 128), (4096, 128), (224, 128), (225, 64)] {
        t.gpu(&format!("vt_tiles::sk{sk}_d{d}"), move |gpu| {
            check_vt_tiles(gpu, &composed::VT_TILES, Shape::cross(2, 3, 5, sk, d))
        });
    }
    t.gpu("vt_tiles::mutant_unswizzled_is_caught", |gpu| {
        let m = composed::VT_TILES.mutated_source("((seg ^ (ch / 4 % 2)) * 16)", "(seg * 16)")?;
        match check_vt_tiles(gpu, &m, Shape::cross(1, 2, 5, 300, 128)) {
            Err(e) => {
                eprintln!("mutant caught: {e:#}");
                Ok(())
            }
            Ok(()) => anyhow::bail!("tile images without the 32-byte swizzle passed"),
        }
    });
    t.gpu("transpose_v::mutant_without_p_key_order_is_caught", |gpu| {
        let m = composed::TRANSPOSE_V.mutated_source(
            "rows[vt_key(16 * seg + k) * stride + cq]",
            "rows[(16 * seg + k) * stride + cq]",
        )?;
        match check_transpose_v(gpu, &m, Shape::cross(1, 2, 5, 77, 64)) {
            Err(e) => {
                eprintln!("mutant caught: {e:#}");
                Ok(())
            }
            Ok(()) => anyhow::bail!("a transpose in plain key order passed"),
        }
    });
    for case in matrix() {
        for stage in Stage::ALL {
            let case = case.clone();
            t.gpu(
                &format!("matrix::{}::{}", stage.name(), case.name),
                move |gpu: &Gpu| {
                    let p = prepared(&case);
                    let dev = run_as(gpu, stage, &p.qz, case.out)?;
                    check(stage, &case, &p, &dev)?;
                    if stage == Stage::S3a {
                        let s2 = run_as(gpu, Stage::S2, &p.qz, case.out)?;
                        ensure!(
                            s2.o.iter()
                                .zip(&dev.o)
                                .all(|(a, b)| a.to_bits() == b.to_bits())
                                && s2
                                    .lse
                                    .iter()
                                    .zip(&dev.lse)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{}: stage3a differs from stage2",
                            case.name
                        );
                    }
                    Ok(())
                },
            );
        }
    }
    t.model("a_nan_code_is_named_with_its_index", || {
        let mut qz = quantize_per_head(&normal(Shape::new(1, 2, 600, 128), 3));
        qz.k[70_000] = 0xFF;
        let e = format!("{:#}", composed::validate(&qz).unwrap_err());
        ensure!(
            e.contains("tensor `k` holds an E4M3 NaN code at index 70000"),
            "{e}"
        );
        Ok(())
    });
    t.model("an_underflowing_score_scale_is_refused", || {
        let mut qz = quantize_per_head(&normal(Shape::new(1, 2, 64, 64), 4));
        qz.q_scale[1] = 1e-30;
        qz.k_scale[1] = 1e-30;
        let e = format!("{:#}", composed::validate(&qz).unwrap_err());
        ensure!(
            e.contains("q_scale[1] · k_scale[1]") && e.contains("underflows"),
            "{e}"
        );
        qz.q_scale[1] = 1e-10;
        qz.k_scale[1] = 1e-10;
        composed::validate(&qz)?;
        Ok(())
    });
    t.gpu("memory_errors_say_how_much", |gpu| {
        let e = format!(
            "{:#}",
            OnDevice::check_fits(gpu, &Shape::new(1024, 64, 65536, 128), OutDtype::F32)
                .unwrap_err()
        );
        ensure!(
            e.contains("needs") && e.contains("GiB free of") && e.contains("Q 512.00 GiB"),
            "{e}"
        );
        Ok(())
    });
    for stage in Stage::ALL {
        t.gpu(&format!("over_2_31_elements::{}", stage.name()), move |gpu| {
            // 64-bit offsets: Q, K, V and O of more than 2^31 elements, 524,800 heads (grid x), checked on every
            // row of ~2,000 heads spread over the whole tensor, the last included, by FlashAttention's rule
            // against the f64 reference and the emulation of those heads. One stage at a time: each needs ~11 GB
            // of the device (13 with the TMA stages' Vᵀ), and the tests of a binary run in parallel.
            static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
            let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
            let qz = huge();
            let s = qz.shape;
            let heads: Vec<usize> = (0..s.heads()).step_by(263).chain([s.heads() - 1]).collect();
            let rows: Vec<usize> = heads.iter().flat_map(|&h| h * s.sq..(h + 1) * s.sq).collect();
            let mut d = OnDevice::upload(gpu, qz)?;
            d.launch(gpu, stage)?;
            let got = d.download_rows(gpu, &rows)?;
            drop(d);
            let mini = subset(qz, &heads);
            let r = reference(&mini);
            let emu = emulation_of(stage, &mini, OutDtype::F16);
            rule(stage, &mini, &r, &emu, &got, "over 2^31 elements", |e, e_emu| {
                eprintln!(
                    "{}: >2^31 elements, {} rows of {} heads checked: {e} | emulation max_abs={e_emu:.3e}",
                    stage.name(),
                    rows.len(),
                    heads.len()
                )
            })
        });
        t.gpu(&format!("out_dtype_tiny::{}", stage.name()), move |gpu| {
            // The user report behind bf16 O: inputs × 1e-6 came back with rel-L2 0.17 in f16. In bf16 the same
            // problem is as accurate as any other; in f16 it still is not (O below f16's normal range).
            let qz = quantize_per_head(&tiny_values(Shape::new(1, 2, 200, 64), 23));
            let r = reference(&qz);
            let rel = |out| -> Result<f64> {
                let dev = run_as(gpu, stage, &qz, out)?;
                let none = Tolerance {
                    atol: 0.0,
                    rtol: 0.0,
                };
                Ok(error_stats(&dev.o, &r.o, none).rel_l2)
            };
            let (bf, h) = (rel(OutDtype::Bf16)?, rel(OutDtype::F16)?);
            let bound = if stage.fp8_p() { 5e-2 } else { 1e-2 };
            ensure!(bf < bound, "bf16 O rel-L2 {bf:.3e} (bound {bound:.0e})");
            ensure!(
                h > 5.0 * bf,
                "f16 O rel-L2 {h:.3e}: the case no longer shows the f16 loss"
            );
            eprintln!(
                "{}: tiny inputs, O rel-L2 bf16 {bf:.3e}, f16 {h:.3e}",
                stage.name()
            );
            Ok(())
        });
        t.gpu(&format!("deterministic::{}", stage.name()), move |gpu| {
            let qz = quantize_per_head(&normal(Shape::new(1, 8, 512, 64), 42));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, stage)?;
            let a = d.download(gpu)?;
            d.launch(gpu, stage)?;
            let b = d.download(gpu)?;
            ensure!(
                a.o.iter()
                    .zip(&b.o)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "O differs between two runs"
            );
            ensure!(
                a.lse
                    .iter()
                    .zip(&b.lse)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "LSE differs between two runs"
            );
            Ok(())
        });
    }
    for (scheme, shapes) in device_schemes() {
        t.gpu(
            &format!("device_quantization::{}", scheme.name()),
            move |gpu| {
                for (shape, dist) in shapes {
                    check_device_scheme(gpu, &composed::Prep::default(), scheme, shape, dist)?;
                }
                Ok(())
            },
        );
    }
    t.gpu("device_quantization::mutants_are_caught", |gpu| {
        let all = fixtures::Scheme {
            per: fixtures::Granularity::PerHead,
            smooth_k: true,
            rotate: fixtures::Rotate::HadamardSigns,
        };
        let base = composed::Prep::default();
        for (what, prep) in [
            (
                "the mean added instead of subtracted",
                composed::Prep {
                    smooth_k: base
                        .smooth_k
                        .mutated_source("kh[(long long)j * d] -= m", "kh[(long long)j * d] += m")?,
                    ..base
                },
            ),
            (
                "the LSE shift without the softmax scale",
                composed::Prep {
                    lse_shift: base
                        .lse_shift
                        .mutated_source("(float)((double)softmax_scale * dot)", "(float)dot")?,
                    ..base
                },
            ),
        ] {
            match check_device_scheme(
                gpu,
                &prep,
                all,
                Shape::cross(2, 3, 77, 130, 64),
                fixtures::Dist::Normal,
            ) {
                Err(e) => eprintln!("mutant `{what}` caught: {e:#}"),
                Ok(()) => anyhow::bail!("the mutant `{what}` passed"),
            }
        }
        Ok(())
    });
    t.gpu("sdpa_run_end_to_end_with_remedies", |_gpu| {
        // The CLI as a user runs it: an F32 file, quantized on the GPU with both remedies, every row checked, O
        // written; the written O must be the unquantized problem's within the FP8 error.
        use safetensors::tensor::{Dtype, TensorView};
        let shape = Shape::cross(1, 2, 150, 260, 128);
        let raw = Raw::generate(shape, 5, fixtures::Dist::KBias);
        let dir = std::env::temp_dir().join(format!("sdpa-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
        let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let (qb, kb, vb) = (bytes(&raw.q), bytes(&raw.k), bytes(&raw.v));
        let dims = |s: usize| vec![shape.b, shape.h, s, shape.d];
        let views = [
            ("q", TensorView::new(Dtype::F32, dims(shape.sq), &qb)?),
            ("k", TensorView::new(Dtype::F32, dims(shape.sk), &kb)?),
            ("v", TensorView::new(Dtype::F32, dims(shape.sk), &vb)?),
        ];
        std::fs::write(&input, safetensors::serialize(views, None)?)?;
        let args = composed::app::Args::try_parse_from([
            "sdpa", "run", "--stage", "stage5", "--check", "full", "--smooth-k", "--rotate", "hadamard",
            "--out-dtype", "f32", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap(),
        ])?;
        composed::app::execute(args)?;
        let out = std::fs::read(&output)?;
        let st = safetensors::SafeTensors::deserialize(&out)?;
        let f32s = |name: &str| -> Result<Vec<f32>> {
            Ok(st.tensor(name)?.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        };
        let (o, lse) = (f32s("o")?, f32s("lse")?);
        std::fs::remove_dir_all(&dir)?;
        let r = reference_unquantized(&raw, 1.0 / (shape.d as f32).sqrt());
        let e = error_stats(&o, &r.o, Tolerance { atol: 0.0, rtol: 0.0 });
        let lse_err = lse.iter().zip(&r.lse).map(|(&a, &b)| (f64::from(a) - b).abs()).fold(0.0, f64::max);
        ensure!(e.rel_l2 < 0.1 && lse_err < 0.1, "sdpa run's O rel-L2 {:.3e}, LSE max abs {lse_err:.3e}", e.rel_l2);
        eprintln!("sdpa run --smooth-k --rotate hadamard on k-bias inputs: written O {e}; LSE max abs {lse_err:.3e}");
        Ok(())
    });
    for (stage, (name, shape)) in Stage::ALL
        .into_iter()
        .filter(|s| s.causal())
        .flat_map(|s| causal_shapes().into_iter().map(move |c| (s, c)))
    {
        t.gpu(&format!("causal::{}::{name}", stage.name()), move |gpu| {
            let qz = quantize_per_head(&normal(shape, 31));
            let dev = run_as(gpu, stage, &qz, OutDtype::F16)?;
            let r = reference(&qz);
            let emu = emulation_of(stage, &qz, OutDtype::F16);
            let blind = shape.sq.saturating_sub(shape.sk) * shape.heads();
            rule(stage, &qz, &r, &emu, &dev, &name, |e, e_emu| {
                eprintln!("{} causal {name}: {e} | emulation max_abs={e_emu:.3e}; {blind} rows see no key", stage.name())
            })?;
            // The mask is the point: the same problem without it must come out different.
            let open = run_as(gpu, stage, &Quantized { shape: shape.with_causal(false), ..qz.clone() }, OutDtype::F16)?;
            ensure!(
                shape.sq * shape.sk == 1 || open.o.iter().zip(&dev.o).any(|(a, b)| a != b),
                "{name}: causal and non-causal O are identical"
            );
            Ok(())
        });
    }
    for (stage, (name, shape)) in Stage::ALL
        .into_iter()
        .filter(|s| s.gqa())
        .flat_map(|s| gqa_shapes().into_iter().map(move |c| (s, c)))
    {
        t.gpu(&format!("gqa::{}::{name}", stage.name()), move |gpu| {
            let qz = quantize_per_head(&normal(shape, 41));
            let dev = run_as(gpu, stage, &qz, OutDtype::F32)?;
            let r = reference(&qz);
            let emu = emulation_of(stage, &qz, OutDtype::F32);
            rule(stage, &qz, &r, &emu, &dev, &name, |e, e_emu| {
                eprintln!(
                    "{} gqa {name}: {e} | emulation max_abs={e_emu:.3e}",
                    stage.name()
                )
            })?;
            // The same problem with every K/V head repeated for its query heads, as ordinary attention: the
            // kernel must give the same bits (the group mapping checked without fixtures' own mapping).
            let wide = expand_kv(&qz);
            let same = run_as(gpu, stage, &wide, OutDtype::F32)?;
            ensure!(
                dev.o
                    .iter()
                    .zip(&same.o)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
                    && dev
                        .lse
                        .iter()
                        .zip(&same.lse)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: grouped-query O / LSE differ from the same heads repeated"
            );
            Ok(())
        });
    }
    for (name, shape) in persistent_shapes() {
        t.gpu(&format!("persistent::stage7::{name}"), move |gpu| {
            // A persistent block runs several units in turn, reusing ring slots and Q buffers across them. The
            // units must come out as they do one a block (each unit's arithmetic is the same wherever it runs:
            // bit-identical), and that launch by the rule against the f64 reference and the emulation.
            let stage = Stage::S7;
            ensure!(stage.persistent(), "stage7 is not persistent");
            let qz = quantize_per_head(&normal(shape, 53));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.use_blocks(Some(usize::MAX));
            d.launch(gpu, stage)?;
            let one = d.download(gpu)?;
            rule(stage, &qz, &reference(&qz), &emulation_of(stage, &qz, OutDtype::F16), &one, &name, |e, e_emu| {
                eprintln!("stage7 persistent {name}, one unit a block: {e} | emulation max_abs={e_emu:.3e}")
            })?;
            // Twice at each block count, the outputs poisoned before each launch: a unit the counter skipped (or a
            // counter left nonzero by the launch before) leaves poison, which the download refuses. Where the host
            // splits the tail (SplitPlan: some units' key tiles shared by two or three blocks, merged after), the
            // merged units are other bits: those launches by the rule, and bit-identical to each other.
            let sections = [None, Some(1), Some(3.min(shape.heads())), None, Some(2.min(shape.heads())), None, None];
            let mut split: Option<(Option<usize>, Attention<f32>)> = None;
            for (blocks, section) in [Some(1), Some(2), Some(5), Some(3), Some(3), None, None].into_iter().zip(sections) {
                d.use_blocks(blocks);
                d.use_section(section);
                d.poison_outputs(gpu)?;
                d.launch(gpu, stage)?;
                let got = d.download(gpu)?;
                let plan = d.split_plan(gpu, stage)?;
                if plan.pieces == 0 {
                    ensure!(
                        bit_identical(&got, &one),
                        "{name}: {blocks:?} blocks (sections of {section:?} heads) give other O / LSE than one unit a block"
                    );
                    continue;
                }
                ensure!(!shape.causal, "{name}: a causal tail split ({plan:?})");
                rule(stage, &qz, &reference(&qz), &emulation_of(stage, &qz, OutDtype::F16), &got, &name, |e, e_emu| {
                    eprintln!("stage7 persistent {name}, {blocks:?} blocks, split {plan:?}: {e} | emulation max_abs={e_emu:.3e}")
                })?;
                if let Some((b, before)) = &split
                    && *b == blocks
                {
                    ensure!(bit_identical(&got, before), "{name}: two launches of one split plan give other bits");
                }
                split = Some((blocks, got));
            }
            Ok(())
        });
    }
    for stage in Stage::ALL.into_iter().filter(|s| s.tma()) {
        t.gpu(&format!("vt_prep_in_every_launch::{}", stage.name()), move |gpu| {
            // Timing a TMA stage with its V transpose (time_vt_prep) remakes Vᵀ in place before every launch:
            // the same bytes, so the same O and LSE as with Vᵀ made once.
            for (i, shape) in [Shape::new(1, 2, 200, 64), Shape::cross(1, 2, 130, 300, 128)].into_iter().enumerate() {
                let qz = quantize_per_head(&normal(shape, 61 + i as u64));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.launch(gpu, stage)?;
                let once = d.download(gpu)?;
                d.time_vt_prep(true);
                for _ in 0..2 {
                    d.launch(gpu, stage)?;
                    ensure!(
                        bit_identical(&d.download(gpu)?, &once),
                        "{} {shape:?}: O / LSE with Vᵀ remade in the launch differ from Vᵀ made once",
                        stage.name()
                    );
                }
            }
            Ok(())
        });
    }
    for (name, shape, blocks, out) in split_cases() {
        t.gpu(&format!("split::stage7::{name}"), move |gpu| {
            // The split tail (SplitPlan): the units past `split` cut into one piece a block, each part's O, m and l
            // written apart and merged by stage7_merge_dD. By the rule against the f64 reference at every output
            // dtype (the merge writes O itself), bit-identical across launches, and the plan must split.
            let qz = quantize_per_head(&normal(shape, 73));
            let mut d = OnDevice::upload_as(gpu, &qz, out)?;
            d.use_blocks(Some(blocks));
            let plan = d.split_plan(gpu, Stage::S7)?;
            ensure!(
                plan.pieces > 0,
                "{name}: no split at {blocks} blocks ({plan:?})"
            );
            d.launch(gpu, Stage::S7)?;
            let got = d.download(gpu)?;
            rule(
                Stage::S7,
                &qz,
                &reference(&qz),
                &emulation_of(Stage::S7, &qz, out),
                &got,
                &name,
                |e, e_emu| {
                    eprintln!("stage7 split {name} ({plan:?}): {e} | emulation max_abs={e_emu:.3e}")
                },
            )?;
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S7)?;
            ensure!(
                bit_identical(&d.download(gpu)?, &got),
                "{name}: a second launch gives other bits"
            );
            Ok(())
        });
    }
    for (mutant, from, to) in [
        // Every part merged with weight 1: the parts' rows kept against their own maxima.
        (
            "unweighted_merge",
            "w[j] = m == wr::neg_inf() ? 0.0f : __expf(lse[j] - m);",
            "w[j] = 1.0f;",
        ),
        // A part's O and LSE written over its unit's own head, not its virtual one.
        (
            "parts_to_own_head",
            "const int obh = dst < 0 ? bh : dst / p.q_tiles",
            "const int obh = bh",
        ),
        // A part's keys masked as if it started at key tile 0: the unit's last, partial tile unmasked.
        ("part_columns_from_zero", ": p.sk - k0 * BC;", ": p.sk;"),
    ] {
        t.gpu(
            &format!("split::stage7::mutant_{mutant}_is_caught"),
            move |gpu| {
                let shape = Shape::new(1, 4, 1000, 128);
                let qz = quantize_per_head(&normal(shape, 79));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.use_blocks(Some(5));
                ensure!(
                    d.split_plan(gpu, Stage::S7)?.pieces > 0,
                    "no split to mutate"
                );
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(
                    "pingpong_attention.cuh",
                    from,
                    to,
                )?));
                d.launch(gpu, Stage::S7)?;
                let bad = d.download(gpu)?;
                let emu = emulation_of(Stage::S7, &qz, OutDtype::F16);
                match rule(
                    Stage::S7,
                    &qz,
                    &reference(&qz),
                    &emu,
                    &bad,
                    mutant,
                    |_, _| {},
                ) {
                    Err(e) => eprintln!("mutant `{mutant}` caught: {e:#}"),
                    Ok(()) => anyhow::bail!("the mutant `{mutant}` passed the rule"),
                }
                Ok(())
            },
        );
    }
    t.gpu(
        "persistent::stage7::mutant_reading_one_q_buffer_is_caught",
        |gpu| {
            // Q's second buffer ignored by the consumers: a block's odd units read the even units' Q.
            let shape = Shape::cross(1, 3, 300, 500, 64);
            let qz = quantize_per_head(&normal(shape, 59));
            let m = Stage::S7.kernel(64).mutated(
                "pingpong_attention.cuh",
                "blk.q_tile(n, wg)",
                "blk.q_tile(0, wg)",
            )?;
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S7)?;
            let good = d.download(gpu)?;
            d.use_kernel(Some(m));
            d.use_blocks(Some(2));
            d.launch(gpu, Stage::S7)?;
            let bad = d.download(gpu)?;
            ensure!(
                !bit_identical(&good, &bad),
                "the kernel reading only Q's first buffer gave the same O and LSE"
            );
            eprintln!("mutant caught: one Q buffer read for every unit changes O");
            Ok(())
        },
    );
    for (mutant, from, to) in [
        ("counter_left_nonzero", "p.sched[0] = 0;", ""),
        (
            "every_other_ticket",
            "atomicAdd(p.sched, 1)",
            "atomicAdd(p.sched, 2)",
        ),
    ] {
        t.gpu(
            &format!("persistent::stage7::mutant_{mutant}_is_caught"),
            move |gpu| {
                // The schedule's counter not set back to zero by the last block (the next launch's blocks then take
                // no unit past their first), or tickets that skip units: the poisoned outputs of the second launch
                // keep elements no unit wrote.
                let shape = Shape::new(1, 4, 1000, 128).with_causal(true);
                let qz = quantize_per_head(&normal(shape, 67));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.launch(gpu, Stage::S7)?;
                let good = d.download(gpu)?;
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(
                    "pingpong_attention.cuh",
                    from,
                    to,
                )?));
                d.use_blocks(Some(3));
                let mut caught = false;
                for _ in 0..2 {
                    d.poison_outputs(gpu)?;
                    d.launch(gpu, Stage::S7)?;
                    caught |= match d.download(gpu) {
                        Ok(bad) => !bit_identical(&good, &bad),
                        Err(e) => format!("{e:#}").contains("never written by the kernel"),
                    };
                }
                ensure!(
                    caught,
                    "the {mutant} mutant wrote every unit as the kernel does"
                );
                eprintln!("mutant caught: {mutant} leaves units unwritten");
                Ok(())
            },
        );
    }
    t.gpu("o_store::stage7::mutant_panel_column_is_caught", |gpu| {
        // Every panel of O stored at column 0 (the TMA store's column coordinate lost): at D = 128 the second
        // panel overwrites the first and columns 64..127 stay as poisoned; at D = 64 (one panel) nothing changes.
        let shape = Shape::cross(1, 2, 300, 500, 128);
        let qz = quantize_per_head(&normal(shape, 71));
        let mut d = OnDevice::upload(gpu, &qz)?;
        d.launch(gpu, Stage::S7)?;
        let good = d.download(gpu)?;
        d.use_kernel(Some(Stage::S7.kernel(128).mutated(
            "pingpong_attention.cuh",
            "tma::store_4d(mo, so, 64 * P, row0, bh, 0)",
            "tma::store_4d(mo, so, 0, row0, bh, 0)",
        )?));
        d.poison_outputs(gpu)?;
        d.launch(gpu, Stage::S7)?;
        let caught = match d.download(gpu) {
            Ok(bad) => !bit_identical(&good, &bad),
            Err(e) => format!("{e:#}").contains("never written by the kernel"),
        };
        ensure!(caught, "O's panels all stored at column 0 went unnoticed");
        eprintln!("mutant caught: O's second panel stored over its first");
        Ok(())
    });
    t.gpu(
        "rescale::stage7::skipping_changes_no_bit_and_mutants_are_caught",
        |gpu| {
            // A warp skips O's rescale only when every row's α is 1 exactly, so the skip must give the same bits as
            // rescaling always; a vote that skips when one row held (all instead of any), or that sees one of a
            // lane's two rows, must change O.
            let shape = Shape::cross(1, 4, 700, 1000, 128);
            let qz = quantize_per_head(&normal(shape, 73));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S7)?;
            let good = d.download(gpu)?;
            let vote = "__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)";
            for (what, to, same) in [
                ("rescale always", "true", true),
                (
                    "all rows must grow",
                    "__all_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)",
                    false,
                ),
                (
                    "the first row only",
                    "__any_sync(0xffffffffu, alpha[0] != 1.0f)",
                    false,
                ),
            ] {
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(
                    "pingpong_attention.cuh",
                    vote,
                    to,
                )?));
                d.launch(gpu, Stage::S7)?;
                let got = d.download(gpu)?;
                if same {
                    ensure!(
                        bit_identical(&good, &got),
                        "skipping the rescale changed O or the LSE against `{what}`"
                    );
                } else {
                    ensure!(
                        !bit_identical(&good, &got),
                        "the mutant `{what}` gave the same O and LSE"
                    );
                    eprintln!("mutant caught: the rescale vote with {what}");
                }
            }
            Ok(())
        },
    );
    // One test for both head dimensions: their kernels share a module, and so its trace buffer.
    t.gpu(
        "trace::stage7_timeline_is_whole_and_changes_nothing",
        |gpu| {
            for shape in [
                Shape::cross(2, 3, 600, 450, 128),
                Shape::cross(1, 2, 300, 1000, 64),
            ] {
                {
                    // `sdpa trace`'s build of stage 7 (clock64 marks) writes the same O and LSE, bit for bit, and its
                    // two blocks' consumer warps mark whole turns: every unit a first turn and a last, a softmax in
                    // every turn but the last, and per consumer warp T + 1 turns for a unit of T key tiles.
                    let qz = quantize_per_head(&normal(shape, 73));
                    let mut d = OnDevice::upload(gpu, &qz)?;
                    d.use_blocks(Some(2));
                    d.launch(gpu, Stage::S7)?;
                    let plain = d.download(gpu)?;
                    let lines = composed::trace::record(gpu, &mut d, shape.d, 1)?;
                    ensure!(
                        bit_identical(&d.download(gpu)?, &plain),
                        "{shape:?}: the traced kernel's O / LSE differ"
                    );
                    let units = shape.heads() * shape.sq.div_ceil(128);
                    let tiles = shape.sk.div_ceil(Stage::S7.bc(shape.d));
                    for warp in 0..8 {
                        let (mut u, mut turns) = (0, 0);
                        for l in lines.iter().filter(|l| l.warp == warp) {
                            let t = composed::trace::turns(l).context("marks out of order")?;
                            ensure!(
                                t.iter().all(|x| x.softmax.is_some() != x.last),
                                "warp {warp}: a softmax in a last turn, or none in another"
                            );
                            let firsts = t.iter().filter(|x| x.first).count();
                            ensure!(firsts == t.iter().filter(|x| x.last).count());
                            u += firsts;
                            turns += t.len();
                        }
                        ensure!(
                            u == units && turns == units * (tiles + 1),
                            "warp {warp}: {u} units and {turns} turns traced, want {units} and {}",
                            units * (tiles + 1)
                        );
                    }
                    let s = composed::trace::summarize(&lines)?;
                    ensure!(
                        s.period > 0.0 && s.softmax > 0.0 && s.softmax < s.period,
                        "{s}"
                    );
                    eprintln!("{shape:?}: {s}");
                }
            }
            Ok(())
        },
    );
    t.gpu("gqa::other_stages_refuse_it_by_name", |gpu| {
        let shape = Shape::new(1, 4, 64, 64).with_kv_heads(2)?;
        refused_by_the_others(gpu, shape, Stage::gqa, "has no grouped-query attention")
    });
    t.gpu("causal::other_stages_refuse_it_by_name", |gpu| {
        let shape = Shape::new(1, 1, 64, 64).with_causal(true);
        refused_by_the_others(gpu, shape, Stage::causal, "has no causal masking")
    });
    t.model("rotation_of_an_unsupported_d_is_named", || {
        let raw = normal(Shape::new(1, 1, 4, 96), 1);
        let scheme = fixtures::Scheme {
            rotate: fixtures::Rotate::Hadamard,
            ..Default::default()
        };
        let e = format!("{:#}", fixtures::prepare(&raw, scheme).unwrap_err());
        ensure!(e.contains("D = 96") && e.contains("Hadamard"), "{e}");
        Ok(())
    });
    t.run()
}

/// prep_vt against its host model, byte for byte (every position of every padded row).
fn check_transpose_v(gpu: &Gpu, spec: &lab::KernelSpec, shape: Shape) -> Result<()> {
    let qz = quantize_per_head(&normal(shape, 9));
    let dv = gpu.stream.clone_htod(&qz.v)?;
    let got = gpu.stream.clone_dtoh(&composed::transpose_v_with(
        gpu,
        spec,
        &gpu.stream,
        &dv,
        &shape,
    )?)?;
    let want = composed::transpose_v_model(&qz.v, &shape);
    ensure!(
        got.len() == want.len(),
        "{} bytes, want {}",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        let kp = composed::vt_keys(shape.sk);
        anyhow::bail!(
            "{shape:?}: Vᵀ head {} channel {} position {}: device {:#04x}, model {:#04x}",
            i / (shape.d * kp),
            i / kp % shape.d,
            i % kp,
            got[i],
            want[i]
        );
    }
    eprintln!("Vᵀ {shape:?}: {} bytes bit-exact to the model", want.len());
    Ok(())
}

/// prep_vt_tiles against its host model (stage 7's tiles at D = 128: 224 keys), byte for byte.
fn check_vt_tiles(gpu: &Gpu, spec: &lab::KernelSpec, shape: Shape) -> Result<()> {
    let bc = Stage::S7.bc(128);
    let qz = quantize_per_head(&normal(shape, 10));
    let dv = gpu.stream.clone_htod(&qz.v)?;
    let got = gpu.stream.clone_dtoh(&composed::vt_tiles_with(
        gpu,
        spec,
        &gpu.stream,
        &dv,
        &shape,
        bc,
    )?)?;
    let want = composed::vt_tiles_model(&qz.v, &shape, bc);
    ensure!(
        got.len() == want.len() && want.len() == composed::vt_tiles_bytes(&shape, bc),
        "{} bytes, want {}",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        let tile = bc * shape.d;
        anyhow::bail!(
            "{shape:?}: Vᵀ tile image {} byte {}: device {:#04x}, model {:#04x}",
            i / tile,
            i % tile,
            got[i],
            want[i]
        );
    }
    eprintln!(
        "Vᵀ tile images {shape:?}: {} bytes bit-exact to the model",
        want.len()
    );
    Ok(())
}

/// The schemes the device pipeline is checked on, each with its shapes and input families: several heads,
/// Sq ≠ Sk, both D, outliers (where the remedies matter).
fn device_schemes() -> Vec<(fixtures::Scheme, Vec<(Shape, fixtures::Dist)>)> {
    use fixtures::{Dist, Granularity, Rotate, Scheme};
    let shapes = vec![
        (Shape::cross(2, 3, 77, 130, 64), Dist::Normal),
        (
            Shape::cross(1, 2, 300, 200, 128),
            Dist::Outliers {
                factor: 30.0,
                both: true,
            },
        ),
        (Shape::new(3, 1, 129, 128), Dist::KBias),
        (Shape::new(1, 2, 64, 64), Dist::HeavyTail),
        (
            Shape::cross(2, 4, 70, 150, 128)
                .with_kv_heads(2)
                .expect("4 / 2"),
            Dist::KBias,
        ),
    ];
    let mut v = Vec::new();
    for per in [Granularity::PerHead, Granularity::PerTensor] {
        for smooth_k in [false, true] {
            for rotate in Rotate::ALL {
                v.push((
                    Scheme {
                        per,
                        smooth_k,
                        rotate,
                    },
                    shapes.clone(),
                ));
            }
        }
    }
    v
}

/// Device quantization against its host model, bit for bit (codes, scales, LSE shift); then stage 5 (stage 4
/// off Hopper) on the device's inputs against the f64 reference on the unquantized inputs: the remedies must
/// leave O and the LSE those of the problem given.
fn check_device_scheme(
    gpu: &Gpu,
    prep: &composed::Prep,
    scheme: fixtures::Scheme,
    shape: Shape,
    dist: fixtures::Dist,
) -> Result<()> {
    let raw = Raw::generate(shape, 77, dist);
    let want = fixtures::prepare(&raw, scheme)?;
    let mut d = OnDevice::prepare_with(gpu, prep, &raw, scheme, OutDtype::F32)?;
    let got = d.quantized(gpu)?;
    let what = format!("{} on {dist} {shape:?}", scheme.name());
    for (name, g, w) in [
        ("q", &got.q, &want.qz.q),
        ("k", &got.k, &want.qz.k),
        ("v", &got.v, &want.qz.v),
    ] {
        if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
            anyhow::bail!(
                "{what}: `{name}` code {i}: device {:#04x}, model {:#04x}",
                g[i],
                w[i]
            );
        }
    }
    for (name, g, w) in [
        ("q_scale", &got.q_scale, &want.qz.q_scale),
        ("k_scale", &got.k_scale, &want.qz.k_scale),
        ("v_scale", &got.v_scale, &want.qz.v_scale),
    ] {
        ensure!(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: `{name}` device {g:?}, model {w:?}"
        );
    }
    let rows: Vec<usize> = (0..shape.heads() * shape.sq).collect();
    let shift = d.lse_shift_rows(gpu, &rows)?;
    let want_shift = want
        .lse_shift
        .clone()
        .unwrap_or_else(|| vec![0.0; rows.len()]);
    ensure!(
        shift
            .iter()
            .zip(&want_shift)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: LSE shift differs from the model"
    );
    let stage = if shape.group() > 1 {
        Stage::S7
    } else if gpu.arch >= lab::Arch::Sm90 {
        Stage::S5
    } else {
        Stage::S4
    };
    d.launch(gpu, stage)?;
    let out = d.download(gpu)?;
    // The kernel on the device's codes, by the stage's own rule (FlashAttention's, against the f64 reference and
    // the emulation of the dequantized, smoothed, rotated inputs); the LSE as the stage wrote it, before the
    // shift (checked bit for bit above) is added back. Where Q and K both carry outlier channels, scores run
    // to the hundreds and wgmma's FP8 accumulation (2^-11.7 of Σ|q·k|, wgmma::FP8_ACCUMULATION_EPS) moves them
    // by ~0.1, which the f32-accumulating emulation does not model: O then differs from it by up to ~0.5 on a
    // few elements (measured on the H100, 2026-11-22), so there the check is O's rel-L2 (observed ≤ 1.5e-2).
    let deq = reference(&got);
    let own = Attention {
        o: out.o.clone(),
        lse: gpu.stream.clone_dtoh(&d.lse)?,
    };
    let e_deq = error_stats(&own.o, &deq.o, Tolerance::exact()).rel_l2;
    if matches!(dist, fixtures::Dist::Outliers { both: true, .. }) {
        ensure!(
            e_deq < 0.03,
            "{what}: {stage:?} against f64 on its dequantized inputs: O rel-L2 {e_deq:.3e} (bound 0.03)"
        );
    } else {
        rule(
            stage,
            &got,
            &deq,
            &emulation_of(stage, &got, OutDtype::F32),
            &own,
            &what,
            |_, _| {},
        )?;
    }
    // Against the unquantized inputs: the remedies must leave O and the LSE those of the problem given. A
    // wrong rotation gives O of another problem (rel-L2 ~1); a missing or reversed shift moves the LSE by
    // softmax_scale·q·μ, large on k-bias inputs. On the outlier families the FP8 error itself is that large,
    // so they are checked only above.
    let r = reference_unquantized(&raw, got.softmax_scale);
    let e = error_stats(&out.o, &r.o, Tolerance::exact());
    let lse_err = out
        .lse
        .iter()
        .zip(&r.lse)
        .map(|(&a, &b)| (f64::from(a) - b).abs())
        .fold(0.0, f64::max);
    let shift_max = want_shift
        .iter()
        .fold(0.0f64, |a, &s| a.max(f64::from(s).abs()));
    match dist {
        fixtures::Dist::Normal => ensure!(
            e.rel_l2 < 0.1 && lse_err < 0.1,
            "{what}: {stage:?} O rel-L2 {:.3e} (bound 0.1), LSE max abs {lse_err:.3e} (bound 0.1) against the unquantized inputs",
            e.rel_l2
        ),
        fixtures::Dist::KBias if scheme.smooth_k => ensure!(
            e.rel_l2 < 0.1 && lse_err < 0.25 * shift_max,
            "{what}: {stage:?} O rel-L2 {:.3e} (bound 0.1), LSE max abs {lse_err:.3e} (bound a quarter of the largest shift, {shift_max:.3e}) against the unquantized inputs",
            e.rel_l2
        ),
        _ => {}
    }
    eprintln!(
        "{what}: bit-exact to the model; {} on the dequantized inputs: O rel-L2 {:.3e}; on the unquantized inputs: O max abs {:.3e}, mean abs {:.3e}, rel-L2 {:.3e}, LSE max abs {lse_err:.3e} (largest shift {shift_max:.2e})",
        stage.name(),
        e_deq,
        e.max_abs,
        e.mean_abs,
        e.rel_l2
    );
    Ok(())
}
