// The FP8 accuracy study: input families × quantization schemes, beside cuDNN's FP8 SDPA and PyTorch's fp16.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use composed::{OnDevice, OutDtype, Stage};
use fixtures::{Dist, Granularity, Raw, Rotate, Scheme, Shape, reference_unquantized};
use lab::numerics::{ErrorStats, Tolerance, error_stats};

/// The schemes of the study, the lab's default (per head) second.
fn schemes() -> Vec<Scheme> {
    let s = |per, smooth_k, rotate| Scheme {
        per,
        smooth_k,
        rotate,
    };
    use Granularity::{PerHead, PerTensor};
    vec![
        s(PerTensor, false, Rotate::None),
        s(PerHead, false, Rotate::None),
        s(PerHead, true, Rotate::None),
        s(PerHead, false, Rotate::Hadamard),
        s(PerHead, false, Rotate::HadamardSigns),
        s(PerHead, true, Rotate::HadamardSigns),
        s(PerTensor, false, Rotate::HadamardSigns),
    ]
}

const TORCH: &str = "PyTorch fp16";
const CUDNN: &str = "cuDNN FP8";

/// (shape, family) → column → O's errors against f64 SDPA on the unquantized inputs, one a seed.
type Table = BTreeMap<(String, String), BTreeMap<String, Vec<ErrorStats>>>;

fn shape_text(s: &Shape) -> String {
    format!("({}, {}, {}, {})", s.b, s.h, s.sq, s.d)
}

fn write_f32(path: &Path, x: &[f32]) -> Result<()> {
    let b: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, b).with_context(|| format!("writing {}", path.display()))
}

fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Runs the study on the GPU machine: each family at each shape, every scheme through stage 5 (O in f16, the
/// default), then cuDNN FP8 and PyTorch fp16 on the same inputs (`composed/bench/accuracy_ref.py`); writes
/// `accuracy.md` and `accuracy.json` into `out`. Inputs go to `work` (hundreds of MB), not to `out`.
pub fn run(out: &Path, work: &Path, shapes: &[Shape], seeds: u64) -> Result<bool> {
    let gpu = lab::Gpu::get().context("the accuracy study needs a CUDA GPU")?;
    std::fs::create_dir_all(out)?;
    if work.exists() {
        std::fs::remove_dir_all(work)?;
    }
    std::fs::create_dir_all(work)?;
    let stage = Stage::S5;
    let mut table = Table::new();
    let mut refs = BTreeMap::new();
    for (shape, dist, seed) in shapes
        .iter()
        .flat_map(|s| Dist::all().into_iter().map(move |d| (s, d)))
        .flat_map(|(s, d)| (0..seeds).map(move |seed| (s, d, seed)))
    {
        let case = format!("{}-{}-d{}-seed{seed}", dist.name(), shape.sq, shape.d);
        let raw = Raw::generate(*shape, 2026 + seed, dist);
        let softmax_scale = 1.0 / (shape.d as f32).sqrt();
        let r = reference_unquantized(&raw, softmax_scale);
        let key = (shape_text(shape), dist.name());
        for scheme in schemes() {
            let mut dev = OnDevice::prepare(gpu, &raw, scheme, OutDtype::F16)?;
            dev.launch(gpu, stage)?;
            let o = dev.download(gpu)?.o;
            let e = error_stats(&o, &r.o, Tolerance::exact());
            table
                .entry(key.clone())
                .or_default()
                .entry(scheme.name())
                .or_default()
                .push(e);
        }
        for (what, x) in [("q", &raw.q), ("k", &raw.k), ("v", &raw.v)] {
            write_f32(&work.join(format!("{case}.{what}.f32")), x)?;
        }
        let s = shape;
        std::fs::write(
            work.join(format!("{case}.json")),
            serde_json::json!({"shape": [s.b, s.h, s.sq, s.sk, s.d]}).to_string(),
        )?;
        eprintln!("{case}: {} schemes run", schemes().len());
        refs.insert(case, (key, r.o));
    }
    let mut notes = Vec::new();
    let py = Command::new("python3")
        .arg(crate::build::workspace_root().join("composed/bench/accuracy_ref.py"))
        .arg(work)
        .output()
        .context("running accuracy_ref.py")?;
    ensure!(
        py.status.success(),
        "accuracy_ref.py failed: {}",
        String::from_utf8_lossy(&py.stderr)
    );
    for line in String::from_utf8_lossy(&py.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if v.get("case").is_none() {
            notes.push(line.to_string());
        } else if let Some(e) = v.get("cudnn_error") {
            notes.push(format!("{}: cuDNN FP8 refused: {e}", v["case"]));
        }
    }
    for (case, (key, want)) in &refs {
        for (col, file) in [(TORCH, "o_torch_fp16"), (CUDNN, "o_cudnn_fp8")] {
            let p = work.join(format!("{case}.{file}.f32"));
            if p.exists() {
                let o = read_f32(&p)?;
                let e = error_stats(&o, want, Tolerance::exact());
                table
                    .get_mut(key)
                    .expect("every case ran")
                    .entry(col.into())
                    .or_default()
                    .push(e);
            }
        }
    }
    std::fs::remove_dir_all(work)?;
    let md = markdown(&table, &notes, shapes, seeds);
    std::fs::write(out.join("accuracy.md"), &md)?;
    let json: serde_json::Value = table
        .iter()
        .map(|((s, f), cols)| {
            serde_json::json!({"shape": s, "family": f, "errors": cols.iter().map(|(c, es)| (c.clone(), es.iter().map(|e| serde_json::json!({"rel_l2": e.rel_l2, "max_abs": e.max_abs, "mean_abs": e.mean_abs})).collect::<Vec<_>>().into())).collect::<serde_json::Map<_, _>>()})
        })
        .collect();
    std::fs::write(
        out.join("accuracy.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    println!("{md}");
    Ok(true)
}

/// Mean rel-L2 over seeds.
fn mean_rel(es: &[ErrorStats]) -> f64 {
    es.iter().map(|e| e.rel_l2).sum::<f64>() / es.len() as f64
}

/// Largest max-abs over seeds.
fn worst_abs(es: &[ErrorStats]) -> f64 {
    es.iter().map(|e| e.max_abs).fold(0.0, f64::max)
}

fn markdown(table: &Table, notes: &[String], shapes: &[Shape], seeds: u64) -> String {
    let cols: Vec<String> = schemes()
        .iter()
        .map(Scheme::name)
        .chain([CUDNN.to_string(), TORCH.to_string()])
        .collect();
    let default = Scheme::default().name();
    let mut md = format!(
        "Device: {}. Shapes (B, H, S, D): {}; {seeds} seeds a (shape, family). Stage 5, O in f16; every figure is O against f64 SDPA on the **unquantized** inputs.\n\n",
        crate::build::device_words(),
        shapes.iter().map(shape_text).collect::<Vec<_>>().join(", ")
    );
    for n in notes {
        md += &format!("- {n}\n");
    }
    type Metric = fn(&[ErrorStats]) -> f64;
    for (title, metric, per_seed) in [
        (
            "O rel-L2, mean over seeds",
            mean_rel as Metric,
            (|e: &ErrorStats| e.rel_l2) as fn(&ErrorStats) -> f64,
        ),
        (
            "O max abs, largest over seeds",
            worst_abs,
            |e: &ErrorStats| e.max_abs,
        ),
    ] {
        md += &format!(
            "\n### {title}\n\n| shape | family | {} | default ÷ cuDNN FP8 (per seed) |\n|---|---|{}---|\n",
            cols.join(" | "),
            "---|".repeat(cols.len())
        );
        for ((s, f), row) in table {
            let cells: Vec<String> = cols
                .iter()
                .map(|c| {
                    row.get(c)
                        .map_or("—".into(), |e| format!("{:.3e}", metric(e)))
                })
                .collect();
            let verdict = match (row.get(&default), row.get(CUDNN)) {
                (Some(a), Some(b)) => {
                    let r = metric(a) / metric(b);
                    let seeds: Vec<f64> = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| per_seed(x) / per_seed(y))
                        .collect();
                    let (lo, hi) = seeds
                        .iter()
                        .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
                    format!(
                        "{}{r:.2}×{} ({lo:.2}–{hi:.2})",
                        if r <= 1.0 { "" } else { "**" },
                        if r <= 1.0 { "" } else { "**" }
                    )
                }
                _ => "—".into(),
            };
            md += &format!("| {s} | {f} | {} | {verdict} |\n", cells.join(" | "));
        }
    }
    md += "\n### Remedies: mean O rel-L2 without the remedy ÷ with it (≥ 1.5 keeps it)\n\n";
    for scheme in schemes()
        .iter()
        .filter(|s| s.smooth_k || s.rotate != Rotate::None)
    {
        let name = scheme.name();
        let base = Scheme {
            smooth_k: false,
            rotate: Rotate::None,
            ..*scheme
        }
        .name();
        let mut gains: Vec<(f64, String)> = table
            .iter()
            .filter_map(|((s, f), row)| {
                Some((
                    mean_rel(row.get(&base)?) / mean_rel(row.get(&name)?),
                    format!("{f} {s}"),
                ))
            })
            .collect();
        gains.sort_by(|a, b| b.0.total_cmp(&a.0));
        let helped: Vec<String> = gains
            .iter()
            .filter(|g| g.0 >= 1.5)
            .map(|g| format!("{} {:.2}×", g.1, g.0))
            .collect();
        let worst = gains
            .last()
            .map_or(String::new(), |g| format!("{} {:.2}×", g.1, g.0));
        md += &format!(
            "- **{name}** vs {base}: {}; least gain: {worst}\n",
            if helped.is_empty() {
                "helps by ≥ 1.5× on no family".into()
            } else {
                format!("≥ 1.5× on {}", helped.join(", "))
            }
        );
    }
    md
}
