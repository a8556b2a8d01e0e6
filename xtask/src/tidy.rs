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

/// Every workspace crate's `src/` folder.
fn crate_sources() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut v = Vec::new();
    let mut dirs = vec![root.clone()];
    dirs.extend(blocks());
    dirs.push(root.join("blocks/lab"));
    for top in std::fs::read_dir(&root).unwrap().flatten() {
        let p = top.path();
        if p.join("Cargo.toml").is_file() && p.join("src").is_dir() {
            v.push(p.join("src"));
        }
    }
    for b in blocks().into_iter().chain([root.join("blocks/lab")]) {
        v.push(b.join("src"));
    }
    v.sort();
    v.dedup();
    v
}

/// The modules of the crate under `src` that each of its modules names through `crate::` (a module is a file's
/// stem; `lib`, `main` and `mod` files are the crate root or their folder).
fn module_imports(
    src: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut files = Vec::new();
    source_files(src, &mut files);
    let module = |p: &Path| {
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if stem == "mod" {
            p.parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        } else {
            stem
        }
    };
    let mods: std::collections::BTreeSet<String> = files.iter().map(|f| module(f)).collect();
    let mut out = std::collections::BTreeMap::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let me = module(f);
        let text = std::fs::read_to_string(f).unwrap();
        let mut uses = std::collections::BTreeSet::new();
        // `crate::a::…` and `use crate::{a::…, b, …}`: every identifier that names a module of this crate.
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + 7..];
            let group = if let Some(r) = rest.strip_prefix('{') {
                &r[..r.find('}').unwrap_or(r.len())]
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            };
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if mods.contains(&name) && name != me {
                    uses.insert(name);
                }
            }
        }
        out.insert(me, uses);
    }
    out
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut crates = 0;
    for src in crate_sources() {
        crates += 1;
        let g = module_imports(&src);
        // Depth-first search for a cycle; the first one found is the error.
        fn visit<'a>(
            g: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
            m: &'a str,
            path: &mut Vec<&'a str>,
            done: &mut std::collections::BTreeSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(i) = path.iter().position(|p| *p == m) {
                let mut c: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
                c.push(m.to_string());
                return Some(c);
            }
            if !done.insert(m) {
                return None;
            }
            path.push(m);
            for n in g.get(m).into_iter().flatten() {
                if let Some(c) = visit(g, n, path, done) {
                    return Some(c);
                }
            }
            path.pop();
            None
        }
        let mut done = std::collections::BTreeSet::new();
        for m in g.keys() {
            // lib/main are the crate root: they name every module, and no module imports them by name.
            if let Some(c) = visit(&g, m, &mut vec![], &mut done) {
                panic!(
                    "{}: modules import each other: {}",
                    src.display(),
                    c.join(" → ")
                );
            }
        }
    }
    assert!(
        crates > 10,
        "found only {crates} crates: is the walk broken?"
    );
}

#[test]
fn the_cycle_finder_sees_a_cycle() {
    let dir = std::env::temp_dir().join(format!("tidy-cycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.rs"), "// a\nuse crate::b::X;\n").unwrap();
    std::fs::write(
        dir.join("b.rs"),
        "// b\nuse crate::{c, a::Y};\nconst X: &[u8] = crate::Z;\nfn f() { a: 1, b: 2 }\n",
    )
    .unwrap();
    std::fs::write(dir.join("c.rs"), "// c\n").unwrap();
    let g = module_imports(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        g["a"].contains("b") && g["b"].contains("a") && g["b"].contains("c"),
        "{g:?}"
    );
    assert!(!g["c"].contains("a") && g["c"].is_empty(), "{g:?}");
}

/// Files written by a generator, whose length is the generator's business.
const GENERATED: &[&str] = &["blocks/frag-layout/cuda/wgmma_instr.cuh"];

/// The longest a hand-written source file may be: past it, a file holds more than one job.
const MAX_LINES: usize = 800;

#[test]
fn no_hand_written_source_file_is_over_800_lines() {
    let root = workspace_root();
    let mut files = Vec::new();
    source_files(&root, &mut files);
    let mut long = vec![];
    for f in files {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if GENERATED.contains(&rel.as_str())
            || rel.starts_with(".toolchain")
            || rel.starts_with(".bundle")
        {
            continue;
        }
        let n = std::fs::read_to_string(&f)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if n > MAX_LINES {
            long.push(format!("{rel} ({n} lines)"));
        }
    }
    assert!(
        long.is_empty(),
        "split these along their seams: {}",
        long.join(", ")
    );
}

#[test]
fn tests_find_tree_files_at_run_time_not_through_the_build_path() {
    // A bundle runs from a tree at another path than the one it was built in: a test that reads a file through the
    // compile-time manifest path reads the build machine's path there. The ones allowed resolve a default only.
    const ALLOWED: &[&str] = &[
        "xtask/src/build.rs",
        "blocks/lab/src/toolchain.rs",
        "blocks/lab/src/tree.rs",
    ];
    let root = workspace_root();
    let mut files = Vec::new();
    source_files(&root, &mut files);
    let needle = concat!("env!(\"CARGO_", "MANIFEST_DIR\")");
    let bad: Vec<String> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .map(|f| {
            f.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .filter(|rel| !ALLOWED.contains(&rel.as_str()) && !rel.starts_with(".toolchain"))
        .filter(|rel| {
            std::fs::read_to_string(root.join(rel))
                .unwrap()
                .contains(needle)
        })
        .collect();
    assert!(
        bad.is_empty(),
        "read tree files through lab::tree_root() instead: {}",
        bad.join(", ")
    );
}

/// Largest file the repository tracks. A submission's commits are limited in size (packed and as diffs); data a
/// script can make again (ladder outputs, bundles, wheels, profiles) stays out of git.
const MAX_TRACKED_BYTES: u64 = 256 * 1024;

#[test]
fn no_tracked_file_is_large_or_generated() {
    let root = workspace_root();
    let Ok(out) = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
    else {
        eprintln!("git is not here: tracked files not checked");
        return;
    };
    assert!(out.status.success(), "git ls-files failed");
    let mut bad = vec![];
    for rel in out.stdout.split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let rel = String::from_utf8_lossy(rel).into_owned();
        let generated = rel.contains("__pycache__/")
            || [".pyc", ".whl", ".cubin", ".ncu-rep", ".tar", ".so"]
                .iter()
                .any(|x| rel.ends_with(x))
            || rel.starts_with(".bundle/")
            || rel.starts_with(".gpu-out/");
        let size = std::fs::metadata(root.join(&rel))
            .map(|m| m.len())
            .unwrap_or(0);
        if generated || size > MAX_TRACKED_BYTES {
            bad.push(format!("{rel} ({size} bytes)"));
        }
    }
    assert!(
        bad.is_empty(),
        "generated or oversized files are tracked (git rm --cached them; .gitignore): {}",
        bad.join(", ")
    );
}
