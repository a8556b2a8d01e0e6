// fp8-relayout's test binary: each relayout bit-exact over all lanes and values, P·V end to end, and mutants.
use anyhow::{Result, ensure};
use fp8_relayout::*;
use half::{bf16, f16};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::Inputs;
use lab::{Gpu, KernelSpec, Suite};

const WG: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (128, 1, 1),
    shared_mem_bytes: 0,
};

/// One warpgroup of `spec(const float* in, float scale, T* out)`: `out` starts as `init` (its length the kernel's
/// output) and comes back.
fn in_scale_out<
    T: lab::cudarc::driver::DeviceRepr
        + lab::cudarc::driver::ValidAsZeroBits
        + Clone
        + Default
        + Unpin,
>(
    gpu: &Gpu,
    spec: &KernelSpec,
    x: &[f32],
    scale: f32,
    init: Vec<T>,
) -> Result<Vec<T>> {
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let dx = s.clone_htod(x)?;
    let mut out = s.clone_htod(&init)?;
    // SAFETY: the caller names a kernel (const float* in, float scale, T* out) of one warpgroup whose output is
    // `init.len()` Ts and whose input `x` holds what it reads.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dx)
            .arg(&scale)
            .arg(&mut out)
            .launch(WG)?
    };
    Ok(s.clone_dtoh(&out)?)
}

/// Values that reach every E4M3 rounding case once scaled: zeros of both signs, subnormals, halfway points,
/// the saturation edge and far beyond it, and random normals.
fn tile(n: usize, seed: u64) -> Vec<f32> {
    let mut inp = Inputs::seeded(seed);
    let mut v = inp.normal(64 * n, 0.0, 40.0);
    let edge = [
        0.0,
        -0.0,
        1e-3,
        -1e-3,
        0.0078125,
        0.013671875,
        448.0,
        464.0,
        480.0,
        -500.0,
        1e6,
        -1e9,
        3.5,
        5.25,
    ];
    for (i, e) in edge.iter().enumerate() {
        v[i * 7 % (64 * n)] = *e;
    }
    v
}

/// Differences between the device's A words and the model's, named by thread, step and register.
fn acc_to_a_diff(
    gpu: &Gpu,
    spec: &KernelSpec,
    n: usize,
    seed: u64,
    scale: f32,
    order: KeyOrder,
) -> Result<Vec<String>> {
    let p = tile(n, seed);
    // acc_to_a(const float* in[64][n], float scale, unsigned* out[128][n/32][4]).
    let got = in_scale_out(gpu, spec, &p, scale, vec![0xDEAD_BEEFu32; 128 * n / 32 * 4])?;
    let want = a_words_in(&p, n, scale, order);
    let steps = n / 32;
    Ok(got
        .iter()
        .zip(&want)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| {
            format!(
                "thread {} step {} a[{}] = {g:#010x}, want {w:#010x}",
                i / (4 * steps),
                i / 4 % steps,
                i % 4
            )
        })
        .collect())
}

fn transpose_diff(
    gpu: &Gpu,
    spec: &KernelSpec,
    rows: usize,
    cols: usize,
    dst: frag_layout::Swizzle,
    seed: u64,
    order: KeyOrder,
) -> Result<usize> {
    let mut inp = Inputs::seeded(seed);
    let src: Vec<u8> = inp
        .integers(rows * cols, 0, 255)
        .into_iter()
        .map(|v| v as u8)
        .collect();
    let want = transposed_in(&src, rows, cols, dst, 0xCD, order);
    tile_diff(gpu, spec, &src, &want)
}

/// A one-warpgroup transpose kernel `(const u8* in, u8* out)` with 128 KiB of shared memory (V's and Vᵀ's tiles, at
/// most 32 KiB each) run on `src`: the bytes of its output that differ from `want` (an output of want's size).
fn tile_diff(gpu: &Gpu, spec: &KernelSpec, src: &[u8], want: &[u8]) -> Result<usize> {
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let din = s.clone_htod(src)?;
    let mut out = s.clone_htod(&vec![0u8; want.len()])?;
    let cfg = LaunchConfig {
        shared_mem_bytes: 4 * 32768,
        ..WG
    };
    k.func.set_attribute(
        lab::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        4 * 32768,
    )?;
    // SAFETY: the kernel reads src's bytes and writes want.len() bytes of out; one warpgroup, the shared memory above.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&din)
            .arg(&mut out)
            .launch(cfg)?
    };
    let got = s.clone_dtoh(&out)?;
    Ok(got.iter().zip(want).filter(|(g, w)| g != w).count())
}

