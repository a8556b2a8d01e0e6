// ring-schedule's test binary: the device's schedule against the model for every world of 1 to 8 ranks, with mutants.
use anyhow::{Result, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec, Suite};
use ring_schedule::*;

/// A case: world, rank, step, causal, sequence length.
type Case = (usize, usize, usize, bool, u64);

/// Every (world, rank, step, causal) of 1 to 8 ranks, each with a sequence length that does not divide evenly.
fn cases() -> Vec<Case> {
    let mut v = vec![];
    for world in 1..=8 {
        for rank in 0..world {
            for step in 0..world {
                for causal in [false, true] {
                    v.push((
                        world,
                        rank,
                        step,
                        causal,
                        131072 + 7 * world as u64 + rank as u64,
                    ));
                }
            }
        }
    }
    v
}

/// `spec` (`ring_schedule` or a mutant) on every case: where its schedule or chunk starts differ from the model's.
fn wrong(gpu: &Gpu, spec: &KernelSpec) -> Result<Vec<String>> {
    let cs = cases();
    let n = cs.len();
    let col = |f: &dyn Fn(&Case) -> i32| cs.iter().map(f).collect::<Vec<i32>>();
    let st = &gpu.stream;
    let (w, r, s, c) = (
        st.clone_htod(&col(&|x| x.0 as i32))?,
        st.clone_htod(&col(&|x| x.1 as i32))?,
        st.clone_htod(&col(&|x| x.2 as i32))?,
        st.clone_htod(&col(&|x| i32::from(x.3)))?,
    );
    let len = st.clone_htod(&cs.iter().map(|x| x.4 as i64).collect::<Vec<i64>>())?;
    let mut out = st.clone_htod(&vec![-7i32; 12 * n])?;
    let mut begins = st.clone_htod(&vec![-7i64; 17 * n])?;
    let k = gpu.load(spec)?;
    let ni = n as i32;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(128) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: ring_schedule(const int* world, rank, step, causal [n], const long long* s [n], int n, int* out[12n],
    // long long* begins[17n]); every world is at most 8 (2·8 + 1 chunk starts a case).
    unsafe {
        st.launch_builder(&k.func)
            .arg(&w)
            .arg(&r)
            .arg(&s)
            .arg(&c)
            .arg(&len)
            .arg(&ni)
            .arg(&mut out)
            .arg(&mut begins)
            .launch(cfg)?
    };
    let (out, begins) = (st.clone_dtoh(&out)?, st.clone_dtoh(&begins)?);
    let mut bad = vec![];
    for (i, &(world, rank, step, causal, s)) in cs.iter().enumerate() {
        let want = blocks(world, rank, step, causal);
        let mut w = vec![source(world, rank, step) as i32, want.len() as i32];
        for j in 0..3 {
            match want.get(j) {
                Some(b) => w.extend([i32::from(b.q), i32::from(b.kv), b.mask as i32]),
                None => w.extend([0, 0, 0]),
            }
        }
        w.push(0);
        if out[12 * i..12 * i + 12] != w[..] {
            bad.push(format!(
                "W = {world}, rank {rank}, step {step}, causal {causal}: device {:?}, model {w:?}",
                &out[12 * i..12 * i + 12]
            ));
        }
        for ch in 0..=2 * world {
            if begins[17 * i + ch] != chunk_begin(s, world, ch) as i64 {
                bad.push(format!(
                    "W = {world}, S = {s}: chunk {ch} begins at {} on the device, {} in the model",
                    begins[17 * i + ch],
                    chunk_begin(s, world, ch)
                ));
            }
        }
    }
    Ok(bad)
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    t.model("coverage::every_visible_pair_once", || {
        for world in 1..=8 {
            for s in [1, 15, 64, 97] {
                for causal in [false, true] {
                    check_coverage(world, s, causal, shard)?;
                }
            }
        }
        eprintln!("ring schedule: every visible (query, key) pair once, W = 1…8, S = 1, 15, 64, 97, with and without the mask");
        Ok(())
    });
    t.gpu("schedule::device_equals_the_model", |gpu| {
        let w = wrong(gpu, &SCHEDULE)?;
        ensure!(w.is_empty(), "{}", w[..w.len().min(4)].join("; "));
        eprintln!("ring_schedule: {} (world, rank, step, causal) cases and their chunk starts as the model", cases().len());
        Ok(())
    });
    t.gpu("schedule::mutants_are_caught", |gpu| {
        for (what, from, to) in [
            (
                "zigzag halves swapped",
                "if (src < rank) {",
                "if (src > rank) {",
            ),
            (
                "shards sent the other way round",
                "((rank - step) % world + world) % world",
                "(rank + step) % world",
            ),
            (
                "the diagonal's cross block dropped",
                "out[1] = Block{2, 1, kFull};",
                "out[1] = Block{2, 1, kCausal};",
            ),
            (
                "chunks rounded up",
                "(long long)c * s / (2 * world)",
                "((long long)c * s + 2 * world - 1) / (2 * world)",
            ),
        ] {
            let w = wrong(gpu, &SCHEDULE.mutated("ring_schedule.cuh", from, to)?)?;
            ensure!(!w.is_empty(), "the mutant `{what}` went unnoticed");
            eprintln!("mutant `{what}` caught: {}", w[0]);
        }
        Ok(())
    });
    t.run()
}
