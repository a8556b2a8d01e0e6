// Runs test binaries, reads libtest's per-test lines, and writes the per-block table, JUnit and a log.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// One test executable and the package it tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestBinary {
    pub package: String,
    pub target: String,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Model,
    Compile,
    Gpu,
}

impl Kind {
    /// Prefixes are given by `lab::Suite`; a crate's unit tests (`lib`, `bin`) are model tests whatever
    /// their module path, which may well start with `gpu::`.
    pub fn of(binary: &str, name: &str) -> Kind {
        if binary == "lib" || binary == "bin" {
            Kind::Model
        } else if name.starts_with(lab::GPU) {
            Kind::Gpu
        } else if name.starts_with(lab::COMPILE) {
            Kind::Compile
        } else {
            Kind::Model
        }
    }
}

#[derive(Debug, Clone)]
pub struct TestResult {
    pub package: String,
    pub binary: String,
    pub name: String,
    pub outcome: Outcome,
    pub message: String,
}

/// Reads libtest's (and libtest-mimic's) lines: `test NAME ... ok|FAILED|ignored`, and the `---- NAME ----`
/// sections that hold each failure's output.
pub fn parse_libtest(stdout: &str) -> Vec<(String, Outcome, String)> {
    let mut results = Vec::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, status)) = rest.split_once(" ... ") else {
            continue;
        };
        let outcome = match status.trim() {
            "ok" => Outcome::Passed,
            "FAILED" => Outcome::Failed,
            s if s.starts_with("ignored") => Outcome::Skipped,
            _ => continue,
        };
        results.push((name.trim().to_string(), outcome, String::new()));
    }
    let mut current: Option<usize> = None;
    let mut in_failures = false;
    for line in stdout.lines() {
        if line == "failures:" {
            if in_failures && current.is_some() {
                break;
            }
            in_failures = true;
            continue;
        }
        if !in_failures {
            continue;
        }
        if let Some(h) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" ----"))
        {
            let name = h.trim_end_matches(" stdout");
            current = results.iter().position(|r| r.0 == name);
            continue;
        }
        if let Some(i) = current {
            results[i].2.push_str(line);
            results[i].2.push('\n');
        }
    }
    results
}

/// Runs every binary, `jobs` at a time, and collects results and logs in the binaries' order. A binary that dies
/// without reporting is one failure.
pub fn run_all(
    bins: &[TestBinary],
    env: &[(&str, &str)],
    jobs: usize,
    log: &mut String,
) -> Result<Vec<TestResult>> {
    // A line on stderr as each binary ends, so that a long run (GPU tests skipped one by one on a machine
    // without a GPU, or the bundle's) shows where it is.
    let done = std::sync::atomic::AtomicUsize::new(0);
    let runs = in_parallel(bins, jobs, |b| {
        let t0 = Instant::now();
        let r = run_one(b, env);
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        eprintln!(
            "[{n}/{}] {}::{}: {} ({:.1} s)",
            bins.len(),
            b.package,
            b.target,
            r.as_ref()
                .map_or_else(|e| format!("error: {e:#}"), |(res, _)| counts_text(res)),
            t0.elapsed().as_secs_f64()
        );
        r
    })?;
    let mut all = Vec::new();
    for r in runs {
        let (results, text) = r?;
        log.push_str(&text);
        all.extend(results);
    }
    Ok(all)
}

/// `3 passed, 2 skipped`: a binary's results by outcome, for its progress line.
fn counts_text(results: &[TestResult]) -> String {
    let n = |o: Outcome| results.iter().filter(|r| r.outcome == o).count();
    let (p, f, s) = (n(Outcome::Passed), n(Outcome::Failed), n(Outcome::Skipped));
    let mut t = format!("{p} passed");
    if f > 0 {
        t += &format!(", {f} FAILED");
    }
    if s > 0 {
        t += &format!(", {s} skipped");
    }
    t
}

/// How many processes go at once, from the variable `var` if set: each is one process with its own context on
/// the one GPU, and mostly CPU-bound, so a few share the machine well; a quarter of the cores by default.
pub fn jobs_from(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| (n.get() / 4).clamp(1, 6))
                .unwrap_or(1)
        })
}

/// `f` over `items`, at most `jobs` at a time, the results in the items' order.
pub fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(&T) -> R + Sync + Send,
) -> Result<Vec<R>> {
    use rayon::prelude::*;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1))
        .build()
        .context("starting a thread pool")?;
    Ok(pool.install(|| items.par_iter().with_max_len(1).map(f).collect()))
}

