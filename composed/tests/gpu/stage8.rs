// Stage 8 (V as the caller has it, transposed in the kernel): stage 7's bits where their tiles agree, the reference
// where they do not, and its mutants caught.
use crate::prelude::*;

/// Shapes stage 8 runs at every block count that changes how units meet the staging slots (one block: every tile
/// through the same slots; the device's SMs; a split tail). Plain, the mission shape, partial key tiles (Sk not a
/// multiple of 192 or 128), causal with Sq ≠ Sk both ways, grouped-query heads, many units a block. At D = 64 stage 8
/// has stage 7's tiles and ring, and every tile of V it transposes is the Vᵀ stage 7 reads (keys in P's order, zero
/// past Sk): O and the LSE must be stage 7's bit for bit. At D = 128 its tiles are 192 keys (stage 7's 224), so its
/// online softmax rounds at other places: it is held to the f64 reference by the rule of its own emulation.
fn same_bits_shapes() -> Vec<(String, Shape)> {
    [
        Shape::new(1, 8, 512, 64),
        Shape::new(2, 4, 1000, 128),
        Shape::cross(1, 3, 300, 1000, 128).with_causal(true),
        Shape::cross(1, 2, 700, 450, 64).with_causal(true),
        Shape::new(2, 8, 600, 128)
            .with_kv_heads(2)
            .expect("8 / 2")
            .with_causal(true),
        Shape::cross(1, 6, 77, 3000, 64)
            .with_kv_heads(3)
            .expect("6 / 3"),
        Shape::new(1, 1, 1, 128),
    ]
    .into_iter()
    .map(|s| {
        let mask = if s.causal { "_causal" } else { "" };
        (
            format!(
                "{}x{}q{}kv_{}x{}x{}{mask}",
                s.b, s.h, s.hkv, s.sq, s.sk, s.d
            ),
            s,
        )
    })
    .collect()
}

/// V staging's mutants (name, D, from, to) in `v_staging.cuh`: one_staging_slot at D = 64, the head dimension with
/// two staging slots.
const STAGING_MUTANTS: [(&str, usize, &str, &str); 2] = [
    // Vᵀ written into the ring stage after the one the consumers read: they meet another tile's (or no) Vᵀ.
    (
        "vt_into_the_next_stage",
        128,
        "blk.svt + blk.ring.stage(r) * Block::kTile, w, lane",
        "blk.svt + blk.ring.stage(r + 1) * Block::kTile, w, lane",
    ),
    // Every V tile loaded into the first staging slot: the transposers of odd tiles read the even tile.
    (
        "one_staging_slot",
        64,
        "__device__ unsigned char* tile(int r) const { return sv + slot(r) * Block::kTile; }",
        "__device__ unsigned char* tile(int r) const { return sv; }",
    ),
];

