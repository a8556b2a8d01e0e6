// pack-gqa's test binary: every packed row's head, token and key range on the device against the model, with mutants.
use anyhow::{Result, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec, Suite};
use pack_gqa::*;

/// (group, Sq, Sk, visibility) cases: decode (Sq 1 and 16 over long caches), prefill, Sq > Sk, windows of 0, 1, and
/// past the sequence, alone and with causal.
fn cases() -> Vec<(usize, usize, usize, Visibility)> {
    let v = |causal, left, right| Visibility {
        causal,
        left,
        right,
    };
    let mut out = vec![];
    for (group, sq, sk) in [
        (4, 1, 8192),
        (8, 16, 4096),
        (1, 300, 300),
        (7, 5, 3),
        (2, 64, 1000),
    ] {
        for vis in [
            v(false, None, None),
            v(true, None, None),
            v(false, Some(0), Some(0)),
            v(false, Some(1), Some(1)),
            v(true, Some(128), None),
            v(false, Some(5000), Some(3)),
            v(true, Some(0), Some(0)),
            v(false, None, Some(0)),
        ] {
            out.push((group, sq, sk, vis));
        }
    }
    out
}

/// `spec` (`pack_rows` or a mutant) on every row of every case: where it differs from the model.
fn wrong(gpu: &Gpu, spec: &KernelSpec) -> Result<Vec<String>> {
    let cs = cases();
    let side = |x: Option<usize>| x.map_or(-1, |v| v as i32);
    let cfg: Vec<i32> = cs
        .iter()
        .flat_map(|&(g, sq, sk, v)| {
            [
                g as i32,
                sq as i32,
                sk as i32,
                i32::from(v.causal),
                side(v.left),
                side(v.right),
            ]
        })
        .collect();
    let (mut case_of, mut rows) = (vec![], vec![]);
    for (c, &(g, sq, ..)) in cs.iter().enumerate() {
        for r in 0..g * sq {
            case_of.push(c as i32);
            rows.push(r as i32);
        }
    }
    let n = rows.len();
    let st = &gpu.stream;
    let (dcfg, dcase, drows) = (
        st.clone_htod(&cfg)?,
        st.clone_htod(&case_of)?,
        st.clone_htod(&rows)?,
    );
    let mut out = st.clone_htod(&vec![-7i32; 4 * n])?;
    let k = gpu.load(spec)?;
    let ni = n as i32;
    let launch = LaunchConfig {
        grid_dim: (n.div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: pack_rows(const int* cfg[6 · cases], const int* cases[n], const int* rows[n], int n, int* out[4n]).
    unsafe {
        st.launch_builder(&k.func)
            .arg(&dcfg)
            .arg(&dcase)
            .arg(&drows)
            .arg(&ni)
            .arg(&mut out)
            .launch(launch)?
    };
    let out = st.clone_dtoh(&out)?;
    let mut bad = vec![];
    for i in 0..n {
        let (g, sq, sk, v) = cs[case_of[i] as usize];
        let r = rows[i] as usize;
        let (h, t) = row(r, g);
        let (lo, hi) = v.keys(t, sq, sk);
        let want = [h as i32, t as i32, lo as i32, hi as i32];
        if out[4 * i..4 * i + 4] != want {
            bad.push(format!(
                "group {g}, Sq {sq}, Sk {sk}, {v:?}, row {r}: device {:?}, model {want:?}",
                &out[4 * i..4 * i + 4]
            ));
        }
    }
    Ok(bad)
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    t.gpu("rows::device_equals_the_model", |gpu| {
        let w = wrong(gpu, &PACK_ROWS)?;
        ensure!(w.is_empty(), "{}", w[..w.len().min(4)].join("; "));
        eprintln!(
            "pack_rows: {} cases, every row's head, token and keys as the model",
            cases().len()
        );
        Ok(())
    });
    t.gpu("rows::mutants_are_caught", |gpu| {
        for (what, from, to) in [
            (
                "heads major, not minor",
                "Row{r % group, r / group}",
                "Row{r / group, r % group}",
            ),
            (
                "causal aligned top-left",
                "(long long)sk - sq + token",
                "(long long)token",
            ),
            (
                "the window's left edge off by one",
                "lo = i - left > lo ? i - left : lo",
                "lo = i - left + 1 > lo ? i - left + 1 : lo",
            ),
            (
                "a row with no key given one",
                "if (hi < 0) hi = 0;\n  if (lo > hi) lo = hi;",
                "if (hi < 1) hi = 1;\n  if (lo > hi) lo = hi;",
            ),
        ] {
            let w = wrong(gpu, &PACK_ROWS.mutated("pack_gqa.cuh", from, to)?)?;
            ensure!(!w.is_empty(), "the mutant `{what}` went unnoticed");
            eprintln!("mutant `{what}` caught: {}", w[0]);
        }
        Ok(())
    });
    t.run()
}
