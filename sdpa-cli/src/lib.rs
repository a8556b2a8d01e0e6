//! `sdpa-cli`: the `sdpa` command (`src/main.rs` only calls [`main`]), in a library so that every flag and error is
//! tested. `run` goes through the `fp8-attention` library; `bench` and `trace` use the lab's knobs in `composed`.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use composed::Stage;
use fixtures::Shape;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

mod args;
mod bench;
mod files;
mod packed;
mod ring;
mod run;
mod varlen;

pub use args::{Args, Check, Cmd, Scales, SchemeArgs};
pub use bench::{Edit, parse_variant};
pub use files::{Loaded, load, save};

/// Where `sdpa` keeps compiled kernels between runs: $LAB_CUBIN_CACHE (`off` for nowhere), else
/// $XDG_CACHE_HOME/lab/cubins, else ~/.cache/lab/cubins.
fn cubin_cache() -> Option<PathBuf> {
    fp8_attention::default_kernel_cache("LAB_CUBIN_CACHE", "lab/cubins")
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
        } => run::run(&run::RunArgs {
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
            serial,
            whole_units,
            bshd,
            causal,
            kv_heads,
            window,
            api,
            ranks,
            nccl_max_ctas,
            one_device,
            mode,
            tokens,
            varlen,
            prefix,
            page,
            scheme,
        } => {
            let s = shape
                .with_kv_heads(kv_heads.unwrap_or(shape.h))?
                .with_causal(causal)
                .with_window(window.unwrap_or(fixtures::Window::NONE));
            ensure!(
                !s.window.is_bounded()
                    || (stage.windows() && varlen.is_none() && mode.is_none() && ranks.is_none()),
                "--window {}: sliding windows run on stage8's dense kernel (not {}{})",
                s.window,
                stage.name(),
                if varlen.is_some() || mode.is_some() || ranks.is_some() {
                    ", --varlen, --mode or --ranks"
                } else {
                    ""
                }
            );
            if let Some(mode) = mode {
                ensure!(
                    stage == Stage::S8,
                    "--mode runs packed batches on stage8, not {}",
                    stage.name()
                );
                let (tokens, prefix, page) = varlen::serving_batch(mode, &s, tokens, page)?;
                return varlen::bench_varlen(s, tokens, prefix, page, &variants, 20);
            }
            if let Some(tokens) = varlen {
                ensure!(
                    stage == Stage::S8,
                    "--varlen runs packed batches on stage8, not {}",
                    stage.name()
                );
                return varlen::bench_varlen(s, tokens, prefix, page, &variants, 20);
            }
            if let Some(n) = ranks {
                ensure!(
                    stage == Stage::S7,
                    "--ranks runs ring attention on stage7, not {}",
                    stage.name()
                );
                if one_device {
                    return ring::bench_one_device(s, n);
                }
                return ring::bench_ranks(s, n, 5, (nccl_max_ctas > 0).then_some(nccl_max_ctas));
            }
            if api {
                bench::api(s, dist, stage)?;
            }
            let knobs = bench::Knobs {
                variants: &variants,
                blocks: &blocks,
                sections: &sections,
                serial,
                whole_units,
                bshd,
            };
            bench::bench(stage, s, dist, &knobs, scheme.scheme())
        }
        Cmd::Trace {
            shape,
            causal,
            kv_heads,
            csv,
        } => bench::trace(
            shape
                .with_kv_heads(kv_heads.unwrap_or(shape.h))?
                .with_causal(causal),
            csv,
        ),
    }
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
        "All stages: E4M3 Q, K, V [B, H, S, D] with per-(b, h) scales; D = 64 or 128 (stage7 also 256); any S ≥ 1; Sq ≠ Sk allowed;"
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

/// The clock and power a timing ran at, and a launch's energy, or why they are missing.
fn telemetry_text(t: &composed::bench::Timing) -> String {
    t.telemetry.map_or_else(
        || "no clock or power readings (NVML unavailable)".into(),
        |x| match t.mj_per_launch() {
            // NVML's energy counter did not move over a short timing: not a launch of no energy.
            Some(mj) if mj <= 0.0 => format!("{x}, energy under the counter's resolution"),
            Some(mj) => format!("{x}, {mj:.2} mJ a launch"),
            None => x.to_string(),
        },
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

/// The process's GPU for `what`, or why there is none (the driver's or the probe's reason, kept).
fn gpu(what: &str) -> Result<&'static lab::Gpu> {
    lab::Gpu::get().with_context(|| format!("{what} needs a CUDA GPU"))
}
