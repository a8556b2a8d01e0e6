// ragged-plan's test binary: the device plan against the model (up to the order of equal units), its units decoded, mutants.
use anyhow::{Result, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::{Gpu, Suite};
use ragged_plan::*;
use rand::{Rng, SeedableRng};

/// A batch: its sequences' (query, key) lengths, heads, query tile rows, key tile, causal, a sliding window's sides.
#[derive(Debug, Clone)]
struct Batch {
    lens: Vec<(usize, usize)>,
    heads: usize,
    tile_rows: usize,
    bc: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
    /// Query heads packed a token (1: none; `heads` then counts K/V heads).
    group: usize,
}

impl Batch {
    fn cu(&self) -> (Vec<i32>, Vec<i32>) {
        let (mut q, mut k) = (vec![0i32], vec![0i32]);
        for &(a, b) in &self.lens {
            q.push(q.last().unwrap() + a as i32);
            k.push(k.last().unwrap() + b as i32);
        }
        (q, k)
    }
    fn geometry(&self) -> Geometry {
        let (q, k) = self.cu();
        Geometry {
            batch: self.lens.len(),
            heads: self.heads,
            tile_rows: self.tile_rows,
            bc: self.bc,
            causal: self.causal,
            left: self.left,
            right: self.right,
            total_q: *q.last().unwrap() as usize,
            total_k: *k.last().unwrap() as usize,
            group: self.group,
        }
    }
}

/// Prefill-like batches of lengths drawn from 0 … 3000 (some empty, some of one token, Sq ≠ Sk), decode-like ones (1–16
/// new tokens over long caches), one sequence, no sequence; causal and not; 1 to 32 heads; 128-row query tiles over
/// 128- and 224-key tiles.
fn batches() -> Vec<(String, Batch)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut out = vec![];
    for (i, (n, decode, heads, bc, causal)) in [
        (7, false, 4, 224, false),
        (7, false, 4, 224, true),
        (40, false, 1, 128, true),
        (64, true, 32, 128, true),
        (16, true, 8, 224, false),
        (1, false, 3, 128, true),
        (0, false, 2, 128, false),
    ]
    .into_iter()
    .enumerate()
    {
        let lens = (0..n)
            .map(|j| {
                if decode {
                    (rng.random_range(1..=16), rng.random_range(100..20000))
                } else if j % 9 == 3 {
                    (0, rng.random_range(0..300))
                } else if j % 9 == 5 {
                    (1, 1)
                } else {
                    let q = rng.random_range(1..3000);
                    (
                        q,
                        if j % 2 == 0 {
                            q
                        } else {
                            rng.random_range(1..3000)
                        },
                    )
                }
            })
            .collect();
        let b = Batch {
            lens,
            heads,
            tile_rows: 128,
            bc,
            causal,
            left: None,
            right: None,
            group: 1,
        };
        out.push((
            format!(
                "b{i}_{n}seqs_{heads}heads_bc{bc}{}",
                if causal { "_causal" } else { "" }
            ),
            b.clone(),
        ));
        // The same batch under sliding windows: a left window alone (with the batch's causal mask, or none), and both
        // sides; units then start past key tile 0 and read fewer tiles.
        for (left, right) in [(Some(300), None), (Some(64), Some(500)), (None, Some(0))] {
            let w = Batch {
                left,
                right,
                ..b.clone()
            };
            let side = |x: Option<usize>| x.map_or("-1".to_string(), |n| n.to_string());
            out.push((
                format!(
                    "b{i}_{n}seqs_{heads}heads_bc{bc}{}_window{}_{}",
                    if causal { "_causal" } else { "" },
                    side(left),
                    side(right)
                ),
                w,
            ));
        }
        // Packed grouped-query heads: 4 and 8 query heads a K/V head (tiles of 32 and 16 tokens), with the batch's
        // mask, and under a left window.
        for (group, left) in [(4, None), (8, None), (4, Some(300))] {
            let p = Batch {
                group,
                left,
                ..b.clone()
            };
            out.push((
                format!(
                    "b{i}_{n}seqs_{heads}heads_bc{bc}{}_packed{group}{}",
                    if causal { "_causal" } else { "" },
                    left.map_or(String::new(), |l| format!("_window{l}_-1"))
                ),
                p,
            ));
        }
    }
    out
}

/// The device plan of `b` by `planner`, as units.
fn device_plan(gpu: &Gpu, planner: &Planner, b: &Batch) -> Result<(Vec<RaggedUnit>, DevicePlan)> {
    let st = &gpu.stream;
    let (cq, ck) = b.cu();
    let g = b.geometry();
    validate_cu_seqlens("cu_seqlens_q", &cq, g.batch, g.total_q)?;
    validate_cu_seqlens("cu_seqlens_k", &ck, g.batch, g.total_k)?;
    let (dq, dk) = (st.clone_htod(&cq)?, st.clone_htod(&ck)?);
    let mut plan = planner.alloc(st, g)?;
    planner.run(gpu, st, addr(&dq, st), addr(&dk, st), &mut plan)?;
    Ok((plan.units(st, &cq)?, plan))
}

/// The device address of `x` (its uses on `st` are ordered by the stream).
fn addr(
    x: &lab::cudarc::driver::CudaSlice<i32>,
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
) -> u64 {
    use lab::cudarc::driver::DevicePtr;
    x.device_ptr(st).0
}

