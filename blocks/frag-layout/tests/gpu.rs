// frag-layout's test binary: model snapshots, header-vs-model at compile time, and the device probes.

use anyhow::{Context, Result, anyhow, ensure};
use frag_layout::probe::{header_on_device, mma_product_errors, probe_all, quad_rowmax};
use frag_layout::probe_wgmma::probe_wgmma_all;
use frag_layout::*;
use lab::{Arch, Source, Suite};

fn snapshot_name(arch: Arch, id: &LayoutId) -> String {
    format!("{}__{}", arch.name(), id.key())
}

fn snapshot(name: &str, description: &str, body: &str) {
    insta::with_settings!({
        snapshot_path => "snapshots",
        prepend_module_to_snapshot => false,
        description => description,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, body);
    });
}

/// The committed snapshot's description and body, read as a file: the sm_90 ones must be probed data, which
/// the CPU cannot produce, so here the CPU only compares.
fn committed(name: &str) -> Result<(String, String)> {
    let block = lab::tree_root().join("blocks/frag-layout");
    let path = block.join("tests/snapshots").join(format!("{name}.snap"));
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no committed snapshot {}: run the GPU bundle on an sm_90 device",
            path.display()
        )
    })?;
    let mut parts = text.splitn(3, "---\n");
    let (_, meta, body) = (
        parts.next(),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let desc = meta
        .lines()
        .find_map(|l| l.strip_prefix("description: "))
        .map(|d| d.trim_matches('"').to_string())
        .unwrap_or_default();
    Ok((desc, body.to_string()))
}

/// The committed snapshot `name` is probed data (by its description) and draws as `drawing`, the model's.
fn committed_probe_equals(name: &str, drawing: &str) -> Result<()> {
    let (desc, body) = committed(name)?;
    ensure!(
        desc.starts_with("source: probed"),
        "{name}.snap is labelled `{desc}`, not probed data"
    );
    ensure!(
        body.trim_end() == drawing.trim_end(),
        "{name}: the model no longer draws the probed snapshot:\n{drawing}"
    );
    Ok(())
}

