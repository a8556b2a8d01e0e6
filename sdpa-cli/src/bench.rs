// `sdpa bench` and `sdpa trace`: a stage timed on generated inputs (with the lab's variants, block counts and
// sections), and stage 7's warps on a timeline.
use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use composed::bench::{BACK_TO_BACK, Timing, time_stage};
use composed::{OnDevice, Stage};
use fixtures::{Dist, OutDtype, Scheme, Shape};

use crate::{gpu, shape_text, telemetry_text};

/// One source edit of a variant: (header, from, to).
pub type Edit<'a> = (&'a str, &'a str, &'a str);

/// `LABEL=HEADER:FROM=>TO[&&HEADER:FROM=>TO…]` → the label and the edits, applied in order.
pub fn parse_variant(v: &str) -> Result<(&str, Vec<Edit<'_>>)> {
    let bad =
        || anyhow::anyhow!("--variant `{v}`: expected LABEL=HEADER:FROM=>TO[&&HEADER:FROM=>TO…]");
    let (label, rest) = v.split_once('=').ok_or_else(bad)?;
    ensure!(!label.is_empty(), bad());
    let mut edits = Vec::new();
    for e in rest.split("&&") {
        let (header, edit) = e.split_once(':').ok_or_else(bad)?;
        let (from, to) = edit.split_once("=>").ok_or_else(bad)?;
        ensure!(!header.is_empty() && !from.is_empty(), bad());
        edits.push((header, from, to));
    }
    Ok((label, edits))
}

/// `--variant` text `v` applied to `base`: its label and the edited kernel.
pub fn variant_of(base: lab::KernelSpec, v: &str) -> Result<(&str, lab::KernelSpec)> {
    let (label, edits) = parse_variant(v)?;
    let mut spec = base;
    for (header, from, to) in edits {
        spec = spec.mutated(header, from, to)?;
    }
    Ok((label, spec))
}

/// One configuration `sdpa bench` times: the stage's kernel or a variant, at a block count, schedule section, with
/// or without Vᵀ remade in every launch.
#[derive(Clone)]
struct Run {
    name: String,
    spec: Option<lab::KernelSpec>,
    blocks: Option<usize>,
    section: Option<usize>,
    vt_prep: bool,
    serial: bool,
    /// Every unit whole (no split tail).
    whole: bool,
}

impl Run {
    fn named(name: String) -> Self {
        Run {
            name,
            spec: None,
            blocks: None,
            section: None,
            vt_prep: false,
            serial: false,
            whole: false,
        }
    }
}

/// What `sdpa bench` times beside the stage as built: source variants, block counts, schedule sections, and the
/// stage's launches as ordinary ones (`serial`).
#[derive(Debug, Default)]
pub struct Knobs<'a> {
    pub variants: &'a [String],
    pub blocks: &'a [usize],
    pub sections: &'a [usize],
    pub serial: bool,
    /// Also every unit whole: no split tail.
    pub whole_units: bool,
    /// Inputs as [B, S, H, D], read through their strides.
    pub bshd: bool,
}

