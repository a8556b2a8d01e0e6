// `cargo xtask ci`: fmt, clippy, every test with snapshots in check mode, and the resource budgets; one verdict line.
use anyhow::Result;
use xshell::{Shell, cmd};

use crate::build::workspace_root;

pub fn run() -> Result<bool> {
    let sh = Shell::new()?;
    sh.change_dir(workspace_root());
    let mut failed: Vec<&str> = Vec::new();
    // Every step runs, whatever the one before said, so that one run names everything to fix.
    let mut step = |name: &'static str, ok: Result<bool>| match ok {
        Ok(true) => {}
        Ok(false) => failed.push(name),
        Err(e) => {
            eprintln!("{name}: {e:#}");
            failed.push(name);
        }
    };
    step(
        "fmt",
        cmd!(sh, "cargo fmt --all -- --check")
            .run()
            .map(|()| true)
            .map_err(Into::into),
    );
    step(
        "clippy",
        cmd!(
            sh,
            "cargo clippy --workspace --all-targets --quiet -- -D warnings"
        )
        .run()
        .map(|()| true)
        .map_err(Into::into),
    );
    // insta in check mode: a differing snapshot fails, and no .snap.new is written.
    step(
        "tests",
        crate::test_blocks::run(
            false,
            &[
                ("INSTA_UPDATE", "no"),
                ("INSTA_FORCE_PASS", "0"),
                ("CI", "true"),
            ],
        ),
    );
    println!("\n== ptxas --check");
    step("ptxas budgets", crate::ptxas::run(&[], true, &[]));
    println!("\n{}", verdict(&failed));
    Ok(failed.is_empty())
}

/// The last line `ci` prints.
fn verdict(failed: &[&str]) -> String {
    if failed.is_empty() {
        "ci: ok".into()
    } else {
        format!("ci: FAILED: {}", failed.join(", "))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_verdict_names_every_failed_step() {
        assert_eq!(super::verdict(&[]), "ci: ok");
        assert_eq!(super::verdict(&["fmt", "tests"]), "ci: FAILED: fmt, tests");
    }
}
