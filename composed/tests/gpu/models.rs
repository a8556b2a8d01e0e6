// Model and compile tests of the stages: geometry, budgets, refusals by name, the SASS each stage exists to use.
use crate::prelude::*;

/// The tests that need no GPU.
pub fn add(t: &mut Suite) {
    t.model(
        "launch_grid_puts_heads_in_x_and_refuses_what_does_not_fit",
        || {
            let g = composed::grid(Stage::S3b, &Shape::new(2, 35000, 3, 64), 64, 132, None)?;
            ensure!(g == (70000, 1, 1), "{g:?}");
            ensure!(
                composed::grid(Stage::S5, &Shape::new(1, 1, 1 << 20, 64), 128, 132, None)?.1
                    == 8192
            );
            let e = format!(
                "{:#}",
                composed::grid(
                    Stage::S3b,
                    &Shape::new(1, 1, 65536 * 64 + 1, 64),
                    64,
                    132,
                    None
                )
                .unwrap_err()
            );
            ensure!(e.contains("query tiles") && e.contains("65535"), "{e}");
            let e = format!(
                "{:#}",
                composed::grid(Stage::S6, &Shape::new(1, 1, 128, 64), 64, 132, Some(8))
                    .unwrap_err()
            );
            ensure!(e.contains("not persistent") && e.contains("stage7"), "{e}");
            Ok(())
        },
    );
    t.model(
        "stage7_is_persistent_one_block_an_sm_at_most_one_a_unit",
        || {
            let big = Shape::new(4, 16, 4096, 64);
            let g = composed::grid(Stage::S7, &big, 128, 132, None)?;
            ensure!(g == (132, 1, 1), "{g:?}");
            ensure!(composed::grid(Stage::S7, &big, 128, 132, Some(2048 + 5))? == (2048, 1, 1));
            ensure!(composed::grid(Stage::S7, &big, 128, 132, Some(7))? == (7, 1, 1));
            // D = 128 too.
            let d128 = Shape::new(4, 16, 4096, 128);
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, None)? == (132, 1, 1));
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, Some(usize::MAX))? == (2048, 1, 1));
            ensure!(composed::grid(Stage::S7, &d128, 128, 132, Some(7))? == (7, 1, 1));
            // The mission shape: 8 heads × 4 query tiles, fewer units than SMs.
            ensure!(
                composed::grid(Stage::S7, &Shape::new(1, 8, 512, 64), 128, 132, None)?
                    == (32, 1, 1)
            );
            // Sq far past a 2-D grid's 65535 tiles is one more unit count in x.
            ensure!(
                composed::grid(
                    Stage::S7,
                    &Shape::new(1, 1, 128 * 70000, 64),
                    128,
                    132,
                    None
                )?
                .0 == 132
            );
            let e = format!(
                "{:#}",
                composed::grid(Stage::S7, &Shape::new(1, 1, 128, 64), 128, 132, Some(0))
                    .unwrap_err()
            );
            ensure!(e.contains("0 blocks"), "{e}");
            Ok(())
        },
    );
    t.model(
        "schedule_sections_hold_16_mib_of_k_and_v_in_whole_groups",
        || {
            // 2·Sk·D bytes of K and V a K/V head: 1 MiB at (Sk, D) = (4096, 128), so 16 K/V heads a section.
            let s = |b, h, sk, d| Shape::new(b, h, sk, d);
            ensure!(composed::schedule_section(&s(4, 16, 4096, 128)) == 16);
            ensure!(composed::schedule_section(&s(4, 32, 4096, 128).with_kv_heads(8)?) == 64);
            ensure!(composed::schedule_section(&s(1, 16, 16384, 128)) == 4);
            ensure!(composed::schedule_section(&s(4, 16, 4096, 64)) == 32);
            // One group at least, however long the keys; every head at most.
            ensure!(composed::schedule_section(&s(1, 8, 1 << 20, 128).with_kv_heads(2)?) == 4);
            ensure!(composed::schedule_section(&s(1, 8, 512, 64)) == 8);
            Ok(())
        },
    );
    t.model(
        "stage6_halves_its_blocks_only_when_they_would_leave_half_the_sms_idle",
        || {
            let rows = |stage: Stage, b, h, sq| stage.rows_for(&Shape::new(b, h, sq, 64), 132);
            // The mission shape: 8 heads × 4 tiles of 128 = 32 blocks on 132 SMs → 64 blocks of 64 rows.
            ensure!(rows(Stage::S6, 1, 8, 512) == 64);
            // 66 blocks of 128 fill exactly half: halved; 67 do not.
            ensure!(rows(Stage::S6, 1, 66, 128) == 64 && rows(Stage::S6, 1, 67, 128) == 128);
            ensure!(rows(Stage::S6, 4, 16, 4096) == 128);
            // Stage 7's pingpong needs both consumers; stage 5 has no producer to spare them.
            ensure!(rows(Stage::S7, 1, 8, 512) == 128 && rows(Stage::S5, 1, 8, 512) == 128);
            Ok(())
        },
    );
    t.model("hopper_stages_elsewhere_are_refused_by_name", || {
        // An sm_90a stage on an sm_80 / sm_89 device: a clear error before any launch, not a launch failure.
        for stage in [Stage::S5, Stage::S6, Stage::S7] {
            for arch in [lab::Arch::Sm80, lab::Arch::Sm89] {
                let e = format!("{:#}", stage.kernel(64).target_for(arch).unwrap_err());
                ensure!(
                    e.contains(&format!("{}_d64", stage.name())) && e.contains("sm_90a"),
                    "{arch}: {e}"
                );
            }
            ensure!(stage.kernel(128).target_for(lab::Arch::Sm90)? == lab::Arch::Sm90a);
            ensure!(stage.needs().starts_with("sm_90a"), "{}", stage.needs());
        }
        Ok(())
    });
    t.compile("accumulating_epilogue_loads_before_it_stores", || {
        // accumulate_rows (the ring's accumulating kernels): every running element a thread merges is loaded before
        // the first store, D / 4 LDG.E.64 in one run; a load where its value is used, after the previous pair's
        // store, orders each load after that store (one memory round trip a pair): its mutant must be caught.
        let run_of_loads = |spec: &lab::KernelSpec| -> Result<usize> {
            let (cubin, _) = spec.compile(lab::Arch::Sm90a)?;
            let text = lab::sass::listing(&cubin, spec.name)?;
            let (mut best, mut run) = (0, 0);
            for line in text.lines() {
                if line.contains("LDG.E.64") {
                    run += 1;
                    best = best.max(run);
                } else if line.contains("STG") {
                    run = 0;
                }
            }
            Ok(best)
        };
        for d in [64, 128] {
            let spec = Stage::S7
                .accumulating_kernel(d)
                .context("stage 7 has an accumulating kernel at D = 64 and 128")?;
            let loads = run_of_loads(&spec)?;
            ensure!(
                loads >= d / 4,
                "{}: {loads} LDG.E.64 in a row before a store, want {} (every running pair first)",
                spec.name,
                d / 4
            );
            let mutant = spec.mutated(
                "pingpong_epilogue.cuh",
                "const float2 a = run[i / 2];",
                "const float2 a = *reinterpret_cast<const float2*>(out + (long long)row * D + col);",
            )?;
            let serial = run_of_loads(&mutant)?;
            ensure!(
                serial < d / 4,
                "{}: the mutant loading each pair where it is merged still has {serial} loads in a row",
                spec.name
            );
            eprintln!("{}: {loads} loads in a row; the load-where-used mutant {serial}", spec.name);
        }
        Ok(())
    });
    t.compile("trace::stage7_traced_build_keeps_its_budget", || {
        // The timeline's marks (a pointer and a count in registers, a store a mark) must not change the kind of
        // code traced: no spills, no serialised wgmma, stage 7's own budget.
        for d in composed::DIMS {
            let spec = composed::trace::traced_kernel(d)?;
            let (cubin, r) = spec.compile(lab::Arch::Sm90a)?;
            let v = spec.violations(&cubin, &r)?;
            ensure!(v.is_empty(), "traced stage7_d{d}: {}", v.join("; "));
        }
        Ok(())
    });
    t.compile("hopper_gemms_run_on_qgmma_and_loads_on_tma", || {
        // Q·Kᵀ is D/32 QGMMA a tile and P·V bc/32: exactly those, and no HMMA (no f16 fallback); stage 6 loads
        // Q, K and Vᵀ with UTMALDG (Q's two boxes, K, Vᵀ) and reads nothing else from global memory but the
        // three scales (LDG); stage 7 also reads its split tail's table (sdpa::SplitTable: split, pieces, whether
        // they are taken, its piece's bounds and parts, and where they are: 9 LDG in its producer), and stores O
        // with UTMASTG.
        for stage in [Stage::S5, Stage::S6, Stage::S7] {
            for &d in stage.dims() {
                let spec = stage.kernel(d);
                let (cubin, _) = spec.compile(lab::Arch::Sm90a)?;
                let h = lab::sass::histogram(&cubin, spec.name)?;
                // Stage 7 peels its first and last turns: each GEMM appears twice in its code.
                let copies = match stage {
                    Stage::S7 => 2,
                    _ => 1,
                };
                let want = (d / 32 + stage.bc(d) / 32) * copies;
                let ldg = match stage {
                    Stage::S7 => 12,
                    _ => 3,
                };
                ensure!(
                    h.get("QGMMA") == Some(&want) && !h.contains_key("HMMA"),
                    "{}: QGMMA {:?} (want {want}), HMMA {:?}",
                    spec.name,
                    h.get("QGMMA"),
                    h.get("HMMA")
                );
                if stage.tma() {
                    ensure!(
                        h.get("UTMALDG").is_some_and(|&n| n >= 3)
                            && !h.contains_key("LDGSTS")
                            && h.get("LDG").is_none_or(|&n| n <= ldg),
                        "{}: UTMALDG {:?}, LDGSTS {:?}, LDG {:?}",
                        spec.name,
                        h.get("UTMALDG"),
                        h.get("LDGSTS"),
                        h.get("LDG")
                    );
                }
                if stage.tma_store() {
                    // O (bf16, f16) leaves by TMA stores, a 64-column panel each; only f32 O and the LSE by STG.
                    ensure!(
                        h.get("UTMASTG").is_some_and(|&n| n >= 1),
                        "{}: UTMASTG {:?}",
                        spec.name,
                        h.get("UTMASTG")
                    );
                }
            }
        }
        Ok(())
    });
    t.model("a_nan_code_is_named_with_its_index", || {
        let mut qz = quantize_per_head(&normal(Shape::new(1, 2, 600, 128), 3));
        qz.k[70_000] = 0xFF;
        let e = format!("{:#}", composed::validate(&qz).unwrap_err());
        ensure!(
            e.contains("tensor `k` holds an E4M3 NaN code at [b, h, s, d] = [0, 0, 546, 112]"),
            "{e}"
        );
        Ok(())
    });
    t.model("an_underflowing_score_scale_is_refused", || {
        let mut qz = quantize_per_head(&normal(Shape::new(1, 2, 64, 64), 4));
        qz.q_scale[1] = 1e-30;
        qz.k_scale[1] = 1e-30;
        let e = format!("{:#}", composed::validate(&qz).unwrap_err());
        ensure!(
            e.contains("q_scale[1] · k_scale[1]") && e.contains("underflows"),
            "{e}"
        );
        qz.q_scale[1] = 1e-10;
        qz.k_scale[1] = 1e-10;
        composed::validate(&qz)?;
        Ok(())
    });
    t.model("rotation_of_an_unsupported_d_is_named", || {
        let raw = normal(Shape::new(1, 1, 4, 96), 1);
        let scheme = fixtures::Scheme {
            rotate: fixtures::Rotate::Hadamard,
            ..Default::default()
        };
        let e = format!("{:#}", fixtures::prepare(&raw, scheme).unwrap_err());
        ensure!(e.contains("D = 96") && e.contains("Hadamard"), "{e}");
        Ok(())
    });
}
