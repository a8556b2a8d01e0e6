// online-softmax's test binary: the register-level update over many tilings and masks, and its broken variants.
use anyhow::{Result, bail, ensure};
use half::f16;
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, Tolerance, check_written, error_stats, poisoned};
use lab::{Gpu, KernelSpec, Suite};
use online_softmax::*;

const ROWS: usize = 16;

fn problem(seed: u64, sk: usize, scores: impl Fn(&mut Inputs, usize, usize) -> f32) -> Problem {
    let mut inp = Inputs::seeded(seed);
    let v = inp
        .normal(sk * D, 0.0, 1.0)
        .into_iter()
        .map(|x| f16::from_f32(x).to_f32())
        .collect();
    let mut s = vec![0.0f32; ROWS * sk];
    for r in 0..ROWS {
        for j in 0..sk {
            s[r * sk + j] = scores(&mut inp, r, j);
        }
    }
    Problem {
        rows: ROWS,
        sk,
        d: D,
        s,
        v,
        scale: 1.0 / (D as f32).sqrt(),
    }
}

fn normal(std: f32) -> impl Fn(&mut Inputs, usize, usize) -> f32 {
    move |inp, _, _| inp.normal(1, 0.0, std)[0]
}

fn scenarios() -> Vec<(String, Problem)> {
    let mut v = Vec::new();
    for (i, sk) in [1usize, 16, 17, 33, 64, 100, 257].into_iter().enumerate() {
        v.push((
            format!("random sk={sk}"),
            problem(i as u64, sk, normal(4.0)),
        ));
    }
    v.push((
        "max grows every tile".into(),
        problem(20, 100, |inp, _, j| {
            0.3 * j as f32 + inp.normal(1, 0.0, 1.0)[0]
        }),
    ));
    v.push((
        "large logits (std 60)".into(),
        problem(21, 90, normal(60.0)),
    ));
    v.push(("equal scores".into(), problem(22, 75, |_, _, _| 1.5)));
    v.push((
        "masked rows".into(),
        problem(23, 70, |inp, r, j| {
            let x = inp.normal(1, 0.0, 3.0)[0];
            match r {
                0 => f32::NEG_INFINITY,               // nothing to attend to
                1 if j < 40 => f32::NEG_INFINITY,     // whole first tiles masked
                2 if j != 69 => f32::NEG_INFINITY,    // one key, in the partial last tile
                3 if j % 2 == 1 => f32::NEG_INFINITY, // every other key
                _ => x,
            }
        }),
    ));
    v
}

/// Windows per row over a few problems (row r over columns lo[r] .. hi[r] − 1): the whole row, a window inside one
/// tile, windows across tile edges and into the partial last tile, one key, empty (lo = hi, lo > hi, past Sk), and a
/// window whose right edge is past Sk (clipped there).
fn window_scenarios() -> Vec<(String, Problem, Vec<i32>, Vec<i32>)> {
    let mut v = Vec::new();
    for (i, sk) in [16usize, 45, 100].into_iter().enumerate() {
        let p = problem(40 + i as u64, sk, normal(4.0));
        let n = sk as i32;
        let rows: [(i32, i32); ROWS] = [
            (0, n),
            (3, 9),
            (15, 17),
            (1, n + 5),
            (n - 1, n),
            (7, 7),
            (9, 4),
            (n, n + 3),
            (0, 1),
            (16, 32),
            (5, n - 2),
            (31, 33),
            (2, 40),
            (n / 2, n / 2 + 1),
            (17, n),
            (0, 0),
        ];
        let (lo, hi): (Vec<i32>, Vec<i32>) = rows.into_iter().unzip();
        v.push((format!("windows over sk={sk}"), p, lo, hi));
    }
    v
}

/// The model's problem for a window per row (columns past Sk stay out whatever hi says).
fn window_problem(p: &Problem, lo: &[i32], hi: &[i32]) -> Problem {
    let (lo, hi): (Vec<usize>, Vec<usize>) = lo
        .iter()
        .zip(hi)
        .map(|(&l, &h)| (l.max(0) as usize, (h.max(0) as usize).min(p.sk)))
        .unzip();
    windowed(p, &lo, &hi)
}

/// What a test kernel takes beyond S, V, sk and skp: the problem's one scale, one scale a row instead
/// (`attend_rows_*`), or the scale and a window per row (`attend_window_bc16`: row r over columns lo[r] .. hi[r] − 1).
enum Extra<'a> {
    Scale,
    Rows(&'a [f32]),
    Window(&'a [i32], &'a [i32]),
}

/// Runs `spec` (tiles of `bc` keys) on `p`: O [16][64], LSE [16].
fn attend(gpu: &Gpu, spec: &KernelSpec, bc: usize, p: &Problem) -> Result<Out<f32>> {
    attend_in(gpu, spec, bc, p, Extra::Scale)
}

