// The correctness matrix and the shape lists the GPU tests walk: inputs, cases, their prepared references.
use crate::prelude::*;

/// One row of the matrix: a name and how to make its inputs.
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub make: fn(Shape, u64) -> Raw,
    pub shape: Shape,
    pub seed: u64,
    /// One scale per tensor instead of one per (b, h).
    pub per_tensor: bool,
    /// What the stage writes O as.
    pub out: OutDtype,
}

pub fn normal(shape: Shape, seed: u64) -> Raw {
    Raw::random(shape, seed, 1.0)
}
pub fn equal_scores(shape: Shape, seed: u64) -> Raw {
    let mut r = Raw::random(shape, seed, 1.0);
    r.q.fill(0.0); // every score 0: softmax uniform, O the mean of V
    r
}
pub fn tiny_values(shape: Shape, seed: u64) -> Raw {
    // Q, K, V × 1e-6: the codes are the same after per-head scaling, O is ~1e-7 (subnormal in f16).
    let mut r = Raw::random(shape, seed, 1e-6);
    r.v.iter_mut().for_each(|x| *x *= 1e-6);
    r
}
pub fn large_logits(shape: Shape, seed: u64) -> Raw {
    Raw::random(shape, seed, 6.0) // |scale·q·k| up to the hundreds
}
pub fn e4m3_limits(shape: Shape, seed: u64) -> Raw {
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

pub fn matrix() -> Vec<Case> {
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
pub struct Prepared {
    pub raw: Raw,
    pub qz: Quantized,
    pub reference: Attention<f64>,
    /// The f16-P stages' rounding points (tiles of `bc(d)` keys).
    pub emulation: Attention<f32>,
    /// The FP8 wgmma stages': P × 2^8 rounded to E4M3, one per key-tile width (`FP8_TILES`: the online
    /// softmax rounds at tile boundaries, so stages with different tiles round differently); made on first use.
    emulation_fp8: [OnceLock<Attention<f32>>; FP8_TILES.len()],
    pub out: OutDtype,
}

impl Prepared {
    pub fn emulation_for(&self, stage: Stage) -> &Attention<f32> {
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
pub const FP8_TILES: [usize; 4] = [128, 192, 224, 256];

/// The stage's rounding points on `qz` (P in f16 over `bc(d)`-key tiles, or P × 2⁸ in E4M3 over `bc(d)`-key tiles
/// for the FP8 wgmma stage), O rounded to `out`.
pub fn emulation_of(stage: Stage, qz: &Quantized, out: OutDtype) -> Attention<f32> {
    let bc = stage.bc(qz.shape.d);
    if stage.fp8_p() {
        emulate_fp8p(qz, bc, composed::FP8_P_OFFSET, out)
    } else {
        emulate(qz, bc, out)
    }
}

/// Case name → its inputs and references, filled by whichever stage's test gets there first.
pub type Cache = Mutex<HashMap<String, Arc<OnceLock<Arc<Prepared>>>>>;

pub fn prepared(case: &Case) -> Arc<Prepared> {
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
pub fn refused_by_the_others(
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
/// causal mask and Sq ≠ Sk, D = 64, 128 and 256.
pub fn gqa_shapes() -> Vec<(String, Shape)> {
    grouped(vec![
        (Shape::new(1, 8, 256, 128), 2, false),
        (Shape::cross(2, 4, 130, 200, 64), 1, false),
        (Shape::new(1, 8, 300, 128), 4, true),
        (Shape::cross(2, 6, 77, 129, 64), 3, true),
        (Shape::cross(2, 4, 130, 200, 256), 1, false),
        (Shape::new(1, 8, 300, 256), 2, true),
    ])
}

/// Stage 7's persistent cases (both head dimensions, `Stage::persistent`): several units a block at small block
/// counts, units of different key-tile counts (causal, Sq ≠ Sk) taken longest first, grouped-query heads, partial
/// query and key tiles; causal ones also in schedule sections of one and of three heads (`OnDevice::use_section`).
pub fn persistent_shapes() -> Vec<(String, Shape)> {
    grouped(vec![
        (Shape::cross(1, 3, 700, 900, 64), 3, true),
        (Shape::cross(2, 4, 600, 450, 64), 2, false),
        (Shape::cross(1, 2, 520, 300, 64), 1, true),
        (Shape::new(1, 4, 1000, 64), 4, false),
        (Shape::new(2, 2, 384, 64), 2, true),
        (Shape::cross(1, 4, 700, 1000, 128), 2, true),
        (Shape::cross(2, 3, 600, 450, 128), 3, false),
        (Shape::new(1, 2, 900, 128), 1, true),
        (Shape::cross(1, 4, 700, 600, 256), 2, true),
        (Shape::cross(2, 3, 300, 450, 256), 3, false),
    ])
}

/// Stage 7's split-tail cases: (name, shape, blocks, O's dtype), each a plan that splits (the test checks), at both
/// head dimensions, Sk a multiple of the key tile and not, pieces of under and over a unit, grouped-query heads.
pub fn split_cases() -> Vec<(String, Shape, usize, OutDtype)> {
    [
        (Shape::new(1, 4, 1000, 128), 5, OutDtype::F16),
        (Shape::cross(2, 3, 600, 900, 128), 4, OutDtype::Bf16),
        (Shape::cross(1, 3, 520, 448, 128), 7, OutDtype::F32),
        (Shape::cross(1, 2, 1000, 2000, 64), 3, OutDtype::F16),
        (Shape::cross(2, 2, 300, 1024, 64), 5, OutDtype::F32),
        (Shape::new(1, 4, 1000, 256), 5, OutDtype::Bf16),
        (Shape::cross(1, 2, 520, 900, 256), 3, OutDtype::F32),
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
pub fn grouped(cases: Vec<(Shape, usize, bool)>) -> Vec<(String, Shape)> {
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
pub fn bit_identical(a: &Attention<f32>, b: &Attention<f32>) -> bool {
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

/// Whether a mutant's download shows it: O or the LSE in other bits than `good`, or outputs the kernel never wrote
/// (which `download` refuses by name).
pub fn mutant_shows(got: Result<Attention<f32>>, good: &Attention<f32>) -> bool {
    match got {
        Ok(bad) => !bit_identical(good, &bad),
        Err(e) => format!("{e:#}").contains("never written by the kernel"),
    }
}

/// `qz` with every K/V head (codes and scales) repeated for each query head that reads it: the same problem
/// as ordinary attention.
pub fn expand_kv(qz: &Quantized) -> Quantized {
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
pub fn causal_shapes() -> Vec<(String, Shape)> {
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
        Shape::cross(1, 2, 300, 200, 256),
        Shape::cross(1, 2, 130, 333, 256),
        Shape::new(1, 2, 260, 256),
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
