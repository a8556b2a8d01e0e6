// warp-reduce's test binary: every shape on random, integer and adversarial tiles, plus broken variants.
use anyhow::{Result, bail, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, Tolerance, check_written, error_stats, poisoned};
use lab::{Gpu, KernelSpec, Suite};
use warp_reduce::*;

/// One case: a tile and which of its columns are real.
struct Case {
    what: String,
    tile: Vec<f32>,
    kv_valid: usize,
    /// A causal diagonal: row r keeps columns ≤ r + diag too (per-row limits, `rows_limited`).
    diag: Option<usize>,
}

impl Case {
    fn mask(&self) -> Mask {
        Mask {
            kv_valid: self.kv_valid,
            diag: self.diag,
        }
    }
}

fn cases(s: &Shape) -> Vec<Case> {
    let (n, cols) = (ROWS * s.cols(), s.cols());
    let mut v = Vec::new();
    for seed in 0..3 {
        v.push(Case {
            what: format!("normal seed {seed}"),
            tile: Inputs::seeded(seed).normal(n, 0.0, 3.0),
            kv_valid: cols,
            diag: None,
        });
    }
    v.push(Case {
        what: "integers (exact sums)".into(),
        tile: Inputs::seeded(4).integers(n, -1000, 1000),
        kv_valid: cols,
        diag: None,
    });
    let sweep = Inputs::seeded(5).normal(n, 1.0, 2.0);
    for kv in 0..=cols {
        v.push(Case {
            what: format!("kv_valid {kv}"),
            tile: sweep.clone(),
            kv_valid: kv,
            diag: None,
        });
    }
    let mut inf_rows = Inputs::seeded(6).normal(n, 0.0, 1.0);
    for r in [0, 9, 15] {
        inf_rows[r * cols..(r + 1) * cols].fill(f32::NEG_INFINITY);
    }
    v.push(Case {
        what: "rows all -inf".into(),
        tile: inf_rows,
        kv_valid: cols,
        diag: None,
    });
    let huge: Vec<f32> = Inputs::seeded(7)
        .bits_u32(n)
        .iter()
        .map(|b| if b & 1 == 0 { 3.0e38 } else { -3.0e38 })
        .collect();
    v.push(Case {
        what: "±3e38 (partial sums overflow)".into(),
        tile: huge,
        kv_valid: cols,
        diag: None,
    });
    v.push(Case {
        what: "single valid column".into(),
        tile: Inputs::seeded(8).normal(n, 0.0, 1.0),
        kv_valid: 1,
        diag: None,
    });
    let mut nan = Inputs::seeded(9).normal(n, 0.0, 1.0);
    nan[3 * cols + cols / 2] = f32::NAN; // valid: must propagate
    nan[5 * cols + cols - 1] = f32::NAN; // masked: must not
    v.push(Case {
        what: "NaN valid in row 3, masked in row 5".into(),
        tile: nan,
        kv_valid: cols - 1,
        diag: None,
    });
    let mut zeros = Inputs::seeded(10).normal(n, 0.0, 1.0);
    zeros[2 * cols..3 * cols].fill(-0.0);
    zeros[2 * cols + cols - 1] = 0.0;
    zeros[4 * cols..5 * cols].fill(-0.0);
    v.push(Case {
        what: "signed zeros".into(),
        tile: zeros,
        kv_valid: cols,
        diag: None,
    });
    // Per-row limits: every row its own; row 0 of diagonal 0 keeps one column; with kv_valid below the
    // diagonal's reach the two limits take turns.
    let tri = Inputs::seeded(11).normal(n, 0.5, 2.0);
    for (diag, kv) in [(0, cols), (3, cols), (1, cols / 2 + 1), (cols, cols - 2)] {
        v.push(Case {
            what: format!("causal diagonal {diag}, kv_valid {kv}"),
            tile: tri.clone(),
            kv_valid: kv,
            diag: Some(diag),
        });
    }
    v
}

/// Runs the kernel of `shape` (from `spec`) on one case: (row max, row sum).
fn launch(
    gpu: &Gpu,
    spec: &KernelSpec,
    shape: &Shape,
    case: &Case,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let k = gpu.load(spec)?;
    let s = &gpu.stream;
    let tile = s.clone_htod(&case.tile)?;
    let mut out = s.clone_htod(&poisoned::<f32>(2 * ROWS))?;
    let kv = case.kv_valid as i32;
    let diag = case.diag.map_or(-1, |d| d as i32);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32 * shape.wn as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: reduce_*(const float* tile[16][cols], int kv_valid, int diag, float* out[32]), wn warps.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&tile)
            .arg(&kv)
            .arg(&diag)
            .arg(&mut out)
            .launch(cfg)?
    };
    let out = s.clone_dtoh(&out)?;
    check_written(&out, &format!("{} {}", spec.name, case.what))?;
    Ok((out[..ROWS].to_vec(), out[ROWS..].to_vec()))
}

