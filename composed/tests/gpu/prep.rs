// The device preparation kernels: Vᵀ (transposed, and as tile images) and quantization by every scheme, with mutants.
use crate::prelude::*;
use lab::cudarc::driver::{CudaSlice, DevicePtr};

/// Vᵀ and device quantization against their host models.
pub fn add(t: &mut Suite) {
    for (sq, sk, d) in [
        (5, 77, 64),
        (130, 300, 128),
        (1, 1, 128),
        (64, 4096, 64),
        (5, 300, 64),
        (3, 1000, 256),
    ] {
        t.gpu(&format!("transpose_v::sk{sk}_d{d}"), move |gpu| {
            check_transpose_v(gpu, &composed::TRANSPOSE_V, Shape::cross(2, 3, sq, sk, d))
        });
    }
    for (sk, d) in [(77, 128), (4096, 128), (224, 128), (225, 64)] {
        t.gpu(&format!("vt_tiles::sk{sk}_d{d}"), move |gpu| {
            check_vt_tiles(gpu, &composed::VT_TILES, Shape::cross(2, 3, 5, sk, d))
        });
    }
    t.gpu("vt_tiles::mutant_unswizzled_is_caught", |gpu| {
        let m = composed::VT_TILES.mutated_source("((seg ^ (ch / 4 % 2)) * 16)", "(seg * 16)")?;
        match check_vt_tiles(gpu, &m, Shape::cross(1, 2, 5, 300, 128)) {
            Err(e) => {
                eprintln!("mutant caught: {e:#}");
                Ok(())
            }
            Ok(()) => anyhow::bail!("tile images without the 32-byte swizzle passed"),
        }
    });
    t.gpu("transpose_v::mutant_without_p_key_order_is_caught", |gpu| {
        let m = composed::TRANSPOSE_V.mutated_source(
            "rows[(32 * g + vt_key(16 * seg + k)) * stride + cq]",
            "rows[(32 * g + 16 * seg + k) * stride + cq]",
        )?;
        match check_transpose_v(gpu, &m, Shape::cross(1, 2, 5, 77, 64)) {
            Err(e) => {
                eprintln!("mutant caught: {e:#}");
                Ok(())
            }
            Ok(()) => anyhow::bail!("a transpose in plain key order passed"),
        }
    });
    t.gpu(
        "transpose_v::mutant_with_half_the_keys_a_block_is_caught",
        |gpu| {
            // The device's keys a block against the host's grid (vt_block_keys): half of them, every other run of keys untouched.
            let m = composed::TRANSPOSE_V
                .mutated_source("32 * max(1, 512 / d)", "32 * max(1, 256 / d)")?;
            match check_transpose_v(gpu, &m, Shape::cross(1, 2, 5, 1000, 64)) {
                Err(e) => {
                    eprintln!("mutant caught: {e:#}");
                    Ok(())
                }
                Ok(()) => anyhow::bail!("a transpose of half the keys a block passed"),
            }
        },
    );
    // Each kernel's own read of V (prep.cu holds both): heads Sk·D apart, as if V were contiguous.
    for (what, spec, rows) in [
        ("transpose_v", composed::TRANSPOSE_V, "n"),
        ("vt_tiles", composed::VT_TILES, "bc"),
    ] {
        t.gpu(
            &format!("{what}::mutant_ignoring_the_head_stride_is_caught"),
            move |gpu| {
                let m = spec.mutated_source(
                    &format!("stage_rows(v + head * hs, sk, d, rs, k0, {rows}, rows)"),
                    &format!("stage_rows(v + head * sk * d, sk, d, rs, k0, {rows}, rows)"),
                )?;
                let shape = Shape::cross(1, 2, 5, 300, 128);
                let r = if what == "vt_tiles" {
                    check_vt_tiles(gpu, &m, shape)
                } else {
                    check_transpose_v(gpu, &m, shape)
                };
                match r {
                    Err(e) => {
                        eprintln!("mutant caught: {e:#}");
                        Ok(())
                    }
                    Ok(()) => anyhow::bail!("{what} reading heads Sk·D apart passed on a view"),
                }
            },
        );
    }
    for (scheme, shapes) in device_schemes() {
        t.gpu(
            &format!("device_quantization::{}", scheme.name()),
            move |gpu| {
                for (shape, dist) in shapes {
                    check_device_scheme(gpu, &composed::Prep::default(), scheme, shape, dist)?;
                }
                Ok(())
            },
        );
    }
    t.gpu("device_quantization::mutants_are_caught", |gpu| {
        let all = fixtures::Scheme {
            per: fixtures::Granularity::PerHead,
            smooth_k: true,
            rotate: fixtures::Rotate::HadamardSigns,
        };
        let base = composed::Prep::default();
        for (what, prep) in [
            (
                "the mean added instead of subtracted",
                composed::Prep {
                    smooth_k: base
                        .smooth_k
                        .mutated_source("kh[(long long)j * d] -= m", "kh[(long long)j * d] += m")?,
                    ..base
                },
            ),
            (
                "the LSE shift without the softmax scale",
                composed::Prep {
                    lse_shift: base
                        .lse_shift
                        .mutated_source("(float)((double)softmax_scale * dot)", "(float)dot")?,
                    ..base
                },
            ),
        ] {
            match check_device_scheme(
                gpu,
                &prep,
                all,
                Shape::cross(2, 3, 77, 130, 64),
                fixtures::Dist::Normal,
            ) {
                Err(e) => eprintln!("mutant `{what}` caught: {e:#}"),
                Ok(()) => anyhow::bail!("the mutant `{what}` passed"),
            }
        }
        Ok(())
    });
}

