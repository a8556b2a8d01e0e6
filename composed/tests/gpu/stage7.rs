// Stage 7's capabilities: GQA/MQA, causal, persistent blocks, the split tail and its merge, O's TMA stores, the trace.
use crate::prelude::*;

/// Stage 7 on `qz` with `blocks` blocks, a split tail (checked) and O in `out`, launched with `spec` (a mutant, or the
/// stage's kernel), downloaded.
fn split_f32_run<'a>(
    gpu: &'a Gpu,
    qz: &'a Quantized,
    blocks: usize,
    out: OutDtype,
) -> impl Fn(Option<lab::KernelSpec>) -> Result<Attention<f32>> + 'a {
    move |spec| {
        let mut d = OnDevice::upload_as(gpu, qz, out)?;
        d.use_blocks(Some(blocks));
        d.use_kernel(spec);
        ensure!(d.split_plan(gpu, Stage::S7)?.pieces > 0, "no split");
        d.launch(gpu, Stage::S7)?;
        d.download(gpu)
    }
}

/// A lag test's two verdicts: the kernel with a warp made to lag (`lagging`) gives the plain kernel's bits, and the same
/// lag without the ordering under test (`unguarded`) must not; `fail` is what each failure says. The unguarded run's
/// outcome, for the log.
fn lag_verdicts(
    run: impl Fn(Option<lab::KernelSpec>) -> Result<Attention<f32>>,
    plain: &Attention<f32>,
    (lagging, unguarded): (lab::KernelSpec, lab::KernelSpec),
    fail: [&str; 2],
) -> Result<String> {
    ensure!(bit_identical(&run(Some(lagging))?, plain), "{}", fail[0]);
    let broken = run(Some(unguarded));
    ensure!(
        !broken.as_ref().is_ok_and(|b| bit_identical(b, plain)),
        "{}",
        fail[1]
    );
    Ok(broken.map_or_else(|e| format!("{e:#}"), |_| "other bits".into()))
}

/// Stage 7 (and stage 6 where it shares the path), capability by capability.
/// The split tail's mutants (name, header, from, to), each a plausible bug its GPU test must catch.
const SPLIT_MUTANTS: [(&str, &str, &str, &str); 3] = [
    // Every part merged with weight 1 (in the attn-merge block the merge kernel uses): the parts' rows kept
    // against their own maxima.
    (
        "unweighted_merge",
        "attn_merge.cuh",
        "r.w[j] = (j < n && m != neg_inf()) ? expf(lse[j] - m) : 0.0f;",
        "r.w[j] = j < n ? 1.0f : 0.0f;",
    ),
    // A part's O and LSE written over its unit's own head, not its virtual one.
    (
        "parts_to_own_head",
        "pingpong_attention.cuh",
        "const int obh = dst < 0 ? bh : dst / p.q_tiles",
        "const int obh = bh",
    ),
    // A part's keys masked as if it started at key tile 0: the unit's last, partial tile unmasked.
    (
        "part_columns_from_zero",
        "pingpong_attention.cuh",
        ": u.sk - k0 * BC;",
        ": u.sk;",
    ),
];

