// `cargo xtask gpu-bundle`: packs the test binaries and a runner for a GPU machine with no Rust; and the runner.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use xshell::{Shell, cmd};

use crate::build::{device_words, test_binaries, test_binaries_of, today, workspace_root};
use crate::runner::{self, TestBinary};

/// The device tool carries at most 64 MiB: the working tree (tracked and untracked, not ignored files) and the
/// ignored paths named in `carry`, this bundle among them.
const MAX_CARRY: u64 = 64 << 20;
/// Room kept for the tree's growth between a build and its run.
const MARGIN: u64 = 1 << 20;

const RUN_SCRIPT: &str = r#"#!/bin/sh
# Runs every lab test binary on a GPU machine (no Rust needed): ./run OUT_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/out}
export LAB_REQUIRE_GPU=1
export INSTA_WORKSPACE_ROOT="${INSTA_WORKSPACE_ROOT:-$(cd "$here/.." && pwd)}"
export INSTA_UPDATE=new
export LAB_NO_INSTALL=1
# A binary still running after this many seconds is killed and its unreported tests named (the slowest, composed's,
# takes ~200–250 s on an H100), leaving a 600 s device call time for the sanitizer (~95 s) and the summary.
export LAB_BINARY_TIMEOUT="${LAB_BINARY_TIMEOUT:-420}"
exec "$here/xtask" run-bundle "$here" "$out"
"#;

pub fn build(dir: Option<PathBuf>, only: &[String], attempts: &[String]) -> Result<()> {
    let sh = Shell::new()?;
    let root = workspace_root();
    sh.change_dir(&root);
    let dir = dir.unwrap_or_else(|| root.join(".bundle"));
    let bins = if only.is_empty() {
        test_binaries(&sh, "bundle")?
    } else {
        let mut select = Vec::new();
        for p in only {
            select.extend(["-p", p.as_str()]);
        }
        select.push("--all-targets");
        test_binaries_of(&sh, "bundle", &select)?
    };
    // The unit tests of libraries and binaries (`--lib`, `--bin`: models, parsers, the tree's rules) need no GPU and
    // run in CI on every commit; the bundle carries the test binaries that do (each block's `gpu`, which also holds
    // its model and compile tests, and the examples), so that every package fits the device tool's carry beside the
    // tree.
    let bins: Vec<_> = bins
        .into_iter()
        .filter(|b| b.target != "lib" && b.target != "bin")
        .collect();
    cmd!(
        sh,
        "cargo build --quiet -p xtask -p sdpa-cli --bins --profile bundle"
    )
    .run()?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin"))?;
    let mut manifest = Vec::new();
    for b in &bins {
        let file = format!("{}--{}", b.package, b.target);
        std::fs::copy(&b.path, dir.join("bin").join(&file))
            .with_context(|| format!("copying {}", b.path.display()))?;
        manifest.push(TestBinary {
            package: b.package.clone(),
            target: b.target.clone(),
            path: PathBuf::from("bin").join(file),
        });
    }
    std::fs::copy(root.join("target/bundle/xtask"), dir.join("xtask"))?;
    std::fs::copy(root.join("target/bundle/sdpa"), dir.join("sdpa"))?;
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    // Where the tree was when the bundle was built: the run says whether it ran from a copy elsewhere.
    std::fs::write(dir.join("built-at"), root.display().to_string())?;
    for rev in attempts {
        build_attempt(&sh, &root, &dir, rev)?;
    }
    std::fs::write(dir.join("run"), RUN_SCRIPT)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("run"), std::fs::Permissions::from_mode(0o755))?;
    }
    let size = dir_size(&dir)?;
    let tree = tree_size(&sh, &root)?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "bundle: {} test binaries + runner in {} ({:.1} MiB)\nrun it on the GPU machine as: {}/run OUT_DIR",
        manifest.len(),
        dir.display(),
        mib(size),
        dir.strip_prefix(&root).unwrap_or(&dir).display()
    );
    let room = MAX_CARRY.saturating_sub(tree + MARGIN);
    ensure!(
        size <= room,
        "bundle is {:.1} MiB: with the tree ({:.1} MiB) over the device tool's {} MiB carry",
        mib(size),
        mib(tree),
        MAX_CARRY >> 20
    );
    println!(
        "carry: the tree {:.1} MiB + the bundle {:.1} MiB; {:.1} MiB left for other carried paths (the ladder's wheels: ~12)",
        mib(tree),
        mib(size),
        mib(room - size)
    );
    Ok(())
}

