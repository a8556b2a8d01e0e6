// attn-merge's test binary: rows merged on the device against the f64 model, the edge rows exactly, with mutants.
use anyhow::{Result, ensure};
use attn_merge::*;
use lab::cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, poisoned};
use lab::{Gpu, KernelSpec, Suite};

const D: usize = 64;

/// A case: n parts of `rows` rows, their O and LSE (f32), named.
struct Case {
    what: &'static str,
    parts: Vec<Part>,
    rows: usize,
}

fn cases() -> Vec<Case> {
    let rows = 1000;
    let rand_parts = |n: usize, seed: u64, spread: f32| -> Vec<Part> {
        (0..n)
            .map(|j| Part {
                o: Inputs::seeded(seed + j as u64).normal(rows * D, 0.0, 1.0),
                lse: Inputs::seeded(seed + 100 + j as u64)
                    .normal(rows, 0.0, spread)
                    .into_iter()
                    .map(|x| x + 20.0 * j as f32)
                    .collect(),
            })
            .collect()
    };
    let mut v: Vec<Case> = (1..=4)
        .map(|n| Case {
            what: ["one part", "two parts", "three parts", "four parts"][n - 1],
            parts: rand_parts(n, 10 * n as u64, 3.0),
            rows,
        })
        .collect();
    // Scores of 10^4: e^{LSE} overflows f32 by far; two parts 3 apart in every row.
    let mut huge = rand_parts(2, 77, 0.0);
    huge[0].lse.iter_mut().for_each(|l| *l = 10_000.0);
    huge[1].lse.iter_mut().for_each(|l| *l = 9_997.0);
    v.push(Case {
        what: "LSEs of 10^4",
        parts: huge,
        rows,
    });
    // Rows a part never saw (−inf), rows no part saw, rows of equal LSEs.
    let mut edge = rand_parts(3, 55, 2.0);
    for r in 0..rows {
        match r % 4 {
            0 => edge[1].lse[r] = f32::NEG_INFINITY,
            1 => edge.iter_mut().for_each(|p| p.lse[r] = f32::NEG_INFINITY),
            2 => edge.iter_mut().for_each(|p| p.lse[r] = 1.5),
            _ => {}
        }
        for p in edge.iter_mut().filter(|p| p.lse[r] == f32::NEG_INFINITY) {
            p.o[r * D..(r + 1) * D].fill(0.0);
        }
    }
    v.push(Case {
        what: "empty parts, empty rows, equal LSEs",
        parts: edge,
        rows,
    });
    v
}