/// V on the device twice: contiguous, and as a view (each head's Sk rows 3 rows into a head of Sk + 7 rows, NaN codes
/// around them), with the view's `FlatHeads`; a transpose that reads outside the view meets the NaN codes.
fn v_on_device(
    gpu: &Gpu,
    v: &[u8],
    shape: &Shape,
) -> Result<[(CudaSlice<u8>, composed::FlatHeads, usize); 2]> {
    let (sk, d) = (shape.sk, shape.d);
    let (rows, off) = (sk + 7, 3);
    let mut padded = vec![0x7fu8; shape.kv_heads() * rows * d];
    for h in 0..shape.kv_heads() {
        padded[(h * rows + off) * d..(h * rows + off + sk) * d]
            .copy_from_slice(&v[h * sk * d..(h + 1) * sk * d]);
    }
    Ok([
        (
            gpu.stream.clone_htod(v)?,
            composed::FlatHeads::contiguous(sk, d),
            0,
        ),
        (
            gpu.stream.clone_htod(&padded)?,
            composed::FlatHeads {
                row: d,
                head: rows * d,
            },
            off * d,
        ),
    ])
}

/// prep_vt against its host model, byte for byte (every position of every padded row), from V contiguous and from a
/// view of it.
pub fn check_transpose_v(gpu: &Gpu, spec: &lab::KernelSpec, shape: Shape) -> Result<()> {
    let qz = quantize_per_head(&normal(shape, 9));
    let want = composed::transpose_v_model(&qz.v, &shape);
    for (dv, rows, off) in v_on_device(gpu, &qz.v, &shape)? {
        let (v, _g) = dv.device_ptr(&gpu.stream);
        let got = gpu.stream.clone_dtoh(&composed::transpose_v_with(
            gpu,
            spec,
            &gpu.stream,
            (v + off as u64, rows),
            &shape,
        )?)?;
        ensure!(
            got.len() == want.len(),
            "{} bytes, want {}",
            got.len(),
            want.len()
        );
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            let kp = composed::vt_keys(shape.sk);
            anyhow::bail!(
                "{shape:?}, V at {rows:?}: Vᵀ head {} channel {} position {}: device {:#04x}, model {:#04x}",
                i / (shape.d * kp),
                i / kp % shape.d,
                i % kp,
                got[i],
                want[i]
            );
        }
    }
    eprintln!(
        "Vᵀ {shape:?}: {} bytes bit-exact to the model, from V contiguous and from a view",
        want.len()
    );
    Ok(())
}