/// As attend, with what the kernel takes beyond S, V, sk and skp.
fn attend_in(
    gpu: &Gpu,
    spec: &KernelSpec,
    bc: usize,
    p: &Problem,
    extra: Extra,
) -> Result<Out<f32>> {
    let skp = p.sk.div_ceil(bc) * bc;
    // Columns past sk hold NaN: the mask must keep them out. V rows past sk are zero, as the ring delivers them.
    let mut s = vec![f32::NAN; ROWS * skp];
    for r in 0..ROWS {
        s[r * skp..r * skp + p.sk].copy_from_slice(&p.s[r * p.sk..(r + 1) * p.sk]);
    }
    let mut v = vec![f16::ZERO; skp * D];
    for (dst, &x) in v.iter_mut().zip(&p.v) {
        *dst = f16::from_f32(x);
    }
    let k = gpu.load(spec)?;
    let st = &gpu.stream;
    let (ds, dv) = (st.clone_htod(&s)?, st.clone_htod(&v)?);
    let mut o = st.clone_htod(&poisoned::<f32>(ROWS * D))?;
    let mut lse = st.clone_htod(&poisoned::<f32>(ROWS))?;
    let (sk, skp_i, scale) = (p.sk as i32, skp as i32, p.scale);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (win, rows) = match extra {
        Extra::Scale => (None, None),
        Extra::Rows(r) => (None, Some(st.clone_htod(r)?)),
        Extra::Window(lo, hi) => (Some((st.clone_htod(lo)?, st.clone_htod(hi)?)), None),
    };
    let mut b = st.launch_builder(&k.func);
    b.arg(&ds).arg(&dv).arg(&sk).arg(&skp_i);
    match &rows {
        Some(r) => b.arg(r),
        None => b.arg(&scale),
    };
    if let Some((lo, hi)) = &win {
        b.arg(lo).arg(hi);
    }
    b.arg(&mut o).arg(&mut lse);
    // SAFETY: attend_*(const float* S[16][skp], const __half* V[skp][64], int sk, int skp, float scale or const
    // float* row_scale[16], [const int* lo[16], const int* hi[16],] float* O[16][64], float* lse[16]), one warp.
    unsafe { b.launch(cfg)? };
    let out = Out {
        o: st.clone_dtoh(&o)?,
        lse: st.clone_dtoh(&lse)?,
    };
    check_written(&out.o, "O")?;
    check_written(&out.lse, "LSE")?;
    Ok(out)
}

/// The tolerance rule: error against the f64 reference at most twice the f32 emulation's plus a noise floor,
/// and within the stated bound; LSE likewise; rows with no finite score exactly O = 0, LSE = −inf.
fn check(what: &str, p: &Problem, bc: usize, dev: &Out<f32>, verbose: bool) -> Result<()> {
    check_against(what, p, bc, dev, verbose, &one_shot(p), &mirror_f32(p, bc))
}

/// `check` against a given f64 reference and f32 emulation of `p` (a model of another form of the problem:
/// `with_row_scales`).
fn check_against(
    what: &str,
    p: &Problem,
    bc: usize,
    dev: &Out<f32>,
    verbose: bool,
    reference: &Out<f64>,
    mirror: &Out<f32>,
) -> Result<()> {
    let floor = 2f64.powi(-20) * p.max_abs_v();
    let (e_dev, e_mir) = (
        max_abs_diff(&dev.o, &reference.o),
        max_abs_diff(&mirror.o, &reference.o),
    );
    ensure!(
        e_dev <= 2.0 * e_mir + floor,
        "{what}: O error {e_dev:.3e} > 2 × emulation's {e_mir:.3e} + {floor:.1e}"
    );
    ensure!(
        e_dev <= o_bound(p),
        "{what}: O error {e_dev:.3e} beyond the stated bound {:.3e}",
        o_bound(p)
    );
    let e_mir_lse = max_abs_diff(&mirror.lse, &reference.lse);
    for r in 0..ROWS {
        let (got, want) = (f64::from(dev.lse[r]), reference.lse[r]);
        if want == f64::NEG_INFINITY {
            ensure!(
                got == want,
                "{what}: row {r} has no finite score, LSE {got} (want -inf)"
            );
            ensure!(
                dev.o[r * D..(r + 1) * D].iter().all(|&x| x == 0.0),
                "{what}: row {r} has no finite score, O ≠ 0"
            );
        } else {
            let tol = 2.0 * e_mir_lse + 8.0 * 2f64.powi(-24) * (1.0 + want.abs());
            ensure!(
                (got - want).abs() <= tol,
                "{what}: row {r} LSE {got} vs {want} (tolerance {tol:.2e})"
            );
        }
    }
    if verbose {
        let stats = error_stats(
            &dev.o,
            &reference.o,
            Tolerance {
                atol: o_bound(p),
                rtol: 0.0,
            },
        );
        eprintln!("{what} (Bc={bc}): O vs f64 {stats}; emulation max_abs={e_mir:.3e}");
    }
    Ok(())
}

