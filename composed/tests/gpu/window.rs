// Sliding windows on stage 8 (stage8w_dD): each row's keys cut on both sides, held to the f64 reference; mutants caught.
use crate::prelude::*;
use fixtures::Window;

fn win(left: i64, right: i64) -> Window {
    let side = |x: i64| (x >= 0).then_some(x as usize);
    Window {
        left: side(left),
        right: side(right),
    }
}

/// Windowed shapes: a left window alone and with causal masking, both sides, the diagonal alone (0, 0), one key
/// past it, Sq ≠ Sk both ways (rows that see no key), grouped-query heads, D = 64 and 128, windows across the key
/// tiles' edges (128 and 192 keys), several units a block.
fn shapes() -> Vec<(String, Shape)> {
    [
        (Shape::new(1, 2, 300, 64), win(32, -1)),
        (Shape::new(1, 2, 600, 128), win(100, -1)),
        (Shape::new(1, 2, 500, 128).with_causal(true), win(191, -1)),
        (Shape::new(2, 2, 400, 64).with_causal(true), win(0, 0)),
        (Shape::new(1, 3, 700, 128), win(64, 64)),
        (Shape::new(1, 2, 256, 64), win(1, 1)),
        (Shape::cross(1, 2, 100, 700, 128), win(50, 10)),
        (
            Shape::cross(1, 2, 450, 130, 64).with_causal(true),
            win(20, -1),
        ),
        (
            Shape::new(2, 8, 520, 128).with_kv_heads(2).expect("8 / 2"),
            win(200, 30),
        ),
        (Shape::new(1, 4, 1000, 64).with_causal(true), win(129, -1)),
    ]
    .into_iter()
    .map(|(s, w)| {
        let s = s.with_window(w);
        let mask = if s.causal { "_causal" } else { "" };
        (
            format!(
                "{}x{}q{}kv_{}x{}x{}_w{}_{}{mask}",
                s.b,
                s.h,
                s.hkv,
                s.sq,
                s.sk,
                s.d,
                w.left.map_or(-1, |x| x as i64),
                w.right.map_or(-1, |x| x as i64)
            ),
            s,
        )
    })
    .collect()
}

/// The window's mutants (name, header, from, to): each a plausible bug the reference must catch.
const WINDOW_MUTANTS: [(&str, &str, &str, &str); 3] = [
    // The left edge never masked: a row attends every key of its unit's first tiles.
    (
        "no_left_mask",
        "pingpong_attention.cuh",
        "if constexpr (WIN) osm::mask_below<SL>(s, tt * BC, lo);",
        "",
    ),
    // The unit's first key tile one past the right one: its first row's first keys never loaded.
    (
        "first_tile_one_late",
        "pingpong_schedule.cuh",
        "const int first = first_key(q0, sq, sk) / BC;",
        "const int first = first_key(q0, sq, sk) / BC + 1;",
    ),
    // The right edge from the unit's first row for every row (the causal side's bound not per row).
    (
        "right_edge_of_the_first_row",
        "pingpong_attention.cuh",
        "limit[h] = win.key_end(row, u.sq, u.sk, p.causal != 0) - k0 * BC;",
        "limit[h] = win.key_end(q0, u.sq, u.sk, p.causal != 0) - k0 * BC;",
    ),
];

pub fn add(t: &mut Suite) {
    for (name, shape) in shapes() {
        t.gpu(&format!("window::stage8::{name}"), move |gpu| {
            // At one unit a block, one block (every unit through the same ring and slots) and five blocks.
            let qz = quantize_per_head(&normal(shape, 61));
            let (want, emu) = (reference(&qz), emulation_of(Stage::S8, &qz, OutDtype::F16));
            for blocks in [None, Some(1), Some(5)] {
                let mut d = OnDevice::upload(gpu, &qz)?;
                d.use_blocks(blocks);
                d.launch(gpu, Stage::S8)?;
                let got = d.download(gpu)?;
                rule(
                    Stage::S8,
                    &qz,
                    &want,
                    &emu,
                    &got,
                    &format!("{name}, {blocks:?} blocks"),
                    |st, e| eprintln!("window {name} {blocks:?}: {st} (emulation {e:.3e})"),
                )?;
            }
            Ok(())
        });
    }
    t.gpu(
        "window::stage8::wider_than_the_sequence_gives_the_unwindowed_bits",
        |gpu| {
            // A window every row's keys fit in: the windowed kernel starts at key tile 0, masks nothing more, and must give
            // stage 8's own bits.
            for (s, w) in [
                (Shape::new(1, 2, 700, 128), win(5000, 5000)),
                (
                    Shape::cross(1, 2, 300, 900, 64).with_causal(true),
                    win(900, -1),
                ),
            ] {
                let qz = quantize_per_head(&normal(s, 67));
                let mut d = OnDevice::upload(gpu, &qz)?;
                // Whole units, as the windowed kernel runs them (no fanned plan).
                d.use_split_tail(false);
                d.launch(gpu, Stage::S8)?;
                let plain = d.download(gpu)?;
                let wq = fixtures::Quantized {
                    shape: s.with_window(w),
                    ..qz.clone()
                };
                let mut dw = OnDevice::upload(gpu, &wq)?;
                dw.launch(gpu, Stage::S8)?;
                ensure!(
                    bit_identical(&plain, &dw.download(gpu)?),
                    "{s:?} under window {w}: not stage 8's bits"
                );
            }
            Ok(())
        },
    );
    t.gpu("window::stage7_refuses_a_window_by_name", |gpu| {
        let s = Shape::new(1, 2, 128, 64).with_window(win(16, -1));
        let qz = quantize_per_head(&normal(s, 3));
        let e = format!(
            "{:#}",
            run_as(gpu, Stage::S7, &qz, OutDtype::F16).unwrap_err()
        );
        ensure!(
            e.contains("stage7 has no sliding window") && e.contains("stage8 has"),
            "{e}"
        );
        Ok(())
    });
    t.model("window::mutants_apply", || {
        for (mutant, header, from, to) in WINDOW_MUTANTS {
            composed::Stage::S8
                .kernel_for(&Shape::new(1, 1, 64, 128).with_window(win(1, -1)))
                .mutated(header, from, to)
                .with_context(|| mutant)?;
        }
        Ok(())
    });
    for (mutant, header, from, to) in WINDOW_MUTANTS {
        t.gpu(&format!("window::mutant_{mutant}_is_caught"), move |gpu| {
            let shape = Shape::new(1, 2, 500, 128)
                .with_causal(true)
                .with_window(win(150, -1));
            let qz = quantize_per_head(&normal(shape, 71));
            let (want, emu) = (reference(&qz), emulation_of(Stage::S8, &qz, OutDtype::F16));
            let mut d = OnDevice::upload(gpu, &qz)?;
            d.use_kernel(Some(
                Stage::S8.kernel_for(&shape).mutated(header, from, to)?,
            ));
            d.launch(gpu, Stage::S8)?;
            let caught = match d.download(gpu) {
                Ok(bad) => rule(Stage::S8, &qz, &want, &emu, &bad, mutant, |_, _| {}).is_err(),
                Err(e) => format!("{e:#}").contains("never written by the kernel"),
            };
            ensure!(caught, "the window mutant `{mutant}` passed the rule");
            eprintln!("window mutant caught: {mutant}");
            Ok(())
        });
    }
}
