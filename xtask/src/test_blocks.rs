// `cargo xtask test-blocks`: builds and runs every block's tests and prints one row per block.
use anyhow::Result;
use xshell::Shell;

use crate::build::{device_words, test_binaries, today, workspace_root};
use crate::runner;

/// `env` is set for the test binaries only (e.g. insta's check mode under `ci`).
pub fn run(release: bool, env: &[(&str, &str)]) -> Result<bool> {
    let sh = Shell::new()?;
    let root = workspace_root();
    sh.change_dir(&root);
    let bins = test_binaries(&sh, if release { "release" } else { "dev" })?;
    let mut log = String::new();
    let results = runner::run_all(&bins, env, 1, &mut log)?;
    let title = format!("test-blocks: {}, {}", device_words(), today());
    let (summary, ok) = runner::summarize(&results, &title);
    let out = root.join("target/test-blocks");
    runner::write_outputs(&out, &root, &results, &summary, &log)?;
    println!("{summary}");
    println!("(JUnit and the full log: {})", out.display());
    Ok(ok)
}
