// Repository invariants, run as ordinary tests: the block file set, file headers, and the kernel registry.
use std::path::{Path, PathBuf};

use crate::build::workspace_root;

/// What every block crate (all of `blocks/` but the harness `lab`) holds, so a new block is a copied sibling.
const BLOCK_FILES: &[&str] = &[
    "Cargo.toml",
    "src/lib.rs",
    "src/model.rs",
    "src/kernels.rs",
    "tests/gpu.rs",
];

fn blocks() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(workspace_root().join("blocks"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file() && !p.ends_with("lab"))
        .collect();
    v.sort();
    v
}

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "snapshots" {
                source_files(&p, out);
            }
        } else if ["rs", "cu", "cuh", "py", "sh", "toml"]
            .iter()
            .any(|x| name.ends_with(&format!(".{x}")))
            || name == "run"
        {
            out.push(p);
        }
    }
}

#[test]
fn every_block_has_the_standard_file_set_and_a_doc_page() {
    let root = workspace_root();
    for b in blocks() {
        let name = b.file_name().unwrap().to_string_lossy().into_owned();
        for f in BLOCK_FILES {
            assert!(
                b.join(f).is_file(),
                "block `{name}` lacks {f} (copy a sibling block)"
            );
        }
        let header = b
            .join("cuda")
            .join(format!("{}.cuh", name.replace('-', "_")));
        assert!(
            header.is_file(),
            "block `{name}` lacks its device header {}",
            header.display()
        );
        let doc = root.join("docs/blocks").join(format!("{name}.md"));
        assert!(doc.is_file(), "block `{name}` lacks docs/blocks/{name}.md");
    }
}

#[test]
fn every_block_is_in_the_kernel_registry() {
    let registry = include_str!("registry.rs");
    for b in blocks() {
        let krate = b.file_name().unwrap().to_string_lossy().replace('-', "_");
        assert!(
            registry.contains(&format!("{krate}::kernels()")),
            "xtask/src/registry.rs does not list `{krate}`"
        );
    }
}

#[test]
fn every_source_file_opens_with_a_one_line_comment() {
    let root = workspace_root();
    let mut files = Vec::new();
    for d in ["blocks", "composed", "fixtures", "xtask", ".ci"] {
        if root.join(d).is_dir() {
            source_files(&root.join(d), &mut files);
        }
    }
    files.push(root.join("Cargo.toml"));
    assert!(
        files.len() > 10,
        "found only {} files: is the walk broken?",
        files.len()
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let first = text.lines().find(|l| !l.starts_with("#!")).unwrap_or("");
        assert!(
            ["// ", "//! ", "# "].iter().any(|p| first.starts_with(p)),
            "{} must open with a one-line comment saying what it is; it opens with `{first}`",
            f.display()
        );
    }
}