fn run_all(gpu: &Gpu, spec: &KernelSpec, bc: usize) -> Result<()> {
    for (what, p) in scenarios() {
        check(&what, &p, bc, &attend(gpu, spec, bc, &p)?, true)?;
    }
    Ok(())
}

/// A scale for each of the 16 rows, from a third to three times the problem's, no two alike (a lane's two rows, r and
/// r + 8, differ): rows of different query heads in one tile.
fn row_scales(p: &Problem) -> Vec<f32> {
    (0..ROWS)
        .map(|r| p.scale * 2f32.powf((r as f32 - 7.5) / 5.0))
        .collect()
}

/// Every scenario through `spec` (an `attend_rows_*` kernel) at `row_scales`, against the model row by row.
fn rows_pass(gpu: &Gpu, spec: &KernelSpec, verbose: bool) -> Result<()> {
    for (what, p) in scenarios() {
        let scales = row_scales(&p);
        let dev = attend_in(gpu, spec, 16, &p, Extra::Rows(&scales))?;
        let reference = with_row_scales(&p, &scales, one_shot);
        let mirror = with_row_scales(&p, &scales, |q| mirror_f32(q, 16));
        check_against(&what, &p, 16, &dev, verbose, &reference, &mirror)?;
    }
    Ok(())
}

