// wgmma's test binary: the header against the model at compile time, exact integer GEMMs on the device, and mutants.
use anyhow::{Result, anyhow, ensure};
use frag_layout::Swizzle;
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, check_written, poisoned};
use lab::{Arch, Gpu, KernelSpec, Source, Suite};
use wgmma::*;

/// One warpgroup, its tiles of `rows` rows × K_BYTES in dynamic shared memory (1024-aligned inside).
fn one_warpgroup(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: (rows * K_BYTES + 1024) as u32,
    }
}

/// One warpgroup GEMM on the device: a [64][K_BYTES] and b [n][K_BYTES] bytes, both tiles `sw`-swizzled, and for
/// the first-steps kernel its K-step count; D [64][n] back, every cell checked written.
fn launch_gemm(
    gpu: &Gpu,
    spec: &KernelSpec,
    a: &[u8],
    b: &[u8],
    n: usize,
    sw: Swizzle,
    steps: Option<i32>,
) -> Result<Vec<f32>> {
    let s = &gpu.stream;
    let kern = gpu.load(spec)?;
    let (da, db) = (s.clone_htod(a)?, s.clone_htod(b)?);
    let mut dd = s.clone_htod(&poisoned::<f32>(64 * n))?;
    let swz = sw.tma_code() as i32;
    let cfg = one_warpgroup(64 + n);
    let mut launch = s.launch_builder(&kern.func);
    launch.arg(&da).arg(&db).arg(&swz);
    if let Some(steps) = &steps {
        launch.arg(steps);
    }
    launch.arg(&mut dd);
    // SAFETY: gemm(const u8* a[64][K_BYTES], const u8* b[n][K_BYTES], int swizzle, float* d[64][n]), or
    // first_steps(…, int swizzle, int steps in 1 ..= 4, float* d); one warpgroup; both tiles in dynamic shared memory.
    unsafe { launch.launch(cfg)? };
    let got = s.clone_dtoh(&dd)?;
    check_written(&got, spec.name)?;
    Ok(got)
}

/// What one GEMM run found: cells compared and the wrong ones (first few named).
struct Outcome {
    cells: usize,
    wrong: Vec<String>,
}

fn run(
    gpu: &Gpu,
    spec: &KernelSpec,
    p: Pairing,
    n: u32,
    sw: Swizzle,
    seed: u64,
) -> Result<Outcome> {
    let (m, nn) = (64usize, n as usize);
    let k = K_BYTES / p.elem_bytes();
    let r = value_range(p.a);
    let mut inp = Inputs::seeded(seed);
    let a = inp.integers(m * k, -r, r);
    let b = inp.integers(nn * k, -r, r);
    let want = gemm(&a, &b, m, nn, k);
    let got = launch_gemm(
        gpu,
        spec,
        &to_bytes(&a, p.a)?,
        &to_bytes(&b, p.b)?,
        nn,
        sw,
        None,
    )?;
    let mut wrong = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if g as f64 != w {
            wrong.push(format!("D({}, {}) = {g}, A·Bᵀ = {w}", i / nn, i % nn));
        }
    }
    Ok(Outcome {
        cells: got.len(),
        wrong,
    })
}