/// Swaps registers `r0` and `r1` in every lane: the classic LUT mistake.
fn swap_regs(l: &Layout, r0: u32, r1: u32) -> Layout {
    let mut m = l.clone();
    for e in m.entries.iter_mut() {
        e.reg = if e.reg == r0 {
            r1
        } else if e.reg == r1 {
            r0
        } else {
            e.reg
        };
    }
    m.normalized()
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    t.kernels(WGMMA_PROBES);

    for arch in [Arch::Sm80, Arch::Sm89] {
        for id in LAYOUTS.iter().filter(|l| l.exists_on(arch)) {
            let name = snapshot_name(arch, id);
            let id = *id;
            t.model(&format!("snapshot::{name}"), move || {
                snapshot(&name, "source: model", &id.model().draw());
                Ok(())
            });
        }
    }
    for (arch, id) in [PROBED_ARCH, Arch::Sm90a].into_iter().flat_map(|a| {
        LAYOUTS
            .iter()
            .filter(move |l| l.exists_on(a))
            .map(move |l| (a, *l))
    }) {
        let name = snapshot_name(arch, &id);
        t.model(
            &format!("committed_probe_equals_model::{name}"),
            move || committed_probe_equals(&name, &id.model().draw()),
        );
    }
    for id in smem_layouts() {
        let name = id.key();
        t.model(
            &format!("committed_probe_equals_model::{name}"),
            move || committed_probe_equals(&name, &id.model().draw()),
        );
    }
    t.model("row_ownership_of_both_accumulators", || {
        for id in LAYOUTS
            .iter()
            .filter(|l| l.operand == Operand::Acc && !l.is_wgmma())
        {
            let o = row_owners(&id.model(), 9);
            ensure!(
                o.lanes == vec![4, 5, 6, 7] && o.lanes == quad_orbit(5),
                "{id}: row 9 owned by {o:?}"
            );
        }
        Ok(())
    });

    t.compile("header_agrees_with_the_model", || {
        let code: &'static str = Box::leak(header_checks().into_boxed_str());
        let src: &'static Source = Box::leak(Box::new(Source {
            file: "header_checks.cu",
            code,
            headers: &[HEADERS],
        }));
        lab::compile(src, Arch::Sm80, &[]).map(|_| ())
    });
    t.compile("mutated_header_is_caught", || {
        // Swap two register indices of the m16n8k16 A layout (row half chosen by bit 2 instead of bit 1).
        let good = HEADERS[0].code;
        let from =
            "m16n8k16_a_row(int lane, int i) { return group_of(lane) + 8 * ((i >> 1) & 1); }";
        ensure!(
            good.contains(from),
            "the mutation no longer applies: update this test"
        );
        let bad: &'static str = Box::leak(
            good.replace(from, &from.replace("(i >> 1)", "(i >> 2)"))
                .into_boxed_str(),
        );
        let headers: &'static [lab::Header] = Box::leak(Box::new([lab::Header {
            name: "frag_layout.cuh",
            code: bad,
        }]));
        let code: &'static str = Box::leak(header_checks().into_boxed_str());
        let src: &'static Source = Box::leak(Box::new(Source {
            file: "header_checks.cu",
            code,
            headers: Box::leak(Box::new([headers])),
        }));
        let err = format!(
            "{:#}",
            lab::compile(src, Arch::Sm80, &[])
                .err()
                .ok_or_else(|| anyhow!("mutant compiled"))?
        );
        ensure!(
            err.contains("frag::m16n8k16_a lane"),
            "the failure does not name the layout: {err}"
        );
        Ok(())
    });

    for id in LAYOUTS.iter().filter(|l| l.exists_on(PROBED_ARCH)) {
        let id = *id;
        t.gpu(&format!("probe::{}", id.key()), move |gpu| {
            let probed = probe_all(gpu)?
                .get(&id)
                .ok_or_else(|| anyhow!("{id} was not probed"))?;
            probed.check_coverage().map_err(|e| anyhow!("{e}"))?;
            let drawing = probed.draw();
            eprintln!(
                "{id}: {} slots probed on {}",
                probed.entries.len(),
                gpu.name
            );
            // The diff is printed before the snapshot assertion, which panics on a difference.
            let d = probed.diff(&id.model());
            if !d.is_empty() {
                eprintln!(
                    "{id}: probe and model differ in {} slots:\n{}",
                    d.len(),
                    d.join("\n")
                );
            }
            if gpu.arch == PROBED_ARCH {
                let desc = format!("source: probed on {} ({})", gpu.name, gpu.arch);
                snapshot(&snapshot_name(gpu.arch, &id), &desc, &drawing);
            }
            ensure!(
                d.is_empty(),
                "{id}: probe and model differ in {} slots:\n{}\nprobed:\n{drawing}",
                d.len(),
                d.join("\n")
            );
            Ok(())
        });
    }
    for (op, dtype) in [
        (Op::Mma16x8x16, DType::F16),
        (Op::Mma16x8x16, DType::Bf16),
        (Op::Mma16x8x32, DType::E4m3),
        (Op::Mma16x8x32, DType::E5m2),
    ] {
        t.gpu(
            &format!("mma_product_exact::{:?}::{}", op, dtype.name()),
            move |gpu| {
                let id = |operand, dt| LayoutId {
                    op,
                    operand,
                    dtype: dt,
                };
                let (a, b, c) = (
                    id(Operand::A(None), dtype).model(),
                    id(Operand::B(None), dtype).model(),
                    id(Operand::Acc, DType::F32).model(),
                );
                for seed in 0..3 {
                    let e = mma_product_errors(gpu, &a, &b, &c, seed)?;
                    ensure!(
                        e.is_empty(),
                        "seed {seed}: {} wrong cells, e.g. {}",
                        e.len(),
                        e[0]
                    );
                }
                Ok(())
            },
        );
    }
    t.gpu("mutated_lut_is_caught", |gpu| {
        let acc = LayoutId {
            op: Op::Wmma16x16x16,
            operand: Operand::Acc,
            dtype: DType::F32,
        };
        let probed = &probe_all(gpu)?[&acc];
        let d = probed.diff(&swap_regs(&acc.model(), 0, 1));
        ensure!(
            d.len() == 64,
            "swapping x[0] and x[1] must differ in 2 slots × 32 lanes, got {}",
            d.len()
        );
        let (a, b, c) = mma_ids_models();
        let e = mma_product_errors(gpu, &swap_regs(&a, 1, 2), &b, &c, 0)?;
        ensure!(
            !e.is_empty(),
            "a product through an A table with x[1] and x[2] swapped went unnoticed"
        );
        eprintln!(
            "mutated LUTs: {} slot differences, {} wrong product cells",
            d.len(),
            e.len()
        );
        Ok(())
    });
    for id in LAYOUTS.iter().filter(|l| l.is_wgmma()) {
        let id = *id;
        t.gpu(&format!("probe::{}", id.key()), move |gpu| {
            let probed = probe_wgmma_all(gpu)?
                .regs
                .get(&id)
                .ok_or_else(|| anyhow!("{id} was not probed"))?;
            probed.check_coverage().map_err(|e| anyhow!("{e}"))?;
            let drawing = probed.draw();
            let d = probed.diff(&id.model());
            let desc = format!("source: probed on {} (sm_90a)", gpu.name);
            snapshot(&snapshot_name(Arch::Sm90a, &id), &desc, &drawing);
            ensure!(
                d.is_empty(),
                "{id}: probe and model differ in {} slots:\n{}",
                d.len(),
                d.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
            );
            Ok(())
        });
    }
    for id in smem_layouts() {
        t.gpu(&format!("probe::{}", id.key()), move |gpu| {
            let probed = probe_wgmma_all(gpu)?
                .smem
                .get(&id)
                .ok_or_else(|| anyhow!("{id} was not probed"))?;
            let d = probed.diff(&id.model());
            let desc = format!("source: probed on {} (sm_90a)", gpu.name);
            snapshot(&id.key(), &desc, &probed.draw());
            ensure!(
                d.is_empty(),
                "{id}: probe and model differ in {} cells:\n{}",
                d.len(),
                d.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
            );
            Ok(())
        });
    }
    t.gpu("wgmma_probe_summary", |gpu| {
        let p = probe_wgmma_all(gpu)?;
        let (all, eq) = p.cells_equal_to_model();
        eprintln!(
            "wgmma probes on {}: {} register layouts, {} shared-memory layouts, {all} cells, {eq} equal to the model",
            gpu.name,
            p.regs.len(),
            p.smem.len()
        );
        ensure!(all == eq, "{} of {all} probed wgmma cells differ from the model", all - eq);
        Ok(())
    });
    t.gpu("wgmma_mutated_model_is_caught", |gpu| {
        // The classic descriptor mistake: LBO and SBO swapped for the no-swizzle layout.
        let p = probe_wgmma_all(gpu)?;
        let id = smem_layouts()
            .into_iter()
            .find(|l| l.swizzle == Swizzle::None && l.operand == SmemOperand::B)
            .ok_or_else(|| anyhow!("no plain B layout"))?;
        let good = id.desc();
        let bad = Desc {
            lbo: good.sbo,
            sbo: good.lbo,
            ..good
        };
        let mut wrong = id.model();
        for ((row, k), b) in wrong.entries.iter_mut() {
            *b = bad.byte_of(*row, *k * id.elem_bytes());
        }
        let d = p.smem[&id].diff(&wrong);
        ensure!(!d.is_empty(), "swapped LBO/SBO went unnoticed");
        // And a swizzle applied with one bit too few.
        let id = smem_layouts()
            .into_iter()
            .find(|l| l.swizzle == Swizzle::B128 && l.operand == SmemOperand::B)
            .ok_or_else(|| anyhow!("no sw128 B layout"))?;
        let mut wrong = id.model();
        let desc = id.desc();
        for ((row, k), b) in wrong.entries.iter_mut() {
            *b = Swizzle::B64.apply(desc.start + (row / 8) * desc.sbo + (row % 8) * 128 + *k * id.elem_bytes());
        }
        let d2 = p.smem[&id].diff(&wrong);
        ensure!(!d2.is_empty(), "a 64B swizzle in place of 128B went unnoticed");
        eprintln!(
            "mutated wgmma models: swapped LBO/SBO → {} cells differ; 64B for 128B swizzle → {} cells differ",
            d.len(),
            d2.len()
        );
        Ok(())
    });
    t.gpu("header_matches_the_model_on_device", |gpu| {
        let rows = header_on_device(gpu)?;
        let mut checked = 0;
        for (f, lane, i, r, c) in rows {
            let id = LAYOUTS
                .iter()
                .find(|l| l.header_fn() == f)
                .ok_or_else(|| anyhow!("{f} has no layout"))?;
            ensure!(
                id.coord(lane, i) == (r, c),
                "{f} lane {lane} x[{i}]: device ({r}, {c}), model {:?}",
                id.coord(lane, i)
            );
            checked += 1;
        }
        eprintln!("header on device: {checked} entries agree with the model");
        Ok(())
    });
    t.gpu("quad_shuffle_reduces_each_accumulator_row", |gpu| {
        let out = quad_rowmax(gpu)?;
        for lane in 0..32u32 {
            for half in 0..2u32 {
                let row = (lane >> 2) + 8 * half;
                let got = out[(lane * 2 + half) as usize];
                ensure!(
                    got == (row * 16 + 15) as f32,
                    "lane {lane} half {half}: max {got}, row {row} max is {}",
                    row * 16 + 15
                );
            }
        }
        Ok(())
    });
    t.gpu("catalogue_json_equals_the_wgmma_probes", |gpu| {
        let probed = &probe_wgmma_all(gpu)?.regs;
        let cat: Vec<Record> = catalogue()
            .into_iter()
            .filter(|r| r.arch == "sm_90a")
            .collect();
        ensure!(
            cat.len() == probed.len(),
            "catalogue has {} sm_90a layouts, {} were probed",
            cat.len(),
            probed.len()
        );
        for (id, layout) in probed {
            let want = Record::new(Arch::Sm90a, layout);
            ensure!(
                cat.contains(&want),
                "{id}: `xtask layouts --json` differs from the probe"
            );
        }
        let smem = &probe_wgmma_all(gpu)?.smem;
        let cat = smem_catalogue();
        ensure!(
            cat.len() == smem.len(),
            "{} smem records, {} probed",
            cat.len(),
            smem.len()
        );
        for (id, l) in smem {
            ensure!(
                cat.contains(&SmemRecord::new(l)),
                "{id}: `xtask layouts --json` differs from the probe"
            );
        }
        Ok(())
    });
    t.gpu("catalogue_json_equals_the_probes", |gpu| {
        let probed = probe_all(gpu)?;
        let cat: Vec<Record> = catalogue()
            .into_iter()
            .filter(|r| r.arch == gpu.arch.name())
            .collect();
        ensure!(
            cat.len() == probed.len(),
            "catalogue has {} {} layouts, {} were probed",
            cat.len(),
            gpu.arch,
            probed.len()
        );
        for (id, layout) in probed {
            let want = Record::new(gpu.arch, layout);
            let got = cat
                .iter()
                .find(|r| r.op == want.op && r.operand == want.operand && r.dtype == want.dtype);
            ensure!(
                got == Some(&want),
                "{id}: `xtask layouts --json` differs from the probe"
            );
        }
        let cells: usize = probed.values().map(|l| l.entries.len()).sum();
        eprintln!(
            "catalogue: {} layouts, {cells} slots, equal to the probes on {}",
            probed.len(),
            gpu.name
        );
        Ok(())
    });
    t.run()
}

fn mma_ids_models() -> (Layout, Layout, Layout) {
    let id = |operand, dtype| LayoutId {
        op: Op::Mma16x8x16,
        operand,
        dtype,
    };
    (
        id(Operand::A(None), DType::F16).model(),
        id(Operand::B(None), DType::F16).model(),
        id(Operand::Acc, DType::F32).model(),
    )
}
