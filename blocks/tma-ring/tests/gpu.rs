// tma-ring's test binary: every byte of every tile of every ring shape, both tensor layouts, tails, and mutants.
use anyhow::{Result, ensure};
use frag_layout::Swizzle;
use lab::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use lab::{Arch, Gpu, KernelSpec, Suite};
use tma_ring::*;

const BATCH: usize = 2;
const HEADS: usize = 3;
/// Bounds every mbarrier spin of the test builds, so that a broken mutant ends instead of hanging the device.
const SPIN: &str = "-DLAB_TMA_SPIN_LIMIT=20000000";
/// The cursor walks' bound: their mutants deadlock outright, so each stuck wait must end quickly.
const CURSOR_SPIN: &str = "-DLAB_TMA_SPIN_LIMIT=2000000";
/// The walks' builds: a stuck wait ends quickly and records where it stood (`test_wait_at`).
const WALK_OPTIONS: [&str; 2] = [CURSOR_SPIN, "-DLAB_TMA_SPIN_PROBE=test_wait_at"];

/// What one run saw: bytes checked, and the first wrong ones.
struct Seen {
    bytes: usize,
    wrong: Vec<String>,
}

/// Copies a [B, H, S, D] (or [B, S, H, D]) tensor through the ring of `shape` and checks every byte of every
/// tile that every consumer wrote out: data rows against the source through the swizzle model, rows past S
/// against zero.
fn run(gpu: &Gpu, spec: &KernelSpec, shape: &Shape, seq: usize, bshd: bool) -> Result<Seen> {
    let d_elems = shape.d_bytes / shape.elem;
    let row = shape.d_bytes;
    let mut src = vec![0u8; BATCH * HEADS * seq * row];
    for b in 0..BATCH {
        for h in 0..HEADS {
            for s in 0..seq {
                let at = if bshd {
                    ((b * seq + s) * HEADS + h) * row
                } else {
                    ((b * HEADS + h) * seq + s) * row
                };
                for kb in 0..row {
                    src[at + kb] = source_byte(b, h, s, kb);
                }
            }
        }
    }
    let st = &gpu.stream;
    let dsrc = st.clone_htod(&src)?;
    let elem = if shape.elem == 1 { Elem::U8 } else { Elem::U16 };
    let spec_map = MapSpec::heads(
        elem,
        [BATCH as u64, HEADS as u64, seq as u64, d_elems as u64],
        bshd,
        shape.rows as u32,
        shape.swizzle,
    );
    let map = {
        let (ptr, _sync) = dsrc.device_ptr(st);
        spec_map.encode(ptr)?
    };
    let tiles = seq.div_ceil(shape.rows);
    let bh = BATCH * HEADS;
    let mut out = st.clone_htod(&vec![
        0xCDu8;
        shape.consumers * bh * tiles * shape.tile_bytes()
    ])?;
    let k = gpu.load_with(spec, &[SPIN])?;
    let cfg = LaunchConfig {
        grid_dim: (bh as u32, 1, 1),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: shape.smem_bytes() as u32,
    };
    let (seq_i, heads_i, tiles_i) = (seq as i32, HEADS as i32, tiles as i32);
    // SAFETY: kernel(const __grid_constant__ tma::Map, int seq, int heads, u8* out[consumers][bh][tiles][tile],
    // int max_tiles); the map describes `dsrc`, which outlives the launch (the stream is synchronised below).
    unsafe {
        st.launch_builder(&k.func)
            .arg(&map)
            .arg(&seq_i)
            .arg(&heads_i)
            .arg(&mut out)
            .arg(&tiles_i)
            .launch(cfg)?
    };
    let out = st.clone_dtoh(&out)?;
    let mut wrong = Vec::new();
    let mut bytes = 0;
    for c in 0..shape.consumers {
        for b in 0..BATCH {
            for h in 0..HEADS {
                for t in 0..tiles {
                    let base = ((c * bh + b * HEADS + h) * tiles + t) * shape.tile_bytes();
                    for r in 0..shape.rows {
                        let s = t * shape.rows + r;
                        for kb in 0..row {
                            let want = if s < seq { source_byte(b, h, s, kb) } else { 0 };
                            let got = out[base + shape.tile_byte(r, kb)];
                            bytes += 1;
                            if got != want && wrong.len() < 6 {
                                wrong.push(format!(
                                    "consumer {c}, head ({b}, {h}), tile {t}, row {r}, byte {kb}: {got:#04x}, want {want:#04x}"
                                ));
                            } else if got != want {
                                wrong.push(String::new());
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Seen { bytes, wrong })
}

const SEQS: [usize; 5] = [1, 63, 64, 200, 1000];

fn all_cases(gpu: &Gpu, spec: &KernelSpec, shape: &Shape) -> Result<usize> {
    let mut bytes = 0;
    for bshd in [false, true] {
        for seq in SEQS {
            let seen = run(gpu, spec, shape, seq, bshd)?;
            ensure!(
                seen.wrong.is_empty(),
                "{} S = {seq} {}: {} of {} bytes wrong: {}",
                spec.name,
                if bshd { "[B,S,H,D]" } else { "[B,H,S,D]" },
                seen.wrong.len(),
                seen.bytes,
                seen.wrong
                    .iter()
                    .filter(|w| !w.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            bytes += seen.bytes;
        }
    }
    Ok(bytes)
}

/// Whether a launch failed because the device aborted the kernel (the context is gone after it).
fn aborted(e: &anyhow::Error) -> bool {
    let e = format!("{e:?}");
    e.contains("CUDA_ERROR_LAUNCH_FAILED") || e.contains("CUDA_ERROR_ILLEGAL")
}

/// Runs of a mutant over S = 1000, both layouts: how many came out wrong. A launch the device aborts (an
/// mbarrier driven into an illegal state) counts as caught and ends the runs, since the context is gone; the
/// mutant tests run in a process of their own (`gpu_isolated`) for that reason.
fn mutant(gpu: &Gpu, from: &str, to: &str) -> Result<(usize, usize)> {
    let shape = SHAPES[0];
    let spec = kernel(&shape).mutated("tma_ring.cuh", from, to)?;
    let (mut bad, mut all) = (0, 0);
    for bshd in [false, true] {
        for _ in 0..4 {
            all += 1;
            match run(gpu, &spec, &shape, 1000, bshd) {
                Ok(seen) => bad += !seen.wrong.is_empty() as usize,
                Err(e) if aborted(&e) => {
                    eprintln!("the device aborted the mutant: {e:#}");
                    return Ok((bad + 1, all));
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((bad, all))
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    lab::sass_snapshots!(t, &[KERNELS[0], KERNELS[6], ROLES_CLAIM]);
    t.compile("claimed_registers_take_effect", || {
        // With the claim, the consumers' 176 live values fit; without it, the 168-register entry cap spills.
        let (_, r) = ROLES_CLAIM.compile(Arch::Sm90a)?;
        ensure!(
            r.spill_stores == 0 && r.stack_bytes == 0,
            "claimed, yet: {r}"
        );
        let bad =
            ROLES_CLAIM.mutated("warp_roles.cuh", "setmaxnreg.inc.sync.aligned.u32 %0;", "")?;
        let (_, rb) = bad.compile(Arch::Sm90a)?;
        ensure!(
            rb.spill_stores > 0 || rb.stack_bytes > 0,
            "without setmaxnreg.inc the consumers should spill under the 168 cap: {rb}"
        );
        eprintln!("setmaxnreg: {r}\nwithout the claim: {rb}");
        Ok(())
    });
    t.gpu("roles_hand_over_through_a_named_barrier", |gpu| {
        let x: Vec<f32> = (0..176).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let rounds = 3;
        let st = &gpu.stream;
        let k = gpu.load(&ROLES_CLAIM)?;
        let din = st.clone_htod(&x)?;
        let mut dout = st.clone_htod(&lab::numerics::poisoned::<f32>(256))?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (384, 1, 1),
            shared_mem_bytes: 0,
        };
        let r_i: i32 = rounds;
        // SAFETY: roles_claim(const float* in[176], float* out[256], int rounds), 384 threads.
        unsafe {
            st.launch_builder(&k.func)
                .arg(&din)
                .arg(&mut dout)
                .arg(&r_i)
                .launch(cfg)?
        };
        let out = st.clone_dtoh(&dout)?;
        for t in 0..256 {
            let want: f64 = (0..176)
                .map(|i| (i + 1) as f64 * x[(t + i) % 176] as f64 * 2f64.powi(rounds))
                .sum();
            ensure!(
                out[t] as f64 == want,
                "consumer thread {t}: {} , want {want}",
                out[t]
            );
        }
        Ok(())
    });
    t.gpu("bulk_load::through_a_ring", |gpu| {
        // Tiles the size of stage 7's Vᵀ (28 KiB) and a small one, more tiles than stages: each comes back exact.
        every_copy_exact(gpu, &BULK_RING, 1)
    });
    t.gpu("bulk_load::mutant_short_copy_is_caught", |gpu| {
        // The copy a byte count short of the tile (16 bytes): its barrier then never completes unless the
        // expected count shrinks too, so both shrink; the tile's last 16 bytes must come back wrong.
        let bad = BULK_RING.mutated_source(
            "unsigned(bytes), ring.full(t));",
            "unsigned(bytes) - 16u, ring.full(t));",
        )?;
        let bad = bad.mutated_source(
            "ring.acquire(t, unsigned(bytes));",
            "ring.acquire(t, unsigned(bytes) - 16u);",
        )?;
        let got = byte_ring(gpu, &bad, 4096, 3, 1)?;
        ensure!(
            got != pattern(4096 * 3),
            "a bulk copy 16 bytes short went unnoticed"
        );
        Ok(())
    });
    t.gpu("cluster_multicast::both_ctas_get_every_tile", |gpu| {
        // The same tiles: each CTA's copy of each is exact, though each CTA loaded only half of it.
        every_copy_exact(gpu, &CLUSTER_RING, 2)
    });
    t.gpu("cluster_multicast::mutant_same_half_is_caught", |gpu| {
        // Both CTAs' halves land at offset 0: the byte count completes the barrier, the second half is stale.
        let bad = CLUSTER_RING.mutated_source(
            "buf + ring.stage(t) * bytes + rank * half,",
            "buf + ring.stage(t) * bytes + 0 * half,",
        )?;
        let got = byte_ring(gpu, &bad, 4096, 3, 2)?;
        ensure!(
            got.chunks(4096 * 3).all(|c| c != pattern(4096 * 3)),
            "a half tile loaded to the wrong offset went unnoticed"
        );
        Ok(())
    });
    t.gpu("store_box::one_box_with_rows_past_the_end", |gpu| {
        let wrong = store_box_wrong(gpu, Swizzle::B128)?;
        ensure!(
            wrong.is_empty(),
            "{} elements wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(8)]
        );
        Ok(())
    });
    t.gpu("store_box::mutant_map_swizzle_is_caught", |gpu| {
        // A map without the swizzle the image was written with: chunks land in other columns.
        let wrong = store_box_wrong(gpu, Swizzle::None)?;
        ensure!(!wrong.is_empty(), "an unswizzled map went unnoticed");
        eprintln!("unswizzled map: {} elements wrong", wrong.len());
        Ok(())
    });
    t.model("the_kernel_table_covers_every_shape", || {
        for s in SHAPES {
            kernel(s);
        }
        ensure!(
            SHAPES.len() == KERNELS.len(),
            "a kernel without a shape, or the reverse"
        );
        Ok(())
    });
    for shape in SHAPES {
        let shape = *shape;
        let spec = kernel(&shape);
        t.gpu(&format!("copy::{}", spec.name), move |gpu| {
            let bytes = all_cases(gpu, &spec, &shape)?;
            eprintln!(
                "{}: {bytes} bytes exact (S = {SEQS:?}, both layouts)",
                spec.name
            );
            Ok(())
        });
    }
    // (test, what the mutant does, header text, its replacement, must every run be wrong, what went unnoticed)
    let mutants: [(&str, &str, &str, &str, bool, &str); 4] = [
        (
            "look_ahead_on_the_wrong_parity",
            "test_full parity flipped",
            "return test_wait(&bars->full[stage(t)], phase(t));",
            "return test_wait(&bars->full[stage(t)], phase(t) ^ 1u);",
            false,
            "a look-ahead consumer reading before the tile landed",
        ),
        (
            "consumer_waits_on_the_wrong_parity",
            "consumer parity flipped",
            "wait(&bars->full[stage(t)], phase(t));",
            "wait(&bars->full[stage(t)], phase(t) ^ 1u);",
            true,
            "a consumer reading before the tile landed",
        ),
        (
            "producer_skips_the_empty_wait",
            "producer ignores empty",
            "    wait(&bars->empty[stage(t)], phase(t) ^ 1u);\n",
            "",
            false,
            "overwriting a stage still being read",
        ),
        (
            "expect_tx_short",
            "expect_tx of half the tile",
            "arrive_expect_tx(&bars->full[stage(t)], bytes);",
            "arrive_expect_tx(&bars->full[stage(t)], bytes / 2);",
            false,
            "a barrier armed for half the bytes",
        ),
    ];
    t.gpu("cursor::every_slot_and_parity_through_several_wraps", |gpu| {
        // 2, 3 and 4 stages, five passes over each ring, a consumer holding 0, 1 or 2 tiles past the current one.
        let mut runs = 0;
        for (n, spec) in CURSOR_WALKS.iter().enumerate() {
            for lag in 0..3 {
                let wrong = cursor_wrong(gpu, spec, n + 2, lag)?;
                ensure!(wrong.is_empty(), "{}, lag {lag}: {}", spec.name, wrong.join("; "));
                runs += 1;
            }
        }
        eprintln!("tma::Cursor: {runs} walks of five passes, every stage, parity and byte as the ring's rule says");
        Ok(())
    });
    let cursor_mutants: [(&str, &str, &str, &str); 2] = [
        (
            "phase_not_flipped_at_the_wrap",
            "    if (++s0 == STAGES) {\n      s0 = 0;\n      par ^= 1u;",
            "    if (++s0 == STAGES) {\n      s0 = 0;",
            "a cursor that keeps waiting on parity 0",
        ),
        (
            "slot_off_by_one_after_the_wrap",
            "    if (++s0 == STAGES) {\n      s0 = 0;",
            "    if (++s0 == STAGES) {\n      s0 = 1;",
            "a cursor that comes back to stage 1 instead of 0",
        ),
    ];
    for (name, from, to, unnoticed) in cursor_mutants {
        t.gpu_isolated(&format!("cursor::mutant::{name}"), move |gpu| {
            // Every ring depth and lag must notice it (the walk ends: every spin is bounded).
            for (n, spec) in CURSOR_WALKS.iter().enumerate() {
                let bad = spec.mutated("tma_ring.cuh", from, to)?;
                for lag in 0..3 {
                    match cursor_wrong(gpu, &bad, n + 2, lag) {
                        Ok(wrong) => ensure!(
                            !wrong.is_empty(),
                            "{unnoticed} went unnoticed: {}, lag {lag}",
                            spec.name
                        ),
                        Err(e) if aborted(&e) => {
                            eprintln!("the device aborted the mutant: {e:#}");
                            return Ok(());
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        });
    }
    t.gpu("cursor::split_ring_in_pingpong_order", |gpu| {
        // 2 and 3 stages, five passes: each tile's first part read in its turn, its second a turn later.
        for (n, spec) in SPLIT_WALKS.iter().enumerate() {
            let wrong = split_wrong(gpu, spec, n + 2)?;
            ensure!(wrong.is_empty(), "{}: {}", spec.name, wrong.join("; "));
        }
        eprintln!("tma::SplitBarriers: both parts of every tile as loaded, 2 and 3 stages, five passes each");
        Ok(())
    });
    let split_mutants: [(&str, &str, &str, &str); 2] = [
        (
            "second_part_waited_on_tile_ts_parity",
            "wait_at(full0 + 16 * STAGES + 8 * s1, parity_prev());",
            "wait_at(full0 + 16 * STAGES + 8 * s1, par);",
            "a wait for tile t − 1's second part on tile t's parity",
        ),
        (
            "second_part_released_on_the_first_set",
            "void release_second_prev2() const { arrive_at(empty0 + 16 * STAGES + 8 * s2); }",
            "void release_second_prev2() const { arrive_at(empty0 + 8 * s2); }",
            "a second part given back on the first set's barrier",
        ),
    ];
    for (name, from, to, unnoticed) in split_mutants {
        t.gpu_isolated(&format!("cursor::mutant::{name}"), move |gpu| {
            for (n, spec) in SPLIT_WALKS.iter().enumerate() {
                let bad = spec.mutated("tma_ring.cuh", from, to)?;
                match split_wrong(gpu, &bad, n + 2) {
                    Ok(wrong) => {
                        if !wrong.is_empty() {
                            eprintln!("{name} caught: {}", wrong.join("; "));
                            return Ok(());
                        }
                    }
                    Err(e) if aborted(&e) => {
                        eprintln!("the device aborted the mutant: {e:#}");
                        return Ok(());
                    }
                    Err(e) => {
                        eprintln!("{name} caught: {e:#}");
                        return Ok(());
                    }
                }
            }
            anyhow::bail!("{unnoticed} went unnoticed at 2 and 3 stages")
        });
    }
    for (name, what, from, to, every_run, unnoticed) in mutants {
        t.gpu_isolated(&format!("mutant::{name}"), move |gpu| {
            let (bad, all) = mutant(gpu, from, to)?;
            eprintln!("{what}: {bad} of {all} runs wrong");
            if every_run {
                ensure!(
                    bad == all,
                    "{unnoticed} went unnoticed in {} runs",
                    all - bad
                );
            } else {
                ensure!(bad > 0, "{unnoticed} went unnoticed in all {all} runs");
            }
            Ok(())
        });
    }
    t.run()
}

/// One 64 × 64 box of 16-bit values, v(r, c) = 64·r + c + 1, written as the 128-byte-swizzled image of
/// frag-layout's canonical tile and stored by `store_box` at columns 64.., rows 64.. of head 1 of a [1, 2, 100,
/// 128] u16 tensor (a map swizzled `sw`), whose buffer runs 64 rows past the tensor: every element of the buffer
/// checked (the box's 36 rows inside the tensor; the rest, past Sq included, still the 0xFFFF fill).
fn store_box_wrong(gpu: &Gpu, sw: Swizzle) -> Result<Vec<String>> {
    let (heads, s, d) = (2usize, 100usize, 128usize);
    let mut img = vec![0u8; 64 * 128];
    for r in 0..64 {
        for c in 0..64 {
            let v = (64 * r + c + 1) as u16;
            for (b, byte) in v.to_le_bytes().into_iter().enumerate() {
                let kb = 2 * c + b;
                let at = frag_layout::Desc::tile_byte(Swizzle::B128, 64, 128, r as u32, kb as u32);
                img[at as usize] = byte;
            }
        }
    }
    let words: Vec<u32> = img
        .chunks(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let st = &gpu.stream;
    let k = gpu.load(&STORE_BOX)?;
    let len = heads * s * d + 64 * d;
    let out = st.clone_htod(&vec![0xFFFFu16; len])?;
    let dimg = st.clone_htod(&words)?;
    let map = {
        let (addr, _g) = out.device_ptr(st);
        MapSpec::heads(
            Elem::U16,
            [1, heads as u64, s as u64, d as u64],
            false,
            64,
            sw,
        )
        .encode(addr)?
    };
    let (n, c0, c1, c2) = (words.len() as i32, 64i32, 64i32, 1i32);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: store_box(Map, const u32* img[n], int n, int c0, int c1, int c2), 128 threads; the map describes
    // `out`'s first heads · s · d elements.
    unsafe {
        st.launch_builder(&k.func)
            .arg(&map)
            .arg(&dimg)
            .arg(&n)
            .arg(&c0)
            .arg(&c1)
            .arg(&c2)
            .launch(cfg)?
    };
    let got = st.clone_dtoh(&out)?;
    let mut wrong = Vec::new();
    for (i, &g) in got.iter().enumerate() {
        let (h, r, c) = (i / (s * d), i / d % s, i % d);
        let inside = i < heads * s * d && h == 1 && r >= 64 && c >= 64;
        let want = if inside {
            (64 * (r - 64) + (c - 64) + 1) as u16
        } else {
            0xFFFF
        };
        if g != want {
            wrong.push(format!("[{i}] = {g:#x}, want {want:#x}"));
        }
    }
    Ok(wrong)
}

/// The bytes the ring tests load: tile after tile of a pattern no two nearby tiles share.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 % 251) as u8).collect()
}

/// `spec` (`bulk_ring`, or `cluster_ring` with `ctas` = 2) over tiles the size of stage 7's Vᵀ and a small one,
/// more tiles than stages: every CTA's copy of every tile exact.
fn every_copy_exact(gpu: &lab::Gpu, spec: &lab::KernelSpec, ctas: usize) -> Result<()> {
    for (bytes, tiles) in [(28672usize, 5usize), (4096, 7)] {
        let got = byte_ring(gpu, spec, bytes, tiles, ctas)?;
        let want = pattern(bytes * tiles);
        for (cta, copy) in got.chunks(bytes * tiles).enumerate() {
            ensure!(
                copy == want,
                "CTA {cta} of {ctas}, {tiles} tiles of {bytes} bytes: {} bytes differ",
                copy.iter().zip(&want).filter(|(a, b)| a != b).count()
            );
        }
    }
    Ok(())
}

/// `spec` loaded with `extra` NVRTC options and allowed `smem` bytes of dynamic shared memory, with the launch of one
/// grid of `ctas` CTAs of `threads` threads that uses them all.
fn ring_kernel(
    gpu: &Gpu,
    spec: &KernelSpec,
    extra: &[&str],
    smem: usize,
    ctas: usize,
    threads: u32,
) -> Result<(lab::Kernel, LaunchConfig)> {
    let k = gpu.load_with(spec, extra)?;
    k.func.set_attribute(
        lab::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    let cfg = LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    Ok((k, cfg))
}

/// `tiles` tiles of `bytes` through a byte ring kernel, `ring(in, bytes, tiles, out)` on `ctas` CTAs of 128 threads
/// (`bulk_ring`: 1; `cluster_ring`: one cluster of 2, each CTA loading half of every tile for both): every CTA's
/// copy, CTA 0's first. A cluster's spin is bounded, so that a broken change ends with wrong bytes (a CTA starved
/// that way leaves the context unusable for the tests after it: no mutant here starves one).
fn byte_ring(
    gpu: &lab::Gpu,
    spec: &lab::KernelSpec,
    bytes: usize,
    tiles: usize,
    ctas: usize,
) -> Result<Vec<u8>> {
    let st = &gpu.stream;
    let spin: &[&str] = if ctas > 1 { &[SPIN] } else { &[] };
    let (k, cfg) = ring_kernel(gpu, spec, spin, 1024 + 2 * bytes, ctas, 128)?;
    let din = st.clone_htod(&pattern(bytes * tiles))?;
    let mut dout = st.clone_htod(&vec![0xA5u8; ctas * bytes * tiles])?;
    let (b, n) = (bytes as i32, tiles as i32);
    // SAFETY: bulk_ring / cluster_ring(const u8* in[bytes·tiles], int bytes, int tiles, u8* out[ctas·bytes·tiles]);
    // `ctas` CTAs (cluster_ring's __cluster_dims__ is 2), 128 threads, 1024 + 2·bytes of dynamic shared memory (two
    // stages, 1024-aligned).
    unsafe {
        st.launch_builder(&k.func)
            .arg(&din)
            .arg(&b)
            .arg(&n)
            .arg(&mut dout)
            .launch(cfg)?
    };
    Ok(st.clone_dtoh(&dout)?)
}

/// Walks a `stages`-deep ring of 512-byte tiles five times over with `spec` (a `cursor_walk_nN`) holding `lag` tiles:
/// every tile's bytes as read in the cursor's stage, the tile before's as read in its previous stage, and where the
/// cursor stood at each tile against `cursor_at` (the ring's rule); the first differences, empty if none.
fn cursor_wrong(gpu: &Gpu, spec: &KernelSpec, stages: usize, lag: usize) -> Result<Vec<String>> {
    let (bytes, tiles) = (512usize, 5 * stages + 1);
    let st = &gpu.stream;
    // A mutant cursor can deadlock producer and consumer both: each wait then spins a bounded count of
    // non-blocking probes (~2 M: tens of milliseconds), where a healthy wait takes a few hundred.
    let (k, cfg) = ring_kernel(gpu, spec, &WALK_OPTIONS, 1024 + stages * bytes, 1, 64)?;
    let want = pattern(bytes * tiles);
    let din = st.clone_htod(&want)?;
    let mut dout = st.clone_htod(&vec![0xA5u8; bytes * tiles])?;
    let mut dprev = st.clone_htod(&vec![0xA5u8; bytes * tiles])?;
    let mut dlog = st.clone_htod(&vec![-1i32; 4 * tiles])?;
    let (b, n, l) = (bytes as i32, tiles as i32, lag as i32);
    // SAFETY: cursor_walk_nN(const u8* in[bytes·tiles], int bytes, int tiles, int lag, u8* out[bytes·tiles],
    // u8* prev[bytes·tiles], int* log[4·tiles]); 64 threads, 1024 + N·bytes of dynamic shared memory.
    unsafe {
        st.launch_builder(&k.func)
            .arg(&din)
            .arg(&b)
            .arg(&n)
            .arg(&l)
            .arg(&mut dout)
            .arg(&mut dprev)
            .arg(&mut dlog)
            .launch(cfg)?
    };
    let (out, prev, log) = (
        st.clone_dtoh(&dout)?,
        st.clone_dtoh(&dprev)?,
        st.clone_dtoh(&dlog)?,
    );
    let mut wrong = vec![];
    for t in 0..tiles {
        let at = cursor_at(t, stages);
        let seen = (log[4 * t], log[4 * t + 1], log[4 * t + 2], log[4 * t + 3]);
        let rule = (
            at.stage as i32,
            at.parity as i32,
            at.prev as i32,
            at.prev2 as i32,
        );
        if seen != rule {
            wrong.push(format!(
                "tile {t}: (stage, parity, prev, prev2) {seen:?}, the rule {rule:?}"
            ));
        }
        let tile = t * bytes..(t + 1) * bytes;
        if out[tile.clone()] != want[tile.clone()] {
            wrong.push(format!("tile {t}: its stage held other bytes"));
        }
        if lag > 0 && t + 1 < tiles && prev[tile.clone()] != want[tile] {
            wrong.push(format!("tile {t}: its stage held other bytes a tile later"));
        }
    }
    wrong.truncate(4);
    Ok(wrong)
}

/// Walks a `stages`-deep split ring of 512-byte tiles five times over with `spec` (a `split_walk_nN`): each tile's
/// first and second part as read, against what was loaded; the first differences, empty if none.
fn split_wrong(gpu: &Gpu, spec: &KernelSpec, stages: usize) -> Result<Vec<String>> {
    let (bytes, tiles) = (512usize, 5 * stages + 1);
    let st = &gpu.stream;
    let (k, cfg) = ring_kernel(gpu, spec, &WALK_OPTIONS, 1024 + 2 * stages * bytes, 1, 64)?;
    let want = pattern(2 * bytes * tiles);
    let din = st.clone_htod(&want)?;
    let mut dout = st.clone_htod(&vec![0xA5u8; 2 * bytes * tiles])?;
    let (b, n) = (bytes as i32, tiles as i32);
    // SAFETY: split_walk_nN(const u8* in[2·bytes·tiles], int bytes, int tiles, u8* out[2·bytes·tiles]); 64 threads,
    // 1024 + 2·N·bytes of dynamic shared memory.
    unsafe {
        st.launch_builder(&k.func)
            .arg(&din)
            .arg(&b)
            .arg(&n)
            .arg(&mut dout)
            .launch(cfg)?
    };
    let out = st.clone_dtoh(&dout)?;
    let mut wrong = vec![];
    for (part, name) in ["first", "second"].iter().enumerate() {
        for t in 0..tiles {
            let at = (part * tiles + t) * bytes..(part * tiles + t + 1) * bytes;
            if out[at.clone()] != want[at] {
                wrong.push(format!("tile {t}: its {name} part held other bytes"));
            }
        }
    }
    wrong.truncate(4);
    Ok(wrong)
}
