// `cargo xtask ci`: fmt, clippy, every test with snapshots in check mode, and the resource budgets.
use anyhow::Result;
use xshell::{Shell, cmd};

use crate::build::workspace_root;

pub fn run() -> Result<bool> {
    let sh = Shell::new()?;
    sh.change_dir(workspace_root());
    cmd!(sh, "cargo fmt --all -- --check").run()?;
    cmd!(
        sh,
        "cargo clippy --workspace --all-targets --quiet -- -D warnings"
    )
    .run()?;
    // insta in check mode: a differing snapshot fails, and no .snap.new is written.
    let tests_ok = crate::test_blocks::run(
        false,
        &[
            ("INSTA_UPDATE", "no"),
            ("INSTA_FORCE_PASS", "0"),
            ("CI", "true"),
        ],
    )?;
    println!("\n== ptxas --check");
    let budgets_ok = crate::ptxas::run(&[], true)?;
    Ok(tests_ok && budgets_ok)
}