/// One test binary: its results and its log section.
/// How long one test binary may run before it is killed with what it started and its unreported tests named
/// (`LAB_BINARY_TIMEOUT` seconds, which the GPU bundle's runner sets; unset: no limit, and the binaries stay in the
/// runner's process group, so that Ctrl-C reaches them): a kernel that deadlocks would otherwise hold the whole run
/// until the device call's own limit ends it unreported.
pub fn binary_limit() -> Option<Duration> {
    std::env::var("LAB_BINARY_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .map(Duration::from_secs)
}

/// A binary's output, read on a thread as it comes (a full pipe would stall the binary), handed back through a
/// channel: a killed binary's child that still holds the pipe cannot hold the runner.
fn read_on_thread(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        let _ = tx.send(v);
    });
    rx
}

/// The tests of binary `path` (`--list`) that `reported` does not name: where a killed binary hung.
fn unreported(
    path: &Path,
    env: &[(&str, &str)],
    reported: &[(String, Outcome, String)],
) -> Vec<String> {
    let Ok(out) = Command::new(path)
        .arg("--list")
        .envs(env.iter().copied())
        .output()
    else {
        return vec!["(its --list failed)".into()];
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .filter(|name| !reported.iter().any(|r| r.0 == *name))
        .map(str::to_string)
        .collect()
}

/// A finished (or killed) process's output and status.
pub struct Finished {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: std::process::ExitStatus,
    /// Killed at the limit.
    pub timed_out: bool,
}

/// Runs `path` to its end, or with a `limit` to it, whichever comes first: then kills it and what it started (it runs
/// in a process group of its own: a test in a fresh process of its own holds the output pipes and may hold the GPU).
fn run_limited(path: &Path, env: &[(&str, &str)], limit: Option<Duration>) -> Result<Finished> {
    let mut cmd = Command::new(path);
    cmd.envs(env.iter().copied());
    run_command_limited(cmd, limit).with_context(|| format!("running {}", path.display()))
}

/// [`run_limited`] for any command (the sanitizer's runs too).
pub fn run_command_limited(mut cmd: Command, limit: Option<Duration>) -> Result<Finished> {
    use std::os::unix::process::CommandExt;
    use wait_timeout::ChildExt;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if limit.is_some() {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn()?;
    let out = read_on_thread(child.stdout.take().context("stdout")?);
    let err = read_on_thread(child.stderr.take().context("stderr")?);
    let waited = match limit {
        Some(l) => child.wait_timeout(l)?,
        None => Some(child.wait()?),
    };
    let (status, timed_out) = match waited {
        Some(s) => (s, false),
        None => {
            // SAFETY: kill(2) on the group the child leads (its pid is the group's id: process_group(0)).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            (child.wait()?, true)
        }
    };
    // A finished binary's pipes close at once; a grandchild left holding them must not hold the runner.
    let grace = Duration::from_secs(if timed_out { 10 } else { 3600 });
    Ok(Finished {
        stdout: out.recv_timeout(grace).unwrap_or_default(),
        stderr: err.recv_timeout(grace).unwrap_or_default(),
        status,
        timed_out,
    })
}

fn run_one(b: &TestBinary, env: &[(&str, &str)]) -> Result<(Vec<TestResult>, String)> {
    let mut log = String::new();
    let mut all = Vec::new();
    let t0 = Instant::now();
    let limit = binary_limit();
    let out = run_limited(&b.path, env, limit)?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = writeln!(
        log,
        "==== {} :: {} ({:.1}s, {})",
        b.package,
        b.target,
        t0.elapsed().as_secs_f64(),
        out.status
    );
    log.push_str(&stderr);
    log.push_str(&stdout);
    for l in stderr.lines().filter(|l| l.starts_with("lab: ")) {
        eprintln!("[{}::{}] {l}", b.package, b.target);
    }
    let parsed = parse_libtest(&stdout);
    let failed_in_parse = parsed.iter().any(|p| p.1 == Outcome::Failed);
    // The binary itself failed (killed, or a failing exit with no failed test): one record for it.
    let binary_failed = |message: String| TestResult {
        package: b.package.clone(),
        binary: b.target.clone(),
        name: "<binary>".into(),
        outcome: Outcome::Failed,
        message,
    };
    if out.timed_out {
        let missing = unreported(&b.path, env, &parsed);
        all.push(binary_failed(format!(
            "{} did not finish in {} s and was killed; {} of its tests never reported (a hung one is among them): \
             {}",
            b.target,
            limit.map_or(0, |l| l.as_secs()),
            missing.len(),
            missing.join(", ")
        )));
    }
    for (name, outcome, message) in parsed {
        all.push(TestResult {
            package: b.package.clone(),
            binary: b.target.clone(),
            name,
            outcome,
            message,
        });
    }
    if !out.status.success() && !failed_in_parse && !out.timed_out {
        all.push(binary_failed(format!(
            "{} exited with {} without reporting a failed test:\n{stderr}",
            b.target, out.status
        )));
    }
    Ok((all, log))
}

#[derive(Debug, Default, Clone, Copy)]
struct Count {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Count {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Passed => self.passed += 1,
            Outcome::Failed => self.failed += 1,
            Outcome::Skipped => self.skipped += 1,
        }
    }
}

#[derive(Debug, Default)]
struct Row {
    model: Count,
    compile: Count,
    gpu: Count,
    kernels_total: usize,
    kernels_compiled: usize,
    budget_failures: usize,
}

/// A kernel check is `compile::<kernel>::sm_XX`, added by `Suite::kernels`.
fn is_kernel_check(binary: &str, name: &str) -> bool {
    Kind::of(binary, name) == Kind::Compile
        && name
            .rsplit("::")
            .next()
            .is_some_and(|a| a.starts_with("sm_"))
}

/// The per-block table, the totals, and the closing line that CI reads.
pub fn summarize(results: &[TestResult], title: &str) -> (String, bool) {
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    let mut total = Count::default();
    for r in results {
        let row = rows.entry(&r.package).or_default();
        total.add(r.outcome);
        match Kind::of(&r.binary, &r.name) {
            Kind::Model => row.model.add(r.outcome),
            Kind::Compile => row.compile.add(r.outcome),
            Kind::Gpu => row.gpu.add(r.outcome),
        }
        if is_kernel_check(&r.binary, &r.name) {
            row.kernels_total += 1;
            let over_budget = r.message.contains("breaks its budget");
            if r.outcome == Outcome::Passed || over_budget {
                row.kernels_compiled += 1;
            }
            if over_budget {
                row.budget_failures += 1;
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "## {title}\n");
    let _ = writeln!(
        s,
        "| block | model tests passed | compile tests passed | GPU tests passed | GPU tests skipped | kernels compiled | resource budget |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let frac = |c: Count| {
        let run = c.passed + c.failed;
        if c.failed > 0 {
            format!("{}/{} ({} FAILED)", c.passed, run, c.failed)
        } else {
            format!("{}/{}", c.passed, run)
        }
    };
    for (block, r) in &rows {
        let budget = if r.kernels_total == 0 {
            "—".to_string()
        } else if r.budget_failures > 0 {
            format!("OVER ({})", r.budget_failures)
        } else if r.kernels_compiled < r.kernels_total {
            "not compiled".to_string()
        } else {
            "ok".to_string()
        };
        let _ = writeln!(
            s,
            "| {block} | {} | {} | {} | {} | {}/{} | {budget} |",
            frac(r.model),
            frac(r.compile),
            frac(r.gpu),
            r.gpu.skipped,
            r.kernels_compiled,
            r.kernels_total
        );
    }
    let failures: Vec<&TestResult> = results
        .iter()
        .filter(|r| r.outcome == Outcome::Failed)
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\n### Failures\n");
        for f in &failures {
            let first = f
                .message
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            let _ = writeln!(s, "- `{}` {}: {}", f.package, f.name, first.trim());
        }
    }
    let skipped_gpu = rows.values().map(|r| r.gpu.skipped).sum::<usize>();
    if skipped_gpu > 0 {
        let _ = writeln!(
            s,
            "\n{skipped_gpu} GPU tests were skipped: they did not run, and are not counted as passed."
        );
    }
    let _ = writeln!(
        s,
        "\nsummary: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    (s, total.failed == 0)
}

/// JUnit XML, one suite per test binary.
pub fn junit(results: &[TestResult], name: &str) -> Result<String> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new(name);
    let mut suites: BTreeMap<String, TestSuite> = BTreeMap::new();
    for r in results {
        let key = format!("{}::{}", r.package, r.binary);
        let suite = suites
            .entry(key.clone())
            .or_insert_with(|| TestSuite::new(key));
        let status = match r.outcome {
            Outcome::Passed => TestCaseStatus::success(),
            Outcome::Skipped => TestCaseStatus::skipped(),
            Outcome::Failed => {
                let mut st = TestCaseStatus::non_success(NonSuccessKind::Failure);
                st.set_description(r.message.clone());
                st
            }
        };
        suite.add_test_case(TestCase::new(r.name.clone(), status));
    }
    report.add_test_suites(suites.into_values());
    Ok(report.to_string()?)
}

/// Every insta `.snap.new` / `.pending-snap` under `root`, outside `target/` and hidden folders.
pub fn pending_snapshots(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(p);
                }
            } else if name.ends_with(".snap.new") || name.ends_with(".pending-snap") {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

/// Writes summary.md, junit.xml, test-log.txt and, if any, snapshots.tar (the `.snap.new` files, with their
/// paths relative to `root`) into `out`: few files, so that the device's $OUT brings them all back.
pub fn write_outputs(
    out: &Path,
    root: &Path,
    results: &[TestResult],
    summary: &str,
    log: &str,
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("summary.md"), summary)?;
    std::fs::write(out.join("junit.xml"), junit(results, "lab")?)?;
    std::fs::write(out.join("test-log.txt"), log)?;
    let snaps = pending_snapshots(root);
    if !snaps.is_empty() {
        let rel: Vec<String> = snaps
            .iter()
            .filter_map(|p| p.strip_prefix(root).ok())
            .map(|p| p.display().to_string())
            .collect();
        let status = Command::new("tar")
            .arg("-cf")
            .arg(out.join("snapshots.tar"))
            .arg("-C")
            .arg(root)
            .args(&rel)
            .status()
            .context("running tar")?;
        anyhow::ensure!(status.success(), "tar failed: {status}");
        eprintln!(
            "{} new snapshot(s) written to {}/snapshots.tar",
            rel.len(),
            out.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_past_its_limit_is_killed_with_what_it_reported() {
        // A "binary" that reports one test and hangs, in a child of its own (as an isolated test would).
        let dir = std::env::temp_dir().join(format!("xtask-limit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("hangs.sh");
        std::fs::write(&bin, "#!/bin/sh\necho 'test a ... ok'\nsleep 60\n").unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let t0 = Instant::now();
        let f = run_limited(&bin, &[], Some(Duration::from_secs(1))).unwrap();
        assert!(f.timed_out);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t0.elapsed()
        );
        assert_eq!(parse_libtest(&String::from_utf8_lossy(&f.stdout)).len(), 1);
        let f = run_limited(Path::new("/bin/true"), &[], Some(Duration::from_secs(10))).unwrap();
        assert!(!f.timed_out && f.status.success());
        let f = run_limited(Path::new("/bin/true"), &[], None).unwrap();
        assert!(!f.timed_out && f.status.success());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn in_parallel_keeps_order_and_its_bound() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (now, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let items: Vec<u64> = (0..24).collect();
        let out = in_parallel(&items, 3, |&i| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(n, Ordering::SeqCst);
            // Later items end first: the order must come from the items, not from the finishing.
            std::thread::sleep(std::time::Duration::from_millis(2 * (24 - i)));
            now.fetch_sub(1, Ordering::SeqCst);
            i * 10
        })
        .unwrap();
        assert_eq!(out, items.iter().map(|i| i * 10).collect::<Vec<_>>());
        let peak = peak.load(Ordering::SeqCst);
        assert!(peak <= 3, "{peak} at once with a bound of 3");
        assert!(peak > 1, "never more than one at once: not parallel");
    }

    const OUT: &str = "\
running 4 tests
test model::a ... ok
test compile::k::sm_90                     ... FAILED
test gpu::x ... ignored
test gpu::y ... ignored, needs a GPU

failures:

---- compile::k::sm_90 ----
lab/k on sm_90 breaks its budget: 99 registers > budget 64

failures:
    compile::k::sm_90

test result: FAILED. 1 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s
";

    fn results() -> Vec<TestResult> {
        parse_libtest(OUT)
            .into_iter()
            .map(|(name, outcome, message)| TestResult {
                package: "blk".into(),
                binary: "gpu".into(),
                name,
                outcome,
                message,
            })
            .collect()
    }

    #[test]
    fn parses_outcomes_and_failure_messages() {
        let r = parse_libtest(OUT);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].1, Outcome::Passed);
        assert_eq!(r[1].1, Outcome::Failed);
        assert!(r[1].2.contains("breaks its budget"), "{:?}", r[1].2);
        assert_eq!((r[2].1, r[3].1), (Outcome::Skipped, Outcome::Skipped));
    }

    #[test]
    fn skipped_gpu_tests_are_never_counted_as_passed() {
        let (table, ok) = summarize(&results(), "t");
        assert!(!ok);
        assert!(
            table.contains("| blk | 1/1 | 0/1 (1 FAILED) | 0/0 | 2 | 1/1 | OVER (1) |"),
            "{table}"
        );
        assert!(
            table.contains("summary: 1 passed, 1 failed, 2 skipped"),
            "{table}"
        );
        assert!(table.contains("2 GPU tests were skipped"), "{table}");
    }

    #[test]
    fn junit_marks_skips_and_failures() {
        let x = junit(&results(), "lab").unwrap();
        assert!(x.contains("<skipped"), "{x}");
        assert!(x.contains("<failure"), "{x}");
        assert!(x.contains("tests=\"4\""), "{x}");
    }
}