pub fn bench(stage: Stage, s: Shape, dist: Dist, knobs: &Knobs, scheme: Scheme) -> Result<()> {
    let Knobs {
        variants,
        blocks,
        sections,
        serial,
        whole_units,
        bshd,
    } = *knobs;
    // Everything that needs no GPU is checked before the GPU is asked for.
    composed::validate_shape(&s)?;
    composed::stage_supports(stage, &s)?;
    ensure!(
        blocks.is_empty() || stage.persistent(),
        "--blocks: {} is not persistent (one block a query tile); stage7 is",
        stage.name()
    );
    ensure!(
        sections.is_empty() || (s.causal && stage.persistent()),
        "--section orders causal stage7's units; this is {}{}",
        stage.name(),
        if s.causal { "" } else { " without --causal" }
    );
    let mut runs = vec![Run::named(stage.name().to_string())];
    for v in variants {
        let (label, spec) = variant_of(stage.kernel(s.d), v)?;
        runs.push(Run {
            spec: Some(spec),
            ..Run::named(format!("{} [{label}]", stage.name()))
        });
    }
    // Every run also at each block count and section asked for.
    let base = runs.clone();
    for &b in blocks {
        runs.extend(base.iter().map(|r| Run {
            name: format!("{} [{b} blocks]", r.name),
            blocks: Some(b),
            ..r.clone()
        }));
    }
    for &h in sections {
        runs.extend(base.iter().map(|r| Run {
            name: format!("{} [sections of {h} heads]", r.name),
            section: Some(h),
            ..r.clone()
        }));
    }
    if serial {
        ensure!(
            stage.programmatic(),
            "--serial: {} is always launched serially (stage7 and stage8 are programmatic)",
            stage.name()
        );
        runs.push(Run {
            serial: true,
            ..Run::named(format!("{} [serial launches]", stage.name()))
        });
    }
    if whole_units {
        ensure!(
            stage.persistent(),
            "--whole-units: {} is not persistent (one block a query tile); stage7 and stage8 are",
            stage.name()
        );
        runs.push(Run {
            whole: true,
            ..Run::named(format!("{} [whole units]", stage.name()))
        });
    }
    // A TMA stage reads V transposed (prep_vt, made once and not timed above): timed again with the transpose in
    // every launch, the figure to set beside cuDNN's FP8 SDPA, which reads V as it is.
    if stage.reads_vt() {
        runs.push(Run {
            vt_prep: true,
            ..Run::named(format!("{} [+ prep_vt]", stage.name()))
        });
    }
    let gpu = gpu("bench")?;
    let raw = fixtures::Raw::generate(s, 1000, dist);
    let mut sets = [OnDevice::prepare(gpu, &raw, scheme, OutDtype::F16)?];
    drop(raw);
    if bshd {
        sets[0].use_bshd_inputs(gpu)?;
        for r in &mut runs {
            r.name.push_str(" [B, S, H, D]");
        }
    }
    // Interleaved rounds, best p50 of two, so that a clock or thermal drift during the run favours no side.
    let mut best: Vec<Option<Timing>> = vec![None; runs.len()];
    for _round in 0..2 {
        for (i, r) in runs.iter().enumerate() {
            sets[0].use_kernel(r.spec);
            sets[0].use_blocks(r.blocks);
            sets[0].use_section(r.section);
            sets[0].time_vt_prep(r.vt_prep);
            sets[0].use_programmatic(!r.serial);
            sets[0].use_split_tail(!r.whole);
            let t = time_stage(gpu, stage, &mut sets, 5, 100)?;
            if best[i].is_none_or(|b| t.p50_us < b.p50_us) {
                best[i] = Some(t);
            }
        }
    }
    for (r, t) in runs.iter().zip(best) {
        let t = t.expect("timed");
        println!(
            "{} {} {dist} {}: p50 {:.1} µs, p90 {:.1} µs, mean {:.1} µs per launch ({} back to back, {} graph replays); {:.2} TFLOP/s; {}",
            r.name,
            shape_text(&s),
            scheme.name(),
            t.p50_us,
            t.p90_us,
            t.mean_us,
            BACK_TO_BACK,
            t.iters,
            t.tflops(&s),
            telemetry_text(&t)
        );
    }
    Ok(())
}