/// Bytes of the working tree the device tool sends: tracked files, and untracked ones git does not ignore.
fn tree_size(sh: &Shell, root: &Path) -> Result<u64> {
    let list = cmd!(sh, "git ls-files --cached --others --exclude-standard -z").read()?;
    Ok(list
        .split('\0')
        .filter(|f| !f.is_empty())
        .filter_map(|f| std::fs::metadata(root.join(f)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum())
}

/// The name an attempt's files go under: the revision with '/' as '-'.
pub fn attempt_name(rev: &str) -> String {
    rev.replace('/', "-")
}

/// The blocks `rev` changes since it left the tree's HEAD (what HEAD changed since is not the attempt's): their GPU
/// tests travel with the attempt.
fn changed_blocks(sh: &Shell, rev: &str) -> Result<Vec<String>> {
    let range = format!("HEAD...{rev}");
    let files = cmd!(sh, "git diff --name-only {range}").read()?;
    let mut blocks: Vec<String> = files
        .lines()
        .filter_map(|f| {
            f.strip_prefix("blocks/")?
                .split('/')
                .next()
                .map(str::to_string)
        })
        .collect();
    blocks.sort();
    blocks.dedup();
    Ok(blocks)
}

/// `rev` checked out in a worktree under target/, its `sdpa` and GPU tests built (one target directory for
/// every attempt, so dependencies build once) and copied into DIR/attempts/NAME/ with the commit's name.
fn build_attempt(sh: &Shell, root: &Path, dir: &Path, rev: &str) -> Result<()> {
    let name = attempt_name(rev);
    let spec = format!("{rev}^{{commit}}");
    let commit = cmd!(sh, "git rev-parse --verify {spec}")
        .read()
        .with_context(|| format!("--attempt {rev}: not a revision of this repository"))?;
    let tree = root.join("target/attempts/tree").join(&name);
    let target = root.join("target/attempts/build");
    let _ = cmd!(sh, "git worktree remove --force {tree}")
        .quiet()
        .ignore_stderr()
        .ignore_status()
        .run();
    // A worktree left by an interrupted build goes first (above), registered or not.
    let _ = std::fs::remove_dir_all(&tree);
    cmd!(sh, "git worktree prune").run()?;
    cmd!(sh, "git worktree add --quiet --detach {tree} {commit}").run()?;
    let built = (|| -> Result<Vec<(PathBuf, String)>> {
        let wsh = Shell::new()?;
        wsh.change_dir(&tree);
        let _env = wsh.push_env("CARGO_TARGET_DIR", &target);
        // The package that builds `sdpa`: sdpa-cli, or composed in revisions from before it had its own crate.
        let cli = if tree.join("sdpa-cli/Cargo.toml").is_file() {
            "sdpa-cli"
        } else {
            "composed"
        };
        cmd!(wsh, "cargo build --quiet -p {cli} --bins --profile bundle").run()?;
        let blocks = changed_blocks(sh, &commit)?;
        let mut select = vec!["-p", "composed", "--test", "gpu"];
        for b in &blocks {
            select.extend(["-p", b.as_str()]);
        }
        let mut files = vec![(target.join("bundle/sdpa"), "sdpa".to_string())];
        for b in test_binaries_of(&wsh, "bundle", &select)? {
            if b.package == "composed" || (blocks.contains(&b.package) && b.target == "gpu") {
                files.push((b.path, format!("{}--{}", b.package, b.target)));
            }
        }
        Ok(files)
    })();
    let _ = cmd!(sh, "git worktree remove --force {tree}")
        .quiet()
        .ignore_stderr()
        .ignore_status()
        .run();
    let out = dir.join("attempts").join(&name);
    std::fs::create_dir_all(&out)?;
    for (from, to) in built? {
        std::fs::copy(&from, out.join(&to))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    std::fs::write(out.join("commit"), format!("{rev} {commit}\n"))?;
    println!(
        "attempt {rev} ({}): {}",
        &commit[..commit.len().min(10)],
        out.display()
    );
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        total += if e.file_type()?.is_dir() {
            dir_size(&e.path())?
        } else {
            e.metadata()?.len()
        };
    }
    Ok(total)
}

/// On the GPU machine: run every binary of the manifest, write the outputs into `out`.
pub fn run(bundle: &Path, out: &Path) -> Result<bool> {
    let t0 = Instant::now();
    let text = std::fs::read_to_string(bundle.join("manifest.json"))
        .context("reading the bundle's manifest.json")?;
    let mut bins: Vec<TestBinary> = serde_json::from_str(&text)?;
    for b in &mut bins {
        b.path = bundle.join(&b.path);
    }
    let root = std::env::var_os("INSTA_WORKSPACE_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| bundle.join(".."));
    let mut log = String::new();
    // The test binaries run a few at a time: most of their time is NVRTC and ptxas on the CPU, each test's
    // arithmetic checked within its own process, none timed. `LAB_TEST_JOBS` overrides.
    let jobs = runner::jobs_from("LAB_TEST_JOBS");
    let results = runner::run_all(&bins, &[], jobs, &mut log)?;
    let title = format!("gpu-bundle: {}, {}", device_words(), today());
    let (mut summary, mut ok) = runner::summarize(&results, &title);
    summary.push_str(&where_text(&root, bundle));
    let tests_s = t0.elapsed().as_secs_f64();
    // The tests' outputs go out before the sanitizer starts: a run cut short by a time limit still reports them.
    let pending =
        format!("{summary}\ncompute-sanitizer: still running (the tests took {tests_s:.1} s)\n");
    runner::write_outputs(out, &root, &results, &pending, &log)?;
    // compute-sanitizer over the asynchronous-copy tests, where the toolkit has it (the GPU machine does).
    if Command::new("compute-sanitizer")
        .arg("--version")
        .output()
        .is_ok()
    {
        let t1 = Instant::now();
        let v = crate::sanitize::run(&bundle.join("bin"), &root, &mut log)?;
        ok &= v.iter().all(|x| x.ok);
        summary.push_str(&crate::sanitize::table(&v));
        summary.push_str(&format!(
            "the tests took {tests_s:.1} s, the sanitizer runs {:.1} s ({} at a time)\n",
            t1.elapsed().as_secs_f64(),
            crate::sanitize::jobs()
        ));
    } else {
        summary.push_str("\ncompute-sanitizer: not found on this machine, NOT run\n");
    }
    summary.push_str(&format!(
        "tests ran in {:.1} s\n",
        t0.elapsed().as_secs_f64()
    ));
    runner::write_outputs(out, &root, &results, &summary, &log)?;
    println!("{summary}");
    Ok(ok)
}

/// The summary's line on where the tests read the tree from, beside where the bundle was built: a run from a copy
/// at another path proves that no test reads a tree file through the build machine's path.
fn where_text(root: &Path, bundle: &Path) -> String {
    let here = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    match std::fs::read_to_string(bundle.join("built-at")) {
        Ok(built) if Path::new(built.trim()) == here => {
            format!(
                "\ntree: {} (the path the bundle was built at)\n",
                here.display()
            )
        }
        Ok(built) => format!(
            "\ntree: {} (built at {}: another path)\n",
            here.display(),
            built.trim()
        ),
        Err(_) => format!(
            "\ntree: {} (the bundle does not say where it was built)\n",
            here.display()
        ),
    }
}