/// TransposeLdsm's kernel on a random V tile against the model's Vᵀ (keys in p_key order): bytes that differ. The
/// model's emulation of the instructions (LdsmTile::emulate) is checked against the same expectation on the CPU.
fn ldsm_diff(gpu: &Gpu, spec: &KernelSpec, tile: &LdsmTile, seed: u64) -> Result<usize> {
    let (rows, cols) = (tile.rows as usize, tile.cols as usize);
    let mut inp = Inputs::seeded(seed);
    let v: Vec<u8> = inp
        .integers(rows * cols, 0, 255)
        .into_iter()
        .map(|x| x as u8)
        .collect();
    let want = ldsm_expected(tile, &v, 0xCD);
    ensure!(
        tile.emulate(&tile.src_image(&v), 0xCD) == want,
        "the model's emulation disagrees with its expectation"
    );
    tile_diff(gpu, spec, &v, &want)
}

/// O = P·V through the relayouts and wgmma, against the exact product: wrong cells.
fn pv_wrong(gpu: &Gpu, keys: usize, d: usize, spec: &KernelSpec, seed: u64) -> Result<usize> {
    let mut inp = Inputs::seeded(seed);
    // Integer P and V, so that O = P·V is exact in f32 and in the output type (|O| ≤ 256 for bf16).
    let p = inp.integers(
        64 * keys,
        0,
        if spec.name.ends_with("bf16") { 1 } else { 2 },
    );
    let v = inp.integers(keys * d, -2, 2);
    let v8: Vec<u8> = v
        .iter()
        .map(|&x| fp8_codec::encode(x, fp8_codec::Saturation::SatFinite, fp8_codec::Format::E4M3))
        .collect();
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let (dp, dv) = (s.clone_htod(&p)?, s.clone_htod(&v8)?);
    let mut o = s.clone_htod(&vec![0xFFFFu16; 64 * d])?;
    let cfg = LaunchConfig {
        shared_mem_bytes: 3 * 16384 + 1024,
        ..WG
    };
    k.func.set_attribute(
        lab::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        3 * 16384 + 1024,
    )?;
    // SAFETY: pv(const float* p[64][keys], const u8* v[keys][d], T* o[64][d]); T is 16-bit.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dp)
            .arg(&dv)
            .arg(&mut o)
            .launch(cfg)?
    };
    let got = s.clone_dtoh(&o)?;
    let bf = spec.name.ends_with("bf16");
    let mut wrong = 0;
    for r in 0..64 {
        for c in 0..d {
            let want: f32 = (0..keys).map(|kk| p[r * keys + kk] * v[kk * d + c]).sum();
            let g = if bf {
                bf16::from_bits(got[r * d + c]).to_f32()
            } else {
                f16::from_bits(got[r * d + c]).to_f32()
            };
            wrong += (g != want) as usize;
        }
    }
    Ok(wrong)
}

fn store_diff(gpu: &Gpu, spec: &KernelSpec, n: usize, valid: i32, seed: u64) -> Result<usize> {
    let mut inp = Inputs::seeded(seed);
    let x = inp.normal(64 * n, 0.0, 3.0);
    let scale = 0.37f32;
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let dx = s.clone_htod(&x)?;
    // Outputs as 32-bit words (f32) or 16-bit ones (bf16, f16); untouched rows keep the all-ones fill.
    let wide = spec.name.ends_with("f32");
    let mut o = s.clone_htod(&vec![0xFFFF_FFFFu32; 64 * n / if wide { 1 } else { 2 }])?;
    // SAFETY: store(const float* in[64][n], float scale, T* out[64][n], int valid_rows); the buffer holds 64·n Ts.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dx)
            .arg(&scale)
            .arg(&mut o)
            .arg(&valid)
            .launch(WG)?
    };
    let words = s.clone_dtoh(&o)?;
    let got: Vec<u32> = if wide {
        words
    } else {
        words.iter().flat_map(|w| [w & 0xFFFF, w >> 16]).collect()
    };
    let mut wrong = 0;
    for (i, &g) in got.iter().enumerate() {
        let v = x[i] * scale;
        let want = if (i / n) as i32 >= valid {
            if wide { 0xFFFF_FFFF } else { 0xFFFF }
        } else if wide {
            v.to_bits()
        } else if spec.name.ends_with("bf16") {
            bf16::from_f32(v).to_bits() as u32
        } else {
            f16::from_f32(v).to_bits() as u32
        };
        wrong += (g != want) as usize;
    }
    Ok(wrong)
}