/// `sdpa bench --api`: the library's call on device tensors of `s`, back to back on one stream: per call, the device
/// time between CUDA events over 200 calls, and the host's time to queue one (the call does not wait for the device).
pub fn api(s: Shape, dist: Dist, stage: Stage) -> Result<()> {
    composed::validate_shape(&s)?;
    let gpu = gpu("bench --api")?;
    let qz = fixtures::quantize_per_head(&fixtures::Raw::generate(s, 1000, dist));
    let st = gpu.stream.clone();
    let up = |x: &[u8]| st.clone_htod(x);
    let upf = |x: &[f32]| st.clone_htod(x);
    let (q, k, v) = (up(&qz.q)?, up(&qz.k)?, up(&qz.v)?);
    let (qs, ks, vs) = (upf(&qz.q_scale)?, upf(&qz.k_scale)?, upf(&qz.v_scale)?);
    let f = |codes, scales| fp8_attention::Fp8 { codes, scales };
    let cfg = fp8_attention::Config {
        causal: s.causal,
        out_dtype: OutDtype::F16,
        softmax_scale: None,
        window: fp8_attention::Window::NONE,
    };
    // The op fixed on the stage asked for where it is stage 7 or 8 (stage 8: V read as given, one launch a call);
    // else the device's default op, which picks its stage by shape (fp8_attention::stage_for_shape).
    let mut op = if matches!(stage, Stage::S7 | Stage::S8) {
        fp8_attention::Attention::with_stage(gpu, cfg, stage)?
    } else {
        fp8_attention::Attention::new(gpu, cfg)?
    };
    op.warm(gpu, s.d)?;
    let mut out = op.alloc_output(gpu, &st, &s)?;
    // `into`: into `out` (no allocation in the call), else into new outputs (two allocations a call).
    let mut call = |into: bool| -> fp8_attention::Result<()> {
        if into {
            op.forward_into(gpu, &st, s, f(&q, &qs), f(&k, &ks), f(&v, &vs), &mut out)
        } else {
            op.forward(gpu, &st, s, f(&q, &qs), f(&k, &ks), f(&v, &vs))
                .map(drop)
        }
    };
    // Per call: device time between CUDA events over `calls` calls back to back, and host time to queue one.
    let mut time = |calls: usize, into: bool| -> Result<(f64, f64)> {
        for _ in 0..20 {
            call(into)?;
        }
        st.synchronize()?;
        let flags = Some(lab::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let t0 = std::time::Instant::now();
        let e0 = st.record_event(flags)?;
        for _ in 0..calls {
            call(into)?;
        }
        let e1 = st.record_event(flags)?;
        let host_us = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
        st.synchronize()?;
        Ok((f64::from(e0.elapsed_ms(&e1)?) * 1e3 / calls as f64, host_us))
    };
    let calls = 200;
    let (device_us, host_us) = time(calls, false)?;
    let (device_into, host_into) = time(calls, true)?;
    // cudarc orders each buffer's uses across streams with events (a wait and a record per buffer a call); a
    // program on one stream can turn that off, as the timings below do.
    // SAFETY: this process does nothing else on the device meanwhile; every use is on `st`.
    unsafe { gpu.ctx.disable_event_tracking() };
    let (device_un, host_un) = time(calls, false)?;
    let (device_un_into, host_un_into) = time(calls, true)?;
    println!(
        "{} {} [fp8_attention::Attention, {calls} calls back to back; µs a call on the device (every kernel of the \
         call, CUDA events) / µs of host time to queue one]: forward {device_us:.1} / {host_us:.1}, forward_into \
         {device_into:.1} / {host_into:.1}; without cudarc's event tracking: forward {device_un:.1} / \
         {host_un:.1}, forward_into {device_un_into:.1} / {host_un_into:.1}",
        op.stage_for_call(&s).name(),
        shape_text(&s),
    );
    Ok(())
}

pub fn trace(s: Shape, csv: Option<PathBuf>) -> Result<()> {
    composed::validate_shape(&s)?;
    let gpu = gpu("trace")?;
    let raw = fixtures::Raw::generate(s, 1000, Dist::Normal);
    let mut d = OnDevice::prepare(gpu, &raw, Scheme::default(), OutDtype::F16)?;
    drop(raw);
    let lines = composed::trace::record(gpu, &mut d, s.d, 5)?;
    if let Some(path) = csv {
        let mut text = String::from("block,warp,cycle,mark\n");
        for l in &lines {
            for (t, m) in &l.marks {
                text += &format!("{},{},{t},{m:?}\n", l.block, l.warp);
            }
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "stage7 {} timeline ({} blocks traced):\n{}",
        shape_text(&s),
        composed::trace::TRACE_BLOCKS,
        composed::trace::summarize(&lines)?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_parse_and_bad_ones_are_named() {
        let (l, e) = parse_variant("a=x.cuh:foo=>bar&&y.cuh:1=>2").unwrap();
        assert_eq!((l, e.len(), e[1]), ("a", 2, ("y.cuh", "1", "2")));
        assert!(
            parse_variant("nolabel")
                .unwrap_err()
                .to_string()
                .contains("LABEL=HEADER:FROM=>TO")
        );
    }
}
