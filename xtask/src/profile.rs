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
const METRICS: [&str; 9] = [
    "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio$",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
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

pub fn run(stage: &str, shape: &str) -> Result<bool> {
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
    let kernel = stage.kernel(shape.d).name;
    let exe = std::env::current_exe()?;
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
    let out = cmd
        .arg(&exe)
        .args(["profile", "--stage", stage.name(), "--shape"])
        .arg(format!(
            "{},{},{},{},{}",
            shape.b, shape.h, shape.sq, shape.sk, shape.d
        ))
        .env(CHILD, "1")
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
    let mut m: BTreeMap<String, (String, String)> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with('"')) {
        let f: Vec<&str> = line.split("\",\"").map(|x| x.trim_matches('"')).collect();
        if f.len() >= 15 && f[0] != "ID" {
            m.insert(clean(f[12]), (clean(f[13]), number(f[14])));
        }
    }
    ensure!(
        !m.is_empty(),
        "ncu printed no metrics for `{kernel}`:\n{text}"
    );
    let get = |k: &str| {
        m.get(k)
            .map(|(u, v)| format!("{v} {u}"))
            .unwrap_or_else(|| "n/a".into())
    };
    println!(
        "profile of {kernel} at (B,H,Sq,Sk,D) = ({},{},{},{},{}) on the device, Nsight Compute",
        shape.b, shape.h, shape.sq, shape.sk, shape.d
    );
    for (label, key) in [
        ("duration", "Duration"),
        ("SM throughput", "Compute (SM) Throughput"),
        ("memory throughput", "Memory Throughput"),
        ("DRAM throughput", "DRAM Throughput"),
        ("L1/shared throughput", "L1/TEX Cache Throughput"),
        ("L2 throughput", "L2 Cache Throughput"),
        ("achieved occupancy", "Achieved Occupancy"),
        ("theoretical occupancy", "Theoretical Occupancy"),
        ("registers per thread", "Registers Per Thread"),
        (
            "warp cycles per issued instruction",
            "Warp Cycles Per Issued Instruction",
        ),
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
    ] {
        println!("  {label:<38} {}", get(key));
    }
    if let Some(ns) = m.get("Duration").and_then(|(u, v)| {
        let x: f64 = v.parse().ok()?;
        Some(if u == "ns" {
            x
        } else if u == "us" {
            x * 1e3
        } else if u == "ms" {
            x * 1e6
        } else {
            x
        })
    }) {
        let tflops = shape.flops() / (ns * 1e-9) / 1e12;
        let peak = if stage.fp8_p() { PEAK_FP8 } else { PEAK_F16 };
        println!(
            "  {:<38} {tflops:.0} TFLOP/s = {:.1}% of the {peak:.0} TFLOP/s dense peak of its tensor-core path",
            "achieved (4·B·H·Sq·Sk·D / duration)",
            100.0 * tflops / peak
        );
    }
    let mut stalls: Vec<(f64, String)> = m
        .iter()
        .filter_map(|(k, (_, v))| {
            let r = k
                .strip_prefix("smsp__average_warps_issue_stalled_")?
                .strip_suffix("_per_issue_active.ratio")?;
            Some((v.parse::<f64>().ok()?, r.to_string()))
        })
        .collect();
    stalls.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("  top warp stalls (cycles per issued instruction):");
    for (v, r) in stalls.iter().take(6) {
        println!("    {r:<24} {v:.2}");
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
}
