// The `sdpa` command's arguments and subcommands, in the library so that every flag and error is testable.
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::{Parser, Subcommand, ValueEnum};
use fixtures::{Dist, Granularity, OutDtype, Rotate, Scheme, Shape};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lab::numerics::{ErrorStats, Tolerance, error_stats};

use crate::{OnDevice, Stage, cli};

#[derive(Parser, Debug)]
#[command(
    name = "sdpa",
    about = "The lab's fused FP8 SDPA forward, stage by stage"
)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// How much of O `sdpa run` checks against the f64 reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Check {
    /// Every row (the reference costs Sq·Sk·D multiply-adds a head on the CPU).
    Full,
    /// A seeded sample of rows per head (--rows-per-head), always the first and the last.
    Sample,
    /// No reference: time and write the outputs only.
    None,
}

/// How real-valued inputs become E4M3 (on the device): `--scales`, `--smooth-k`, `--rotate`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct SchemeArgs {
    /// One scale per head or one per tensor (amax / 448).
    #[arg(long, value_enum, default_value_t = Scales::PerHead)]
    pub scales: Scales,
    /// Subtract K's per-channel mean over keys before quantizing (the softmax is unchanged; the LSE is
    /// corrected back). Off by default: docs/accuracy.md says where it helps.
    #[arg(long)]
    pub smooth_k: bool,
    /// Rotate Q and K along D by the same orthonormal Hadamard matrix before quantizing (hadamard-signs: with
    /// seeded sign flips). D must be a power of two. Off by default: docs/accuracy.md says where it helps.
    #[arg(long, default_value = "none", value_parser = Rotate::from_str)]
    pub rotate: Rotate,
}

/// `--scales` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scales {
    PerHead,
    PerTensor,
}

