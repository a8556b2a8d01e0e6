// `cargo xtask ladder`: every stage and PyTorch's SDPA timed on the GPU machine in one run; Markdown and SVG.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use composed::Stage;
use composed::bench::{input_sets, time_stage};
use fixtures::Shape;

use crate::build::{device_words, today, workspace_root};

/// (shape, causal). The causal and grouped-query rows are timed for the stages that take them (stage 7) and the
/// references; the grouped-query shape is 32 query heads over 8 K/V heads. At D = 256 (stage 7 only) its rows are the
/// references' and stage 7's, and "not run" for the other stages. torch_sdpa.py times the same list (`shapes_json`).
const GQA: Shape = Shape {
    hkv: 8,
    ..Shape::new(4, 32, 4096, 128)
};
const SHAPES: [(Shape, bool); 14] = [
    (Shape::new(1, 1, 32, 64), false),
    (Shape::new(1, 8, 512, 64), false),
    (Shape::new(1, 8, 2048, 64), false),
    (Shape::new(2, 8, 256, 64), false),
    (Shape::new(4, 16, 4096, 64), false),
    (Shape::new(4, 16, 4096, 128), false),
    (Shape::new(8, 16, 2048, 128), false),
    (Shape::new(2, 16, 8192, 128), false),
    (Shape::new(1, 16, 16384, 128), false),
    (Shape::new(4, 16, 4096, 128), true),
    (GQA, false),
    (GQA, true),
    (Shape::new(4, 16, 4096, 256), false),
    (Shape::new(4, 16, 4096, 256), true),
];

/// The shapes as torch_sdpa.py takes them (`--shapes`): [B, H, S, D, causal, Hkv] each, one JSON list.
fn shapes_json() -> String {
    let rows: Vec<serde_json::Value> = SHAPES
        .iter()
        .map(|(s, c)| serde_json::json!([s.b, s.h, s.sq, s.d, c, s.hkv]))
        .collect();
    serde_json::Value::Array(rows).to_string()
}

fn shape_name(s: &Shape) -> String {
    if s.hkv != s.h {
        format!("({},{}q/{}kv,{},{})", s.b, s.h, s.hkv, s.sq, s.d)
    } else {
        format!("({},{},{},{})", s.b, s.h, s.sq, s.d)
    }
}

fn key(s: &Shape, causal: bool) -> String {
    if causal {
        format!("{} causal", shape_name(s))
    } else {
        shape_name(s)
    }
}

/// The ladder's second row for a TMA stage: timed with Vᵀ made once per problem (`prep_vt` outside the timed
/// launches, like quantization). Its main row counts every kernel the call launches, V's transpose included.
fn vt_once(stage: Stage) -> String {
    format!("{}, Vᵀ made once", stage.name())
}

/// FLOPs of a launch: causal attention does about half the work.
fn flops(s: &Shape, causal: bool) -> f64 {
    if causal { s.flops() / 2.0 } else { s.flops() }
}

/// The early rungs (shared-memory softmax, scalar P·V) take seconds on the largest shapes and say nothing new
/// there: they are timed up to 4·16·4096² work.
fn timed(stage: Stage, s: &Shape) -> bool {
    stage >= Stage::S3b || s.b * s.h * s.sq * s.sk <= 4 * 16 * 4096 * 4096
}

/// One implementation's timing of one shape: p50, p90 and (where its timing reports one) mean µs, and the SM
/// clock and power it ran at (where NVML could read them).
#[derive(Debug, Clone, Copy)]
struct Row {
    p50: f64,
    p90: f64,
    mean: Option<f64>,
    clock: Option<Clock>,
}

/// Median SM MHz and W over a timing, and the share of its samples at the software power cap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Clock {
    mhz: f64,
    watts: f64,
    capped: f64,
    /// Share of readings with a thermal or hardware slowdown (torch_sdpa.py's `slowdown`; 0 where not reported).
    slowdown: f64,
    /// A launch's energy, mJ (NVML's energy counter over the timed replays ÷ their launches; None where not kept).
    mj: Option<f64>,
}