fn model(b: &Batch) -> Vec<RaggedUnit> {
    let (cq, ck) = b.cu();
    ragged_plan_packed(
        &cq,
        &ck,
        b.heads,
        b.tile_rows,
        b.bc,
        b.causal,
        b.left,
        b.right,
        b.group,
    )
}

/// Whether `planner` (a mutant) gets some batch's plan wrong.
fn caught(gpu: &Gpu, planner: &Planner) -> Result<bool> {
    for (_, b) in batches() {
        let (units, _) = device_plan(gpu, planner, &b)?;
        if same_plan(&units, &model(&b)).is_err() {
            return Ok(true);
        }
    }
    Ok(false)
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    for (name, b) in batches() {
        t.gpu(&format!("plan::matches_the_model::{name}"), move |gpu| {
            let want = model(&b);
            let (units, mut plan) = device_plan(gpu, &Planner::default(), &b)?;
            same_plan(&units, &want)?;
            // Again on the same buffers (the histogram is zeroed by the run): the same units.
            let (cq, ck) = b.cu();
            let st = &gpu.stream;
            let (dq, dk) = (st.clone_htod(&cq)?, st.clone_htod(&ck)?);
            Planner::default().run(gpu, st, addr(&dq, st), addr(&dk, st), &mut plan)?;
            same_plan(&plan.units(st, &cq)?, &want)?;
            eprintln!("{name}: {} units longest first, as the model's", want.len());
            Ok(())
        });
    }
    t.gpu("decode::every_unit_s_rows_in_the_packed_tensors", |gpu| {
        for (name, b) in batches() {
            let (cq, ck) = b.cu();
            let (units, plan) = device_plan(gpu, &Planner::default(), &b)?;
            let st = &gpu.stream;
            let (dq, dk) = (st.clone_htod(&cq)?, st.clone_htod(&ck)?);
            let n = units.len();
            let mut out = st.alloc_zeros::<i32>(9 * n.max(1))?;
            let k = gpu.load(&DECODE)?;
            let (rows, group) = (b.tile_rows as i32, b.group as i32);
            // SAFETY: ragged_decode(table, cu_q, cu_k, tile_rows, group, out[9 · count]); threads past the count
            // return.
            unsafe {
                st.launch_builder(&k.func)
                    .arg(&plan.table)
                    .arg(&dq)
                    .arg(&dk)
                    .arg(&rows)
                    .arg(&group)
                    .arg(&mut out)
                    .launch(LaunchConfig::for_num_elems(n.max(1) as u32))?
            };
            let got = st.clone_dtoh(&out)?;
            for (i, u) in units.iter().enumerate() {
                let c = coord_packed(&cq, &ck, u, b.tile_rows, b.group);
                let want = [
                    u.seq as i32,
                    u.head as i32,
                    u.q0 as i32,
                    u.key_tiles as i32,
                    c.q_row0 as i32,
                    c.rows as i32,
                    c.k_row0 as i32,
                    c.sq as i32,
                    c.sk as i32,
                ];
                ensure!(
                    got[9 * i..9 * i + 9] == want,
                    "{name}: unit {i} decodes as {:?}, not {want:?}",
                    &got[9 * i..9 * i + 9]
                );
            }
        }
        Ok(())
    });
    for (mutant, from, to) in [
        // The causal bound one key too far: units whose last row ends a key tile read one tile more.
        (
            "causal_bound_off_by_one",
            "const long long last = (long long)q0 + rows + sk - sq;",
            "const long long last = (long long)q0 + rows + sk - sq + 1;",
        ),
        // One count a query tile instead of one a head: the runs overlap and units overwrite each other.
        (
            "histogram_without_heads",
            "atomicAdd(&counts[kt], heads);",
            "atomicAdd(&counts[kt], 1);",
        ),
        // A window's left side ignored: every unit reads from key tile 0 (too many tiles under a left window).
        (
            "window_left_ignored",
            "long long first_key = left < 0 ? 0 : (long long)q0 + sk - sq - left;",
            "long long first_key = 0;",
        ),
        // Packed heads: the histogram counting a sequence's tokens instead of its packed rows (its runs too short:
        // units overwrite each other or land past the count).
        (
            "packed_histogram_counts_tokens",
            "const int sq = cu_q[seq + 1] - cu_q[seq], sk = cu_k[seq + 1] - cu_k[seq], all = sq * group;",
            "const int sq = cu_q[seq + 1] - cu_q[seq], sk = cu_k[seq + 1] - cu_k[seq], all = sq;",
        ),
        // Packed heads: a unit's tokens one short (its last token's keys left out under a causal mask).
        (
            "packed_unit_one_token_short",
            "tokens = (q0 + rows - 1) / group - t0 + 1;",
            "tokens = (q0 + rows - 1) / group - t0 + (group > 1 ? 0 : 1);",
        ),
        // The scan's carry across warps dropped: runs of bins past the first warp's start at zero.
        (
            "scan_without_the_carry_across_warps",
            "int start = incl - sum + (w > 0 ? warp_sums[w - 1] : 0);",
            "int start = incl - sum;",
        ),
    ] {
        t.gpu(&format!("mutant::{mutant}"), move |gpu| {
            let bad = Planner::default().mutated("ragged_plan.cuh", from, to)?;
            ensure!(
                caught(gpu, &bad)?,
                "the {mutant} mutant planned every batch as the model does"
            );
            Ok(())
        });
    }
    t.run()
}
