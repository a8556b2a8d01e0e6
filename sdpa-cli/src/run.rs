// `sdpa run`: one stage on a safetensors file, checked against the f64 reference, timed, outputs written.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::ValueEnum;
use fixtures::{OutDtype, Scheme};
use fp8_attention::{Problem, Stage};
use lab::numerics::{ErrorStats, Tolerance, error_stats};

use crate::args::Check;
use crate::{files, gpu, progress, telemetry_text};

pub struct RunArgs {
    pub stage: Stage,
    pub input: PathBuf,
    pub output: Option<PathBuf>,
    pub check: Check,
    pub rows_per_head: usize,
    pub out_dtype: OutDtype,
    pub json: bool,
    pub causal: bool,
    pub scheme: Scheme,
}

fn stats_json(e: &ErrorStats) -> serde_json::Value {
    serde_json::json!({"max_abs": e.max_abs, "mean_abs": e.mean_abs, "rel_l2": e.rel_l2, "nan": e.nan, "inf": e.inf})
}

/// Wall time of each step of `sdpa run`, in order: a step ends where the next begins.
struct Phases(Vec<(&'static str, f64)>, std::time::Instant);

impl Phases {
    fn done(&mut self, what: &'static str) {
        self.0.push((what, self.1.elapsed().as_secs_f64()));
        self.1 = std::time::Instant::now();
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let mut ph = Phases(Vec::new(), std::time::Instant::now());
    let bar = progress(None, "reading");
    let bytes =
        std::fs::read(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    ph.done("read");
    if crate::packed::is_packed(&bytes) {
        bar.finish_and_clear();
        anyhow::ensure!(
            a.stage == Stage::S8,
            "{} holds a packed batch (cu_seqlens_q): packed and paged batches run on stage8, not {}",
            a.input.display(),
            a.stage.name()
        );
        anyhow::ensure!(
            a.scheme == Scheme::default() && !a.json,
            "{} holds a packed batch: its E4M3 codes are used as they are (real tokens get one scale a head) and \
             the report is text, so --scales/--smooth-k/--rotate and --json do not apply",
            a.input.display()
        );
        return crate::packed::run(
            &bytes,
            a.check != Check::None,
            a.causal,
            a.out_dtype,
            a.output.as_deref(),
        )
        .with_context(|| format!("{}", a.input.display()));
    }
    bar.set_message("parsing");
    let mut loaded =
        files::load(&bytes, a.scheme).with_context(|| format!("{}", a.input.display()))?;
    loaded.shape_mut().causal = a.causal;
    drop(bytes);
    bar.finish_and_clear();
    ph.done("parse");
    let s = loaded.shape();
    composed::stage_supports(a.stage, &s)?;
    let gpu = gpu("run")?;
    let bar = progress(None, "running");
    let rows: Vec<usize> = match a.check {
        Check::Full => (0..s.heads() * s.sq).collect(),
        Check::Sample => fixtures::sample_rows(s, a.rows_per_head, 0),
        Check::None => Vec::new(),
    };
    // Real-valued inputs are quantized on the device; the reference then needs the device's codes back
    // (one byte an element, only when rows are checked), and the LSE the smoothing shift the device added.
    let (mut dev, qz, raw) = match loaded {
        files::Loaded::Fp8(qz) => (Problem::upload(gpu, &qz, a.out_dtype)?, Some(qz), None),
        files::Loaded::Real(raw) => {
            let dev = Problem::quantize(gpu, &raw, a.scheme, a.out_dtype)?;
            let qz = (!rows.is_empty()).then(|| dev.quantized(gpu)).transpose()?;
            (dev, qz, Some(raw))
        }
    };
    dev.launch(gpu, a.stage)?;
    let got = dev.download_rows(gpu, &rows)?;
    let shift = dev.lse_shift_rows(gpu, &rows)?;
    bar.finish_and_clear();
    ph.done("device: init, compile, upload, quantize, run");
    // The reference a few heads at a time, so that the bar moves.
    let mut want = fixtures::Attention {
        o: Vec::with_capacity(got.o.len()),
        lse: Vec::with_capacity(got.lse.len()),
    };
    let mut want_unq = want.clone();
    // Chunks of whole heads, as many as there are cores at least: the reference runs a head per core.
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    let chunk = (rows.len() / 8)
        .max(cores * a.rows_per_head.min(s.sq))
        .max(1);
    let bar = progress(Some(rows.len() as u64), "reference");
    for part in rows.chunks(chunk) {
        let qz = qz
            .as_ref()
            .expect("the codes are kept whenever rows are checked");
        let r = fixtures::reference_rows(qz, part);
        want.o.extend(r.o);
        want.lse.extend(r.lse);
        if let Some(raw) = &raw {
            let u = fixtures::reference_unquantized_rows(raw, qz.softmax_scale, part);
            want_unq.o.extend(u.o);
            want_unq.lse.extend(u.lse);
        }
        bar.inc(part.len() as u64);
    }
    // The stage's LSE is of the smoothed problem plus the shift: so is the reference's.
    want.lse
        .iter_mut()
        .zip(&shift)
        .for_each(|(w, &sh)| *w += f64::from(sh));
    bar.finish_and_clear();
    ph.done("reference");
    let tol = Tolerance {
        atol: 1e-2,
        rtol: 0.0,
    };
    let checked = (!rows.is_empty()).then(|| error_stats(&got.o, &want.o, tol));
    let lse_max = got
        .lse
        .iter()
        .zip(&want.lse)
        .map(|(&g, &w)| {
            if g as f64 == w {
                0.0
            } else {
                (g as f64 - w).abs()
            }
        })
        .fold(0.0, f64::max);
    let unq = (raw.is_some() && !rows.is_empty()).then(|| error_stats(&got.o, &want_unq.o, tol));
    let lse_unq_max = got
        .lse
        .iter()
        .zip(&want_unq.lse)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    let bar = progress(None, "timing");
    // A short timing (20 graph replays of 20 launches): `sdpa bench` is the instrument; this is a figure.
    let t = dev.time(gpu, a.stage, 3, 20)?;
    bar.finish_and_clear();
    ph.done("timing");
    if let Some(path) = &a.output {
        let bar = progress(None, "writing");
        let all = dev.download(gpu)?;
        std::fs::write(path, files::save(s, &all.o, &all.lse, a.out_dtype)?)
            .with_context(|| format!("writing {}", path.display()))?;
        bar.finish_and_clear();
        ph.done("write");
    }
    let check_value = a.check.to_possible_value().expect("no variant is skipped");
    let check_name = check_value.get_name();
    if a.json {
        let report = serde_json::json!({
            "stage": a.stage.name(),
            "device": gpu.name,
            "shape": {"b": s.b, "h": s.h, "sq": s.sq, "sk": s.sk, "d": s.d, "causal": s.causal},
            "out_dtype": a.out_dtype.name(),
            "check": {
                "mode": check_name,
                "rows_checked": rows.len(),
                "rows_total": s.heads() * s.sq,
                "o_vs_dequantized": checked.as_ref().map(stats_json),
                "lse_max_abs": (!rows.is_empty()).then_some(lse_max),
                "o_vs_unquantized": unq.as_ref().map(stats_json),
                "lse_vs_unquantized_max_abs": unq.is_some().then_some(lse_unq_max),
            },
            "scheme": raw.is_some().then(|| a.scheme.name()),
            "time": {"p50_us": t.p50_us, "p90_us": t.p90_us, "replays": t.iters, "tflops": t.tflops(&s), "telemetry": t.telemetry},
            "output": a.output.as_ref().map(|p| p.display().to_string()),
            "phases_s": ph.0.iter().map(|(k, v)| serde_json::json!({"phase": k, "s": v})).collect::<Vec<_>>(),
        });
        println!("{report}");
        return Ok(());
    }
    println!(
        "{} on {} for [B, H, Sq, Sk, D] = [{}, {}, {}, {}, {}]{}, O in {}",
        a.stage.name(),
        gpu.name,
        s.b,
        s.h,
        s.sq,
        s.sk,
        s.d,
        if s.causal { ", causal" } else { "" },
        a.out_dtype
    );
    match &checked {
        Some(e) => {
            println!(
                "checked {} of {} rows ({check_name}) against f64 SDPA",
                rows.len(),
                s.heads() * s.sq
            );
            println!("O vs f64 SDPA on the dequantized inputs: {e}");
            println!("LSE vs f64: max_abs={lse_max:.3e}");
        }
        None => println!("not checked (--check none)"),
    }
    if let Some(u) = &unq {
        println!(
            "O vs f64 SDPA on the unquantized inputs ({}, quantized on the GPU): {u}",
            a.scheme.name()
        );
        println!("LSE vs f64 on the unquantized inputs: max_abs={lse_unq_max:.3e}");
    }
    println!(
        "time: p50 {:.1} µs, p90 {:.1} µs over {} graph replays; {:.2} TFLOP/s; {}",
        t.p50_us,
        t.p90_us,
        t.iters,
        t.tflops(&s),
        telemetry_text(&t)
    );
    if let Some(path) = &a.output {
        println!("wrote o and lse to {}", path.display());
    }
    let words: Vec<String> = ph.0.iter().map(|(k, v)| format!("{k} {v:.2} s")).collect();
    println!("wall: {}", words.join(", "));
    Ok(())
}