impl Clock {
    /// The readings over a lab timing.
    fn of_timing(t: &composed::bench::Timing) -> Option<Clock> {
        let x = t.telemetry.as_ref()?;
        Some(Clock {
            mhz: x.sm_mhz_p50,
            watts: x.power_w_p50,
            capped: x.power_capped,
            slowdown: x.slowdown,
            mj: t.mj_per_launch(),
        })
    }

    /// The fields torch_sdpa.py adds to a row (`sm_mhz`, `power_w`, `power_capped`), where it could read them.
    fn of_json(v: &serde_json::Value) -> Option<Clock> {
        Some(Clock {
            mhz: v["sm_mhz"].as_f64()?,
            watts: v["power_w"].as_f64()?,
            capped: v["power_capped"].as_f64()?,
            slowdown: v["slowdown"].as_f64().unwrap_or(0.0),
            mj: v["mj_per_launch"].as_f64(),
        })
    }

    /// The table's cell: `1605 MHz, 699 W, capped 100%`, and `, slowdown 40%` where a thermal or hardware
    /// slowdown held the clock down.
    fn cell(c: Option<Clock>) -> String {
        c.map_or("—".into(), |c| {
            let mut s = format!(
                "{:.0} MHz, {:.0} W, capped {:.0}%",
                c.mhz,
                c.watts,
                100.0 * c.capped
            );
            if c.slowdown > 0.0 {
                s += &format!(", slowdown {:.0}%", 100.0 * c.slowdown);
            }
            match c.mj {
                // NVML's energy counter did not move over a short timing: not a launch of no energy.
                Some(mj) if mj <= 0.0 => s += ", energy under the counter's resolution",
                Some(mj) => {
                    // Three significant figures: 412 mJ at the long shapes, 0.0213 at the smallest.
                    let places = (2 - mj.log10().floor() as i32).max(0) as usize;
                    s += &format!(", {mj:.places$} mJ a launch");
                }
                None => {}
            }
            s
        })
    }
}

/// (implementation, shape) → its row.
type Results = BTreeMap<(String, String), Row>;
/// (implementation, shape) → why it has no time (a backend that refused, a missing wheel): shown in the table.
type Refusals = BTreeMap<(String, String), String>;

/// PyTorch's fp16 SDPA through `composed/bench/torch_sdpa.py`, when `python3 -c "import torch"` works.
fn torch(root: &Path, results: &mut Results, refusals: &mut Refusals) -> Result<String> {
    let ok = Command::new("python3")
        .args(["-c", "import torch; assert torch.cuda.is_available()"])
        .status();
    if !ok.is_ok_and(|s| s.success()) {
        return Ok("PyTorch with CUDA is not available here: its rows are missing.".into());
    }
    let out = Command::new("python3")
        .arg(root.join("composed/bench/torch_sdpa.py"))
        .args(["--shapes", &shapes_json()])
        .output()
        .context("running torch_sdpa.py")?;
    anyhow::ensure!(
        out.status.success(),
        "torch_sdpa.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut header = String::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if let Some(t) = v["torch"].as_str() {
            header = format!("PyTorch {t} on {}", v["device"].as_str().unwrap_or("?"));
            continue;
        }
        let s: Vec<usize> = v["shape"]
            .as_array()
            .context("shape")?
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as usize)
            .collect();
        let causal = v["causal"].as_bool().unwrap_or(false);
        let hkv = s.get(4).copied().unwrap_or(s[1]);
        let shape = key(
            &Shape {
                hkv,
                ..Shape::new(s[0], s[1], s[2], s[3])
            },
            causal,
        );
        let name = format!("torch-{}", v["backend"].as_str().unwrap_or("?"));
        match (v["p50_us"].as_f64(), v["p90_us"].as_f64()) {
            (Some(p50), Some(p90)) => {
                let row = Row {
                    p50,
                    p90,
                    mean: v["mean_us"].as_f64(),
                    clock: Clock::of_json(&v),
                };
                results.insert((name, shape), row);
            }
            _ => {
                let why = v["error"]
                    .as_str()
                    .unwrap_or("no time reported")
                    .to_string();
                eprintln!("{name} {shape}: {why}");
                refusals.insert((name, shape), why);
            }
        }
    }
    Ok(header)
}

