// cp-async-ring's test binary: position-encoded tensors through every ring shape, byte by byte, and mutants.
use anyhow::{Result, bail, ensure};
use cp_async_ring::*;
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{check_written, poisoned};
use lab::{Gpu, KernelSpec, Suite};

const HEADS: usize = 3;

/// How the heads' rows sit in memory.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// [B, H, S, D]: a head's rows are contiguous.
    Bhsd,
    /// [B, S, H, D]: rows of one head are H rows apart, so the ring must follow the stride.
    Bshd,
}

/// (row stride, head stride) in bytes.
fn strides(layout: Layout, seq: usize, row_bytes: usize) -> (usize, usize) {
    match layout {
        Layout::Bhsd => (row_bytes, seq * row_bytes),
        Layout::Bshd => (HEADS * row_bytes, row_bytes),
    }
}

/// Every 4-byte word of row r of head h holds (h + 1) << 24 | r << 8 | word: never zero, never the poison.
fn word(h: usize, r: usize, w: usize) -> [u8; 4] {
    (((h as u32 + 1) << 24) | ((r as u32) << 8) | w as u32).to_le_bytes()
}

fn source(layout: Layout, seq: usize, row_bytes: usize) -> Vec<u8> {
    let (rs, hs) = strides(layout, seq, row_bytes);
    let mut src = vec![0u8; HEADS * seq * row_bytes];
    for h in 0..HEADS {
        for r in 0..seq {
            for w in 0..row_bytes / 4 {
                let at = h * hs + r * rs + 4 * w;
                src[at..at + 4].copy_from_slice(&word(h, r, w));
            }
        }
    }
    src
}

/// Copies through the ring of `shape` (kernel `spec`); checks every byte of every tile and each tile's valid
/// row count. Returns the number of bytes checked.
/// Where byte b of row i of a tile sits in its stage.
type Place = dyn Fn(usize, usize) -> usize;

fn run(gpu: &Gpu, spec: &KernelSpec, shape: &Shape, layout: Layout, seq: usize) -> Result<usize> {
    let rb = shape.row_bytes();
    run_placed(gpu, spec, shape, layout, seq, &move |i, b| i * rb + b)
}

fn run_placed(
    gpu: &Gpu,
    spec: &KernelSpec,
    shape: &Shape,
    layout: Layout,
    seq: usize,
    place: &Place,
) -> Result<usize> {
    let rb = shape.row_bytes();
    let (rs, hs) = strides(layout, seq, rb);
    let tiles = seq.div_ceil(shape.rows);
    let k = gpu.load(spec)?;
    let s = &gpu.stream;
    let src = s.clone_htod(&source(layout, seq, rb))?;
    // 0xCD is neither a zero-filled byte nor a byte of any encoded word's top byte, so a byte the kernel never
    // wrote shows up as a mismatch.
    let mut out = s.clone_htod(&vec![0xCDu8; HEADS * tiles * shape.tile_bytes()])?;
    let mut valid = s.clone_htod(&poisoned::<i32>(HEADS * tiles))?;
    let (rs_i, hs_i, seq_i, tiles_i) = (rs as i64, hs as i64, seq as i32, tiles as i32);
    let cfg = LaunchConfig {
        grid_dim: (HEADS as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: shape.smem_bytes() as u32,
    };
    // SAFETY: ring_*(const u8* src, long long stride, long long head_stride, int rows, u8* out[heads][tiles][tile],
    // int* valid[heads][tiles], int max_tiles); 128 threads; dynamic smem = the stages.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&src)
            .arg(&rs_i)
            .arg(&hs_i)
            .arg(&seq_i)
            .arg(&mut out)
            .arg(&mut valid)
            .arg(&tiles_i)
            .launch(cfg)?
    };
    let (out, valid) = (s.clone_dtoh(&out)?, s.clone_dtoh(&valid)?);
    check_written(&valid, "valid rows")?;
    for h in 0..HEADS {
        for t in 0..tiles {
            let v = valid[h * tiles + t];
            ensure!(
                v as usize == valid_rows(seq, shape.rows, t),
                "head {h} tile {t}: ring reports {v} valid rows"
            );
            for i in 0..shape.rows {
                let r = t * shape.rows + i;
                for w in 0..rb / 4 {
                    let at = (h * tiles + t) * shape.tile_bytes() + place(i, 4 * w);
                    let want = if r < seq { word(h, r, w) } else { [0; 4] };
                    if out[at..at + 4] != want {
                        bail!(
                            "{} {layout:?} S={seq}: head {h} tile {t} row {i} word {w}: got {:02x?}, want {want:02x?} ({})",
                            spec.name,
                            &out[at..at + 4],
                            if r < seq { "data" } else { "zero-filled tail" }
                        );
                    }
                }
            }
        }
    }
    Ok(out.len())
}

fn seqs(shape: &Shape) -> Vec<usize> {
    let r = shape.rows;
    vec![1, r - 1, r, r + 1, 3 * r + 5, 7 * r, 200, 1000]
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    t.kernels(&[SWIZZLED]);
    for shape in SHAPES {
        t.gpu(&format!("copy::{}", shape.kernel()), move |gpu| {
            let (mut bytes, mut cases) = (0, 0);
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for seq in seqs(shape) {
                    bytes += run(gpu, &kernel(shape), shape, layout, seq)?;
                    cases += 1;
                }
            }
            eprintln!(
                "{}: {cases} (layout, S) cases, {bytes} bytes checked, tile order and tails exact",
                shape.kernel()
            );
            Ok(())
        });
    }
    t.gpu("copy::swizzled_into_a_wgmma_tile", |gpu| {
        // 64 rows of 128 bytes placed as frag-layout's (probed) 128-byte-swizzled K-major tile.
        let shape = Shape::new(2, 64, 128, 1);
        let place = |i: usize, b: usize| {
            frag_layout::Desc::tile_byte(frag_layout::Swizzle::B128, 64, 128, i as u32, b as u32)
                as usize
        };
        let mut bytes = 0;
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for seq in seqs(&shape) {
                bytes += run_placed(gpu, &SWIZZLED, &shape, layout, seq, &place)?;
            }
        }
        eprintln!("swizzled placement: {bytes} bytes exact");
        Ok(())
    });
    let mutants: [(&str, &str, &str); 2] = [
        ("wait removed", "    wait_group<STAGES - 1>();\n", ""),
        (
            "stage index off by one",
            "return tile_ptr(t);",
            "return tile_ptr(t + 1);",
        ),
    ];
    for (what, from, to) in mutants {
        t.gpu(
            &format!("mutant_caught::{}", what.replace(' ', "_")),
            move |gpu| {
                for shape in SHAPES {
                    let m = kernel(shape).mutated("cp_async_ring.cuh", from, to)?;
                    for seq in seqs(shape) {
                        if let Err(e) = run(gpu, &m, shape, Layout::Bhsd, seq) {
                            eprintln!("mutant `{what}` caught: {e}");
                            return Ok(());
                        }
                    }
                }
                bail!("mutant `{what}` copied every case correctly: the suite cannot see it")
            },
        );
    }
    t.run()
}