/// `spec` (`merge_parts` or a mutant) on case `c`: the device's O and LSE.
fn device(gpu: &Gpu, spec: &KernelSpec, c: &Case) -> Result<(Vec<f32>, Vec<f32>)> {
    let st = &gpu.stream;
    let o: Vec<f32> = c.parts.iter().flat_map(|p| p.o.clone()).collect();
    let l: Vec<f32> = c.parts.iter().flat_map(|p| p.lse.clone()).collect();
    let (dox, dl) = (st.clone_htod(&o)?, st.clone_htod(&l)?);
    let mut out_o = st.clone_htod(&poisoned::<f32>(c.rows * D))?;
    let mut out_l = st.clone_htod(&poisoned::<f32>(c.rows))?;
    let k = gpu.load(spec)?;
    let (n, rows, d) = (c.parts.len() as i32, c.rows as i64, D as i32);
    let cfg = LaunchConfig {
        grid_dim: ((c.rows * D / 8).div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: merge_parts(const float* o[n·rows·d], const float* lse[n·rows], int n ≤ 4, long long rows, int d,
    // float* out_o[rows·d], float* out_lse[rows]); grid-stride.
    unsafe {
        st.launch_builder(&k.func)
            .arg(&dox)
            .arg(&dl)
            .arg(&n)
            .arg(&rows)
            .arg(&d)
            .arg(&mut out_o)
            .arg(&mut out_l)
            .launch(cfg)?
    };
    Ok((st.clone_dtoh(&out_o)?, st.clone_dtoh(&out_l)?))
}

/// Where the device's merge of `c` is off the model: O beyond 4e-6 absolute (the parts' O are of order 1; f32 expf
/// and a sum of four terms add a few ulps), the LSE beyond 4e-6 relative; rows with an empty part must be the other
/// parts' merge, rows with one part exactly it, rows no part saw exactly O = 0, LSE = −inf.
fn wrong(gpu: &Gpu, spec: &KernelSpec, c: &Case) -> Result<Option<String>> {
    let (o, l) = device(gpu, spec, c)?;
    let (wo, wl) = merge(&c.parts, c.rows, D);
    let (mut max_o, mut max_l) = (0.0f64, 0.0f64);
    for r in 0..c.rows {
        let empty = wl[r] == f64::NEG_INFINITY;
        if empty {
            if l[r] != f32::NEG_INFINITY || o[r * D..(r + 1) * D].iter().any(|&x| x != 0.0) {
                return Ok(Some(format!(
                    "{}: row {r} saw no key: LSE {}, O[0] {}",
                    c.what,
                    l[r],
                    o[r * D]
                )));
            }
            continue;
        }
        let el = (f64::from(l[r]) - wl[r]).abs() / wl[r].abs().max(1.0);
        if el.is_nan() || el > 4e-6 {
            return Ok(Some(format!(
                "{}: row {r}: LSE {} against {}",
                c.what, l[r], wl[r]
            )));
        }
        max_l = max_l.max(el);
        for i in r * D..(r + 1) * D {
            let e = (f64::from(o[i]) - wo[i]).abs();
            if e.is_nan() || e > 4e-6 {
                return Ok(Some(format!(
                    "{}: row {r} column {}: O {} against {}",
                    c.what,
                    i % D,
                    o[i],
                    wo[i]
                )));
            }
            max_o = max_o.max(e);
        }
    }
    eprintln!(
        "{}: O max abs error {max_o:.2e}, LSE max relative error {max_l:.2e}",
        c.what
    );
    Ok(None)
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    t.gpu("merge::parts_as_the_f64_model", |gpu| {
        for c in cases() {
            if let Some(w) = wrong(gpu, &MERGE_PARTS, &c)? {
                anyhow::bail!("{w}");
            }
        }
        // One part alone is itself, bit for bit (its weight is e^0 = 1, the sum 1).
        let c = &cases()[0];
        let (o, l) = device(gpu, &MERGE_PARTS, c)?;
        ensure!(
            o == c.parts[0].o && l == c.parts[0].lse,
            "one part merged is not itself"
        );
        Ok(())
    });
    t.gpu("merge::mutants_are_caught", |gpu| {
        for (what, from, to) in [
            ("no max subtracted", "expf(lse[j] - m)", "expf(lse[j])"),
            (
                "the empty-row guard dropped",
                "(j < n && m != neg_inf())",
                "(j < n)",
            ),
            ("not normalised", "return x * inv;", "return x;"),
            ("the LSE without the max", "m + logf(r.sum)", "logf(r.sum)"),
        ] {
            let m = MERGE_PARTS.mutated("attn_merge.cuh", from, to)?;
            let mut caught = None;
            for c in cases() {
                if let Some(w) = wrong(gpu, &m, &c)? {
                    caught = Some(w);
                    break;
                }
            }
            match caught {
                Some(w) => eprintln!("mutant `{what}` caught: {w}"),
                None => anyhow::bail!("the mutant `{what}` passed every case"),
            }
        }
        Ok(())
    });
    t.gpu("merger::grouped_rows_as_the_model", |gpu| {
        // A ring step's merges: a part of one Q half's rows lands in every head's rows of that half, in an
        // accumulator of heads of both halves (groups of `per` rows, `stride` apart, from row `off`); rows a part
        // does not reach keep their value. Against the model on the parts spread to the accumulator's rows (−inf
        // elsewhere); and a mutant that drops the offset is caught.
        let m = Merger::default();
        check_grouped(gpu, &m)?;
        let bad = Merger {
            accumulate: ACCUMULATE
                .mutated_source("stride + off + row % per", "stride + row % per")?,
            ..m
        };
        match check_grouped(gpu, &bad) {
            Err(e) => eprintln!("mutant `offset dropped` caught: {e:#}"),
            Ok(()) => anyhow::bail!("the mutant `offset dropped` passed"),
        }
        eprintln!("merger: grouped rows (two halves of 10 heads, then all rows) as the model");
        Ok(())
    });
    t.gpu("merger::parts_accumulated_in_turn_as_the_model", |gpu| {
        // The library's form: a running (O, LSE), starting empty (O = 0, LSE = −inf), each part merged in turn (a
        // ring's steps); then stored as bf16 and f16 against half's round-to-nearest-even.
        let st = &gpu.stream;
        let m = Merger::default();
        for c in cases() {
            let rows = c.rows;
            let mut acc_o = st.alloc_zeros::<f32>(rows * D)?;
            let mut acc_l = st.clone_htod(&vec![f32::NEG_INFINITY; rows])?;
            for p in &c.parts {
                let (po, pl) = (st.clone_htod(&p.o)?, st.clone_htod(&p.lse)?);
                let (ao, _g0) = acc_o.device_ptr_mut(st);
                let (al, _g1) = acc_l.device_ptr_mut(st);
                let (bo, _g2) = po.device_ptr(st);
                let (bl, _g3) = pl.device_ptr(st);
                // SAFETY: four separate allocations of rows·D and rows f32, alive until the copies below.
                unsafe { m.accumulate(gpu, st, ao, al, bo, bl, rows, D)? };
                st.synchronize()?;
            }
            let (o, l) = (st.clone_dtoh(&acc_o)?, st.clone_dtoh(&acc_l)?);
            let (wo, wl) = merge(&c.parts, rows, D);
            // n pairwise merges: each adds its few ulps, so the bound is n times the one-pass merge's.
            let n = c.parts.len() as f64;
            for r in 0..rows {
                if wl[r] == f64::NEG_INFINITY {
                    ensure!(
                        l[r] == f32::NEG_INFINITY && o[r * D..(r + 1) * D].iter().all(|&x| x == 0.0),
                        "{}: row {r} saw no key: LSE {}, O[0] {}",
                        c.what,
                        l[r],
                        o[r * D]
                    );
                    continue;
                }
                let el = (f64::from(l[r]) - wl[r]).abs() / wl[r].abs().max(1.0);
                ensure!(el <= 4e-6 * n, "{}: row {r}: LSE {} against {}", c.what, l[r], wl[r]);
                for i in r * D..(r + 1) * D {
                    let e = (f64::from(o[i]) - wo[i]).abs();
                    ensure!(e <= 4e-6 * n, "{}: row {r} col {}: O {} against {}", c.what, i % D, o[i], wo[i]);
                }
            }
            let n_vals = rows * D;
            for to in [Half::Bf16, Half::F16] {
                let mut out = st.alloc_zeros::<u16>(n_vals)?;
                {
                    let (x, _g0) = acc_o.device_ptr(st);
                    let (y, _g1) = out.device_ptr_mut(st);
                    // SAFETY: rows·D f32 in, as many u16 out, separate allocations.
                    unsafe { m.store(gpu, st, x, n_vals, to, y)? };
                }
                let got = st.clone_dtoh(&out)?;
                let bad = (0..n_vals).find(|&i| {
                    got[i]
                        != match to {
                            Half::Bf16 => half::bf16::from_f32(o[i]).to_bits(),
                            Half::F16 => half::f16::from_f32(o[i]).to_bits(),
                        }
                });
                ensure!(bad.is_none(), "{}: {to:?} store differs at {:?}", c.what, bad);
            }
        }
        eprintln!("merger: every case's parts accumulated in turn as the model; bf16 and f16 stores as half's rounding");
        Ok(())
    });
    t.run()
}

/// Accumulates three parts as a ring rank does (the first Q half's 60 rows of each of 10 heads of 100, the second's
/// 40 from row 60, then every row) and checks every accumulator row against the model.
fn check_grouped(gpu: &Gpu, m: &Merger) -> Result<()> {
    let st = &gpu.stream;
    let (heads, pitch) = (10, 100);
    let rows = heads * pitch;
    let layouts = [
        Rows {
            n: heads * 60,
            per: 60,
            stride: pitch,
            off: 0,
        },
        Rows {
            n: heads * 40,
            per: 40,
            stride: pitch,
            off: 60,
        },
        Rows::all(rows),
    ];
    let mut spread = Vec::new();
    let mut acc_o = st.alloc_zeros::<f32>(rows * D)?;
    let mut acc_l = st.clone_htod(&vec![f32::NEG_INFINITY; rows])?;
    for (j, at) in layouts.iter().enumerate() {
        let o = Inputs::seeded(500 + j as u64).normal(at.n * D, 0.0, 1.0);
        let lse = Inputs::seeded(600 + j as u64).normal(at.n, 0.0, 3.0);
        let mut full = Part {
            o: vec![0.0; rows * D],
            lse: vec![f32::NEG_INFINITY; rows],
        };
        for r in 0..at.n {
            let a = r / at.per * at.stride + at.off + r % at.per;
            full.lse[a] = lse[r];
            full.o[a * D..(a + 1) * D].copy_from_slice(&o[r * D..(r + 1) * D]);
        }
        spread.push(full);
        let (po, pl) = (st.clone_htod(&o)?, st.clone_htod(&lse)?);
        let (ao, _g0) = acc_o.device_ptr_mut(st);
        let (al, _g1) = acc_l.device_ptr_mut(st);
        let (bo, _g2) = po.device_ptr(st);
        let (bl, _g3) = pl.device_ptr(st);
        ensure!(at.acc_rows() <= rows, "{at:?} reaches past the accumulator");
        // SAFETY: the part holds at.n rows, the accumulator at.acc_rows() ≤ rows; separate allocations, alive until
        // the synchronisation below.
        unsafe { m.accumulate_rows(gpu, st, (ao, al), (bo, bl), *at, D)? };
        st.synchronize()?;
    }
    let (o, l) = (st.clone_dtoh(&acc_o)?, st.clone_dtoh(&acc_l)?);
    let (wo, wl) = merge(&spread, rows, D);
    for r in 0..rows {
        let el = (f64::from(l[r]) - wl[r]).abs() / wl[r].abs().max(1.0);
        ensure!(
            el <= 1.2e-5,
            "row {r} (head {}, row {}): LSE {} against {}",
            r / pitch,
            r % pitch,
            l[r],
            wl[r]
        );
        for i in r * D..(r + 1) * D {
            let e = (f64::from(o[i]) - wo[i]).abs();
            ensure!(
                e <= 1.2e-5,
                "row {r} col {}: O {} against {}",
                i % D,
                o[i],
                wo[i]
            );
        }
    }
    Ok(())
}