/// Elements of `spec`'s (store_grouped_n64_f16) output [⌈64 / group⌉][heads][64] f16 that differ from the model: row
/// r (< valid) of the 64 × 64 input times the scale at token r / group, head r % group; every other element keeps
/// the all-ones fill.
fn grouped_diff(
    gpu: &Gpu,
    spec: &KernelSpec,
    group: usize,
    heads: usize,
    valid: i32,
    seed: u64,
) -> Result<usize> {
    const N: usize = 64;
    let mut inp = Inputs::seeded(seed);
    let x = inp.normal(64 * N, 0.0, 3.0);
    let scale = 0.37f32;
    let tokens = 64usize.div_ceil(group);
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let dx = s.clone_htod(&x)?;
    let mut o = s.clone_htod(&vec![0xFFFFu16; tokens * heads * N])?;
    let (g, h) = (group as i32, heads as i32);
    // SAFETY: store_grouped_n64_f16(const float* in[64][64], float scale, __half* out[tokens][heads][64], int
    // valid_rows, int group, int heads): rows reach token ⌈64 / group⌉ − 1, head group − 1 < heads.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dx)
            .arg(&scale)
            .arg(&mut o)
            .arg(&valid)
            .arg(&g)
            .arg(&h)
            .launch(WG)?
    };
    let got = s.clone_dtoh(&o)?;
    let mut want = vec![0xFFFFu16; tokens * heads * N];
    for r in 0..(valid.max(0) as usize).min(64) {
        let at = ((r / group) * heads + r % group) * N;
        for c in 0..N {
            want[at + c] = f16::from_f32(x[r * N + c] * scale).to_bits();
        }
    }
    Ok(got.iter().zip(&want).filter(|(a, b)| a != b).count())
}

/// Bytes of `spec`'s staged panel (stage_panel through `stage`) that differ from staged_panel's.
fn stage_diff(gpu: &Gpu, spec: &KernelSpec, n: usize, panel: usize, seed: u64) -> Result<usize> {
    let mut inp = Inputs::seeded(seed);
    let x = inp.normal(64 * n, 0.0, 3.0);
    let scale = 0.37f32;
    // stage(const float* in[64][n], float scale, u8* out[8192]).
    let got = in_scale_out(gpu, spec, &x, scale, vec![0u8; 64 * 128])?;
    let want = if spec.name.ends_with("bf16") {
        staged_panel(&x, n, panel, [scale, 0.5 * scale], |v| {
            bf16::from_f32(v).to_bits()
        })
    } else {
        staged_panel(&x, n, panel, [scale, 0.5 * scale], |v| {
            f16::from_f32(v).to_bits()
        })
    };
    Ok(got.iter().zip(&want).filter(|(a, b)| a != b).count())
}

