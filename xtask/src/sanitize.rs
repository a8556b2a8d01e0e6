// compute-sanitizer over the GPU tests that move data asynchronously, on the GPU machine, with the racecheck ledger.
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// (test binary, libtest filter, tools): the tests whose kernels use TMA, mbarriers, wgmma or cp.async rings,
/// and the grid-stride library kernels of device quantization (64-bit indexing, vector loads).
const RUNS: &[(&str, &str, &[&str])] = &[
    (
        "tma-ring--gpu",
        "gpu::copy",
        &["memcheck", "synccheck", "racecheck"],
    ),
    (
        "fp8-relayout--gpu",
        "gpu::pv_exact",
        &["memcheck", "racecheck"],
    ),
    (
        "wgmma--gpu",
        "gpu::reuse_of_a_tile",
        &["memcheck", "racecheck"],
    ),
    (
        "fp8-codec--gpu",
        "gpu::tensor_quantizer_is_bit_exact",
        &["memcheck"],
    ),
    ("hadamard--gpu", "gpu::rows_are_bit_exact", &["memcheck"]),
    (
        "composed--gpu",
        "gpu::device_quantization::per-head+smooth-k+hadamard-signs",
        &["memcheck", "initcheck"],
    ),
    (
        "composed--gpu",
        "gpu::matrix::stage5::mission_1x8x512x64_s0",
        &["memcheck", "racecheck", "synccheck", "initcheck"],
    ),
    (
        "composed--gpu",
        "gpu::matrix::stage6::mission_1x8x512x64_s0",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        "composed--gpu",
        "gpu::matrix::stage7::mission_1x8x512x64_s0",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        "composed--gpu",
        "gpu::causal::stage7::1x2x300x100x64",
        &["memcheck", "synccheck"],
    ),
    (
        "tma-ring--gpu",
        "gpu::bulk_load::through_a_ring",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // Stage 7 at D = 128: Vᵀ's tile images (prep_vt_tiles) by bulk copy, remade before every launch.
        "composed--gpu",
        "gpu::vt_prep_in_every_launch::stage7",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // Persistent blocks: several units a block, ring slots and Q buffers reused across them.
        "composed--gpu",
        "gpu::persistent::stage7::2x2q2kv_384x384x64_causal",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // The same at D = 128 (Vᵀ's tile images by bulk copy), units taken from the counter longest first.
        "composed--gpu",
        "gpu::persistent::stage7::1x4q2kv_700x1000x128_causal",
        &["memcheck", "racecheck", "synccheck"],
    ),
];

/// One sanitizer run's verdict.
#[derive(Debug)]
pub struct Verdict {
    pub what: String,
    pub errors: usize,
    pub hazards: usize,
    pub unlisted: Vec<String>,
    pub ok: bool,
    /// False where the binary is not in this bundle (`gpu-bundle --only`): not run, and said so.
    pub ran: bool,
}

/// The hazards the ledger (docs/blocks/tma-ring-racecheck.md) accepts: the first column of each table row
/// under its header, as `kernel`; an entry matches a reported hazard line that names the kernel.
fn ledger(root: &Path) -> Vec<String> {
    let text =
        std::fs::read_to_string(root.join("docs/blocks/tma-ring-racecheck.md")).unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect()
}

fn count_after(text: &str, key: &str) -> usize {
    text.lines()
        .filter_map(|l| l.split(key).nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
        .sum()
}

/// Runs every (binary, filter, tool) of RUNS from `bin_dir`; each log goes into `log`.
pub fn run(bin_dir: &Path, root: &Path, log: &mut String) -> Result<Vec<Verdict>> {
    let accepted = ledger(root);
    let mut out = Vec::new();
    for (bin, filter, tools) in RUNS {
        for tool in *tools {
            let what = format!("{tool} on {bin} {filter}");
            if !bin_dir.join(bin).is_file() {
                log.push_str(&format!(
                    "\n===== {what} =====\nnot run: {bin} is not in this bundle\n"
                ));
                out.push(Verdict {
                    what,
                    errors: 0,
                    hazards: 0,
                    unlisted: Vec::new(),
                    ok: true,
                    ran: false,
                });
                continue;
            }
            let o = Command::new("compute-sanitizer")
                .args(["--tool", tool, "--error-exitcode", "3"])
                .arg(bin_dir.join(bin))
                .args([filter, "--test-threads", "1"])
                .env("LAB_REQUIRE_GPU", "1")
                .output()
                .with_context(|| format!("running compute-sanitizer ({what})"))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            log.push_str(&format!("\n===== {what} =====\n{text}"));
            let errors = count_after(&text, "ERROR SUMMARY:");
            let hazards = count_after(&text, "RACECHECK SUMMARY:");
            // A hazard line names the kernel it was found in; each must have a ledger entry.
            let unlisted: Vec<String> = text
                .lines()
                .filter(|l| l.contains("Race reported") || l.contains("Hazard"))
                .filter(|l| !accepted.iter().any(|k| l.contains(k.as_str())))
                .map(|l| l.trim().to_string())
                .collect();
            let tests_ok = text.contains("test result: ok") && o.status.code() != Some(3);
            let ok = tests_ok
                && errors == 0
                && unlisted.is_empty()
                && (hazards == 0 || !accepted.is_empty());
            out.push(Verdict {
                what,
                errors,
                hazards,
                unlisted,
                ok,
                ran: true,
            });
        }
    }
    Ok(out)
}

/// The summary's section.
pub fn table(v: &[Verdict]) -> String {
    let mut s = String::from(
        "\n### compute-sanitizer\n\n| run | errors | racecheck hazards | hazards not in the ledger | verdict |\n|---|---|---|---|---|\n",
    );
    for x in v {
        if !x.ran {
            s.push_str(&format!(
                "| {} | | | | NOT RUN (binary not in this bundle) |\n",
                x.what
            ));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            x.what,
            x.errors,
            x.hazards,
            x.unlisted.len(),
            if x.ok { "ok" } else { "FAILED" }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_counted() {
        let t = "========= ERROR SUMMARY: 2 errors\n========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)\n";
        assert_eq!(count_after(t, "ERROR SUMMARY:"), 2);
        assert_eq!(count_after(t, "RACECHECK SUMMARY:"), 3);
    }
}