fn svg(results: &Results, impls: &[String]) -> String {
    let (row_h, left, width) = (14.0, 190.0, 560.0);
    let max = results
        .values()
        .map(|v| v.p50)
        .fold(1.0f64, f64::max)
        .log10();
    let min = results
        .values()
        .map(|v| v.p50)
        .fold(f64::MAX, f64::min)
        .log10()
        .floor();
    let x = |us: f64| left + width * (us.log10() - min) / (max - min);
    let mut s = String::new();
    let mut y = 30.0;
    let mut body = String::new();
    for shape in SHAPES.iter().map(|(s, c)| key(s, *c)) {
        let _ = writeln!(
            body,
            r#"<text x="4" y="{}" font-weight="bold">{shape}</text>"#,
            y + 10.0
        );
        y += row_h;
        for (k, imp) in impls.iter().enumerate() {
            if let Some(&Row { p50, .. }) = results.get(&(imp.clone(), shape.clone())) {
                let _ = writeln!(
                    body,
                    r#"<text x="12" y="{}">{imp}</text><rect x="{left}" y="{}" width="{:.1}" height="{}" fill="hsl({},60%,55%)"/><text x="{:.1}" y="{}">{p50:.1} µs</text>"#,
                    y + 10.0,
                    y + 1.0,
                    x(p50) - left,
                    row_h - 3.0,
                    k * 360 / impls.len(),
                    x(p50) + 4.0,
                    y + 10.0
                );
                y += row_h;
            }
        }
        y += 6.0;
    }
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="11">"#,
        left + width + 90.0,
        y + 10.0
    );
    let _ = writeln!(
        s,
        r#"<text x="4" y="16" font-size="13">p50 latency per shape (log scale; shorter is faster)</text>"#
    );
    s.push_str(&body);
    s.push_str("</svg>\n");
    s
}

fn report(
    results: &mut Results,
    name: String,
    shape: &Shape,
    causal: bool,
    t: composed::bench::Timing,
) {
    eprintln!(
        "{name} {}: p50 {:.1} µs, p90 {:.1} µs, mean {:.1} µs, {:.1} TFLOP/s; {}",
        key(shape, causal),
        t.p50_us,
        t.p90_us,
        t.mean_us,
        t.tflops(&shape.with_causal(causal)),
        Clock::cell(Clock::of_timing(&t))
    );
    let row = Row {
        p50: t.p50_us,
        p90: t.p90_us,
        mean: Some(t.mean_us),
        clock: Clock::of_timing(&t),
    };
    results.insert((name, key(shape, causal)), row);
}