fn main() {
    let mut t = Suite::new();
    t.kernels(&kernels());
    lab::sass_snapshots!(t, &[ACC_TO_A[1].1, TRANSPOSES[1].4, PV[0].2]);
    t.compile("acc_to_a_local_has_no_shuffles", || {
        let (cubin, _) = ACC_TO_A_LOCAL.1.compile(lab::Arch::Sm90a)?;
        let h = lab::sass::histogram(&cubin, ACC_TO_A_LOCAL.1.name)?;
        ensure!(
            !h.contains_key("SHFL"),
            "SHFL in {}: {h:?}",
            ACC_TO_A_LOCAL.1.name
        );
        let (cubin, _) = ACC_TO_A[1].1.compile(lab::Arch::Sm90a)?;
        let h = lab::sass::histogram(&cubin, ACC_TO_A[1].1.name)?;
        ensure!(
            h.get("SHFL") == Some(&32),
            "the shuffling form: {:?} SHFL",
            h.get("SHFL")
        );
        Ok(())
    });
    let orders = ACC_TO_A.map(|x| (x, KeyOrder::InOrder));
    for ((n, spec), order) in orders
        .into_iter()
        .chain([(ACC_TO_A_LOCAL, KeyOrder::Local)])
    {
        t.gpu(&format!("acc_to_a_e4m3::{}", spec.name), move |gpu| {
            for (seed, scale) in [(0, 1.0), (1, 3.0), (2, 0.125), (3, 11.0)] {
                let d = acc_to_a_diff(gpu, &spec, n as usize, seed, scale, order)?;
                ensure!(
                    d.is_empty(),
                    "seed {seed} scale {scale}: {} words differ, e.g. {}",
                    d.len(),
                    d[..d.len().min(4)].join("; ")
                );
            }
            eprintln!(
                "acc_to_a_e4m3 n{n}: {} words bit-exact × 4 inputs",
                128 * n / 32 * 4
            );
            Ok(())
        });
    }
    let transposes = TRANSPOSES.map(|x| (x, KeyOrder::InOrder));
    for ((rows, cols, src, dst, spec), order) in transposes
        .into_iter()
        .chain([(TRANSPOSE_LOCAL, KeyOrder::Local)])
        .chain(TRANSPOSES_LEAN.map(|x| (x, KeyOrder::Local)))
    {
        t.gpu(&format!("transpose::{}", spec.name), move |gpu| {
            let _ = src;
            for seed in 0..3 {
                let bad =
                    transpose_diff(gpu, &spec, rows as usize, cols as usize, dst, seed, order)?;
                ensure!(
                    bad == 0,
                    "seed {seed}: {bad} bytes of the transposed tile differ"
                );
            }
            Ok(())
        });
    }
    for (tile, _, spec) in TRANSPOSES_LDSM {
        t.gpu(&format!("transpose::{}", spec.name), move |gpu| {
            for seed in 0..3 {
                let bad = ldsm_diff(gpu, &spec, &tile, seed)?;
                ensure!(
                    bad == 0,
                    "seed {seed}: {bad} bytes of the transposed tile differ"
                );
            }
            Ok(())
        });
    }
    // Plausible bugs of TransposeLdsm, each a source edit the tests must catch: (name, tile, from, to, what).
    let ldsm_mutants: [(&str, usize, &str, &str, &str); 3] = [
        (
            // Every lane's even channel in the even matrix: rows 4–7 of each matrix get their neighbour's channel.
            "ldsm_selectors_not_swapped",
            0,
            "lane < 16 ? 0x6420u : 0x7531u",
            "0x6420u",
            "unswapped selectors",
        ),
        (
            // Channels 16–31: keys 8–15 put where 0–7 belong, so P's slots would meet the wrong keys of V.
            "ldsm_key_halves_swapped",
            1,
            "w[2] = __byte_perm(r[j][2], r[j][3], sel0);",
            "w[2] = __byte_perm(r[j][3], r[j][2], sel0);",
            "swapped key halves",
        ),
        (
            // Vᵀ's 16-byte chunks left in place (no XOR with the row's swizzle): wgmma would read other keys.
            "ldsm_dst_unswizzled",
            0,
            "(((k % (kWd / 16u)) ^ dx) << 4)",
            "((k % (kWd / 16u)) << 4)",
            "an unswizzled Vᵀ",
        ),
    ];
    for (name, at, from, to, what) in ldsm_mutants {
        t.gpu(&format!("mutant::{name}"), move |gpu| {
            let (tile, _, spec) = TRANSPOSES_LDSM[at];
            let bad = spec.mutated("fp8_relayout.cuh", from, to)?;
            let n = ldsm_diff(gpu, &bad, &tile, 0)?;
            ensure!(n > 0, "{what} went unnoticed");
            eprintln!("{what}: {n} bytes differ");
            Ok(())
        });
    }
    t.gpu("mutant::ldsm_last_key_block_skipped", |gpu| {
        // A key block too few (the loop bound off by one): its 4 units, 2 KiB, keep the fill.
        let (tile, _, spec) = TRANSPOSES_LDSM[4];
        let bad = spec.mutated(
            "fp8_relayout.cuh",
            "for (int kb = warp; kb < ROWS / 16; kb += WARPS)",
            "for (int kb = warp; kb < ROWS / 16 - 1; kb += WARPS)",
        )?;
        let n = ldsm_diff(gpu, &bad, &tile, 0)?;
        ensure!(
            n > 0 && n <= 2048,
            "a skipped key block must leave at most its 2048 bytes wrong, and some: {n}"
        );
        Ok(())
    });
    t.gpu("store_rows::bf16_f16_f32_with_tails", |gpu| {
        for valid in [64, 63, 17, 1] {
            ensure!(
                store_diff(gpu, &STORE_F32, 64, valid, 7)? == 0,
                "f32, {valid} rows"
            );
            ensure!(
                store_diff(gpu, &STORE_BF16, 128, valid, 5)? == 0,
                "bf16, {valid} rows"
            );
            ensure!(
                store_diff(gpu, &STORE_F16, 64, valid, 6)? == 0,
                "f16, {valid} rows"
            );
        }
        Ok(())
    });
    t.gpu("store_rows::grouped_rows_of_packed_heads", |gpu| {
        // Groups of 1 (plain rows, ld = heads·64), 4 and 8 query heads a K/V head, in an O of as many heads as a
        // group or four times more, with tails.
        for (group, heads) in [(1, 1), (1, 3), (4, 4), (4, 16), (8, 32)] {
            for valid in [64, 63, 17, 1] {
                let bad = grouped_diff(gpu, &STORE_GROUPED_F16, group, heads, valid, 9)?;
                ensure!(
                    bad == 0,
                    "group {group}, {heads} heads, {valid} rows: {bad} elements wrong"
                );
            }
        }
        Ok(())
    });
    t.gpu("mutant::grouped_rows_member_and_group_swapped", |gpu| {
        let bad = STORE_GROUPED_F16.mutated(
            "fp8_relayout.cuh",
            "(r / group) * ld_outer + (r % group) * ld_inner",
            "(r % group) * ld_outer + (r / group) * ld_inner",
        )?;
        let n = grouped_diff(gpu, &bad, 4, 16, 64, 9)?;
        ensure!(n > 0, "rows with member and group swapped went unnoticed");
        eprintln!("member and group swapped: {n} elements wrong");
        Ok(())
    });
    for (keys, d, spec) in PV {
        t.gpu(&format!("pv_exact::{}", spec.name), move |gpu| {
            for seed in 0..4 {
                let bad = pv_wrong(gpu, keys, d, &spec, seed)?;
                ensure!(
                    bad == 0,
                    "seed {seed}: {bad} of {} cells of O = P·V wrong",
                    64 * d
                );
            }
            Ok(())
        });
    }
    t.gpu("mutant::byte_permute_halves_swapped", |gpu| {
        let bad = ACC_TO_A[1].1.mutated(
            "fp8_relayout.cuh",
            "(q >> 1) ? 0x7632u : 0x5410u",
            "(q >> 1) ? 0x5410u : 0x7632u",
        )?;
        let d = acc_to_a_diff(gpu, &bad, 128, 0, 1.0, KeyOrder::InOrder)?;
        ensure!(!d.is_empty(), "swapped byte-permute halves went unnoticed");
        eprintln!("swapped halves: {} words differ", d.len());
        Ok(())
    });
    t.gpu("mutant::shuffle_from_the_wrong_lane", |gpu| {
        let bad = ACC_TO_A[1]
            .1
            .mutated("fp8_relayout.cuh", "src1 = src0 + 1;", "src1 = src0;")?;
        let d = acc_to_a_diff(gpu, &bad, 128, 0, 1.0, KeyOrder::InOrder)?;
        ensure!(
            !d.is_empty(),
            "reading both halves from one lane went unnoticed"
        );
        Ok(())
    });
    t.gpu("mutant::transpose_byte_order", |gpu| {
        let (rows, cols, _, dst, spec) = TRANSPOSES[1];
        let bad = spec.mutated(
            "fp8_relayout.cuh",
            "__byte_perm(w[0], w[1], 0x5140)",
            "__byte_perm(w[0], w[1], 0x4150)",
        )?;
        let n = transpose_diff(
            gpu,
            &bad,
            rows as usize,
            cols as usize,
            dst,
            0,
            KeyOrder::InOrder,
        )?;
        ensure!(n > 0, "a wrong transpose permute went unnoticed");
        Ok(())
    });
    t.gpu("mutant::lean_rotation_not_undone", |gpu| {
        // The stores' channel left unrotated while the permutes rotate: channels land in each other's rows.
        let (rows, cols, _, dst, spec) = TRANSPOSES_LEAN[0];
        let bad = spec.mutated(
            "fp8_relayout.cuh",
            "const unsigned c4 = 4 * g + (i + rot) % 4;",
            "const unsigned c4 = 4 * g + i;",
        )?;
        let n = transpose_diff(
            gpu,
            &bad,
            rows as usize,
            cols as usize,
            dst,
            0,
            KeyOrder::Local,
        )?;
        ensure!(n > 0, "an unrotated store went unnoticed");
        eprintln!("unrotated stores: {n} bytes differ");
        Ok(())
    });
    t.gpu("mutant::local_pack_pair_swapped", |gpu| {
        let bad = ACC_TO_A_LOCAL.1.mutated(
            "fp8_relayout.cuh",
            "e4m3x2(acc[i + 4] * scale, acc[i + 5] * scale)",
            "e4m3x2(acc[i + 5] * scale, acc[i + 4] * scale)",
        )?;
        let d = acc_to_a_diff(gpu, &bad, 128, 0, 1.0, KeyOrder::Local)?;
        ensure!(
            !d.is_empty(),
            "a swapped key pair in the local A went unnoticed"
        );
        Ok(())
    });
    t.gpu("mutant::p_key_pairs_swapped", |gpu| {
        // V's keys in an order P does not have: the product must be wrong (the model's p_key is its own copy).
        let (keys, d, spec) = PV[3];
        let bad = spec.mutated("fp8_relayout.cuh", "+ slot % 2;", "+ (slot + 1) % 2;")?;
        ensure!(
            pv_wrong(gpu, keys, d, &bad, 0)? > 0,
            "V keys out of P's order went unnoticed"
        );
        Ok(())
    });
    for (n, panel, spec) in STAGE_PANEL {
        t.gpu(&format!("stage_panel::{}", spec.name), move |gpu| {
            // Every byte of the 8 KiB image, as a TMA box with the 128-byte swizzle holds it.
            for seed in 0..2 {
                let bad = stage_diff(gpu, &spec, n, panel, seed)?;
                ensure!(
                    bad == 0,
                    "seed {seed}: {bad} bytes of the staged panel differ"
                );
            }
            Ok(())
        });
    }
    t.gpu("mutant::stage_panel_unswizzled", |gpu| {
        // The 16-byte chunks left in place (no XOR with the row): each row's chunks land where another's belong.
        let (n, panel, spec) = STAGE_PANEL[0];
        let bad = spec.mutated(
            "fp8_relayout.cuh",
            "((col_byte / 16) ^ (row % 8))",
            "(col_byte / 16)",
        )?;
        let wrong = stage_diff(gpu, &bad, n, panel, 0)?;
        ensure!(wrong > 0, "an unswizzled staging panel went unnoticed");
        eprintln!("unswizzled panel: {wrong} bytes differ");
        Ok(())
    });
    t.gpu("mutant::store_row_mask_off_by_one", |gpu| {
        let bad = STORE_BF16.mutated(
            "fp8_relayout.cuh",
            "if (row < valid_rows)",
            "if (row <= valid_rows)",
        )?;
        ensure!(
            store_diff(gpu, &bad, 128, 17, 5)? > 0,
            "writing one row too many went unnoticed"
        );
        Ok(())
    });
    t.run()
}
