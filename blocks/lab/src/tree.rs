// tree.rs: where the lab's source tree is at run time, for tests that read committed files (headers, snapshots).
use std::path::{Path, PathBuf};

/// The root of the tree the tests read files from: `INSTA_WORKSPACE_ROOT` where it is set (the GPU bundle sets it to
/// the tree it runs beside), else the nearest folder at or above the current directory whose `Cargo.toml` holds a
/// `[workspace]` (cargo runs a test in its package's folder), else the tree this binary was built from. A bundle
/// copied to another path therefore reads the copy, never the build machine's path.
pub fn tree_root() -> PathBuf {
    if let Some(r) = std::env::var_os("INSTA_WORKSPACE_ROOT").filter(|r| !r.is_empty()) {
        return PathBuf::from(r);
    }
    if let Ok(cwd) = std::env::current_dir()
        && let Some(root) = workspace_above(&cwd)
    {
        return root;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The nearest folder at or above `dir` with a workspace manifest.
pub fn workspace_above(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_found_from_below_and_not_from_outside() {
        let base = std::env::temp_dir().join(format!("lab-tree-{}", std::process::id()));
        let deep = base.join("ws/blocks/x/src");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(
            base.join("ws/Cargo.toml"),
            "# m\n[workspace]\nmembers = []\n",
        )
        .unwrap();
        std::fs::write(
            base.join("ws/blocks/x/Cargo.toml"),
            "# m\n[package]\nname = \"x\"\n",
        )
        .unwrap();
        assert_eq!(workspace_above(&deep), Some(base.join("ws")));
        let outside = base.join("other");
        std::fs::create_dir_all(&outside).unwrap();
        let found = workspace_above(&outside);
        std::fs::remove_dir_all(&base).unwrap();
        assert_ne!(found, Some(base.join("ws")));
    }
}