/// prep_vt_tiles against its host model (stage 7's tiles at D = 128: 224 keys), byte for byte, from V contiguous and
/// from a view of it.
pub fn check_vt_tiles(gpu: &Gpu, spec: &lab::KernelSpec, shape: Shape) -> Result<()> {
    let bc = Stage::S7.bc(128);
    let qz = quantize_per_head(&normal(shape, 10));
    let want = composed::vt_tiles_model(&qz.v, &shape, bc);
    for (dv, rows, off) in v_on_device(gpu, &qz.v, &shape)? {
        let (v, _g) = dv.device_ptr(&gpu.stream);
        let got = gpu.stream.clone_dtoh(&composed::vt_tiles_with(
            gpu,
            spec,
            &gpu.stream,
            (v + off as u64, rows),
            &shape,
            bc,
        )?)?;
        ensure!(
            got.len() == want.len() && want.len() == composed::vt_tiles_bytes(&shape, bc),
            "{} bytes, want {}",
            got.len(),
            want.len()
        );
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            let tile = bc * shape.d;
            anyhow::bail!(
                "{shape:?}, V at {rows:?}: Vᵀ tile image {} byte {}: device {:#04x}, model {:#04x}",
                i / tile,
                i % tile,
                got[i],
                want[i]
            );
        }
    }
    eprintln!(
        "Vᵀ tile images {shape:?}: {} bytes bit-exact to the model, from V contiguous and from a view",
        want.len()
    );
    Ok(())
}

/// The schemes the device pipeline is checked on, each with its shapes and input families: several heads,
/// Sq ≠ Sk, both D, outliers (where the remedies matter).
pub fn device_schemes() -> Vec<(fixtures::Scheme, Vec<(Shape, fixtures::Dist)>)> {
    use fixtures::{Dist, Granularity, Rotate, Scheme};
    let shapes = vec![
        (Shape::cross(2, 3, 77, 130, 64), Dist::Normal),
        (
            Shape::cross(1, 2, 300, 200, 128),
            Dist::Outliers {
                factor: 30.0,
                both: true,
            },
        ),
        (Shape::new(3, 1, 129, 128), Dist::KBias),
        (Shape::new(1, 2, 64, 64), Dist::HeavyTail),
        (
            Shape::cross(2, 4, 70, 150, 128)
                .with_kv_heads(2)
                .expect("4 / 2"),
            Dist::KBias,
        ),
    ];
    let mut v = Vec::new();
    for per in [Granularity::PerHead, Granularity::PerTensor] {
        for smooth_k in [false, true] {
            for rotate in Rotate::ALL {
                v.push((
                    Scheme {
                        per,
                        smooth_k,
                        rotate,
                    },
                    shapes.clone(),
                ));
            }
        }
    }
    v
}

