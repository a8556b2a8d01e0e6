// Every mutation test's source edit still applies: its FROM text is in the CUDA sources, checked here without a GPU.
//
// A mutant is a plausible bug made by a source edit (`KernelSpec::mutated(header, from, to)`, `mutated_source(from,
// to)`); its GPU test fails, naming the edit, once `from` is no longer in the source. Without a GPU (CI) that test is
// skipped, so a kernel change that moves a mutant's text would first be seen on the device. Every mutation test
// writes FROM and TO as two consecutive string literals of one tuple or call: this walks the tests' syntax (syn),
// takes each run of consecutive string literals, and pairs them FROM-then-TO from the first that reads as code.
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::build::workspace_root;

/// Runs of consecutive string literals (value, line) in one tuple's elements or one call's arguments.
#[derive(Default)]
struct Runs(Vec<Vec<(String, usize)>>);

impl Runs {
    fn push<'a>(&mut self, exprs: impl Iterator<Item = &'a syn::Expr>) {
        let lits: Vec<Option<(String, usize)>> = exprs
            .map(|e| match e {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some((s.value(), s.span().start().line)),
                _ => None,
            })
            .collect();
        self.0.extend(
            lits.split(Option::is_none)
                .filter(|run| run.len() > 1)
                .map(|run| run.iter().flatten().cloned().collect()),
        );
    }
}

impl<'a> Visit<'a> for Runs {
    fn visit_expr_tuple(&mut self, t: &'a syn::ExprTuple) {
        self.push(t.elems.iter());
        syn::visit::visit_expr_tuple(self, t);
    }
    fn visit_expr_call(&mut self, c: &'a syn::ExprCall) {
        self.push(c.args.iter());
        syn::visit::visit_expr_call(self, c);
    }
    fn visit_expr_method_call(&mut self, c: &'a syn::ExprMethodCall) {
        self.push(c.args.iter());
        syn::visit::visit_expr_method_call(self, c);
    }
    // Macros (`vec![…]`, `ensure!(…)`) whose bodies are comma-separated expressions: walked as such.
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        use syn::parse::Parser;
        let exprs = syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated;
        if let Ok(list) = exprs.parse2(m.tokens.clone()) {
            for e in &list {
                self.visit_expr(e);
            }
        }
    }
}

/// Whether a literal reads as source code rather than a name, a header or prose.
fn codeish(s: &str) -> bool {
    s.len() >= 4 && s.chars().any(|c| ";()[]=<>?*&|^%".contains(c)) && !s.contains("{}")
}

/// The (FROM, line, found in `cuda`) of `file`'s runs: in each run, from a literal that reads as code, two at a time
/// as FROM then TO. A code-like literal that is not in `cuda` but whose follower is was prose (a mutant's
/// description: "amax without |x|"), and the pairing starts at the follower. Heuristic: a stale FROM whose TO is
/// somewhere in the sources reads as prose and is missed.
fn froms(file: &Path, cuda: &str) -> Vec<(String, usize, bool)> {
    let text = std::fs::read_to_string(file).unwrap();
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut runs = Runs::default();
    runs.visit_file(&ast);
    let mut out = Vec::new();
    for run in runs.0 {
        let mut i = 0;
        while i + 1 < run.len() {
            let (a, b) = (&run[i].0, &run[i + 1].0);
            if !codeish(a) || a == b {
                i += 1;
            } else if cuda.contains(a.as_str()) {
                out.push((a.clone(), run[i].1, true));
                i += 2;
            } else if cuda.contains(b.as_str()) {
                i += 1;
            } else {
                out.push((a.clone(), run[i].1, false));
                i += 2;
            }
        }
    }
    out
}

fn files_under(dir: &Path, ext: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, ext, out);
        } else if ext.iter().any(|x| p.extension().is_some_and(|e| e == *x)) {
            out.push(p);
        }
    }
}

/// The text of every CUDA source and header of the blocks and composed.
fn cuda_text() -> String {
    let root = workspace_root();
    let mut files = Vec::new();
    for d in std::fs::read_dir(root.join("blocks")).unwrap().flatten() {
        files_under(&d.path().join("cuda"), &["cu", "cuh"], &mut files);
    }
    files_under(&root.join("composed/cuda"), &["cu", "cuh"], &mut files);
    assert!(files.len() > 20, "found only {} CUDA files", files.len());
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The tests that hold mutants: each block's and composed's GPU tests.
fn test_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = Vec::new();
    for d in std::fs::read_dir(root.join("blocks")).unwrap().flatten() {
        files_under(&d.path().join("tests"), &["rs"], &mut files);
    }
    files_under(&root.join("composed/tests"), &["rs"], &mut files);
    files_under(&root.join("fp8-attention/tests"), &["rs"], &mut files);
    files.sort();
    files
}

#[test]
fn every_mutants_edit_still_applies() {
    let cuda = cuda_text();
    let (mut seen, mut stale) = (0, Vec::new());
    for f in test_files() {
        for (from, line, found) in froms(&f, &cuda) {
            seen += 1;
            if !found {
                stale.push(format!("{}:{line}: `{from}`", f.display()));
            }
        }
    }
    eprintln!("{seen} mutation edits found in the tests, each checked against the CUDA sources");
    assert!(
        seen >= 30,
        "found only {seen} mutation edits: is the walk broken?"
    );
    assert!(
        stale.is_empty(),
        "mutation edits whose text is in no CUDA source (update the test to the kernel's text):\n{}",
        stale.join("\n")
    );
}

#[test]
fn a_stale_edit_is_found() {
    // fp8-relayout's mutant before TransposeLdsm batched its loads: its text had gone from the header. Its
    // description reads as code and is passed over; FROM is reported.
    let dir = std::env::temp_dir().join(format!("tidy-mutants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("gpu.rs");
    std::fs::write(
        &f,
        r#"fn m() { let _ = [("ldsm_key_halves_swapped", 1, "w[2] = __byte_perm(r[2], r[3], sel0);",
            "w[2] = __byte_perm(r[3], r[2], sel0);", "swapped key halves (r[2] first)"),
            ("|x| dropped", "fmaxf(fabsf(v.x), fabsf(v.y))", "fmaxf(v.x, fabsf(v.y))")]; }"#,
    )
    .unwrap();
    let got = froms(&f, &cuda_text());
    std::fs::remove_dir_all(&dir).unwrap();
    let stale: Vec<_> = got.iter().filter(|x| !x.2).map(|x| x.0.as_str()).collect();
    let found: Vec<_> = got.iter().filter(|x| x.2).map(|x| x.0.as_str()).collect();
    assert_eq!(stale, ["w[2] = __byte_perm(r[2], r[3], sel0);"], "{got:?}");
    assert_eq!(found, ["fmaxf(fabsf(v.x), fabsf(v.y))"], "{got:?}");
}