pub fn add(t: &mut Suite) {
    for (name, shape) in same_bits_shapes() {
        let same_tiles = Stage::S8.bc(shape.d) == Stage::S7.bc(shape.d);
        let what = if same_tiles {
            "same_bits_as_stage7"
        } else {
            "the_reference_at_every_block_count"
        };
        t.gpu(&format!("stage8::{what}::{name}"), move |gpu| {
            // Stage 7 reads Vᵀ made by prep_vt / prep_vt_tiles; stage 8 makes the same bytes in shared memory from V
            // itself.
            let qz = quantize_per_head(&normal(shape, 83));
            let (want, emu) = (reference(&qz), emulation_of(Stage::S8, &qz, OutDtype::F16));
            for blocks in [None, Some(1), Some(5)] {
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.use_blocks(blocks);
                // A halved launch (SplitPlan::halved: stage 8 only) merges each unit's two halves of its keys: by the
                // rule.
                let halved = d.split_plan(gpu, Stage::S8)?.halved;
                d.launch(gpu, Stage::S8)?;
                let eight = d.download(gpu)?;
                if same_tiles && !halved {
                    d.poison_outputs(gpu)?;
                    d.launch(gpu, Stage::S7)?;
                    let seven = d.download(gpu)?;
                    ensure!(
                        bit_identical(&seven, &eight),
                        "{name}, {blocks:?} blocks: stage 8's O / LSE differ from stage 7's"
                    );
                } else {
                    rule(
                        Stage::S8,
                        &qz,
                        &want,
                        &emu,
                        &eight,
                        &format!("{name}, {blocks:?} blocks"),
                        |_, _| {},
                    )?;
                }
            }
            eprintln!("stage8 {name}: {what} at 3 block counts");
            Ok(())
        });
    }
    for shape in [
        Shape::new(2, 8, 512, 64),
        Shape::cross(2, 4, 300, 700, 128)
            .with_kv_heads(2)
            .expect("4 / 2")
            .with_causal(true),
    ] {
        let name = format!(
            "{}x{}q{}kv_{}x{}x{}",
            shape.b, shape.h, shape.hkv, shape.sq, shape.sk, shape.d
        );
        t.gpu(&format!("stage8::bshd_inputs::{name}"), move |gpu| {
            // Q, K and V moved on the device to [B, S, H, D] and read through those strides (tensor maps of (D, S, H,
            // B)): the same bits as from [B, H, S, D]. Stage 7 refuses them by name (B > 1), before any launch.
            let qz = quantize_per_head(&normal(shape, 97));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S8)?;
            let plain = d.download(gpu)?;
            d.use_bshd_inputs(gpu)?;
            ensure!(d.quantized(gpu)?.q == qz.q, "the [B, S, H, D] copy does not read back as the problem");
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S8)?;
            ensure!(
                bit_identical(&d.download(gpu)?, &plain),
                "{name}: O / LSE from [B, S, H, D] inputs differ from [B, H, S, D]'s"
            );
            let e = format!("{:#}", d.launch(gpu, Stage::S7).unwrap_err());
            ensure!(e.contains("take stage8"), "{e}");
            // The batch coordinate dropped from Q's loads: batch 1 would read batch 0's queries.
            // (A halved launch, the default at 2x8x512x512x64, loads Q by produce_halved_unit.)
            d.use_kernel(Some(
                Stage::S8
                    .kernel(shape.d)
                    .mutated("pingpong_producer.cuh", "s.kt, s.dst, b);", "s.kt, s.dst, 0);")?
                    .mutated(
                        "pingpong_producer.cuh",
                        "64 * int(blockIdx.x & 1), b);",
                        "64 * int(blockIdx.x & 1), 0);",
                    )?,
            ));
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S8)?;
            let caught = mutant_shows(d.download(gpu), &plain);
            ensure!(caught, "a lost batch coordinate went unnoticed");
            eprintln!("stage8 {name}: [B, S, H, D] inputs give [B, H, S, D]'s bits; the batch-coordinate mutant is caught");
            Ok(())
        });
    }
    for (shape, out) in [
        (Shape::new(1, 8, 512, 64), OutDtype::F16),
        (Shape::cross(2, 8, 256, 512, 64), OutDtype::Bf16),
        (Shape::cross(2, 2, 300, 400, 64), OutDtype::F32),
        // Sk past 512 at D = 64: the halved kernel on the stage's 256-key tiles (`Stage::halved_bc`), a partial last.
        (Shape::cross(1, 8, 256, 1000, 64), OutDtype::Bf16),
        (
            Shape::new(1, 8, 300, 128).with_kv_heads(2).expect("8 / 2"),
            OutDtype::F16,
        ),
    ] {
        let name = format!(
            "{}x{}q{}kv_{}x{}x{}_{out:?}",
            shape.b, shape.h, shape.hkv, shape.sq, shape.sk, shape.d
        );
        t.gpu(&format!("stage8::halved::{name}"), move |gpu| {
            // Few units on many SMs (SplitPlan::halved): a unit's rows in two blocks of 64, each block's consumers on
            // the first and second halves of the keys, merged by consumer 0. By the rule against the f64 reference,
            // the same bits launch after launch; a merge that drops consumer 1's half must show.
            let qz = quantize_per_head(&normal(shape, 101));
            let mut d = OnDevice::upload_as(gpu, &qz, out)?;
            let plan = d.split_plan(gpu, Stage::S8)?;
            ensure!(plan.halved, "{name}: {plan:?} not halved");
            d.launch(gpu, Stage::S8)?;
            let got = d.download(gpu)?;
            rule(
                Stage::S8,
                &qz,
                &reference(&qz),
                &emulation_of(Stage::S8, &qz, out),
                &got,
                &name,
                |e, e_emu| {
                    eprintln!(
                        "stage8 halved {name} ({}-key tiles): {e} | emulation max_abs={e_emu:.3e}",
                        Stage::S8.halved_bc(shape.d, shape.sk)
                    )
                },
            )?;
            for _ in 0..2 {
                d.poison_outputs(gpu)?;
                d.launch(gpu, Stage::S8)?;
                ensure!(
                    bit_identical(&d.download(gpu)?, &got),
                    "{name}: another launch gives other bits"
                );
            }
            let mut m = OnDevice::upload_as(gpu, &qz, out)?;
            m.use_kernel(Some(Stage::S8.kernel(shape.d).mutated(
                "pingpong_epilogue.cuh",
                "w[h] = amerge::weights(l2, 2);",
                "w[h] = amerge::weights(l2, 1);",
            )?));
            m.launch(gpu, Stage::S8)?;
            let caught = mutant_shows(m.download(gpu), &got);
            ensure!(
                caught,
                "{name}: a merge without consumer 1's half went unnoticed"
            );
            // The split tail off (a ring step's launches): every unit whole, one a block.
            d.use_split_tail(false);
            ensure!(
                !d.split_plan(gpu, Stage::S8)?.halved,
                "{name}: halved with the split tail off"
            );
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S8)?;
            rule(
                Stage::S8,
                &qz,
                &reference(&qz),
                &emulation_of(Stage::S8, &qz, out),
                &d.download(gpu)?,
                &name,
                |_, _| {},
            )?;
            Ok(())
        });
    }
    t.gpu("stage8::refuses_d256_by_name", |gpu| {
        let qz = quantize_per_head(&normal(Shape::new(1, 2, 64, 256), 1));
        let e = format!(
            "{:#}",
            run_as(gpu, Stage::S8, &qz, OutDtype::F16).unwrap_err()
        );
        ensure!(
            e.contains("stage8 is not built for head dimension D = 256") && e.contains("stage7"),
            "{e}"
        );
        Ok(())
    });
    t.model("stage8::mutants_apply", || {
        for (mutant, d, from, to) in STAGING_MUTANTS {
            Stage::S8
                .kernel(d)
                .mutated("v_staging.cuh", from, to)
                .with_context(|| mutant)?;
        }
        Ok(())
    });
    for (mutant, d, from, to) in STAGING_MUTANTS {
        t.gpu(&format!("stage8::mutant_{mutant}_is_caught"), move |gpu| {
            assert_eq!(
                Stage::S8.v_slots(64),
                2,
                "one_staging_slot needs two slots to mutate"
            );
            let shape = Shape::new(1, 4, 1000, d);
            let qz = quantize_per_head(&normal(shape, 89));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.launch(gpu, Stage::S8)?;
            let good = d.download(gpu)?;
            d.use_kernel(Some(Stage::S8.kernel(shape.d).mutated(
                "v_staging.cuh",
                from,
                to,
            )?));
            d.poison_outputs(gpu)?;
            d.launch(gpu, Stage::S8)?;
            let caught = mutant_shows(d.download(gpu), &good);
            ensure!(caught, "the {mutant} mutant gave stage 8's O and LSE");
            eprintln!("mutant caught: {mutant}");
            Ok(())
        });
    }
}