fn must_fail(gpu: &Gpu, what: &str, spec: &KernelSpec) -> Result<()> {
    for (name, p) in scenarios() {
        if let Err(e) = check(&name, &p, 16, &attend(gpu, spec, 16, &p)?, false) {
            eprintln!("mutant `{what}` caught: {e}");
            return Ok(());
        }
    }
    bail!("mutant `{what}` passed every scenario: the suite cannot see it")
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    t.gpu("update_bc16_matches_the_model", |gpu| {
        run_all(gpu, &ATTEND_BC16, 16)
    });
    t.gpu("update_bc32_matches_the_model", |gpu| {
        run_all(gpu, &ATTEND_BC32, 32)
    });
    t.gpu("two_runs_are_bit_identical", |gpu| {
        let p = &scenarios()[5].1;
        let (a, b) = (
            attend(gpu, &ATTEND_BC32, 32, p)?,
            attend(gpu, &ATTEND_BC32, 32, p)?,
        );
        ensure!(
            a.o.iter()
                .zip(&b.o)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "O differs between runs"
        );
        ensure!(
            a.lse
                .iter()
                .zip(&b.lse)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "LSE differs between runs"
        );
        Ok(())
    });
    t.gpu("pieces_match_the_model", |gpu| {
        run_all(gpu, &ATTEND_PIECES_BC16, 16)
    });
    t.gpu("pieces_are_bit_identical_to_step", |gpu| {
        for (what, p) in scenarios() {
            let (a, b) = (
                attend(gpu, &ATTEND_BC16, 16, &p)?,
                attend(gpu, &ATTEND_PIECES_BC16, 16, &p)?,
            );
            let same =
                |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
            ensure!(
                same(&a.o, &b.o),
                "{what}: O of the pieces differs from step's"
            );
            ensure!(
                same(&a.lse, &b.lse),
                "{what}: LSE of the pieces differs from step's"
            );
        }
        Ok(())
    });
    t.gpu("window_matches_the_model", |gpu| {
        for (what, p, lo, hi) in window_scenarios() {
            let dev = attend_in(gpu, &ATTEND_WINDOW_BC16, 16, &p, Extra::Window(&lo, &hi))?;
            check(&what, &window_problem(&p, &lo, &hi), 16, &dev, true)?;
        }
        Ok(())
    });
    // The left edge off by one: a row's first visible key's left neighbour kept.
    t.gpu("mutant_caught::window_left_edge_off_by_one", |gpu| {
        let bad = ATTEND_WINDOW_BC16.mutated(
            "online_softmax.cuh",
            "+ L::col(lane, i) < lo[frag::acc_half(i)]) s[f].x[i] = wr::neg_inf();",
            "+ L::col(lane, i) < lo[frag::acc_half(i)] - 1) s[f].x[i] = wr::neg_inf();",
        )?;
        for (what, p, lo, hi) in window_scenarios() {
            let dev = attend_in(gpu, &bad, 16, &p, Extra::Window(&lo, &hi))?;
            if let Err(e) = check(&what, &window_problem(&p, &lo, &hi), 16, &dev, false) {
                eprintln!("mutant `window left edge off by one` caught: {e}");
                return Ok(());
            }
        }
        bail!("the window's left edge off by one passed every scenario")
    });
    for (name, spec) in [
        ("row_scales_match_the_model", ATTEND_ROWS_BC16),
        (
            "row_scales_in_pieces_match_the_model",
            ATTEND_ROWS_PIECES_BC16,
        ),
    ] {
        t.gpu(name, move |gpu| rows_pass(gpu, &spec, true));
    }
    t.gpu("row_scales_all_equal_are_the_one_scale_s_bits", |gpu| {
        // The same scale on every row: bit for bit the kernel with the one float (its arithmetic, row by row).
        for (what, p) in scenarios() {
            let (a, b) = (
                attend(gpu, &ATTEND_BC16, 16, &p)?,
                attend_in(
                    gpu,
                    &ATTEND_ROWS_BC16,
                    16,
                    &p,
                    Extra::Rows(&[p.scale; ROWS]),
                )?,
            );
            let same =
                |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
            ensure!(
                same(&a.o, &b.o) && same(&a.lse, &b.lse),
                "{what}: equal row scales give other bits than the one scale"
            );
        }
        Ok(())
    });
    for (what, spec, from, to) in [
        (
            "row scales: every row at row 0 scale",
            ATTEND_ROWS_BC16,
            "return c.c[h]; }",
            "return c.c[0]; }",
        ),
        (
            "row scales: pieces exponentials at row 0 scale",
            ATTEND_ROWS_PIECES_BC16,
            "fmaf(x[i], row_c(c, frag::acc_half(i)),",
            "fmaf(x[i], row_c(c, 0),",
        ),
    ] {
        t.gpu(
            &format!(
                "mutant_caught::{}",
                what.replace(": ", "_").replace(' ', "_")
            ),
            move |gpu| {
                let bad = spec.mutated("online_softmax.cuh", from, to)?;
                if rows_pass(gpu, &bad, false).is_err() {
                    eprintln!("mutant `{what}` caught");
                    return Ok(());
                }
                bail!("mutant `{what}` passed every scenario: the suite cannot see it")
            },
        );
    }
    let piece_mutants: [(&str, &str, &str); 3] = [
        (
            "pieces: exponentials with row 0's bias",
            "bias[frag::acc_half(i)]));",
            "bias[0]));",
        ),
        (
            "pieces: partial tile not masked",
            "if (col0 + L::kCols > min(limit[0], limit[1])) {",
            "if (false) {",
        ),
        (
            "pieces: l not rescaled",
            "st.l[h] = fmaf(alpha[h], st.l[h], wr::quad(v, wr::SumOp{}));",
            "st.l[h] = st.l[h] + wr::quad(v, wr::SumOp{});",
        ),
    ];
    for (what, from, to) in piece_mutants {
        t.gpu(
            &format!(
                "mutant_caught::{}",
                what.replace(": ", "_").replace(' ', "_")
            ),
            move |gpu| {
                must_fail(
                    gpu,
                    what,
                    &ATTEND_PIECES_BC16.mutated("online_softmax.cuh", from, to)?,
                )
            },
        );
    }
    let mutants: [(&str, &str, &str, &str); 5] = [
        (
            "reduce over the wrong lanes",
            "frag_layout.cuh",
            "kQuadXorMasks[2] = {1, 2}",
            "kQuadXorMasks[2] = {1, 4}",
        ),
        (
            "O not rescaled",
            "online_softmax.cuh",
            "o[f].x[i] *= alpha[frag::acc_half(i)];",
            "(void)alpha;",
        ),
        (
            "l not rescaled",
            "online_softmax.cuh",
            "st.l[h] = fmaf(alpha[h], st.l[h], ps[h]);",
            "st.l[h] = st.l[h] + ps[h];",
        ),
        (
            "-inf guard removed from m",
            "online_softmax.cuh",
            "m_use[h] = m_new == wr::neg_inf() ? 0.0f : m_new;",
            "m_use[h] = m_new;",
        ),
        (
            "l = 0 guard removed from finish",
            "online_softmax.cuh",
            "inv[h] = st.l[h] > 0.0f ? 1.0f / st.l[h] : 0.0f;",
            "inv[h] = 1.0f / st.l[h];",
        ),
    ];
    for (what, header, from, to) in mutants {
        t.gpu(
            &format!("mutant_caught::{}", what.replace(' ', "_")),
            move |gpu| must_fail(gpu, what, &ATTEND_BC16.mutated(header, from, to)?),
        );
    }
    t.run()
}
