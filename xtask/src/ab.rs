// `cargo xtask ab`: `sdpa` binaries timed against each other in alternating processes, on the GPU machine.
//
// Why processes and not variants in one process: the first configuration `sdpa bench` times in a process reads
// 1–3% faster than the same one timed later in it (the GPU starts each process cooler; docs/decisions.md's
// preamble). Here each binary runs in its own process, one after the other, and every other round runs them in
// the reverse order, so neither side always goes first.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::build::{device_words, today};

/// A process that has not finished by then is killed and its timing counted as missing.
const PROCESS_LIMIT: Duration = Duration::from_secs(200);

/// One binary under test: a name for the tables, and its path.
#[derive(Debug, Clone, PartialEq)]
pub struct Bin {
    pub name: String,
    pub path: PathBuf,
}

/// `NAME=PATH`.
pub fn parse_bin(s: &str) -> Result<Bin, String> {
    match s.split_once('=') {
        Some((n, p)) if !n.is_empty() && !p.is_empty() => Ok(Bin {
            name: n.to_string(),
            path: PathBuf::from(p),
        }),
        _ => Err(format!("expected NAME=PATH, got {s:?}")),
    }
}

/// What one `sdpa bench` line says of the stage's own timing.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub p50_us: f64,
    pub mean_us: f64,
    pub tflops: f64,
    /// The clock and power text `sdpa bench` appends (NVML), as printed.
    pub telemetry: String,
}

/// The number before `unit` after the first `key ` in `line`.
fn number_after(line: &str, key: &str, unit: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest.find(unit)?;
    rest[..end].trim().parse().ok()
}

/// The stage's own line of `sdpa bench`'s output (`STAGE B,H,...: p50 … µs, …; … TFLOP/s; telemetry`), not a
/// variant's (`STAGE [label] …`); for a packed batch (`--varlen`, `--mode varlen|paged|decode`), its line `varlen on
/// STAGE: …: T µs a call (plan and kernel; median of N), F TFLOP/s`: the median as p50 and mean, no telemetry.
pub fn parse_reading(stdout: &str, stage: &str) -> Option<Reading> {
    let prefix = format!("{stage} ");
    let Some(line) = stdout
        .lines()
        .find(|l| l.starts_with(&prefix) && !l[prefix.len()..].starts_with('['))
    else {
        return parse_varlen(stdout, stage);
    };
    let tflops = {
        let head = &line[..line.find(" TFLOP/s")?];
        head[head.rfind(';')? + 1..].trim().parse().ok()?
    };
    Some(Reading {
        p50_us: number_after(line, "p50 ", " µs")?,
        mean_us: number_after(line, "mean ", " µs")?,
        tflops,
        telemetry: line[line.find(" TFLOP/s;")? + " TFLOP/s;".len()..]
            .trim()
            .to_string(),
    })
}

/// A packed batch's line of `sdpa bench` (see [`parse_reading`]).
fn parse_varlen(stdout: &str, stage: &str) -> Option<Reading> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(&format!("varlen on {stage}: ")))?;
    let head = &line[..line.find(" µs a call")?];
    let us: f64 = head[head.rfind(": ")? + 2..].trim().parse().ok()?;
    let tail = line[..line.rfind(" TFLOP/s")?].trim_end();
    let tflops = tail[tail.rfind(", ")? + 2..].trim().parse().ok()?;
    Some(Reading {
        p50_us: us,
        mean_us: us,
        tflops,
        telemetry: String::new(),
    })
}

