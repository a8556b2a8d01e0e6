// The host→device tables: Rust's layouts (composed::tables) against the headers', read back from a kernel.
use crate::prelude::*;
use composed::tables::{LAYOUTS, expected_layout_words, layout_differences};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};

/// The sizes and field offsets `spec` (`sdpa_layouts`, or a mutant) writes.
fn device_layouts(gpu: &Gpu, spec: &lab::KernelSpec) -> Result<Vec<i32>> {
    let n = expected_layout_words().len();
    let k = gpu.load(spec)?;
    let st = &gpu.stream;
    let mut out = st.clone_htod(&vec![-1i32; n + 8])?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: sdpa_layouts(int* out) writes one word per size and offset of composed::tables::layouts(), n of them;
    // out holds n + 8.
    unsafe { st.launch_builder(&k.func).arg(&mut out).launch(cfg)? };
    Ok(st.clone_dtoh(&out)?)
}

/// The layouts test and its mutants.
pub fn add(t: &mut Suite) {
    t.kernels(&[LAYOUTS]);
    t.gpu("tables::layouts_match_the_headers", |gpu| {
        let words = device_layouts(gpu, &LAYOUTS)?;
        let wrong = layout_differences(&words);
        ensure!(wrong.is_empty(), "Rust and the headers disagree: {}", wrong.join("; "));
        let n = expected_layout_words().len();
        ensure!(words[n..].iter().all(|&w| w == -1), "the kernel wrote past its {n} words");
        eprintln!("{n} sizes and offsets of sdpa::Params, SplitHead, SplitPart, MergeList: the headers agree with Rust");
        Ok(())
    });
    // A field moved or dropped on the device side only: the test must name it.
    for (name, header, from, to, field) in [
        (
            "params_fields_swapped",
            "sdpa_common.cuh",
            "  int causal;   // stage 7 only",
            "  int group_first_;\n  int causal;   // stage 7 only",
            "sdpa::Params.causal",
        ),
        (
            "split_head_without_done",
            "pingpong_schedule.cuh",
            "  int counter, done, split,",
            "  int counter, split, done,",
            "sdpa::SplitHead.done",
        ),
    ] {
        t.gpu(&format!("tables::mutant::{name}"), move |gpu| {
            let bad = LAYOUTS.mutated(header, from, to)?;
            let wrong = layout_differences(&device_layouts(gpu, &bad)?);
            ensure!(
                wrong.iter().any(|w| w.starts_with(field)),
                "a layout change on the device side went unnoticed ({field}): {wrong:?}"
            );
            Ok(())
        });
    }
}