/// Every swizzle, three seeds: the number of cells checked, or the first wrong ones.
fn exact_everywhere(gpu: &Gpu, spec: &KernelSpec, p: Pairing, n: u32) -> Result<usize> {
    let mut cells = 0;
    for sw in Swizzle::ALL {
        for seed in 0..3 {
            let o = run(gpu, spec, p, n, sw, seed)?;
            ensure!(
                o.wrong.is_empty(),
                "{} with {} swizzle, seed {seed}: {} of {} cells wrong, e.g. {}",
                spec.name,
                sw.name(),
                o.wrong.len(),
                o.cells,
                o.wrong
                    .iter()
                    .take(4)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            cells += o.cells;
        }
    }
    Ok(cells)
}

/// A mutant of the N = 256 FP8 GEMM (A from shared memory and from registers): how many runs of the 4
/// swizzles × 8 seeds come out wrong.
fn wrong_runs(gpu: &Gpu, from: &str, to: &str) -> Result<(usize, usize)> {
    let p = PAIRINGS[0];
    let (mut bad, mut all) = (0, 0);
    for a_regs in [false, true] {
        let spec = p.kernel(256, a_regs).mutated("wgmma.cuh", from, to)?;
        for sw in Swizzle::ALL {
            for seed in 0..8 {
                all += 1;
                if !run(gpu, &spec, p, 256, sw, seed)?.wrong.is_empty() {
                    bad += 1;
                }
            }
        }
    }
    Ok((bad, all))
}

/// The first-steps GEMM (`mma_rs_first`, FP8, N = 128) on `steps` of the 4 K-steps: its wrong cells against A·Bᵀ
/// over the first 32 · steps bytes of K (A's later bytes are nonzero: a GEMM over them all is wrong).
fn first_steps(gpu: &Gpu, spec: &KernelSpec, steps: i32, sw: Swizzle, seed: u64) -> Result<usize> {
    let p = PAIRINGS[0];
    let (m, n, k) = (64usize, 128usize, K_BYTES);
    let mut inp = Inputs::seeded(seed);
    let a = inp.integers(m * k, -3, 3);
    let b = inp.integers(n * k, -3, 3);
    let cut = 32 * steps as usize;
    let a_cut: Vec<f32> = a
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % k < cut { x } else { 0.0 })
        .collect();
    let want = gemm(&a_cut, &b, m, n, k);
    let got = launch_gemm(
        gpu,
        spec,
        &to_bytes(&a, p.a)?,
        &to_bytes(&b, p.b)?,
        n,
        sw,
        Some(steps),
    )?;
    Ok(got
        .iter()
        .zip(&want)
        .filter(|(g, w)| **g as f64 != **w)
        .count())
}

/// Wrong runs of `spec` over steps 1 ..= 4, every swizzle, two seeds, and the runs.
fn first_steps_wrong(gpu: &Gpu, spec: &KernelSpec) -> Result<(usize, usize)> {
    let (mut bad, mut all) = (0, 0);
    for steps in 1..=4 {
        for sw in Swizzle::ALL {
            for seed in 0..2 {
                all += 1;
                if first_steps(gpu, spec, steps, sw, seed)? > 0 {
                    bad += 1;
                }
            }
        }
    }
    Ok((bad, all))
}

/// The two-GEMM kernel through one B tile (128B swizzle): wrong cells of D1 and D2.
fn reuse(gpu: &Gpu, spec: &KernelSpec, seed: u64) -> Result<(usize, usize)> {
    let p = PAIRINGS[0];
    let (m, n, k) = (64usize, 128usize, K_BYTES);
    let mut inp = Inputs::seeded(seed);
    let a = inp.integers(m * k, -3, 3);
    let b1 = inp.integers(n * k, -3, 3);
    let b2 = inp.integers(n * k, -3, 3);
    // The first GEMM passes over its tile REPEAT times (a long GEMM, a wide race window for the mutant).
    let w1: Vec<f64> = gemm(&a, &b1, m, n, k).iter().map(|v| v * REPEAT).collect();
    let w2 = gemm(&a, &b2, m, n, k);
    let s = &gpu.stream;
    let kern = gpu.load(spec)?;
    let da = s.clone_htod(&to_bytes(&a, p.a)?)?;
    let db1 = s.clone_htod(&to_bytes(&b1, p.b)?)?;
    let db2 = s.clone_htod(&to_bytes(&b2, p.b)?)?;
    let mut dd = s.clone_htod(&poisoned::<f32>(2 * m * n))?;
    let cfg = one_warpgroup(m + n);
    // SAFETY: reuse(const u8* a[64][128], const u8* b1[128][128], const u8* b2[128][128], float* d[2][64][128]).
    unsafe {
        s.launch_builder(&kern.func)
            .arg(&da)
            .arg(&db1)
            .arg(&db2)
            .arg(&mut dd)
            .launch(cfg)?
    };
    let got = s.clone_dtoh(&dd)?;
    check_written(&got, spec.name)?;
    let bad1 = got[..m * n]
        .iter()
        .zip(&w1)
        .filter(|(g, w)| **g as f64 != **w)
        .count();
    let bad2 = got[m * n..]
        .iter()
        .zip(&w2)
        .filter(|(g, w)| **g as f64 != **w)
        .count();
    Ok((bad1, bad2))
}