/// Device quantization against its host model, bit for bit (codes, scales, LSE shift); then stage 5 (stage 4
/// off Hopper) on the device's inputs against the f64 reference on the unquantized inputs: the remedies must
/// leave O and the LSE those of the problem given.
pub fn check_device_scheme(
    gpu: &Gpu,
    prep: &composed::Prep,
    scheme: fixtures::Scheme,
    shape: Shape,
    dist: fixtures::Dist,
) -> Result<()> {
    let raw = Raw::generate(shape, 77, dist);
    let want = fixtures::prepare(&raw, scheme)?;
    let mut d = OnDevice::prepare_with(gpu, prep, &raw, scheme, OutDtype::F32)?;
    let got = d.quantized(gpu)?;
    let what = format!("{} on {dist} {shape:?}", scheme.name());
    for (name, g, w) in [
        ("q", &got.q, &want.qz.q),
        ("k", &got.k, &want.qz.k),
        ("v", &got.v, &want.qz.v),
    ] {
        if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
            anyhow::bail!(
                "{what}: `{name}` code {i}: device {:#04x}, model {:#04x}",
                g[i],
                w[i]
            );
        }
    }
    for (name, g, w) in [
        ("q_scale", &got.q_scale, &want.qz.q_scale),
        ("k_scale", &got.k_scale, &want.qz.k_scale),
        ("v_scale", &got.v_scale, &want.qz.v_scale),
    ] {
        ensure!(
            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: `{name}` device {g:?}, model {w:?}"
        );
    }
    let rows: Vec<usize> = (0..shape.heads() * shape.sq).collect();
    let shift = d.lse_shift_rows(gpu, &rows)?;
    let want_shift = want
        .lse_shift
        .clone()
        .unwrap_or_else(|| vec![0.0; rows.len()]);
    ensure!(
        shift
            .iter()
            .zip(&want_shift)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{what}: LSE shift differs from the model"
    );
    let stage = if shape.group() > 1 {
        Stage::S7
    } else if gpu.arch >= lab::Arch::Sm90 {
        Stage::S5
    } else {
        Stage::S4
    };
    d.launch(gpu, stage)?;
    let out = d.download(gpu)?;
    // The kernel on the device's codes, by the stage's own rule (FlashAttention's, against the f64 reference and
    // the emulation of the dequantized, smoothed, rotated inputs); the LSE as the stage wrote it, before the
    // shift (checked bit for bit above) is added back. Where Q and K both carry outlier channels, scores run
    // to the hundreds and wgmma's FP8 accumulation (2^-11.7 of Σ|q·k|, wgmma::FP8_ACCUMULATION_EPS) moves them
    // by ~0.1, which the f32-accumulating emulation does not model: O then differs from it by up to ~0.5 on a
    // few elements (measured on the H100, 2026-11-22), so there the check is O's rel-L2 (observed ≤ 1.5e-2).
    let deq = reference(&got);
    let own = Attention {
        o: out.o.clone(),
        lse: gpu.stream.clone_dtoh(&d.lse)?,
    };
    let e_deq = error_stats(&own.o, &deq.o, Tolerance::exact()).rel_l2;
    if matches!(dist, fixtures::Dist::Outliers { both: true, .. }) {
        ensure!(
            e_deq < 0.03,
            "{what}: {stage:?} against f64 on its dequantized inputs: O rel-L2 {e_deq:.3e} (bound 0.03)"
        );
    } else {
        rule(
            stage,
            &got,
            &deq,
            &emulation_of(stage, &got, OutDtype::F32),
            &own,
            &what,
            |_, _| {},
        )?;
    }
    // Against the unquantized inputs: the remedies must leave O and the LSE those of the problem given. A
    // wrong rotation gives O of another problem (rel-L2 ~1); a missing or reversed shift moves the LSE by
    // softmax_scale·q·μ, large on k-bias inputs. On the outlier families the FP8 error itself is that large,
    // so they are checked only above.
    let r = reference_unquantized(&raw, got.softmax_scale);
    let e = error_stats(&out.o, &r.o, Tolerance::exact());
    let lse_err = out
        .lse
        .iter()
        .zip(&r.lse)
        .map(|(&a, &b)| (f64::from(a) - b).abs())
        .fold(0.0, f64::max);
    let shift_max = want_shift
        .iter()
        .fold(0.0f64, |a, &s| a.max(f64::from(s).abs()));
    match dist {
        fixtures::Dist::Normal => ensure!(
            e.rel_l2 < 0.1 && lse_err < 0.1,
            "{what}: {stage:?} O rel-L2 {:.3e} (bound 0.1), LSE max abs {lse_err:.3e} (bound 0.1) against the unquantized inputs",
            e.rel_l2
        ),
        fixtures::Dist::KBias if scheme.smooth_k => ensure!(
            e.rel_l2 < 0.1 && lse_err < 0.25 * shift_max,
            "{what}: {stage:?} O rel-L2 {:.3e} (bound 0.1), LSE max abs {lse_err:.3e} (bound a quarter of the largest shift, {shift_max:.3e}) against the unquantized inputs",
            e.rel_l2
        ),
        _ => {}
    }
    eprintln!(
        "{what}: bit-exact to the model; {} on the dequantized inputs: O rel-L2 {:.3e}; on the unquantized inputs: O max abs {:.3e}, mean abs {:.3e}, rel-L2 {:.3e}, LSE max abs {lse_err:.3e} (largest shift {shift_max:.2e})",
        stage.name(),
        e_deq,
        e.max_abs,
        e.mean_abs,
        e.rel_l2
    );
    Ok(())
}