/// Every row of one case against the model; the first disagreement as an error.
fn check_case(shape: &Shape, case: &Case, mx: &[f32], sm: &[f32]) -> Result<()> {
    let (want_mx, want_sm) = (
        row_max(shape, &case.tile, case.mask()),
        row_sum_device(shape, &case.tile, case.mask()),
    );
    let (exact, abs) = (
        row_sum_exact(shape, &case.tile, case.mask()),
        row_abs_sum(shape, &case.tile, case.mask()),
    );
    for r in 0..ROWS {
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        ensure!(
            same(mx[r], want_mx[r]),
            "{}: row {r} max {:e} ({:#x}), model {:e} ({:#x})",
            case.what,
            mx[r],
            mx[r].to_bits(),
            want_mx[r],
            want_mx[r].to_bits()
        );
        ensure!(
            same(sm[r], want_sm[r]),
            "{}: row {r} sum {:e}, model (device order) {:e}",
            case.what,
            sm[r],
            want_sm[r]
        );
        if exact[r].is_finite() && abs[r] < f32::MAX as f64 {
            let bound = gamma(shape.sum_depth()) * abs[r];
            ensure!(
                (f64::from(sm[r]) - exact[r]).abs() <= bound,
                "{}: row {r} sum {} vs exact {} beyond γ·Σ|x| = {bound:e}",
                case.what,
                sm[r],
                exact[r]
            );
        }
    }
    Ok(())
}

fn run_shape(gpu: &Gpu, shape: &Shape) -> Result<()> {
    let spec = kernel(shape);
    let (mut got, mut want): (Vec<f32>, Vec<f64>) = (Vec::new(), Vec::new());
    let all = cases(shape);
    for case in &all {
        let (mx, sm) = launch(gpu, &spec, shape, case)?;
        check_case(shape, case, &mx, &sm)?;
        if case.what.starts_with("normal") {
            got.extend(&sm);
            want.extend(row_sum_exact(shape, &case.tile, case.mask()));
        }
    }
    let stats = error_stats(
        &got,
        &want,
        Tolerance {
            atol: 0.0,
            rtol: gamma(shape.sum_depth()) * 10.0,
        },
    );
    eprintln!(
        "{}: {} cases, max bit-exact, sums bit-exact to the f32 order; sums vs f64: {stats}",
        spec.name,
        all.len()
    );
    Ok(())
}

/// The mutant must fail at least one case.
fn must_fail(gpu: &Gpu, what: &str, shape: &Shape, spec: &KernelSpec) -> Result<()> {
    for case in cases(shape) {
        let (mx, sm) = launch(gpu, spec, shape, &case)?;
        if let Err(e) = check_case(shape, &case, &mx, &sm) {
            eprintln!("mutant `{what}` caught: {e}");
            return Ok(());
        }
    }
    bail!("mutant `{what}` passed every case: the suite cannot see it")
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    for shape in SHAPES {
        t.gpu(&format!("rows::{}", shape.kernel()), move |gpu| {
            run_shape(gpu, shape)
        });
    }
    let wide = Shape::new(Frag::MmaC, 8, 1);
    t.gpu("mutant_wrong_lanes_is_caught", move |gpu| {
        let m = kernel(&wide).mutated(
            "frag_layout.cuh",
            "kQuadXorMasks[2] = {1, 2}",
            "kQuadXorMasks[2] = {1, 4}",
        )?;
        must_fail(gpu, "quad shuffle over lanes xor 4", &wide, &m)
    });
    t.gpu("mutant_mask_off_by_one_is_caught", move |gpu| {
        let m = kernel(&wide).mutated("warp_reduce.cuh", "c < limit[h]", "c <= limit[h]")?;
        must_fail(gpu, "mask keeps column kv_valid", &wide, &m)
    });
    t.gpu("mutant_one_limit_for_both_rows_is_caught", move |gpu| {
        let m = kernel(&wide).mutated("warp_reduce.cuh", "c < limit[h]", "c < limit[0]")?;
        must_fail(gpu, "row 8's limit taken from row 0", &wide, &m)
    });
    t.gpu("mutant_fmaxf_drops_nan_is_caught", move |gpu| {
        let m = kernel(&wide).mutated("warp_reduce.cuh", "max.NaN.f32 %0", "max.f32 %0")?;
        must_fail(gpu, "max through plain fmaxf", &wide, &m)
    });
    t.gpu(
        "mutant_sum_chains_out_of_step_with_the_model_is_caught",
        move |gpu| {
            // The sum's partials are part of its bits: one chain on the device while the model keeps two.
            let m = kernel(&wide).mutated(
                "warp_reduce.cuh",
                "struct SumOp {\n  static constexpr int kChains = 2;",
                "struct SumOp {\n  static constexpr int kChains = 1;",
            )?;
            must_fail(gpu, "one sum chain against the model's two", &wide, &m)
        },
    );
    t.gpu(
        "mutant_max_chains_dropping_a_partial_is_caught",
        move |gpu| {
            let m = kernel(&wide).mutated(
                "warp_reduce.cuh",
                "for (int j = 1; j < K; ++j) v[0] = op(v[0], v[j]);",
                "for (int j = 1; j < K - 1; ++j) v[0] = op(v[0], v[j]);",
            )?;
            must_fail(gpu, "the last partial left out of the fold", &wide, &m)
        },
    );
    let multi = Shape::new(Frag::WmmaAcc, 2, 4);
    t.gpu("mutant_one_warp_only_is_caught", move |gpu| {
        let m = kernel(&multi).mutated(
            "warp_reduce.cuh",
            "for (int w = 1; w < WN; ++w)",
            "for (int w = 1; w < 1; ++w)",
        )?;
        must_fail(gpu, "cross-warp fold skips warps 1..", &multi, &m)
    });
    t.run()
}