/// FP8 wgmma on arbitrary E4M3 values (not integers): the largest |D − A·Bᵀ| over Σ|a·b| of its cell. The
/// tensor cores do not accumulate FP8 products in IEEE f32 (a known trait of Hopper's FP8 path); this is the
/// measured bound the FP8 attention stages' tolerances are built on.
fn fp8_accumulation_error(gpu: &Gpu, seed: u64) -> Result<f64> {
    let p = PAIRINGS[0];
    let spec = p.kernel(128, false);
    let (m, n, k) = (64usize, 128usize, K_BYTES);
    let mut inp = Inputs::seeded(seed);
    let code =
        |x: f32| fp8_codec::encode(x, fp8_codec::Saturation::SatFinite, fp8_codec::Format::E4M3);
    let dec = |c: u8| fp8_codec::decode(c, fp8_codec::Format::E4M3);
    let a8: Vec<u8> = inp.normal(m * k, 0.0, 8.0).into_iter().map(code).collect();
    let b8: Vec<u8> = inp.normal(n * k, 0.0, 8.0).into_iter().map(code).collect();
    let (a, b): (Vec<f32>, Vec<f32>) = (
        a8.iter().map(|&c| dec(c)).collect(),
        b8.iter().map(|&c| dec(c)).collect(),
    );
    let want = gemm(&a, &b, m, n, k);
    let abs: Vec<f64> = gemm(
        &a.iter().map(|x| x.abs()).collect::<Vec<_>>(),
        &b.iter().map(|x| x.abs()).collect::<Vec<_>>(),
        m,
        n,
        k,
    );
    let got = launch_gemm(gpu, &spec, &a8, &b8, n, Swizzle::B128, None)?;
    Ok(got
        .iter()
        .zip(&want)
        .zip(&abs)
        .map(|((&g, &w), &s)| {
            if s > 0.0 {
                (g as f64 - w).abs() / s
            } else {
                0.0
            }
        })
        .fold(0.0, f64::max))
}

const REPEAT: f64 = 8.0;
const FP8_ACC_EPS: f64 = wgmma::FP8_ACCUMULATION_EPS;

const WAIT_ASM: &str =
    "  asm volatile(\"wgmma.wait_group.sync.aligned %0;\\n\" ::\"n\"(N) : \"memory\");";