pub fn add(t: &mut Suite) {
    for (stage, (name, shape)) in Stage::ALL
        .into_iter()
        .filter(|s| s.causal())
        .flat_map(|s| causal_shapes().into_iter().map(move |c| (s, c)))
        .filter(|(s, (_, shape))| s.dims().contains(&shape.d))
    {
        t.gpu(&format!("causal::{}::{name}", stage.name()), move |gpu| {
            let qz = quantize_per_head(&normal(shape, 31));
            let dev = run_as(gpu, stage, &qz, OutDtype::F16)?;
            let r = reference(&qz);
            let emu = emulation_of(stage, &qz, OutDtype::F16);
            let blind = shape.sq.saturating_sub(shape.sk) * shape.heads();
            rule(stage, &qz, &r, &emu, &dev, &name, |e, e_emu| {
                eprintln!("{} causal {name}: {e} | emulation max_abs={e_emu:.3e}; {blind} rows see no key", stage.name())
            })?;
            // The mask is the point: the same problem without it must come out different.
            let open = run_as(gpu, stage, &Quantized { shape: shape.with_causal(false), ..qz.clone() }, OutDtype::F16)?;
            ensure!(
                shape.sq * shape.sk == 1 || open.o.iter().zip(&dev.o).any(|(a, b)| a != b),
                "{name}: causal and non-causal O are identical"
            );
            Ok(())
        });
    }
    for (stage, (name, shape)) in Stage::ALL
        .into_iter()
        .filter(|s| s.gqa())
        .flat_map(|s| gqa_shapes().into_iter().map(move |c| (s, c)))
        .filter(|(s, (_, shape))| s.dims().contains(&shape.d))
    {
        t.gpu(&format!("gqa::{}::{name}", stage.name()), move |gpu| {
            let qz = quantize_per_head(&normal(shape, 41));
            let dev = run_as(gpu, stage, &qz, OutDtype::F32)?;
            let r = reference(&qz);
            let emu = emulation_of(stage, &qz, OutDtype::F32);
            rule(stage, &qz, &r, &emu, &dev, &name, |e, e_emu| {
                eprintln!(
                    "{} gqa {name}: {e} | emulation max_abs={e_emu:.3e}",
                    stage.name()
                )
            })?;
            // The same problem with every K/V head repeated for its query heads, as ordinary attention: the
            // kernel must give the same bits (the group mapping checked without fixtures' own mapping).
            let wide = expand_kv(&qz);
            let same = run_as(gpu, stage, &wide, OutDtype::F32)?;
            ensure!(
                dev.o
                    .iter()
                    .zip(&same.o)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
                    && dev
                        .lse
                        .iter()
                        .zip(&same.lse)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: grouped-query O / LSE differ from the same heads repeated"
            );
            Ok(())
        });
    }
    for (stage, (name, shape)) in Stage::ALL
        .into_iter()
        .filter(|s| s.persistent())
        .flat_map(|s| persistent_shapes().into_iter().map(move |c| (s, c)))
        .filter(|(s, (_, shape))| s.dims().contains(&shape.d))
    {
        t.gpu(&format!("persistent::{}::{name}", stage.name()), move |gpu| {
            // A persistent block runs several units in turn, reusing ring slots and Q buffers (and stage 8's V
            // staging slots) across them. The units must come out as they do one a block (each unit's arithmetic is
            // the same wherever it runs: bit-identical), and that launch by the rule against the f64 reference and
            // the emulation.
            let qz = quantize_per_head(&normal(shape, 53));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.use_blocks(Some(usize::MAX));
            d.launch(gpu, stage)?;
            let one = d.download(gpu)?;
            rule(stage, &qz, &reference(&qz), &emulation_of(stage, &qz, OutDtype::F16), &one, &name, |e, e_emu| {
                eprintln!("{} persistent {name}, one unit a block: {e} | emulation max_abs={e_emu:.3e}", stage.name())
            })?;
            // Twice at each block count, the outputs poisoned before each launch: a unit the counter skipped (or a
            // counter left nonzero by the launch before) leaves poison, which the download refuses. Where the host
            // splits the tail (SplitPlan: some units' key tiles shared by two or three blocks, merged after), the
            // merged units are other bits: those launches by the rule, and bit-identical to each other.
            let sections = [None, Some(1), Some(3.min(shape.heads())), None, Some(2.min(shape.heads())), None, None];
            let mut split: Option<(Option<usize>, Attention<f32>)> = None;
            for (blocks, section) in [Some(1), Some(2), Some(5), Some(3), Some(3), None, None].into_iter().zip(sections) {
                d.use_blocks(blocks);
                d.use_section(section);
                d.poison_outputs(gpu)?;
                d.launch(gpu, stage)?;
                let got = d.download(gpu)?;
                let plan = d.split_plan(gpu, stage)?;
                if plan.pieces == 0 && !plan.halved {
                    ensure!(
                        bit_identical(&got, &one),
                        "{name}: {blocks:?} blocks (sections of {section:?} heads) give other O / LSE than one unit a block"
                    );
                    continue;
                }
                ensure!(!shape.causal, "{name}: a causal tail split ({plan:?})");
                rule(stage, &qz, &reference(&qz), &emulation_of(stage, &qz, OutDtype::F16), &got, &name, |e, e_emu| {
                    eprintln!("{} persistent {name}, {blocks:?} blocks, split {plan:?}: {e} | emulation max_abs={e_emu:.3e}", stage.name())
                })?;
                if let Some((b, before)) = &split
                    && *b == blocks
                {
                    ensure!(bit_identical(&got, before), "{name}: two launches of one split plan give other bits");
                }
                split = Some((blocks, got));
            }
            // Without the split tail (a ring step's launches, beside NCCL's kernels), every block count plans no
            // split and takes each unit whole from the counter: the bits of one unit a block.
            d.use_split_tail(false);
            d.use_section(None);
            for blocks in [Some(3), Some(5), None] {
                d.use_blocks(blocks);
                let plan = d.split_plan(gpu, stage)?;
                ensure!(plan.pieces == 0, "{name}: {blocks:?} blocks with the split tail off plan {plan:?}");
                d.poison_outputs(gpu)?;
                d.launch(gpu, stage)?;
                ensure!(
                    bit_identical(&d.download(gpu)?, &one),
                    "{name}: {blocks:?} blocks, split tail off, give other O / LSE than one unit a block"
                );
            }
            Ok(())
        });
    }
    for stage in Stage::ALL.into_iter().filter(|s| s.tma()) {
        t.gpu(&format!("vt_prep_in_every_launch::{}", stage.name()), move |gpu| {
            // Timing a TMA stage with its V transpose (time_vt_prep) remakes Vᵀ in place before every launch:
            // the same bytes, so the same O and LSE as with Vᵀ made once.
            for (i, shape) in [Shape::new(1, 2, 200, 64), Shape::cross(1, 2, 130, 300, 128)].into_iter().enumerate() {
                let qz = quantize_per_head(&normal(shape, 61 + i as u64));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.launch(gpu, stage)?;
                let once = d.download(gpu)?;
                d.time_vt_prep(true);
                for _ in 0..2 {
                    d.launch(gpu, stage)?;
                    ensure!(
                        bit_identical(&d.download(gpu)?, &once),
                        "{} {shape:?}: O / LSE with Vᵀ remade in the launch differ from Vᵀ made once",
                        stage.name()
                    );
                }
            }
            Ok(())
        });
    }
    for (stage, (name, shape, blocks, out)) in [Stage::S7, Stage::S8]
        .into_iter()
        .flat_map(|s| split_cases().into_iter().map(move |c| (s, c)))
        .filter(|(s, (_, shape, _, _))| s.dims().contains(&shape.d))
    {
        t.gpu(&format!("split::{}::{name}", stage.name()), move |gpu| {
            // The split tail (SplitPlan): the units past `split` cut into one piece a block, each part's O, m and l
            // written apart and merged by stage7_merge_dD. By the rule against the f64 reference at every output
            // dtype (the merge writes O itself), bit-identical across launches, and the plan must split.
            let qz = quantize_per_head(&normal(shape, 73));
            let mut d = OnDevice::upload_as(gpu, &qz, out)?;
            d.use_blocks(Some(blocks));
            let plan = d.split_plan(gpu, stage)?;
            ensure!(
                plan.pieces > 0,
                "{name}: no split at {blocks} blocks ({plan:?})"
            );
            d.launch(gpu, stage)?;
            let got = d.download(gpu)?;
            rule(
                stage,
                &qz,
                &reference(&qz),
                &emulation_of(stage, &qz, out),
                &got,
                &name,
                |e, e_emu| {
                    eprintln!(
                        "{} split {name} ({plan:?}): {e} | emulation max_abs={e_emu:.3e}",
                        stage.name()
                    )
                },
            )?;
            d.poison_outputs(gpu)?;
            d.launch(gpu, stage)?;
            ensure!(
                bit_identical(&d.download(gpu)?, &got),
                "{name}: a second launch gives other bits"
            );
            // The same plan taken (whole units, then pieces, from the counter): stage 7 takes it, with the dealt
            // plan's bits (the same parts and merge); stage 8 deals it as before.
            d.take_split_tail(true);
            let taken = d.split_plan(gpu, stage)?;
            ensure!(
                taken.taken == stage.takes_pieces() && taken.pieces == plan.pieces,
                "{name}: taking the split tail plans {taken:?}"
            );
            d.poison_outputs(gpu)?;
            d.launch(gpu, stage)?;
            ensure!(
                bit_identical(&d.download(gpu)?, &got),
                "{name}: the taken split tail gives other bits than the dealt one"
            );
            Ok(())
        });
    }
    t.gpu("split::stage7::taken_pieces_run_every_part", |gpu| {
        // A taken plan whose pieces hold two parts each (pieces of 7 key tiles over units of 5): the mutant that moves
        // on to the counter after a piece's first part leaves the second parts unrun, and the merge reads poison.
        let (shape, blocks) = (Shape::new(1, 4, 1000, 128), 5);
        let qz = quantize_per_head(&normal(shape, 73));
        let run = |spec: Option<lab::KernelSpec>| -> Result<Attention<f32>> {
            let mut d = OnDevice::upload_as(gpu, &qz, OutDtype::F16)?;
            d.use_blocks(Some(blocks));
            d.use_kernel(spec);
            d.take_split_tail(true);
            let plan = d.split_plan(gpu, Stage::S7)?;
            ensure!(
                plan.taken && plan.tail_tiles() > plan.pieces * plan.unit_tiles,
                "plan {plan:?}"
            );
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S7)?;
            d.download(gpu)
        };
        let good = run(None)?;
        rule(
            Stage::S7,
            &qz,
            &reference(&qz),
            &emulation_of(Stage::S7, &qz, OutDtype::F16),
            &good,
            "taken split tail",
            |e, _| eprintln!("stage7 taken split tail 1x4x1000x128, 5 blocks: {e}"),
        )?;
        let mutant = Stage::S7.kernel(128).mutated(
            "pingpong_attention.cuh",
            "++w;  // the piece's next part",
            "w = end;",
        )?;
        let bad = run(Some(mutant));
        ensure!(
            !bad.as_ref().is_ok_and(|b| bit_identical(b, &good)),
            "a taken piece's later parts skipped: O and the LSE unchanged"
        );
        eprintln!(
            "mutant `taken piece's later parts skipped` caught: {}",
            bad.map_or_else(|e| format!("{e:#}"), |_| "other bits".into())
        );
        Ok(())
    });
    t.gpu("split::stage7::f32_parts_land_when_warps_lag", |gpu| {
        // A split part's destination sits in shared memory across its unit; with f32 O (direct stores, no panel
        // barrier) the warpgroup's first warp could go on to its next unit and overwrite it before a slower warp had
        // read it: that warp's 16 rows then went elsewhere (seen once under racecheck as 1024 NaN in O). Warps 1–3
        // are made to lag before they read it: with the epilogue's barrier O is as without the lag; without the
        // barrier, the lag must show. D = 128.
        let lag = "if (threadIdx.x % 128 >= 32)\n    for (int i = 0; i < 200; ++i) __nanosleep(1000);\n  const int dst = blk.qb->dest[wg];";
        let (shape, blocks, out) = (Shape::new(2, 2, 300, 128).with_kv_heads(2)?, 5, OutDtype::F32);
        let shape = Shape { sk: 1024, ..shape };
        let qz = quantize_per_head(&normal(shape, 73));
        let run = split_f32_run(gpu, &qz, blocks, out);
        let plain = run(None)?;
        let lagging = Stage::S7
            .kernel(128)
            .mutated("pingpong_attention.cuh", "const int dst = blk.qb->dest[wg];", lag)?;
        let unguarded = lagging.mutated("pingpong_epilogue.cuh", "roles::sync(3 + wg, 128);  // dest read by all", "")?;
        let broken = lag_verdicts(run, &plain, (lagging, unguarded), [
            "with warps 1–3 lagging, O or the LSE changed: the destination was overwritten before they read it",
            "without the epilogue's barrier the lagging warps' rows still landed: the test no longer shows the race",
        ])?;
        eprintln!("f32 split parts: lagging warps land their rows with the barrier; without it: {broken}");
        Ok(())
    });
    // Every mutation still applies to today's headers (no GPU needed): a mutant whose text moved would otherwise be
    // found only on the device.
    t.model("split::stage7::mutants_apply", || {
        for (mutant, header, from, to) in SPLIT_MUTANTS {
            Stage::S7
                .kernel(128)
                .mutated(header, from, to)
                .with_context(|| mutant)?;
        }
        Ok(())
    });
    for (mutant, header, from, to) in SPLIT_MUTANTS {
        t.gpu(
            &format!("split::stage7::mutant_{mutant}_is_caught"),
            move |gpu| {
                let shape = Shape::new(1, 4, 1000, 128);
                let qz = quantize_per_head(&normal(shape, 79));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.use_blocks(Some(5));
                ensure!(
                    d.split_plan(gpu, Stage::S7)?.pieces > 0,
                    "no split to mutate"
                );
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(header, from, to)?));
                d.launch(gpu, Stage::S7)?;
                let bad = d.download(gpu)?;
                let emu = emulation_of(Stage::S7, &qz, OutDtype::F16);
                match rule(
                    Stage::S7,
                    &qz,
                    &reference(&qz),
                    &emu,
                    &bad,
                    mutant,
                    |_, _| {},
                ) {
                    Err(e) => eprintln!("mutant `{mutant}` caught: {e:#}"),
                    Ok(()) => anyhow::bail!("the mutant `{mutant}` passed the rule"),
                }
                Ok(())
            },
        );
    }
    t.gpu(
        "persistent::stage7::mutant_reading_one_q_buffer_is_caught",
        |gpu| {
            // Q's second buffer ignored by the consumers: a block's odd units read the even units' Q.
            let shape = Shape::cross(1, 3, 300, 500, 64);
            let qz = quantize_per_head(&normal(shape, 59));
            let m = Stage::S7.kernel(64).mutated(
                "pingpong_attention.cuh",
                "blk.q_tile(n, wg)",
                "blk.q_tile(0, wg)",
            )?;
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S7)?;
            let good = d.download(gpu)?;
            d.use_kernel(Some(m));
            d.use_blocks(Some(2));
            d.launch(gpu, Stage::S7)?;
            let bad = d.download(gpu)?;
            ensure!(
                !bit_identical(&good, &bad),
                "the kernel reading only Q's first buffer gave the same O and LSE"
            );
            eprintln!("mutant caught: one Q buffer read for every unit changes O");
            Ok(())
        },
    );
    for (mutant, from, to) in [
        ("counter_left_nonzero", "sched->counter = 0;", ""),
        (
            "every_other_ticket",
            "w = tickets ? int(gridDim.x) + atomicAdd(&sched->counter, 1) : work;",
            "w = tickets ? int(gridDim.x) + atomicAdd(&sched->counter, 2) : work;",
        ),
    ] {
        t.gpu(
            &format!("persistent::stage7::mutant_{mutant}_is_caught"),
            move |gpu| {
                // The schedule's counter not set back to zero by the last block (the next launch's blocks then take
                // no unit past their first), or tickets that skip units: the poisoned outputs of the second launch
                // keep elements no unit wrote.
                let shape = Shape::new(1, 4, 1000, 128).with_causal(true);
                let qz = quantize_per_head(&normal(shape, 67));
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.launch(gpu, Stage::S7)?;
                let good = d.download(gpu)?;
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(
                    "pingpong_attention.cuh",
                    from,
                    to,
                )?));
                d.use_blocks(Some(3));
                let mut caught = false;
                for _ in 0..2 {
                    d.poison_outputs(gpu)?;
                    d.launch(gpu, Stage::S7)?;
                    caught |= mutant_shows(d.download(gpu), &good);
                }
                ensure!(
                    caught,
                    "the {mutant} mutant wrote every unit as the kernel does"
                );
                eprintln!("mutant caught: {mutant} leaves units unwritten");
                Ok(())
            },
        );
    }
    t.gpu("o_store::stage7::mutant_panel_column_is_caught", |gpu| {
        // Every panel of O stored at column 0 (the TMA store's column coordinate lost): at D = 128 the second
        // panel overwrites the first and columns 64..127 stay as poisoned; at D = 64 (one panel) nothing changes.
        let shape = Shape::cross(1, 2, 300, 500, 128);
        let qz = quantize_per_head(&normal(shape, 71));
        let mut d = OnDevice::upload(gpu, &qz)?;
        d.launch(gpu, Stage::S7)?;
        let good = d.download(gpu)?;
        d.use_kernel(Some(Stage::S7.kernel(128).mutated(
            "pingpong_epilogue.cuh",
            "tma::store_4d(mo, so, 64 * P, row0, bh, 0)",
            "tma::store_4d(mo, so, 0, row0, bh, 0)",
        )?));
        d.poison_outputs(gpu)?;
        d.launch(gpu, Stage::S7)?;
        let caught = mutant_shows(d.download(gpu), &good);
        ensure!(caught, "O's panels all stored at column 0 went unnoticed");
        eprintln!("mutant caught: O's second panel stored over its first");
        Ok(())
    });
    t.gpu(
        "rescale::stage7::skipping_changes_no_bit_and_mutants_are_caught",
        |gpu| {
            // A warp skips O's rescale only when every row's α is 1 exactly, so the skip must give the same bits as
            // rescaling always; a vote that skips when one row held (all instead of any), or that sees one of a
            // lane's two rows, must change O.
            let shape = Shape::cross(1, 4, 700, 1000, 128);
            let qz = quantize_per_head(&normal(shape, 73));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S7)?;
            let good = d.download(gpu)?;
            let vote = "__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)";
            for (what, to, same) in [
                ("rescale always", "true", true),
                (
                    "all rows must grow",
                    "__all_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)",
                    false,
                ),
                (
                    "the first row only",
                    "__any_sync(0xffffffffu, alpha[0] != 1.0f)",
                    false,
                ),
            ] {
                d.use_kernel(Some(Stage::S7.kernel(128).mutated(
                    "pingpong_attention.cuh",
                    vote,
                    to,
                )?));
                d.launch(gpu, Stage::S7)?;
                let got = d.download(gpu)?;
                if same {
                    ensure!(
                        bit_identical(&good, &got),
                        "skipping the rescale changed O or the LSE against `{what}`"
                    );
                } else {
                    ensure!(
                        !bit_identical(&good, &got),
                        "the mutant `{what}` gave the same O and LSE"
                    );
                    eprintln!("mutant caught: the rescale vote with {what}");
                }
            }
            Ok(())
        },
    );
    // One test for both head dimensions: their kernels share a module, and so its trace buffer.
    t.gpu(
        "trace::stage7_timeline_is_whole_and_changes_nothing",
        |gpu| {
            for shape in [
                Shape::cross(2, 3, 600, 450, 128),
                Shape::cross(1, 2, 300, 1000, 64),
            ] {
                {
                    // `sdpa trace`'s build of stage 7 (clock64 marks) writes the same O and LSE, bit for bit, and its
                    // two blocks' consumer warps mark whole turns: every unit a first turn and a last, a softmax in
                    // every turn but a unit's last, and per consumer warp T + 1 turns for a unit of T key tiles.
                    let qz = quantize_per_head(&normal(shape, 73));
                    let mut d = OnDevice::upload(gpu, &qz)?;
                    d.use_blocks(Some(2));
                    d.launch(gpu, Stage::S7)?;
                    let plain = d.download(gpu)?;
                    let lines = composed::trace::record(gpu, &mut d, shape.d, 1)?;
                    ensure!(
                        bit_identical(&d.download(gpu)?, &plain),
                        "{shape:?}: the traced kernel's O / LSE differ"
                    );
                    let units = shape.heads() * shape.sq.div_ceil(128);
                    let tiles = shape.sk.div_ceil(Stage::S7.bc(shape.d));
                    for warp in 0..8 {
                        let (mut u, mut turns) = (0, 0);
                        for l in lines.iter().filter(|l| l.warp == warp) {
                            let t = composed::trace::turns(l).context("marks out of order")?;
                            ensure!(
                                t.iter().all(|x| x.softmax.is_some() != (x.last && !x.first)),
                                "warp {warp}: a softmax in a unit's last turn, or none in another"
                            );
                            let firsts = t.iter().filter(|x| x.first).count();
                            ensure!(firsts == t.iter().filter(|x| x.last).count());
                            u += firsts;
                            turns += t.len();
                        }
                        let want = units * (tiles + 1);
                        ensure!(
                            u == units && turns == want,
                            "warp {warp}: {u} units and {turns} turns traced, want {units} and {want}"
                        );
                    }
                    let s = composed::trace::summarize(&lines)?;
                    ensure!(
                        s.period > 0.0 && s.softmax > 0.0 && s.softmax < s.period,
                        "{s}"
                    );
                    eprintln!("{shape:?}: {s}");
                }
            }
            Ok(())
        },
    );
    for (name, shape, out) in [
        ("1x1x32x256", Shape::new(1, 1, 32, 256), OutDtype::F16),
        (
            "mission_1x8x512x256",
            Shape::new(1, 8, 512, 256),
            OutDtype::Bf16,
        ),
        (
            "2x3x129x300x256",
            Shape::cross(2, 3, 129, 300, 256),
            OutDtype::F32,
        ),
        ("1x4x1000x256", Shape::new(1, 4, 1000, 256), OutDtype::F16),
    ] {
        t.gpu(&format!("d256::stage7::{name}_{out:?}"), move |gpu| {
            // Head dimension 256: Q and K tiles as two 128-byte panels (one TMA box each), O of 128 registers a
            // thread; by the rule against the f64 reference and the emulation, and the same bits twice.
            let qz = quantize_per_head(&normal(shape, 59));
            let dev = run_as(gpu, Stage::S7, &qz, out)?;
            rule(
                Stage::S7,
                &qz,
                &reference(&qz),
                &emulation_of(Stage::S7, &qz, out),
                &dev,
                name,
                |e, e_emu| {
                    eprintln!("stage7 d256 {name} {out:?}: {e} | emulation max_abs={e_emu:.3e}")
                },
            )?;
            ensure!(
                bit_identical(&run_as(gpu, Stage::S7, &qz, out)?, &dev),
                "{name}: a second launch gives other bits"
            );
            Ok(())
        });
    }
    t.gpu("d256::other_stages_refuse_it_by_name", |gpu| {
        let shape = Shape::new(1, 2, 64, 256);
        refused_by_the_others(
            gpu,
            shape,
            |s| s.dims().contains(&256),
            "is not built for head dimension D = 256",
        )
    });
    t.gpu("gqa::other_stages_refuse_it_by_name", |gpu| {
        let shape = Shape::new(1, 4, 64, 64).with_kv_heads(2)?;
        refused_by_the_others(gpu, shape, Stage::gqa, "has no grouped-query attention")
    });
    t.gpu("causal::other_stages_refuse_it_by_name", |gpu| {
        let shape = Shape::new(1, 1, 64, 64).with_causal(true);
        refused_by_the_others(gpu, shape, Stage::causal, "has no causal masking")
    });
}
