// Builds the workspace's test binaries with cargo and lists them (package, target, path).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::runner::TestBinary;

/// The tree's root: `INSTA_WORKSPACE_ROOT` where the bundle runs (the tree sits elsewhere there), else the
/// checkout this xtask was built in.
pub fn workspace_root() -> PathBuf {
    match std::env::var_os("INSTA_WORKSPACE_ROOT") {
        Some(r) if !r.is_empty() => PathBuf::from(r),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace")
            .to_path_buf(),
    }
}

/// The `name = "..."` of a manifest's [package].
fn package_name(manifest: &Path) -> Result<String> {
    let text = std::fs::read_to_string(manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    text.lines()
        .skip_while(|l| l.trim() != "[package]")
        .find_map(|l| {
            l.trim().strip_prefix("name").map(|r| {
                r.trim_start_matches([' ', '='])
                    .trim_matches('"')
                    .to_string()
            })
        })
        .with_context(|| format!("no package name in {}", manifest.display()))
}

/// `cargo test --no-run` for the whole workspace under `profile`, and the executables it made.
pub fn test_binaries(sh: &Shell, profile: &str) -> Result<Vec<TestBinary>> {
    test_binaries_of(sh, profile, &["--workspace", "--all-targets"])
}

/// `cargo test --no-run` of what `select` names (`-p composed --test gpu`, …) under `profile`, and the
/// executables it made.
pub fn test_binaries_of(sh: &Shell, profile: &str, select: &[&str]) -> Result<Vec<TestBinary>> {
    let json = cmd!(sh, "cargo test {select...} --no-run --profile {profile} --message-format=json-render-diagnostics")
        .read()
        .context("building the test binaries")?;
    let mut bins = Vec::new();
    for line in json.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let kind = v["target"]["kind"][0].as_str().unwrap_or("");
        if kind == "bench" {
            continue;
        }
        let manifest = v["manifest_path"]
            .as_str()
            .context("artifact without manifest_path")?;
        bins.push(TestBinary {
            package: package_name(Path::new(manifest))?,
            target: if kind == "test" {
                v["target"]["name"].as_str().unwrap_or("?").to_string()
            } else {
                kind.to_string()
            },
            path: PathBuf::from(exe),
        });
    }
    bins.sort_by(|a, b| (&a.package, &a.target).cmp(&(&b.package, &b.target)));
    Ok(bins)
}

/// Today's date (UTC) as YYYY-MM-DD, for report titles, without a date crate.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02}")
}

/// Where the tests run, in words, for report titles.
pub fn device_words() -> String {
    match lab::status() {
        lab::GpuStatus::Present { name, major, minor } => format!("{name} (sm_{major}{minor})"),
        lab::GpuStatus::Absent(why) => format!("no GPU ({why})"),
    }
}