const PUBLISH: &str = "  proxy_fence();\n  __syncthreads();";

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    lab::sass_snapshots!(
        t,
        &[
            PAIRINGS[0].kernel(128, false),
            PAIRINGS[0].kernel(128, true),
            PAIRINGS[4].kernel(128, false),
            REUSE,
        ]
    );

    t.compile("header_agrees_with_the_model", || {
        let code: &'static str = Box::leak(header_checks().into_boxed_str());
        let src: &'static Source = Box::leak(Box::new(Source {
            file: "wgmma_header_checks.cu",
            code,
            headers: &[frag_layout::WGMMA_HEADERS, HEADERS],
        }));
        lab::compile(src, Arch::Sm90a, &[]).map(|_| ())
    });
    t.compile("mutated_header_is_caught", || {
        // A stride byte offset of 4 rows instead of 8: the model's static_asserts must fail, naming the tile.
        let spec = PAIRINGS[0].kernel(64, false).mutated(
            "wgmma.cuh",
            "16u, 8u * w, s};",
            "16u, 4u * w, s};",
        )?;
        let code: &'static str = Box::leak(header_checks().into_boxed_str());
        let src: &'static Source = Box::leak(Box::new(Source {
            file: "wgmma_header_checks.cu",
            code,
            headers: spec.source.headers,
        }));
        let err = format!(
            "{:#}",
            lab::compile(src, Arch::Sm90a, &[])
                .err()
                .ok_or_else(|| anyhow!("the mutated header compiled"))?
        );
        ensure!(
            err.contains("Swizzle::B"),
            "the failure does not name the tile: {err}"
        );
        Ok(())
    });
    t.compile("publishing_shared_memory_emits_the_proxy_fence", || {
        // FENCE.VIEW.ASYNC.S is fence.proxy.async.shared::cta in SASS: without it, wgmma may read stale bytes.
        let spec = PAIRINGS[0].kernel(64, false);
        let (cubin, _) = spec.compile(Arch::Sm90a)?;
        let h = lab::sass::histogram(&cubin, spec.name)?;
        ensure!(h.contains_key("FENCE"), "no FENCE in {}: {h:?}", spec.name);
        let bad = spec.mutated("wgmma.cuh", PUBLISH, "  __syncthreads();")?;
        let (cubin, _) = bad.compile(Arch::Sm90a)?;
        let hb = lab::sass::histogram(&cubin, spec.name)?;
        ensure!(
            hb.get("FENCE") < h.get("FENCE"),
            "removing fence.proxy.async left the SASS's FENCE count at {:?}",
            hb.get("FENCE")
        );
        Ok(())
    });

    for p in PAIRINGS {
        for n in NS {
            for a_regs in [false, true] {
                let spec = p.kernel(n, a_regs);
                t.gpu(&format!("gemm_exact::{}", spec.name), move |gpu| {
                    let cells = exact_everywhere(gpu, &spec, p, n)?;
                    eprintln!(
                        "{}: {cells} cells exact over 4 swizzles × 3 seeds",
                        spec.name
                    );
                    Ok(())
                });
            }
        }
    }

    t.gpu("first_steps_exact", |gpu| {
        let (bad, all) = first_steps_wrong(gpu, &FIRST_STEPS)?;
        ensure!(bad == 0, "mma_rs_first: {bad} of {all} runs wrong");
        eprintln!("mma_rs_first: {all} runs (1 to 4 K-steps, 4 swizzles, 2 seeds) exact");
        Ok(())
    });
    t.gpu("mutant::first_steps_run_every_step", |gpu| {
        // The count's test dropped: every K-step issued, A's later bytes counted.
        let bad_spec = FIRST_STEPS.mutated(
            "wgmma.cuh",
            "    if (steps < K) return mma_rs_first",
            "    if (false) return mma_rs_first",
        )?;
        let (bad, all) = first_steps_wrong(gpu, &bad_spec)?;
        // Runs of 4 steps are right either way: the 24 runs of 1 to 3 steps must all be wrong.
        ensure!(
            bad == all - 8,
            "every step issued: only {bad} of {all} runs wrong"
        );
        eprintln!("mutant caught: every step issued, {bad} of {all} runs wrong");
        Ok(())
    });
    t.gpu("mutant::wrong_stride_byte_offset", |gpu| {
        let (bad, all) = wrong_runs(gpu, "16u, 8u * w, s};", "16u, 4u * w, s};")?;
        eprintln!("SBO of 4 rows: {bad} of {all} runs wrong");
        // None has its own SBO, so the three swizzled modes of both A sources must all fail.
        ensure!(
            bad >= 3 * 8 * 2,
            "a wrong stride byte offset went unnoticed in {} runs",
            all - bad
        );
        Ok(())
    });
    t.gpu("mutant::step_offset_one_step_behind", |gpu| {
        // Every K-step but the first reads the K-step before it (an off-by-one in step_offset). Inside the tile,
        // so the mutant runs to completion with wrong sums (advancing in bytes instead of 16-byte units, the
        // other plausible slip, leaves shared memory: a fault that would poison the context for later tests;
        // the model's static_asserts catch that one at compile time).
        let (bad, all) = wrong_runs(
            gpu,
            "return k_major(s, rows, step).start >> 4;",
            "return k_major(s, rows, step > 0 ? step - 1 : 0).start >> 4;",
        )?;
        eprintln!("step offset one step behind: {bad} of {all} runs wrong");
        ensure!(
            bad == all,
            "a K-step descriptor one step behind went unnoticed in {} runs",
            all - bad
        );
        Ok(())
    });
    t.gpu("fp8_accumulation_error_is_bounded", |gpu| {
        let worst = (0..8).map(|seed| fp8_accumulation_error(gpu, seed)).collect::<Result<Vec<_>>>()?;
        let max = worst.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "FP8 wgmma, K = 128, arbitrary E4M3 values: max |D − A·Bᵀ| / Σ|a·b| = {max:.3e} (2^{:.1}); per seed {worst:?}",
            max.log2()
        );
        // Measured on the H100 (2026-11-22): at most 2^-11.7 over 8 seeds. The lab's FP8 tolerances use 2^-11.
        ensure!(max <= FP8_ACC_EPS, "FP8 accumulation error {max:.3e} above 2^-11 of Σ|a·b|");
        Ok(())
    });
    t.gpu("reuse_of_a_tile_after_the_wait_is_exact", |gpu| {
        for seed in 0..4 {
            let (b1, b2) = reuse(gpu, &REUSE, seed)?;
            ensure!(
                b1 + b2 == 0,
                "seed {seed}: {b1} wrong cells in D1, {b2} in D2"
            );
        }
        Ok(())
    });
    t.gpu("mutant::missing_wait", |gpu| {
        // Without wgmma.wait_group, B2's stores race the first GEMM's reads of B1. (Reading the accumulators
        // early is no test: ptxas waits before accumulator reads on its own; the SASS is unchanged.)
        let bad_spec = REUSE.mutated("wgmma.cuh", WAIT_ASM, "")?;
        let (mut wrong, runs) = (0, 32);
        for seed in 0..runs {
            let (b1, _) = reuse(gpu, &bad_spec, seed)?;
            wrong += (b1 > 0) as usize;
        }
        // The race is real but its window depends on what else the SM runs: on the H100 the device caught it
        // in 15 of 16 runs once and in 0 of 16 another time (tests running beside it). The SASS cannot
        // hide it: the mutant lacks the WARPGROUP.DEPBAR before the stores.
        let waits = |spec: &KernelSpec| -> Result<usize> {
            let (cubin, _) = spec.compile(Arch::Sm90a)?;
            Ok(lab::sass::histogram(&cubin, spec.name)?
                .get("WARPGROUP")
                .copied()
                .unwrap_or(0))
        };
        let (good_w, bad_w) = (waits(&REUSE)?, waits(&bad_spec)?);
        eprintln!(
            "no wgmma.wait_group before reusing a tile: D1 wrong in {wrong} of {runs} runs on the device; \
             WARPGROUP ops in the SASS {good_w} → {bad_w}"
        );
        ensure!(
            wrong > 0 || bad_w < good_w,
            "overwriting an in-flight wgmma's tile went unnoticed by the device ({runs} runs) and the SASS"
        );
        Ok(())
    });
    t.gpu("mutant::missing_proxy_fence", |gpu| {
        let (bad, all) = wrong_runs(gpu, PUBLISH, "  __syncthreads();")?;
        // The device may well read the right bytes anyway (the race is narrow); the SASS cannot hide it.
        let spec = PAIRINGS[0].kernel(256, false).mutated("wgmma.cuh", PUBLISH, "  __syncthreads();")?;
        let (cubin, _) = spec.compile(Arch::Sm90a)?;
        let fences = lab::sass::histogram(&cubin, spec.name)?.get("FENCE").copied().unwrap_or(0);
        eprintln!("no fence.proxy.async: {bad} of {all} runs wrong on the device; {fences} FENCE left in the SASS");
        ensure!(bad > 0 || fences == 0, "a missing proxy fence went unnoticed by the device and the SASS");
        Ok(())
    });
    t.run()
}