impl SchemeArgs {
    pub fn scheme(&self) -> Scheme {
        Scheme {
            per: match self.scales {
                Scales::PerHead => Granularity::PerHead,
                Scales::PerTensor => Granularity::PerTensor,
            },
            smooth_k: self.smooth_k,
            rotate: self.rotate,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run one stage: q, k, v in F16/BF16/F32 (quantized on the GPU), or F8_E4M3 with q_scale, k_scale, v_scale.
    Run {
        #[arg(long, value_parser = Stage::parse)]
        stage: Stage,
        #[arg(long)]
        input: PathBuf,
        /// Write `o` (in --out-dtype) and `lse` (F32) here.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Rows of O checked against the f64 reference.
        #[arg(long, value_enum, default_value_t = Check::Sample)]
        check: Check,
        /// Rows a head that `--check sample` checks.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
        rows_per_head: u32,
        /// What the stage writes O as: f16, bf16 or f32.
        #[arg(long, default_value_t = OutDtype::F16, value_parser = OutDtype::from_str)]
        out_dtype: OutDtype,
        /// Print the report as one JSON object on stdout (progress stays on stderr).
        #[arg(long)]
        json: bool,
        /// Causal masking, aligned bottom-right (row i sees keys j <= i + Sk - Sq); stage7 only.
        #[arg(long)]
        causal: bool,
        #[command(flatten)]
        scheme: SchemeArgs,
    },
    /// List the stages and what each needs.
    Stages,
    /// Time a stage on generated inputs (quantized on the GPU): no file needed.
    Bench {
        #[arg(long, value_parser = Stage::parse)]
        stage: Stage,
        /// B,H,Sq,Sk,D (or B,H,S,D)
        #[arg(long, value_parser = Shape::parse)]
        shape: Shape,
        /// Input family: normal, outliers-k-x10 … outliers-qk-x100, large-logits, heavy-tail, k-bias.
        #[arg(long, default_value = "normal", value_parser = Dist::from_str)]
        dist: Dist,
        /// A source variant timed beside the stage in the same process, as LABEL=HEADER:FROM=>TO (the first FROM
        /// in block header HEADER becomes TO; several edits joined by &&); repeatable. For "change one thing,
        /// measure": the A/B of a change is its revert as a variant.
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// A persistent stage (stage7), and each variant, also timed launched with this many blocks instead of one
        /// an SM (as many as its work units: one unit a block, as a non-persistent launch); repeatable.
        #[arg(long = "blocks")]
        blocks: Vec<usize>,
        /// Causal stage7, and each variant, also timed with its units ordered in schedule sections of this many
        /// heads (longest units first within a section) instead of as many as keep 16 MiB of K and V; repeatable.
        #[arg(long = "section")]
        sections: Vec<usize>,
        /// Causal masking (stage7 only); its TFLOP/s count half the work.
        #[arg(long)]
        causal: bool,
        /// Key/value heads a batch, for grouped-query attention (stage7 only; must divide H).
        #[arg(long)]
        kv_heads: Option<usize>,
        #[command(flatten)]
        scheme: SchemeArgs,
    },
    /// Stage 7's consumer warps on a timeline: clock64 at each turn's grant and handover, each softmax's start and
    /// end, and each unit's start, last P·V commit and epilogue end, in the first blocks of one launch; summarised
    /// (a turn's parts, a unit's cost beyond its key tiles, how far apart the two consumers' turns are, the last
    /// turn's parts).
    Trace {
        /// B,H,Sq,Sk,D (or B,H,S,D)
        #[arg(long, value_parser = Shape::parse)]
        shape: Shape,
        /// Causal masking.
        #[arg(long)]
        causal: bool,
        /// Key/value heads a batch, for grouped-query attention (must divide H).
        #[arg(long)]
        kv_heads: Option<usize>,
        /// Also write every stamp here as CSV: block, warp, cycle, mark.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
}

/// Where `sdpa` keeps compiled kernels between runs: $LAB_CUBIN_CACHE (`off` for nowhere), else
/// $XDG_CACHE_HOME/lab/cubins, else ~/.cache/lab/cubins.
fn cubin_cache() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match env("LAB_CUBIN_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("lab/cubins")),
    }
}

/// Runs a parsed command, keeping compiled kernels on disk between runs (see `cubin_cache`).
pub fn main(args: Args) -> Result<()> {
    if let Some(dir) = cubin_cache() {
        lab::cache_cubins_in(dir);
    }
    execute(args)
}

/// Runs a parsed command with no disk cache: what tests call, so that no test reads another run's kernels.
pub fn execute(args: Args) -> Result<()> {
    match args.cmd {
        Cmd::Stages => {
            stages();
            Ok(())
        }
        Cmd::Run {
            stage,
            input,
            output,
            check,
            rows_per_head,
            out_dtype,
            json,
            causal,
            scheme,
        } => run(&RunArgs {
            stage,
            input,
            output,
            check,
            rows_per_head: rows_per_head as usize,
            out_dtype,
            json,
            causal,
            scheme: scheme.scheme(),
        }),
        Cmd::Bench {
            stage,
            shape,
            dist,
            variants,
            blocks,
            sections,
            causal,
            kv_heads,
            scheme,
        } => bench(
            stage,
            shape
                .with_kv_heads(kv_heads.unwrap_or(shape.h))?
                .with_causal(causal),
            dist,
            &variants,
            &blocks,
            &sections,
            scheme.scheme(),
        ),
        Cmd::Trace {
            shape,
            causal,
            kv_heads,
            csv,
        } => trace(
            shape
                .with_kv_heads(kv_heads.unwrap_or(shape.h))?
                .with_causal(causal),
            csv,
        ),
    }
}

fn trace(s: Shape, csv: Option<PathBuf>) -> Result<()> {
    let gpu = lab::Gpu::get().context("sdpa trace needs a CUDA GPU")?;
    let raw = fixtures::Raw::generate(s, 1000, Dist::Normal);
    let mut d = OnDevice::prepare(gpu, &raw, Scheme::default(), OutDtype::F16)?;
    drop(raw);
    let lines = crate::trace::record(gpu, &mut d, s.d, 5)?;
    if let Some(path) = csv {
        let mut text = String::from("block,warp,cycle,mark\n");
        for l in &lines {
            for (t, m) in &l.marks {
                text += &format!("{},{},{t},{m:?}\n", l.block, l.warp);
            }
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "stage7 {} timeline ({} blocks traced):\n{}",
        shape_text(&s),
        crate::trace::TRACE_BLOCKS,
        crate::trace::summarize(&lines)?
    );
    Ok(())
}

/// A progress bar on stderr (drawn only when stderr is a terminal), or a spinner when `len` is None.
fn progress(len: Option<u64>, msg: &str) -> ProgressBar {
    let target = ProgressDrawTarget::stderr();
    let bar = match len {
        Some(n) => ProgressBar::with_draw_target(Some(n), target).with_style(
            ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({elapsed})")
                .expect("a valid template")
                .progress_chars("=> "),
        ),
        None => {
            let b = ProgressBar::with_draw_target(None, target).with_style(
                ProgressStyle::with_template("{msg:>12} {spinner} ({elapsed})")
                    .expect("a valid template"),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        }
    };
    bar.with_message(msg.to_string())
}

/// One source edit of a variant: (header, from, to).
pub type Edit<'a> = (&'a str, &'a str, &'a str);

/// `LABEL=HEADER:FROM=>TO[&&HEADER:FROM=>TO…]` → the label and the edits, applied in order.
pub fn parse_variant(v: &str) -> Result<(&str, Vec<Edit<'_>>)> {
    let bad =
        || anyhow::anyhow!("--variant `{v}`: expected LABEL=HEADER:FROM=>TO[&&HEADER:FROM=>TO…]");
    let (label, rest) = v.split_once('=').ok_or_else(bad)?;
    ensure!(!label.is_empty(), bad());
    let mut edits = Vec::new();
    for e in rest.split("&&") {
        let (header, edit) = e.split_once(':').ok_or_else(bad)?;
        let (from, to) = edit.split_once("=>").ok_or_else(bad)?;
        ensure!(!header.is_empty() && !from.is_empty(), bad());
        edits.push((header, from, to));
    }
    Ok((label, edits))
}

/// One configuration `sdpa bench` times: the stage's kernel or a variant, at a block count, schedule section, with
/// or without Vᵀ remade in every launch.
#[derive(Clone)]
struct Run {
    name: String,
    spec: Option<lab::KernelSpec>,
    blocks: Option<usize>,
    section: Option<usize>,
    vt_prep: bool,
}

impl Run {
    fn named(name: String) -> Self {
        Run {
            name,
            spec: None,
            blocks: None,
            section: None,
            vt_prep: false,
        }
    }
}

fn bench(
    stage: Stage,
    s: Shape,
    dist: Dist,
    variants: &[String],
    blocks: &[usize],
    sections: &[usize],
    scheme: Scheme,
) -> Result<()> {
    ensure!(
        blocks.is_empty() || stage.persistent(),
        "--blocks: {} is not persistent (one block a query tile); stage7 is",
        stage.name()
    );
    ensure!(
        sections.is_empty() || (s.causal && stage.persistent()),
        "--section orders causal stage7's units; this is {}{}",
        stage.name(),
        if s.causal { "" } else { " without --causal" }
    );
    let mut runs = vec![Run::named(stage.name().to_string())];
    for v in variants {
        let (label, edits) = parse_variant(v)?;
        let mut spec = stage.kernel(s.d);
        for (header, from, to) in edits {
            spec = spec.mutated(header, from, to)?;
        }
        runs.push(Run {
            spec: Some(spec),
            ..Run::named(format!("{} [{label}]", stage.name()))
        });
    }
    // Every run also at each block count and section asked for.
    let base = runs.clone();
    for &b in blocks {
        runs.extend(base.iter().map(|r| Run {
            name: format!("{} [{b} blocks]", r.name),
            blocks: Some(b),
            ..r.clone()
        }));
    }
    for &h in sections {
        runs.extend(base.iter().map(|r| Run {
            name: format!("{} [sections of {h} heads]", r.name),
            section: Some(h),
            ..r.clone()
        }));
    }
    // A TMA stage reads V transposed (prep_vt, made once and not timed above): timed again with the transpose in
    // every launch, the figure to set beside cuDNN's FP8 SDPA, which reads V as it is.
    if stage.tma() {
        runs.push(Run {
            vt_prep: true,
            ..Run::named(format!("{} [+ prep_vt]", stage.name()))
        });
    }
    let gpu = lab::Gpu::get().context("sdpa bench needs a CUDA GPU")?;
    let raw = fixtures::Raw::generate(s, 1000, dist);
    let mut sets = [OnDevice::prepare(gpu, &raw, scheme, OutDtype::F16)?];
    drop(raw);
    // Interleaved rounds, best p50 of two, so that a clock or thermal drift during the run favours no side.
    let mut best: Vec<Option<crate::bench::Timing>> = vec![None; runs.len()];
    for _round in 0..2 {
        for (i, r) in runs.iter().enumerate() {
            sets[0].use_kernel(r.spec);
            sets[0].use_blocks(r.blocks);
            sets[0].use_section(r.section);
            sets[0].time_vt_prep(r.vt_prep);
            let t = crate::bench::time_stage(gpu, stage, &mut sets, 5, 100)?;
            if best[i].is_none_or(|b| t.p50_us < b.p50_us) {
                best[i] = Some(t);
            }
        }
    }
    for (r, t) in runs.iter().zip(best) {
        let t = t.expect("timed");
        println!(
            "{} {} {dist} {}: p50 {:.1} µs, p90 {:.1} µs, mean {:.1} µs per launch ({} back to back, {} graph replays); {:.2} TFLOP/s; {}",
            r.name,
            shape_text(&s),
            scheme.name(),
            t.p50_us,
            t.p90_us,
            t.mean_us,
            crate::bench::BACK_TO_BACK,
            t.iters,
            t.tflops(&s),
            telemetry_text(&t)
        );
    }
    Ok(())
}

/// The clock and power a timing ran at, or why they are missing.
fn telemetry_text(t: &crate::bench::Timing) -> String {
    t.telemetry.map_or_else(
        || "no clock or power readings (NVML unavailable)".into(),
        |x| x.to_string(),
    )
}

/// `B,H,Sq,Sk,D`, with the K/V heads and the mask when they are not the defaults.
fn shape_text(s: &Shape) -> String {
    let mut t = format!("{},{},{},{},{}", s.b, s.h, s.sq, s.sk, s.d);
    if s.hkv != s.h {
        t += &format!(" ({} K/V heads)", s.hkv);
    }
    if s.causal {
        t += " causal";
    }
    t
}

fn stages() {
    println!(
        "{:<8} {:>6} {:>14} {:>14}  what",
        "stage", "ring", "smem D=64", "smem D=128"
    );
    for s in Stage::ALL {
        println!(
            "{:<8} {:>6} {:>12} B {:>12} B  {}",
            s.name(),
            if s.ring_stages(64) == s.ring_stages(128) {
                s.ring_stages(64).to_string()
            } else {
                format!("{}/{}", s.ring_stages(64), s.ring_stages(128))
            },
            s.smem_bytes(64),
            s.smem_bytes(128),
            s.describe()
        );
        println!("{:<8} needs: {}", "", s.needs());
    }
    println!(
        "All stages: E4M3 Q, K, V [B, H, S, D] with per-(b, h) scales; D = 64 or 128; any S ≥ 1; Sq ≠ Sk allowed;"
    );
    println!(
        "stage7 also takes causal masking (--causal, bottom-right diagonal) and grouped-query attention (K, V with"
    );
    println!("fewer heads than Q, dividing H); the other stages refuse both by name.");
    println!(
        "outputs O [B, H, Sq, D] in f16, bf16 or f32 (--out-dtype) and LSE f32 [B, H, Sq]. stage1-4 run on sm_80 or"
    );
    println!(
        "later (cp.async, mma.sync); stage5 needs an sm_90 GPU (built for sm_90a: wgmma): elsewhere `run` refuses it by"
    );
    println!("name before any launch.");
}

struct RunArgs {
    stage: Stage,
    input: PathBuf,
    output: Option<PathBuf>,
    check: Check,
    rows_per_head: usize,
    out_dtype: OutDtype,
    json: bool,
    causal: bool,
    scheme: Scheme,
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

fn run(a: &RunArgs) -> Result<()> {
    let mut ph = Phases(Vec::new(), std::time::Instant::now());
    let bar = progress(None, "reading");
    let bytes =
        std::fs::read(&a.input).with_context(|| format!("reading {}", a.input.display()))?;
    ph.done("read");
    bar.set_message("parsing");
    let mut loaded = cli::load(&bytes, a.scheme)?;
    loaded.shape_mut().causal = a.causal;
    drop(bytes);
    bar.finish_and_clear();
    ph.done("parse");
    let s = loaded.shape();
    let gpu = lab::Gpu::get().context("sdpa run needs a CUDA GPU")?;
    let bar = progress(None, "running");
    let rows: Vec<usize> = match a.check {
        Check::Full => (0..s.heads() * s.sq).collect(),
        Check::Sample => fixtures::sample_rows(s, a.rows_per_head, 0),
        Check::None => Vec::new(),
    };
    // Real-valued inputs are quantized on the device; the reference then needs the device's codes back
    // (one byte an element, only when rows are checked), and the LSE the smoothing shift the device added.
    let (mut dev, qz, raw) = match loaded {
        cli::Loaded::Fp8(qz) => (OnDevice::upload_as(gpu, &qz, a.out_dtype)?, Some(qz), None),
        cli::Loaded::Real(raw) => {
            let dev = OnDevice::prepare(gpu, &raw, a.scheme, a.out_dtype)?;
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
    let t = crate::bench::time_stage(gpu, a.stage, std::slice::from_mut(&mut dev), 3, 20)?;
    bar.finish_and_clear();
    ph.done("timing");
    if let Some(path) = &a.output {
        let bar = progress(None, "writing");
        let all = dev.download(gpu)?;
        std::fs::write(path, cli::save(s, &all.o, &all.lse, a.out_dtype)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(args: &[&str]) -> String {
        let mut v = vec!["sdpa"];
        v.extend_from_slice(args);
        Args::try_parse_from(v).unwrap_err().to_string()
    }

    const RUN: [&str; 5] = ["run", "--stage", "stage4", "--input", "x.safetensors"];

    #[test]
    fn run_defaults_are_sample_f16_text() {
        let mut v = vec!["sdpa"];
        v.extend_from_slice(&RUN);
        let Cmd::Run {
            check,
            out_dtype,
            json,
            rows_per_head,
            scheme,
            ..
        } = Args::try_parse_from(v).unwrap().cmd
        else {
            panic!("not run")
        };
        assert_eq!(
            (check, out_dtype, json, rows_per_head),
            (Check::Sample, OutDtype::F16, false, 32)
        );
        assert_eq!(scheme.scheme(), Scheme::default());
        assert_eq!(scheme.scheme().name(), "per-head");
        let mut v = vec!["sdpa"];
        v.extend_from_slice(&RUN);
        v.extend([
            "--scales",
            "per-tensor",
            "--smooth-k",
            "--rotate",
            "hadamard-signs",
        ]);
        let Cmd::Run { scheme, .. } = Args::try_parse_from(v).unwrap().cmd else {
            panic!("not run")
        };
        assert_eq!(scheme.scheme().name(), "per-tensor+smooth-k+hadamard-signs");
    }

    #[test]
    fn bad_flags_are_named() {
        let with = |extra: &[&str]| {
            let mut v = RUN.to_vec();
            v.extend_from_slice(extra);
            parse_err(&v)
        };
        let e = with(&["--out-dtype", "f8"]);
        assert!(
            e.contains("--out-dtype") && e.contains("unknown output dtype `f8`"),
            "{e}"
        );
        let e = with(&["--check", "most"]);
        assert!(
            e.contains("--check") && e.contains("full, sample, none"),
            "{e}"
        );
        let e = with(&["--rows-per-head", "0"]);
        assert!(e.contains("--rows-per-head"), "{e}");
        let e = with(&["--rotate", "fourier"]);
        assert!(
            e.contains("--rotate") && e.contains("unknown rotation `fourier`"),
            "{e}"
        );
        let e = with(&["--scales", "per-row"]);
        assert!(
            e.contains("--scales") && e.contains("per-head, per-tensor"),
            "{e}"
        );
        let e = parse_err(&["run", "--stage", "stage9", "--input", "x"]);
        assert!(e.contains("unknown stage `stage9`"), "{e}");
        let e = parse_err(&["bench", "--stage", "stage5", "--shape", "4,16,x,128"]);
        assert!(
            e.contains("--shape") && e.contains("expected B,H,Sq,Sk,D"),
            "{e}"
        );
        let e = parse_err(&["bench", "--stage", "stage5", "--shape", "4,16,0,128"]);
        assert!(e.contains("at least 1"), "{e}");
        let e = parse_err(&[
            "bench", "--stage", "stage5", "--shape", "1,1,8,64", "--dist", "cauchy",
        ]);
        assert!(e.contains("unknown input family `cauchy`"), "{e}");
    }

    #[test]
    fn every_family_and_dtype_parses_back() {
        for d in Dist::all() {
            assert_eq!(Dist::from_str(&d.name()).unwrap(), d);
        }
        for o in OutDtype::ALL {
            assert_eq!(OutDtype::from_str(o.name()).unwrap(), o);
        }
    }

    #[test]
    fn variants_parse_and_bad_ones_are_named() {
        let (l, e) = parse_variant("a=x.cuh:foo=>bar&&y.cuh:1=>2").unwrap();
        assert_eq!((l, e.len(), e[1]), ("a", 2, ("y.cuh", "1", "2")));
        assert!(
            parse_variant("nolabel")
                .unwrap_err()
                .to_string()
                .contains("LABEL=HEADER:FROM=>TO")
        );
    }
}
