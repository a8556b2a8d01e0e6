// `cargo xtask profile`: one stage at one shape under Nsight Compute on the GPU machine, summarised in a few lines.
use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use composed::{OnDevice, Stage};
use fixtures::{Raw, Shape, quantize_per_head};

/// Set in the process ncu profiles: it only launches the stage.
const CHILD: &str = "LAB_PROFILE_CHILD";

const SECTIONS: [&str; 5] = [
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "MemoryWorkloadAnalysis",
    "WarpStateStats",
];
const METRICS: &[&str] = &[
    "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio$",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "sm__cycles_elapsed.max",
    "smsp__inst_executed.sum",
    "smsp__inst_executed_pipe_fma.sum",
    "smsp__inst_executed_pipe_alu.sum",
    "sm__inst_executed_pipe_xu.sum",
    "lts__t_bytes.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
];
/// H100 SXM dense peaks (TFLOP/s): FP8 wgmma and f16 mma, for the share of peak the duration implies.
const PEAK_FP8: f64 = 1979.0;
const PEAK_F16: f64 = 989.0;

/// A CSV field without quotes or surrounding space.
fn clean(x: &str) -> String {
    x.chars()
        .filter(|&c| c != '"')
        .collect::<String>()
        .trim()
        .to_string()
}

/// The number in a CSV value field: ncu's thousands separators, quotes and stray characters dropped.
fn number(x: &str) -> String {
    x.chars()
        .filter(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
        .collect()
}

/// The reference `--against` can name: cuDNN's FP8 SDPA through `composed/bench/cudnn_fp8_launch.py` (its kernel
/// names say `sdpa`; the one that runs is named for its tile, e.g. `..._64x256x128_...`).
const AGAINST: &str = "cudnn-fp8";

/// One kernel's ncu metrics (name → (unit, value)) and its full name.
struct Profiled {
    kernel: String,
    m: BTreeMap<String, (String, String)>,
}

impl Profiled {
    fn get(&self, k: &str) -> String {
        self.m
            .get(k)
            .filter(|(_, v)| !v.is_empty())
            .map(|(u, v)| format!("{v} {u}").trim().to_string())
            .unwrap_or_else(|| "n/a".into())
    }

    /// Achieved TFLOP/s from the duration, for `flops` of work.
    fn tflops(&self, flops: f64) -> Option<f64> {
        let (u, v) = self.m.get("Duration")?;
        let x: f64 = v.parse().ok()?;
        let ns = match u.as_str() {
            "us" => x * 1e3,
            "ms" => x * 1e6,
            _ => x,
        };
        Some(flops / (ns * 1e-9) / 1e12)
    }

    /// The top warp stalls, cycles per issued instruction.
    fn stalls(&self) -> Vec<(f64, String)> {
        let mut v: Vec<(f64, String)> = self
            .m
            .iter()
            .filter_map(|(k, (_, v))| {
                let r = k
                    .strip_prefix("smsp__average_warps_issue_stalled_")?
                    .strip_suffix("_per_issue_active.ratio")?;
                Some((v.parse::<f64>().ok()?, r.to_string()))
            })
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        v
    }
}

/// ncu on the third launch of `kernel` (a name or `regex:`) that `program` makes, with the lab's sections and
/// metrics.
fn ncu(kernel: &str, program: &Command) -> Result<Profiled> {
    let mut cmd = Command::new("ncu");
    cmd.args([
        "--kernel-name",
        kernel,
        "--launch-skip",
        "2",
        "--launch-count",
        "1",
    ])
    .args(["--csv", "--page", "details", "--print-units", "base"]);
    for s in SECTIONS {
        cmd.args(["--section", s]);
    }
    cmd.args(["--metrics", &METRICS.join(",")]);
    cmd.arg(program.get_program()).args(program.get_args());
    for (k, v) in program.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let out = cmd
        .output()
        .context("running ncu (Nsight Compute): the profile runs on the GPU machine")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "ncu failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // CSV rows: "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",
    // "Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value".
    let (mut m, mut name) = (BTreeMap::new(), String::new());
    for line in text.lines().filter(|l| l.starts_with('"')) {
        let f: Vec<&str> = line.split("\",\"").map(|x| x.trim_matches('"')).collect();
        if f.len() >= 15 && f[0] != "ID" {
            name = clean(f[4]);
            m.insert(clean(f[12]), (clean(f[13]), number(f[14])));
        }
    }
    ensure!(
        !m.is_empty(),
        "ncu printed no metrics for `{kernel}`:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Profiled { kernel: name, m })
}

/// The rows printed: a label and the ncu metric (or section value) behind it.
const ROWS: &[(&str, &str)] = &[
    ("duration", "Duration"),
    ("SM cycles (the slowest SM)", "sm__cycles_elapsed.max"),
    ("SM throughput", "Compute (SM) Throughput"),
    ("memory throughput", "Memory Throughput"),
    ("DRAM throughput", "DRAM Throughput"),
    ("L1/shared throughput", "L1/TEX Cache Throughput"),
    ("L2 throughput", "L2 Cache Throughput"),
    ("L2 traffic (lts__t_bytes)", "lts__t_bytes.sum"),
    ("L2 to SM bytes", "l1tex__m_xbar2l1tex_read_bytes.sum"),
    ("DRAM read", "dram__bytes_read.sum"),
    ("DRAM written", "dram__bytes_write.sum"),
    ("achieved occupancy", "Achieved Occupancy"),
    ("theoretical occupancy", "Theoretical Occupancy"),
    ("registers per thread", "Registers Per Thread"),
    ("block size", "Block Size"),
    ("grid size", "Grid Size"),
    (
        "warp cycles per issued instruction",
        "Warp Cycles Per Issued Instruction",
    ),
    ("instructions (warp)", "smsp__inst_executed.sum"),
    ("  FMA pipe", "smsp__inst_executed_pipe_fma.sum"),
    ("  ALU pipe", "smsp__inst_executed_pipe_alu.sum"),
    ("  XU pipe (MUFU)", "sm__inst_executed_pipe_xu.sum"),
    (
        "GMMA instructions",
        "sm__inst_executed_pipe_tensor_op_gmma.sum",
    ),
    (
        "tensor pipe (GMMA) active, % of peak",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    ),
    (
        "MUFU (XU pipe) issue, % of peak",
        "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    ),
    (
        "issue slots used, % of peak",
        "smsp__issue_active.avg.pct_of_peak_sustained_active",
    ),
    (
        "shared loads: wavefronts",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    ),
    (
        "shared loads: bank conflicts",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    ),
    (
        "shared stores: wavefronts",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    ),
    (
        "shared stores: bank conflicts",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    ),
];

/// `against`: also profile that reference at the same shape and print it beside the stage (`cudnn-fp8`).
pub fn run(stage: &str, shape: &str, against: Option<&str>) -> Result<bool> {
    let stage = Stage::parse(stage)?;
    let shape = Shape::parse(shape)?;
    if std::env::var(CHILD).is_ok() {
        let gpu = lab::Gpu::get()?;
        let mut d = OnDevice::upload(gpu, &quantize_per_head(&Raw::random(shape, 7, 1.0)))?;
        for _ in 0..4 {
            d.launch(gpu, stage)?;
        }
        gpu.stream.synchronize()?;
        return Ok(true);
    }
    if let Some(a) = against {
        ensure!(
            a == AGAINST,
            "--against {a}: the reference this profiles is `{AGAINST}`"
        );
        ensure!(
            shape.sq == shape.sk,
            "--against {AGAINST}: Sq = Sk only (the shape has Sq {} and Sk {})",
            shape.sq,
            shape.sk
        );
    }
    let mut child = Command::new(std::env::current_exe()?);
    child
        .args(["profile", "--stage", stage.name(), "--shape"])
        .arg(format!(
            "{},{},{},{},{}",
            shape.b, shape.h, shape.sq, shape.sk, shape.d
        ))
        .env(CHILD, "1");
    let ours = ncu(stage.kernel(shape.d).name, &child)?;
    let theirs = match against {
        Some(_) => {
            let mut py = Command::new("python3");
            py.arg(crate::build::workspace_root().join("composed/bench/cudnn_fp8_launch.py"))
                .arg(format!("{},{},{},{}", shape.b, shape.h, shape.sq, shape.d));
            Some(ncu("regex:sdpa", &py)?)
        }
        None => None,
    };
    println!(
        "profile at (B,H,Sq,Sk,D) = ({},{},{},{},{}) on the device, Nsight Compute (compare SM cycles: its clock was not the same between runs, 676–711 µs for one kernel)",
        shape.b, shape.h, shape.sq, shape.sk, shape.d
    );
    println!("  {:<38} {}", "kernel", ours.kernel);
    if let Some(t) = &theirs {
        println!("  {:<38} {}", AGAINST, t.kernel);
        println!("  {:<38} {:>22} {:>22}", "", stage.name(), AGAINST);
    }
    for (label, key) in ROWS {
        match &theirs {
            Some(t) => println!("  {label:<38} {:>22} {:>22}", ours.get(key), t.get(key)),
            None => println!("  {label:<38} {}", ours.get(key)),
        }
    }
    let peak = if stage.fp8_p() { PEAK_FP8 } else { PEAK_F16 };
    let achieved = |p: &Profiled| {
        p.tflops(shape.flops()).map_or("n/a".into(), |t| {
            format!("{t:.0} TFLOP/s = {:.1}% of {peak:.0}", 100.0 * t / peak)
        })
    };
    match &theirs {
        Some(t) => println!(
            "  {:<38} {:>22} {:>22}",
            "achieved (4·B·H·Sq·Sk·D / duration)",
            achieved(&ours),
            achieved(t)
        ),
        None => println!(
            "  {:<38} {} (the dense peak of its tensor-core path)",
            "achieved (4·B·H·Sq·Sk·D / duration)",
            achieved(&ours)
        ),
    }
    for (who, p) in
        std::iter::once((stage.name(), &ours)).chain(theirs.iter().map(|t| (AGAINST, t)))
    {
        println!("  top warp stalls of {who} (cycles per issued instruction):");
        for (v, r) in p.stalls().iter().take(6) {
            println!("    {r:<24} {v:.2}");
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_lose_quotes_and_separators() {
        assert_eq!(number("4,319,616\""), "4319616");
        assert_eq!(number("\"47.34\"\r"), "47.34");
        assert_eq!(clean("\"Duration\""), "Duration");
        assert!(Shape::parse("4,16,4096,4096,128").is_ok());
        assert!(Shape::parse("4,16,x,128").is_err());
        assert!(Shape::parse("4,16,0,128").is_err());
    }

    #[test]
    fn against_names_its_one_reference_and_its_shapes() {
        // Refused before ncu runs, so these hold where there is no GPU.
        let e = run("stage7", "4,16,4096,128", Some("flash")).unwrap_err();
        assert!(format!("{e:#}").contains("`cudnn-fp8`"), "{e:#}");
        let e = run("stage7", "4,16,4096,2048,128", Some("cudnn-fp8")).unwrap_err();
        assert!(format!("{e:#}").contains("Sq = Sk"), "{e:#}");
    }
}