/// The order the binaries run in, round r (from 1): as given in odd rounds, reversed in even ones.
pub fn order(n: usize, round: usize) -> Vec<usize> {
    if round % 2 == 1 {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// One process: `bin bench --stage STAGE CASE…`, its whole output and the stage's reading.
fn run_one(bin: &Path, stage: &str, case: &str) -> Result<(String, Option<Reading>)> {
    let mut cmd = Command::new(bin);
    cmd.args(["bench", "--stage", stage])
        .args(case.split_whitespace());
    // Read while it runs (a full pipe would stall it), killed with what it started at the limit.
    let f = crate::runner::run_command_limited(cmd, Some(PROCESS_LIMIT))
        .with_context(|| format!("starting {}", bin.display()))?;
    let (out, err) = (
        String::from_utf8_lossy(&f.stdout).into_owned(),
        String::from_utf8_lossy(&f.stderr).into_owned(),
    );
    let text = if f.timed_out {
        format!("{out}{err}(killed after {} s)\n", PROCESS_LIMIT.as_secs())
    } else if !f.status.success() {
        format!("{out}{err}({})\n", f.status)
    } else {
        format!("{out}{err}")
    };
    let reading = parse_reading(&out, stage);
    Ok((text, reading))
}

/// Every (case, round, binary) reading; None where a process failed.
pub type Table = Vec<Vec<Vec<Option<Reading>>>>;

/// The report: per case, each round's p50 of each binary with its speed against the first binary's p50 of the
/// same round (+x%: faster), the TFLOP/s and the telemetry; then the rounds' median of each comparison.
pub fn report(bins: &[Bin], stage: &str, cases: &[String], table: &Table, title: &str) -> String {
    let mut s = format!("# A/B of {stage}: {title}\n\n");
    let _ = writeln!(
        s,
        "Each binary in its own process, one after another; every other round in the reverse order. p50 and mean \
         are µs a launch; `vs {}` is the first binary's p50 over this one's, less 1 (+: this one is faster).\n",
        bins[0].name
    );
    for (ci, case) in cases.iter().enumerate() {
        let _ = writeln!(s, "## `{case}`\n");
        let _ = writeln!(
            s,
            "| round | binary | p50 | mean | TFLOP/s | vs {} | clock and power |",
            bins[0].name
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        let mut speedups: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
        for (ri, round) in table[ci].iter().enumerate() {
            let base = round[0].as_ref().map(|r| r.p50_us);
            for (bi, b) in bins.iter().enumerate() {
                match &round[bi] {
                    Some(r) => {
                        let vs = base.map(|p| p / r.p50_us - 1.0);
                        if let Some(v) = vs {
                            speedups[bi].push(v);
                        }
                        let _ = writeln!(
                            s,
                            "| {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
                            ri + 1,
                            b.name,
                            r.p50_us,
                            r.mean_us,
                            r.tflops,
                            vs.map_or("—".into(), |v| format!("{:+.1}%", 100.0 * v)),
                            r.telemetry
                        );
                    }
                    None => {
                        let _ = writeln!(s, "| {} | {} | failed | | | | |", ri + 1, b.name);
                    }
                }
            }
        }
        let _ = writeln!(s);
        for (bi, b) in bins.iter().enumerate().skip(1) {
            let v = &speedups[bi];
            if v.is_empty() {
                let _ = writeln!(s, "- {}: no comparison (a process failed)", b.name);
            } else {
                let list: Vec<String> = v.iter().map(|x| format!("{:+.1}%", 100.0 * x)).collect();
                let m = lab::numerics::median(v.clone());
                let (fast, slow) = if m >= 0.0 {
                    (&b.name, &bins[0].name)
                } else {
                    (&bins[0].name, &b.name)
                };
                let _ = writeln!(
                    s,
                    "- {} against {}: {} (median {:+.1}%: {fast} faster than {slow}; + means {} faster)",
                    b.name,
                    bins[0].name,
                    list.join(", "),
                    100.0 * m,
                    b.name
                );
            }
        }
        let _ = writeln!(s);
    }
    s
}

/// `cargo xtask ab`: runs, writes OUT/ab.md (the report) and OUT/ab.txt (every process's output).
pub fn run(bins: &[Bin], cases: &[String], stage: &str, rounds: usize, out: &Path) -> Result<bool> {
    ensure!(
        bins.len() >= 2,
        "ab compares at least two binaries (--bin NAME=PATH, twice or more)"
    );
    ensure!(
        !cases.is_empty(),
        "ab needs a case (--case \"--shape B,H,S,D …\")"
    );
    ensure!(rounds >= 1, "ab needs a round");
    for b in bins {
        if !b.path.is_file() {
            bail!("{}: no binary at {}", b.name, b.path.display());
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut raw = String::new();
    let mut table: Table = vec![vec![vec![None; bins.len()]; rounds]; cases.len()];
    for round in 1..=rounds {
        for (ci, case) in cases.iter().enumerate() {
            for bi in order(bins.len(), round) {
                let b = &bins[bi];
                eprintln!("ab: round {round}, {}: {case}", b.name);
                let (text, reading) = run_one(&b.path, stage, case)?;
                let _ = writeln!(raw, "## round {round} {}: {case}\n{text}", b.name);
                table[ci][round - 1][bi] = reading;
            }
        }
    }
    let title = format!("{}, {}", device_words(), today());
    let md = report(bins, stage, cases, &table, &title);
    std::fs::write(out.join("ab.md"), &md)?;
    std::fs::write(out.join("ab.txt"), &raw)?;
    println!("{md}");
    Ok(table.iter().flatten().flatten().all(Option::is_some))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "stage7 4,16,4096,4096,128 normal per-head: p50 631.9 µs, p90 632.6 µs, mean 630.7 µs per launch \
                        (1 back to back, 200 graph replays); 870.01 TFLOP/s; 1635 MHz, 697 W (power cap 100%)";

    #[test]
    fn reads_the_stage_line_not_a_variant() {
        let out = format!(
            "stage7 [no stores] 4,16,4096,4096,128 normal per-head: p50 612.5 µs, p90 613.0 µs, mean 612.0 µs per \
             launch (1 back to back, 200 graph replays); 897.00 TFLOP/s; x\n{LINE}\n"
        );
        let r = parse_reading(&out, "stage7").expect("a reading");
        assert_eq!(r.p50_us, 631.9);
        assert_eq!(r.mean_us, 630.7);
        assert_eq!(r.tflops, 870.01);
        assert_eq!(r.telemetry, "1635 MHz, 697 W (power cap 100%)");
    }

    #[test]
    fn no_reading_from_another_stage_or_an_error() {
        assert_eq!(parse_reading(LINE, "stage6"), None);
        assert_eq!(
            parse_reading("Error: sdpa bench needs a CUDA GPU", "stage7"),
            None
        );
    }

    #[test]
    fn reads_a_packed_batchs_line() {
        let out = "varlen on stage8: 16 sequences, 65536 query and 65536 key tokens, H = 16, Hkv = 16, D = 128: \
                   3309.2 µs a call (plan and kernel; median of 20), 856.7 TFLOP/s\n  with each K/V head's 4 query \
                   heads packed into a unit's rows (pack-gqa): 3290.0 µs (861.7 TFLOP/s), 0.994× unpacked\n";
        let r = parse_reading(out, "stage8").expect("a reading");
        assert_eq!((r.p50_us, r.mean_us, r.tflops), (3309.2, 3309.2, 856.7));
        assert_eq!(r.telemetry, "");
        assert_eq!(parse_reading(out, "stage7"), None);
        assert_eq!(
            parse_reading("varlen on stage8: no number here", "stage8"),
            None
        );
    }

    #[test]
    fn rounds_alternate_the_order() {
        assert_eq!(order(3, 1), vec![0, 1, 2]);
        assert_eq!(order(3, 2), vec![2, 1, 0]);
        assert_eq!(order(2, 3), vec![0, 1]);
    }

    #[test]
    fn bins_parse_as_name_equals_path() {
        assert_eq!(
            parse_bin("new=.bundle/sdpa"),
            Ok(Bin {
                name: "new".into(),
                path: PathBuf::from(".bundle/sdpa")
            })
        );
        assert!(parse_bin("new").is_err());
        assert!(parse_bin("=x").is_err());
    }

    #[test]
    fn the_report_compares_each_round_with_the_first_binary() {
        let bins = [parse_bin("old=a").unwrap(), parse_bin("new=b").unwrap()];
        let r = |p50: f64| {
            Some(Reading {
                p50_us: p50,
                mean_us: p50,
                tflops: 1.0,
                telemetry: String::new(),
            })
        };
        let table: Table = vec![vec![vec![r(110.0), r(100.0)], vec![r(104.0), r(100.0)]]];
        let md = report(&bins, "stage7", &["--shape 1,1,64,64".into()], &table, "t");
        assert!(
            md.contains("| 1 | new | 100.0 | 100.0 | 1.0 | +10.0% |"),
            "{md}"
        );
        assert!(
            md.contains("new against old: +10.0%, +4.0% (median +7.0%: new faster than old; + means new faster)"),
            "{md}"
        );
        let failed: Table = vec![vec![vec![r(110.0), None]]];
        let md = report(&bins, "stage7", &["c".into()], &failed, "t");
        assert!(md.contains("| 1 | new | failed |"), "{md}");
        assert!(md.contains("new: no comparison"), "{md}");
    }
}
