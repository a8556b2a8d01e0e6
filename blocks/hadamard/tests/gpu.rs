// hadamard's test binary: rotations bit-exact to the model, orthonormal, inverted, and mutants caught.
use anyhow::{Result, bail, ensure};
use hadamard::*;
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, Tolerance, check_written, error_stats, poisoned};
use lab::{Gpu, KernelSpec, Suite};

/// Rows a case: not a multiple of the 8 rows a block, so the last block is partial.
const ROWS_A_CASE: usize = 1001;

fn rotations(d: usize) -> Vec<Rotation> {
    vec![
        Rotation::new(d, None).expect("supported"),
        Rotation::new(d, Some(3)).expect("supported"),
    ]
}

/// Inputs of every magnitude: normal rows, a row of huge values, a row of subnormal-sized ones.
fn inputs(d: usize) -> Vec<f32> {
    let mut x = Inputs::seeded(d as u64).normal(ROWS_A_CASE * d, 0.0, 1.0);
    x[..d].iter_mut().for_each(|v| *v *= 1e30);
    x[d..2 * d].iter_mut().for_each(|v| *v *= 1e-38);
    x
}

/// Device against model, bit for bit, every D, with and without signs, forward and inverse, through `spec`
/// (the library kernel for D, or a mutant of it).
fn check_bit_exact(gpu: &Gpu, spec_for: impl Fn(usize) -> Result<KernelSpec>) -> Result<usize> {
    let mut n = 0;
    for d in DIMS {
        let x = inputs(d);
        for r in rotations(d) {
            for inverse in [false, true] {
                let mut dx = gpu.stream.clone_htod(&x)?;
                r.apply_with(gpu, &spec_for(d)?, &mut dx, inverse)?;
                let got = gpu.stream.clone_dtoh(&dx)?;
                let mut want = x.clone();
                r.rows(&mut want, inverse);
                if let Some(i) = (0..x.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                    bail!(
                        "D = {d}, signs {}, inverse {inverse}: row {} col {}: device {:e}, model {:e}",
                        r.signs.is_some(),
                        i / d,
                        i % d,
                        got[i],
                        want[i]
                    );
                }
                n += x.len();
            }
        }
    }
    Ok(n)
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    t.gpu("rows_are_bit_exact_to_the_model", |gpu| {
        let n = check_bit_exact(gpu, |d| for_dim(&ROWS, d))?;
        eprintln!(
            "rotate: {n} values (D = {DIMS:?} × signs or none × forward and inverse) bit-exact to the model"
        );
        Ok(())
    });
    t.gpu("the_rotation_is_orthonormal", |gpu| {
        for d in DIMS {
            for r in rotations(d) {
                // The rows of the identity, rotated: R itself.
                let mut eye = vec![0.0f32; d * d];
                (0..d).for_each(|i| eye[i * d + i] = 1.0);
                let mut dx = gpu.stream.clone_htod(&eye)?;
                r.apply(gpu, &mut dx, false)?;
                let m = gpu.stream.clone_dtoh(&dx)?;
                let exact = r.matrix();
                for (i, (&g, &w)) in m.iter().zip(&exact).enumerate() {
                    ensure!(
                        g == norm(d) * w.signum() as f32,
                        "D = {d}: R[{}][{}] = {g}, want ±1/√D with the sign of {w}",
                        i / d,
                        i % d
                    );
                }
                let mut worst = 0.0f64;
                for i in 0..d {
                    for j in 0..d {
                        let dot: f64 = (0..d)
                            .map(|c| f64::from(m[i * d + c]) * f64::from(m[j * d + c]))
                            .sum();
                        worst = worst.max((dot - f64::from(u8::from(i == j))).abs());
                    }
                }
                // Each entry is 1/√D rounded to f32: R·Rᵀ's diagonal is D·norm² = 1 within 2·2⁻²⁴.
                ensure!(
                    worst <= 2.0 * f64::from(f32::EPSILON),
                    "D = {d}: |R·Rᵀ − I| reaches {worst:e}"
                );
                eprintln!(
                    "D = {d}, signs {}: R entries exactly ±1/√D, |R·Rᵀ − I| ≤ {worst:.2e}",
                    r.signs.is_some()
                );
            }
        }
        Ok(())
    });
    t.gpu("rotating_back_recovers_the_rows", |gpu| {
        for d in DIMS {
            let x = Inputs::seeded(40 + d as u64).normal(ROWS_A_CASE * d, 0.0, 3.0);
            for r in rotations(d) {
                let mut dx = gpu.stream.clone_htod(&x)?;
                r.apply(gpu, &mut dx, false)?;
                r.apply(gpu, &mut dx, true)?;
                let back = gpu.stream.clone_dtoh(&dx)?;
                let want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
                let e = error_stats(&back, &want, Tolerance { atol: 0.0, rtol: 0.0 });
                // 2·log2(D) add stages and two scalings, each at most half an f32 ulp of a row-norm-sized value.
                let bound = (2.0 * (d as f64).log2() + 2.0) * f64::from(f32::EPSILON);
                ensure!(e.rel_l2 <= bound, "D = {d}: round trip rel-L2 {:e} > {bound:e}", e.rel_l2);
                eprintln!(
                    "D = {d}, signs {}: round trip max abs {:.2e}, mean abs {:.2e}, rel-L2 {:.2e} (bound {bound:.1e})",
                    r.signs.is_some(),
                    e.max_abs,
                    e.mean_abs,
                    e.rel_l2
                );
            }
        }
        Ok(())
    });
    t.gpu("fwht_twice_is_d_times_the_identity_exactly", |gpu| {
        for (d, spec) in DIMS.iter().zip(&TWICE) {
            let rows = 257usize;
            // Small integers: every sum is exact in f32, so H·H = D·I must hold bit for bit.
            let x: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 7919) % 17) as f32 - 8.0)
                .collect();
            let k = gpu.load(spec)?;
            let s = &gpu.stream;
            let dx = s.clone_htod(&x)?;
            let mut dy = s.clone_htod(&poisoned::<f32>(x.len()))?;
            let r = rows as i64;
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(8) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: fwht_twice_dD(const float* x[rows·D], float* y[rows·D], long long rows), a warp a row.
            unsafe {
                s.launch_builder(&k.func)
                    .arg(&dx)
                    .arg(&mut dy)
                    .arg(&r)
                    .launch(cfg)?
            };
            let y = s.clone_dtoh(&dy)?;
            check_written(&y, spec.name)?;
            if let Some(i) = (0..x.len()).find(|&i| y[i] != *d as f32 * x[i]) {
                bail!(
                    "D = {d}: element {i}: H·H·x = {}, want {}",
                    y[i],
                    *d as f32 * x[i]
                );
            }
        }
        eprintln!("H·H = D·I exactly for D = {DIMS:?} (in registers, integers)");
        Ok(())
    });
    t.gpu("mutant_transforms_are_caught", |gpu| {
        for (what, from, to) in [
            (
                "the upper lane subtracts the wrong way",
                "upper ? o - v[i] : v[i] + o",
                "upper ? v[i] - o : v[i] + o",
            ),
            (
                "the last cross-lane stage dropped",
                "m < 32; m <<= 1",
                "m < 16; m <<= 1",
            ),
            (
                "the in-lane butterfly reversed",
                "v[i + h] = a - b;",
                "v[i + h] = b - a;",
            ),
            (
                "signs flipped on the way back too early",
                "if (signs != nullptr && !inverse)",
                "if (signs != nullptr)",
            ),
        ] {
            match check_bit_exact(gpu, |d| {
                for_dim(&ROWS, d)?.mutated("hadamard.cuh", from, to)
            }) {
                Err(e) => eprintln!("mutant `{what}` caught: {e}"),
                Ok(_) => bail!("the mutant `{what}` agreed with the model everywhere"),
            }
        }
        Ok(())
    });
    t.run()
}
