// compute-sanitizer over the GPU tests that move data asynchronously, on the GPU machine, with the racecheck ledger.
use std::path::Path;
use std::process::Command;
use std::time::Instant;

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
        "tma-ring--gpu",
        "gpu::cursor::split_ring_in_pingpong_order",
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
        "gpu::d256::stage7::mission_1x8x512x256_Bf16",
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
        // paged-kv: every key gathered through a block table (a read outside the pool would show here).
        "paged-kv--gpu",
        "gpu::gather::every_key_of_every_sequence",
        &["memcheck"],
    ),
    (
        // tma::Cursor: one consumer's walk over 2-, 3- and 4-stage rings, holding up to two tiles past the current.
        "tma-ring--gpu",
        "gpu::cursor::every_slot_and_parity_through_several_wraps",
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
    (
        // The split tail: parts written to virtual heads past B·H, then the merge kernel reading them (D = 128,
        // grouped-query heads).
        "composed--gpu",
        "gpu::split::stage7::1x8q2kv_700x700x128_5blocks_F16",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // The same at D = 64, Sk not a multiple of the key tile, O in f32.
        "composed--gpu",
        "gpu::split::stage7::2x2q2kv_300x1024x64_5blocks_F32",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // The ring's accumulating kernel at D = 64 splitting its tail: split parts, the accumulating merge kernel;
        // ~10 units a block, so Q's slots are overwritten after being read (the ledger's Q-slot rows).
        "fp8-attention--gpu",
        "gpu::ring::on_one_device::1x43x4096x64_split_tail",
        &["memcheck", "racecheck"],
    ),
    (
        // Ring attention on one device: zigzag views, stage 7 and its accumulating kernel, attn-merge's merges, and
        // stage 8 as the dense reference.
        "fp8-attention--gpu",
        "gpu::ring::on_one_device::1x4x1000x128",
        &["memcheck", "racecheck"],
    ),
    (
        // The device plan of a packed batch: atomics into the histogram and the table, the scan's shared memory.
        "ragged-plan--gpu",
        "gpu::plan::matches_the_model",
        &["memcheck", "racecheck"],
    ),
    (
        // TransposeLdsm: ldmatrix.trans and stmatrix over V's and Vᵀ's tiles, by four and by three warps.
        "fp8-relayout--gpu",
        "gpu::transpose::transpose_ldsm",
        &["memcheck", "racecheck"],
    ),
    (
        // Stage 8: V by TMA into staging slots, transposed into the ring's Vᵀ by three producer warps (ordinary
        // stores that wgmma reads: the proxy fence and the ring's extra arrivals), the mission shape.
        "composed--gpu",
        "gpu::matrix::stage8::mission_1x8x512x64_s0",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // Stage 8 persistent at D = 128: 192-key tiles through three ring stages and one staging slot, units longest
        // first.
        "composed--gpu",
        "gpu::persistent::stage8::1x4q2kv_700x1000x128_causal",
        &["memcheck", "racecheck", "synccheck"],
    ),
    (
        // Stage 8 under a window, causal, D = 128: units starting past key tile 0, the left edge masked in the loop.
        "composed--gpu",
        "gpu::window::stage8::1x2q2kv_500x500x128_w191_-1_causal",
        &["memcheck", "racecheck"],
    ),
    (
        // Packed batches, D = 64, grouped heads: unpacked, then packed heads (stage8_varlen_pack_d64: Q by a 4-D map of
        // a token's heads, O and the LSE at each row's head and token), from packed keys and from pages.
        "composed--gpu",
        "gpu::varlen::stage8::decode_like_d64::bits_of_each_sequence_alone",
        &["memcheck", "racecheck"],
    ),
    (
        // Split-KV (split_kv_prep's tables and Q copies, the packed kernel on the virtual batch, split_kv_merge_d64),
        // unpacked heads, a sequence with no queries and one with one key.
        "composed--gpu",
        "gpu::varlen::split_kv::decode_mixed_d64",
        &["memcheck"],
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

/// Sanitizer runs at once (`LAB_SANITIZER_JOBS`): mostly the tool's host-side bookkeeping.
pub fn jobs() -> usize {
    crate::runner::jobs_from("LAB_SANITIZER_JOBS")
}

/// One run's verdict from its output and exit status; `accepted` is the racecheck ledger.
fn verdict(what: String, text: &str, status: Option<i32>, accepted: &[String]) -> Verdict {
    let errors = count_after(text, "ERROR SUMMARY:");
    let hazards = count_after(text, "RACECHECK SUMMARY:");
    // A hazard line names the kernel it was found in; each must have a ledger entry.
    let unlisted: Vec<String> = text
        .lines()
        .filter(|l| l.contains("Race reported") || l.contains("Hazard"))
        .filter(|l| !accepted.iter().any(|k| l.contains(k.as_str())))
        .map(|l| l.trim().to_string())
        .collect();
    // A filter that matches no test (a renamed test) would run nothing and pass: at least one must have passed.
    // "test result: ok. N passed; …": a failed run counts none.
    // The tool's own error exit (3) fails the run, but for racecheck hazards that the ledger lists every one of: the
    // tool exits 3 for those too.
    let listed_only = hazards > 0 && errors == 0 && unlisted.is_empty();
    let tests_ok = count_after(text, "test result: ok.") > 0 && (status != Some(3) || listed_only);
    let ok =
        tests_ok && errors == 0 && unlisted.is_empty() && (hazards == 0 || !accepted.is_empty());
    Verdict {
        what,
        errors,
        hazards,
        unlisted,
        ok,
        ran: true,
    }
}

/// Runs every (binary, filter, tool) of RUNS from `bin_dir`, `jobs()` at a time; verdicts and logs come back in
/// RUNS's order whatever order the runs end in.
pub fn run(bin_dir: &Path, root: &Path, log: &mut String) -> Result<Vec<Verdict>> {
    let accepted = ledger(root);
    let todo: Vec<(&str, &str, &str)> = RUNS
        .iter()
        .flat_map(|(bin, filter, tools)| tools.iter().map(move |t| (*bin, *filter, *t)))
        .collect();
    let done = crate::runner::in_parallel(&todo, jobs(), |&(bin, filter, tool)| {
        one(bin_dir, bin, filter, tool, &accepted)
    })?;
    let mut out = Vec::new();
    for r in done {
        let (v, text) = r?;
        log.push_str(&format!("\n===== {} =====\n{text}", v.what));
        out.push(v);
    }
    Ok(out)
}

/// A run's verdict and its output.
type Ran = (Verdict, String);

/// One (binary, filter, tool) run.
fn one(bin_dir: &Path, bin: &str, filter: &str, tool: &str, accepted: &[String]) -> Result<Ran> {
    let what = format!("{tool} on {bin} {filter}");
    if !bin_dir.join(bin).is_file() {
        let v = Verdict {
            what,
            errors: 0,
            hazards: 0,
            unlisted: Vec::new(),
            ok: true,
            ran: false,
        };
        return Ok((v, format!("not run: {bin} is not in this bundle\n")));
    }
    let t0 = Instant::now();
    let mut cmd = Command::new("compute-sanitizer");
    cmd.args(["--tool", tool, "--error-exitcode", "3"])
        .arg(bin_dir.join(bin))
        .args([filter, "--test-threads", "1"])
        .env("LAB_REQUIRE_GPU", "1");
    // A run past the binaries' limit is killed: no test result, so its verdict fails.
    let o = crate::runner::run_command_limited(cmd, crate::runner::binary_limit())
        .with_context(|| format!("running compute-sanitizer ({what})"))?;
    let text = format!(
        "({:.1} s, {}{})\n{}{}",
        t0.elapsed().as_secs_f64(),
        o.status,
        if o.timed_out {
            ", killed at the limit"
        } else {
            ""
        },
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Ok((verdict(what, &text, o.status.code(), accepted), text))
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

    #[test]
    fn a_run_that_ran_no_test_fails() {
        let clean = "========= ERROR SUMMARY: 0 errors\n";
        let ran = format!(
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 478 filtered out\n{clean}"
        );
        let none = format!(
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 479 filtered out\n{clean}"
        );
        let failed = format!("test result: FAILED. 0 passed; 1 failed; 0 ignored\n{clean}");
        assert!(verdict("ran".into(), &ran, Some(0), &[]).ok);
        assert!(!verdict("none".into(), &none, Some(0), &[]).ok);
        assert!(!verdict("failed".into(), &failed, Some(101), &[]).ok);
        assert!(!verdict("exit 3".into(), &ran, Some(3), &[]).ok);
        let hazard = format!(
            "{ran}========= RACECHECK SUMMARY: 1 hazard displayed\n========= Race reported in k\n"
        );
        assert!(!verdict("hazard".into(), &hazard, Some(0), &[]).ok);
        assert!(verdict("ledger".into(), &hazard, Some(0), &["k".to_string()]).ok);
        // racecheck exits 3 on hazards: listed ones still pass, others fail, and exit 3 with no hazard fails.
        assert!(
            verdict(
                "ledger, exit 3".into(),
                &hazard,
                Some(3),
                &["k".to_string()]
            )
            .ok
        );
        assert!(
            !verdict(
                "unlisted, exit 3".into(),
                &hazard,
                Some(3),
                &["j".to_string()]
            )
            .ok
        );
        assert!(
            !verdict(
                "exit 3, no hazard".into(),
                &ran,
                Some(3),
                &["k".to_string()]
            )
            .ok
        );
    }

    #[test]
    fn the_ledger_accepts_the_q_slot_reads_and_nothing_else() {
        // Hazard lines as racecheck printed them on the ring's D = 64 split-tail test (H100, 2026-11-28).
        let accepted = ledger(&crate::build::workspace_root());
        let ran = "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 36 filtered out\n========= ERROR SUMMARY: 0 errors\n";
        // One hazard: a read in TmaBlock's accessor `read` against the producer's write.
        let report = |read: &str| {
            format!(
                "{ran}========= RACECHECK SUMMARY: 1 hazards displayed\n========= Error: Race reported between Read \
                 access at sdpa::TmaBlock<(int)64, (int)4, (int)128, (int)2, (bool)0>::{read} in tma_attention.cuh:118\n"
            )
        };
        for read in [
            "unit(int) const+0xdac0",
            "k0(int) const+0xe930",
            "kt(int) const+0xe920",
        ] {
            assert!(
                verdict(read.into(), &report(read), Some(0), &accepted).ok,
                "{read}"
            );
        }
        // Another word of the slot, or a ring stage's tile, is not covered.
        for read in ["dst(int) const+0x10", "k_stage(int) const+0x20"] {
            assert!(
                !verdict(read.into(), &report(read), Some(0), &accepted).ok,
                "{read}"
            );
        }
    }

    #[test]
    fn every_run_names_a_test_of_its_binary() {
        for (bin, filter, tools) in RUNS {
            assert!(bin.ends_with("--gpu"), "{bin}: not a GPU test binary");
            assert!(
                filter.starts_with("gpu::"),
                "{filter}: not a GPU test's name"
            );
            assert!(!tools.is_empty(), "{bin} {filter}: no tool");
        }
    }
}