/// The ladder on this machine's GPU: every stage (or those in `only`, when it names any), PyTorch and cuDNN.
pub fn run(out: &Path, iters: usize, only: &[Stage]) -> Result<bool> {
    let picked = |s: &Stage| only.is_empty() || only.contains(s);
    let gpu = lab::Gpu::get().context("the ladder runs on a GPU machine (through the bundle)")?;
    let root = workspace_root();
    let mut results = Results::new();
    let mut refusals = Refusals::new();
    for (shape, causal) in SHAPES {
        for stage in Stage::ALL.into_iter().filter(picked) {
            let why = if !stage.dims().contains(&shape.d) {
                "this stage is not built for this head dimension"
            } else if causal && !stage.causal() {
                "no causal masking in this stage"
            } else if shape.group() > 1 && !stage.gqa() {
                "no grouped-query attention in this stage"
            } else {
                continue;
            };
            refusals.insert((stage.name().to_string(), key(&shape, causal)), why.into());
        }
        let n_sets = if shape.sq * shape.sk > 4096 * 4096 {
            1
        } else {
            3
        };
        if !composed::DIMS.contains(&shape.d) {
            continue;
        }
        let mut sets = input_sets(gpu, shape.with_causal(causal), n_sets)?;
        for stage in Stage::ALL.into_iter().filter(|s| {
            picked(s)
                && timed(*s, &shape)
                && s.dims().contains(&shape.d)
                && (!causal || s.causal())
                && (shape.group() == 1 || s.gqa())
        }) {
            // Every kernel a call launches: the TMA stages read V transposed, so their main row makes Vᵀ in every
            // launch (cuDNN's FP8 SDPA reads V as it is); their second row takes Vᵀ as made once per problem.
            sets.iter_mut()
                .for_each(|s| s.time_vt_prep(stage.reads_vt()));
            let t = time_stage(gpu, stage, &mut sets, 5, iters)?;
            report(&mut results, stage.name().to_string(), &shape, causal, t);
            if stage.reads_vt() {
                sets.iter_mut().for_each(|s| s.time_vt_prep(false));
                let t = time_stage(gpu, stage, &mut sets, 5, iters)?;
                report(&mut results, vt_once(stage), &shape, causal, t);
            }
        }
    }
    let torch_header = torch(&root, &mut results, &mut refusals)?;
    let mut impls: Vec<String> = Vec::new();
    for s in Stage::ALL.into_iter().filter(picked) {
        impls.push(s.name().to_string());
        if s.reads_vt() {
            impls.push(vt_once(s));
        }
    }
    impls.extend([
        "torch-cudnn-fp8".to_string(),
        "torch-cudnn".to_string(),
        "torch-flash".to_string(),
    ]);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Measured on {}, {}. Each implementation is captured {} times back to back in a CUDA graph per input set (3 sets; 1 above 4096² queries × keys); 5 warm-up",
        device_words(),
        today(),
        composed::bench::BACK_TO_BACK
    );
    let _ = writeln!(
        md,
        "replays, then up to {iters} replays (about 1.5 s of work, at least 10), each between two CUDA events: p50, p90 and mean of the per-launch time (replay ÷ launches). TFLOP/s = 4·B·H·Sq·Sk·D / p50, half that when causal. Every row counts every kernel a call launches: the TMA stages (6, 7) read V transposed in global memory (`prep_vt`; stage 7 at D = 128 `prep_vt_tiles`, Vᵀ as its tiles' shared-memory images), made in every launch in their main rows, as cuDNN's FP8 SDPA reads V as it is; their `Vᵀ made once` rows take it as made once per problem, like quantization. The last column is the SM clock and board power over each timing (NVML every 10 ms: medians) and the share of readings with the software power cap holding the clock down (and with a thermal or hardware slowdown, where there was one), and a launch's energy (NVML's energy counter over the timed replays ÷ their launches, where it keeps one): the long shapes run every implementation at the cap, where time follows energy per unit of work."
    );
    let _ = writeln!(
        md,
        "{torch_header} (fp16 inputs, same shapes, same run); torch-cudnn-fp8 is cuDNN's own FP8 SDPA (`graph.sdpa_fp8`, nvidia-cudnn-frontend, E4M3 in and out, unit descales).\n"
    );
    let _ = writeln!(
        md,
        "| shape (B,H,S,D) | implementation | p50 µs | p90 µs | mean µs | TFLOP/s | speedup over previous stage | p50 ÷ cuDNN fp16 p50 | p50 ÷ cuDNN FP8 p50 | SM clock, power (medians), at the power cap, energy a launch |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for (shape, causal) in SHAPES {
        let sn = key(&shape, causal);
        let cudnn = results
            .get(&("torch-cudnn".to_string(), sn.clone()))
            .map(|v| v.p50);
        let cudnn_fp8 = results
            .get(&("torch-cudnn-fp8".to_string(), sn.clone()))
            .map(|v| v.p50);
        let mut prev: Option<f64> = None;
        for imp in &impls {
            let Some(&Row {
                p50,
                p90,
                mean,
                clock,
            }) = results.get(&(imp.clone(), sn.clone()))
            else {
                if let Some(why) = refusals.get(&(imp.clone(), sn.clone())) {
                    let _ = writeln!(
                        md,
                        "| {sn} | {imp} | — | — | — | — | — | — | not run: {why} | — |"
                    );
                }
                continue;
            };
            let stage = Stage::ALL.iter().any(|s| s.name() == imp);
            let speedup = match (stage, prev) {
                (true, Some(p)) => format!("{:.2}×", p / p50),
                _ => "—".into(),
            };
            if stage {
                prev = Some(p50);
            }
            let mean = mean.map_or("—".into(), |m| format!("{m:.1}"));
            let ratio = cudnn.map_or("—".into(), |c| format!("{:.2}", p50 / c));
            let ratio8 = cudnn_fp8.map_or("—".into(), |c| format!("{:.2}", p50 / c));
            let _ = writeln!(
                md,
                "| {sn} | {imp} | {p50:.1} | {p90:.1} | {mean} | {:.2} | {speedup} | {ratio} | {ratio8} | {} |",
                flops(&shape, causal) / (p50 * 1e-6) / 1e12,
                Clock::cell(clock)
            );
        }
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("ladder.md"), &md)?;
    std::fs::write(out.join("ladder.svg"), svg(&results, &impls))?;
    println!("{md}");
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_go_to_the_script_as_one_list() {
        let v: serde_json::Value = serde_json::from_str(&shapes_json()).unwrap();
        let rows = v.as_array().unwrap();
        assert_eq!(rows.len(), SHAPES.len());
        assert_eq!(rows[10], serde_json::json!([4, 32, 4096, 128, false, 8]));
        assert_eq!(rows[13], serde_json::json!([4, 16, 4096, 256, true, 16]));
        for want in [(8, 16, 2048, 128), (2, 16, 8192, 128), (4, 16, 4096, 256)] {
            assert!(
                SHAPES.iter().any(|(s, _)| (s.b, s.h, s.sq, s.d) == want),
                "{want:?}"
            );
        }
    }

    #[test]
    fn clock_cells_from_telemetry_and_from_torch_rows() {
        let mut t = lab::Telemetry::summarize(
            &[lab::telemetry::Sample {
                sm_mhz: 1605,
                power_w: 699.4,
                power_capped: true,
                slowdown: false,
            }],
            700.0,
        )
        .unwrap();
        let timing = |t: lab::Telemetry| composed::bench::Timing {
            p50_us: 600.0,
            p90_us: 610.0,
            mean_us: 605.0,
            iters: 100,
            telemetry: Some(t),
        };
        assert_eq!(
            Clock::cell(Clock::of_timing(&timing(t))),
            "1605 MHz, 699 W, capped 100%"
        );
        // 100 replays of 20 launches in 823.4 J: 412 mJ a launch, to three figures.
        t.energy_j = Some(823.4);
        assert_eq!(
            Clock::cell(Clock::of_timing(&timing(t))),
            "1605 MHz, 699 W, capped 100%, 412 mJ a launch"
        );
        // torch_sdpa.py's rows: a launch's energy where NVML kept the counter, a slowdown where one held the clock.
        for (row, cell) in [
            (
                r#"{"sm_mhz": 1980, "power_w": 136.0, "power_capped": 0.0, "mj_per_launch": 0.021349}"#,
                "1980 MHz, 136 W, capped 0%, 0.0213 mJ a launch",
            ),
            (
                r#"{"sm_mhz": 1980, "power_w": 129.0, "power_capped": 0.0, "mj_per_launch": 0.0}"#,
                "1980 MHz, 129 W, capped 0%, energy under the counter's resolution",
            ),
            (
                r#"{"p50_us": 1.0, "sm_mhz": 1710, "power_w": 650.2, "power_capped": 0.5}"#,
                "1710 MHz, 650 W, capped 50%",
            ),
            (
                r#"{"sm_mhz": 1560, "power_w": 663.0, "power_capped": 0.0, "slowdown": 1.0}"#,
                "1560 MHz, 663 W, capped 0%, slowdown 100%",
            ),
        ] {
            let v: serde_json::Value = serde_json::from_str(row).unwrap();
            assert_eq!(Clock::cell(Clock::of_json(&v)), cell, "{row}");
        }
        // A row without readings (no pynvml on the machine) says so by a dash, never zeros.
        let bare: serde_json::Value = serde_json::from_str(r#"{"p50_us": 1.0}"#).unwrap();
        assert_eq!(Clock::of_json(&bare), None);
        assert_eq!(Clock::cell(None), "—");
    }
}
