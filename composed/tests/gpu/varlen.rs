// Stage 8 over packed (variable-length) batches: every sequence's O and LSE bit for bit as stage 8 gives it alone.
use crate::prelude::*;
use composed::ragged::validate_cu_seqlens;
use composed::{PagedKv, Varlen, VarlenShape, VarlenTensors};
use fixtures::Window;
use half::f16;
use lab::cudarc::driver::{CudaSlice, DevicePtr};

/// A batch: each sequence's (Sq, Sk), H, Hkv, D, causal, a sliding window (per sequence).
type Case = (
    &'static str,
    Vec<(usize, usize)>,
    usize,
    usize,
    usize,
    bool,
    Window,
);

fn window(left: Option<usize>, right: Option<usize>) -> Window {
    Window { left, right }
}

fn cases() -> Vec<Case> {
    vec![
        // Prefill lengths across tile edges (1, 127, 128, 129, 224, 225, 1000), Sq = Sk, D = 64 and 128.
        (
            "prefill_d64",
            vec![
                (1, 1),
                (127, 127),
                (128, 128),
                (129, 129),
                (1000, 1000),
                (300, 300),
            ],
            4,
            4,
            64,
            false,
            Window::NONE,
        ),
        (
            "prefill_causal_gqa_d128",
            vec![(224, 224), (225, 225), (700, 700), (5, 5), (450, 450)],
            8,
            2,
            128,
            true,
            Window::NONE,
        ),
        // A cached prefix: new tokens onto longer key sequences (Sq < Sk), causal bottom-right per sequence; a
        // sequence with no queries in the middle.
        (
            "prefix_causal_d128",
            vec![(512, 2048), (100, 1000), (0, 300), (129, 130), (16, 4000)],
            4,
            1,
            128,
            true,
            Window::NONE,
        ),
        // Decode-like: 1–16 queries over long keys, grouped heads.
        (
            "decode_like_d64",
            vec![(1, 3000), (16, 777), (4, 4096), (1, 1)],
            8,
            2,
            64,
            false,
            Window::NONE,
        ),
        // Decode with 8 query heads a K/V head (packed 8 ways: 16 tokens a unit), causal, a sequence of one key and one
        // with no queries.
        (
            "decode_gqa8_causal_d128",
            vec![(1, 8192), (3, 5000), (16, 300), (1, 1), (0, 50), (9, 129)],
            16,
            2,
            128,
            true,
            Window::NONE,
        ),
        // Under sliding windows, per sequence: a left window with causal grouped heads, and both sides over a cached
        // prefix (units start past key tile 0; a sequence with no queries).
        (
            "prefill_window_causal_gqa_d128",
            vec![(224, 224), (225, 225), (700, 700), (5, 5), (450, 450)],
            8,
            2,
            128,
            true,
            window(Some(100), None),
        ),
        (
            "prefix_window_d64",
            vec![(512, 2048), (100, 1000), (0, 300), (129, 130), (16, 4000)],
            4,
            1,
            64,
            false,
            window(Some(300), Some(20)),
        ),
    ]
}

/// Every sequence's rows of a packed batch's O (`o_h`, [total_q, H, D]) and LSE (`l_h`, [H, total_q]) bit for bit its
/// result alone (`alone[i]`, None for a sequence with no queries); `what` names the launch.
#[allow(clippy::too_many_arguments)]
fn each_as_alone(
    what: &str,
    lens: &[(usize, usize)],
    cu_q: &[i32],
    alone: &[Option<Attention<f32>>],
    h: usize,
    d: usize,
    o_h: &[f16],
    l_h: &[f32],
) -> Result<()> {
    let tq = *cu_q.last().expect("B + 1 boundaries") as usize;
    for (i, a) in alone.iter().enumerate() {
        let Some(a) = a else { continue };
        let sq = lens[i].0;
        for hi in 0..h {
            for r in 0..sq {
                let row = cu_q[i] as usize + r;
                let (got_l, want_l) = (l_h[hi * tq + row], a.lse[hi * sq + r]);
                ensure!(
                    got_l.to_bits() == want_l.to_bits(),
                    "{what}: sequence {i} head {hi} row {r}: LSE {got_l} where alone {want_l}"
                );
                let at = (row * h + hi) * d;
                for c in 0..d {
                    let (got, want) = (o_h[at + c].to_f32(), a.o[(hi * sq + r) * d + c]);
                    ensure!(
                        got.to_bits() == want.to_bits(),
                        "{what}: sequence {i} head {hi} row {r} column {c}: O {got} where alone {want}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// [1, H, S, D] (one sequence, row-major) into packed [total, H, D] rows starting at `row0`.
pub(crate) fn pack(dst: &mut [u8], src: &[u8], h: usize, s: usize, d: usize, row0: usize) {
    for hi in 0..h {
        for si in 0..s {
            let from = (hi * s + si) * d;
            let to = ((row0 + si) * h + hi) * d;
            dst[to..to + d].copy_from_slice(&src[from..from + d]);
        }
    }
}

/// Packed K and V rows ([total_k, Hkv·D bytes a row], sequence i's from cu_k[i]) in a paged cache: each sequence's keys
/// cut into pages of `page` rows (the last zero-padded), the pages shuffled through a pool with spare pages, the block
/// table [B][max_pages] (−1 past a sequence's pages). (the two pools, the table, max_pages, num_pages).
pub(crate) fn page_out(
    tensors: [&[u8]; 2],
    cu_k: &[i32],
    row_bytes: usize,
    page: usize,
    seed: u64,
) -> (Vec<Vec<u8>>, Vec<i32>, usize, usize) {
    let b = cu_k.len() - 1;
    let pages_of = |i: usize| ((cu_k[i + 1] - cu_k[i]) as usize).div_ceil(page);
    let max_pages = (0..b).map(pages_of).max().unwrap_or(0).max(1);
    let used: usize = (0..b).map(pages_of).sum();
    let num_pages = used + 3;
    // A permutation of the pool's pages (a fixed LCG shuffle): sequence pages land anywhere, spares between.
    let mut ids: Vec<usize> = (0..num_pages).collect();
    let mut x = seed | 1;
    for i in (1..num_pages).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ids.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut table = vec![-1i32; b * max_pages];
    let mut pools = vec![vec![0u8; num_pages * page * row_bytes]; 2];
    let mut next = 0;
    for i in 0..b {
        let (k0, sk) = (cu_k[i] as usize, (cu_k[i + 1] - cu_k[i]) as usize);
        for j in 0..pages_of(i) {
            let id = ids[next];
            next += 1;
            table[i * max_pages + j] = id as i32;
            let rows = page.min(sk - j * page);
            for (t, pool) in tensors.iter().zip(pools.iter_mut()) {
                let src = &t[(k0 + j * page) * row_bytes..(k0 + j * page + rows) * row_bytes];
                pool[id * page * row_bytes..id * page * row_bytes + rows * row_bytes]
                    .copy_from_slice(src);
            }
        }
    }
    (pools, table, max_pages, num_pages)
}

pub fn add(t: &mut Suite) {
    for (name, lens, h, hkv, d, causal, win) in cases() {
        t.gpu(&format!("varlen::stage8::{name}::bits_of_each_sequence_alone"), move |gpu| {
            let st = gpu.stream.clone();
            let batch = lens.len();
            let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
            for &(a, b) in &lens {
                cu_q.push(cu_q.last().unwrap() + a as i32);
                cu_k.push(cu_k.last().unwrap() + b as i32);
            }
            let (tq, tk) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
            validate_cu_seqlens("cu_seqlens_q", &cu_q, batch, tq)?;
            validate_cu_seqlens("cu_seqlens_k", &cu_k, batch, tk)?;
            // Each sequence its own problem, quantized per (sequence, head); packed into the batch's tensors.
            let (mut q, mut k, mut v) = (vec![0u8; tq * h * d], vec![0u8; tk * hkv * d], vec![0u8; tk * hkv * d]);
            let (mut qs, mut ks, mut vs) = (vec![1f32; batch * h], vec![1f32; batch * hkv], vec![1f32; batch * hkv]);
            let mut alone = vec![];
            for (i, &(sq, sk)) in lens.iter().enumerate() {
                if sq == 0 {
                    alone.push(None);
                    continue;
                }
                let shape = Shape::cross(1, h, sq, sk, d)
                    .with_kv_heads(hkv)?
                    .with_causal(causal)
                    .with_window(win);
                let qz = quantize_per_head(&normal(shape, 101 + i as u64));
                pack(&mut q, &qz.q, h, sq, d, cu_q[i] as usize);
                pack(&mut k, &qz.k, hkv, sk, d, cu_k[i] as usize);
                pack(&mut v, &qz.v, hkv, sk, d, cu_k[i] as usize);
                qs[i * h..(i + 1) * h].copy_from_slice(&qz.q_scale);
                ks[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.k_scale);
                vs[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.v_scale);
                alone.push(Some(run_whole(gpu, Stage::S8, &qz, OutDtype::F16)?));
            }
            let up8 = |x: &[u8]| st.clone_htod(if x.is_empty() { &[0u8][..] } else { x });
            let (dq, dk, dv) = (up8(&q)?, up8(&k)?, up8(&v)?);
            let (dqs, dks, dvs) = (st.clone_htod(&qs)?, st.clone_htod(&ks)?, st.clone_htod(&vs)?);
            let mut o = st.clone_htod(&lab::numerics::poisoned::<f16>(tq * h * d))?;
            let mut lse = st.clone_htod(&lab::numerics::poisoned::<f32>(h * tq))?;
            let (dcq, dck) = (st.clone_htod(&cu_q)?, st.clone_htod(&cu_k)?);
            let addr = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
            let (cq_at, ck_at) = (addr(dcq.device_ptr(&st)), addr(dck.device_ptr(&st)));
            let tensors = VarlenTensors {
                q: addr(dq.device_ptr(&st)),
                k: addr(dk.device_ptr(&st)),
                v: addr(dv.device_ptr(&st)),
                q_scale: addr(dqs.device_ptr(&st)),
                k_scale: addr(dks.device_ptr(&st)),
                v_scale: addr(dvs.device_ptr(&st)),
                o: addr(o.device_ptr(&st)),
                lse: addr(lse.device_ptr(&st)),
                cu_q: cq_at,
                cu_k: ck_at,
                strides: None,
                paged: None,
                one_scale: composed::OneScale::default(),
            };
            let shape = VarlenShape { batch, h, hkv, d, total_q: tq, total_k: tk, causal, window: win };
            let mut vl = Varlen::new();
            // Bit for bit each sequence alone: no split-KV (its parts merge to other bits; tests/gpu/split_kv.rs).
            vl.split_kv(false);
            let scale = 1.0 / (d as f32).sqrt();
            // Grouped heads packed into a unit's rows where they can be (composed::packs_heads): the same bits.
            let packings: &[bool] = if composed::packs_heads(&shape) { &[false, true] } else { &[false] };
            for &pack in packings {
                vl.pack_heads(pack);
                let how = if pack { ", heads packed" } else { "" };
                for launch in 0..2 {
                    st.memcpy_htod(&lab::numerics::poisoned::<f16>(tq * h * d), &mut o)?;
                    st.memcpy_htod(&lab::numerics::poisoned::<f32>(h * tq), &mut lse)?;
                    vl.launch(gpu, &st, &shape, scale, OutDtype::F16, &tensors)?;
                    let (o_h, l_h) = (st.clone_dtoh(&o)?, st.clone_dtoh(&lse)?);
                    each_as_alone(&format!("{name}{how}, launch {launch}"), &lens, &cu_q, &alone, h, d, &o_h, &l_h)?;
                }
                // The same keys in a paged cache (shuffled pages of 16, 64 and 256 rows): the same bits.
                for page in [16usize, 64, 256] {
                    let (pools, table, max_pages, num_pages) = page_out([&k, &v], &cu_k, hkv * d, page, page as u64);
                    let (pk, pv) = (st.clone_htod(&pools[0])?, st.clone_htod(&pools[1])?);
                    let dt = st.clone_htod(&table)?;
                    let paged_t = VarlenTensors {
                        k: addr(pk.device_ptr(&st)),
                        v: addr(pv.device_ptr(&st)),
                        paged: Some(PagedKv {
                            block_table: addr(dt.device_ptr(&st)),
                            max_pages,
                            page_size: page,
                            num_pages,
                        }),
                        ..tensors
                    };
                    // Poisoned again: every element must come from the paged launch.
                    st.memcpy_htod(&lab::numerics::poisoned::<f16>(tq * h * d), &mut o)?;
                    st.memcpy_htod(&lab::numerics::poisoned::<f32>(h * tq), &mut lse)?;
                    vl.launch(gpu, &st, &shape, scale, OutDtype::F16, &paged_t)?;
                    let (o_h, l_h) = (st.clone_dtoh(&o)?, st.clone_dtoh(&lse)?);
                    each_as_alone(&format!("{name}{how}, pages of {page}"), &lens, &cu_q, &alone, h, d, &o_h, &l_h)?;
                }
            }
            eprintln!(
                "varlen {name}: {batch} sequences, every O and LSE bit as each sequence alone, twice, and from pages of \
                 16, 64 and 256{}",
                if packings.len() > 1 { "; the same with the heads packed" } else { "" }
            );
            Ok(())
        });
    }
    t.gpu(
        "varlen::stage8::mutants_of_packed_heads_are_caught",
        |gpu| {
            // Decode-like causal batch, 4 query heads a K/V head, each query head its own scale: the packed launch gives the
            // unpacked one's bits, and each mutant of the packing other bits.
            let (h, hkv, d) = (8, 2, 64);
            let qs: Vec<f32> = (0..3 * h).map(|i| 0.01 * (1.0 + 0.1 * i as f32)).collect();
            let mut c = Codes::new(
                gpu,
                &[(1, 3000), (16, 777), (5, 200)],
                [h, hkv, d],
                9,
                qs,
                0.012,
            )?;
            let vs = c.shape(true);
            let t = c.tensors(&gpu.stream);
            let mut vl = Varlen::new();
            let good = c.run(gpu, &mut vl, &vs, &t)?;
            vl.pack_heads(true);
            ensure!(
                c.run(gpu, &mut vl, &vs, &t)? == good,
                "packed heads give other bits than unpacked"
            );
            for (what, header, from, to) in [
                (
                    "each row's causal limit from its head, not its token",
                    "pingpong_attention.cuh",
                    "const int tok = PACK ? row / p.group : row;",
                    "const int tok = PACK ? row % p.group : row;",
                ),
                (
                    "a token's heads all at its group's first head's Q scale",
                    "ragged_units.cuh",
                    "scale_at(one, kOneQ, u.bh + row % p.group)",
                    "scale_at(one, kOneQ, u.bh)",
                ),
            ] {
                vl.use_kernel(Some(
                    composed::varlen_pack_kernel(d).mutated(header, from, to)?,
                ));
                ensure!(
                    c.run(gpu, &mut vl, &vs, &t)? != good,
                    "mutant `{what}` went unnoticed"
                );
                eprintln!("mutant `{what}` caught");
            }
            Ok(())
        },
    );
    t.gpu(
        "varlen::stage8::one_scale_for_the_batch",
        one_scale_for_the_batch,
    );
    t.gpu("varlen::stage8::mutants_of_paged_tiles_are_caught", |gpu| {
        // Every box of a paged key tile written over its first rows (the box's place in the tile dropped: the
        // tile's other rows keep what was there), or a tile's boxes loaded from the next tile's pages: O must
        // differ from the packed launch's.
        let (h, hkv, d) = (4, 4, 128);
        let st = gpu.stream.clone();
        let mut c = Codes::new(
            gpu,
            &[(300, 700), (129, 300)],
            [h, hkv, d],
            7,
            vec![0.01; 2 * h],
            0.01,
        )?;
        let vs = c.shape(false);
        let t = c.tensors(&st);
        let mut vl = Varlen::new();
        let good = c.run(gpu, &mut vl, &vs, &t)?;
        let (pools, table, max_pages, num_pages) =
            page_out([&c.qz.k, &c.qz.v], &c.cu_k, hkv * d, 64, 5);
        let (pk, pv, dt) = (
            st.clone_htod(&pools[0])?,
            st.clone_htod(&pools[1])?,
            st.clone_htod(&table)?,
        );
        let addr = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
        let pt = VarlenTensors {
            k: addr(pk.device_ptr(&st)),
            v: addr(pv.device_ptr(&st)),
            paged: Some(PagedKv {
                block_table: addr(dt.device_ptr(&st)),
                max_pages,
                page_size: 64,
                num_pages,
            }),
            ..t
        };
        ensure!(
            c.run(gpu, &mut vl, &vs, &pt)? == good,
            "the paged launch differs from the packed one"
        );
        for (what, from, to) in [
            (
                "boxes written into one place",
                "dst + c * BC * PANEL + j * box * PANEL",
                "dst + c * BC * PANEL",
            ),
            (
                "a tile's boxes from the next tile's pages (the lookups taken one tile ahead)",
                "const int j = g + i, key = tile * BC + j * box;",
                "const int j = g + i, key = (tile + 1) * BC + j * box;",
            ),
        ] {
            vl.use_kernel(Some(composed::varlen_kernel(d).mutated(
                "ragged_units.cuh",
                from,
                to,
            )?));
            ensure!(
                c.run(gpu, &mut vl, &vs, &pt)? != good,
                "mutant `{what}` went unnoticed"
            );
            eprintln!("mutant `{what}` caught");
        }
        Ok(())
    });
}

/// A scale that is one value for the batch (`VarlenTensors::one_scale`, a per-tensor scale) gives the bits of the same
/// value expanded to every (sequence, head): each of Q's, K's and V's alone and all three, unpacked and with packed
/// heads, unsplit and split-KV (whose prep copies the scales into the virtual batch). Each one-value buffer holds decoys past
/// its first element, so a kernel that reads it per head writes other bits; two mutants of the index are caught.
fn one_scale_for_the_batch(gpu: &Gpu) -> Result<()> {
    use composed::OneScale;
    let (h, hkv, d) = (8, 2, 64);
    let (q1, k1, v1) = (0.011f32, 0.012f32, 0.0125f32);
    let lens = [(1, 3000), (16, 777), (5, 200), (1, 9000)];
    let b = lens.len();
    let st = gpu.stream.clone();
    let mut c = Codes::new(gpu, &lens, [h, hkv, d], 13, vec![q1; b * h], k1)?;
    let vs_full = st.clone_htod(&vec![v1; b * hkv])?;
    let decoy = |x: f32, n: usize| -> Result<CudaSlice<f32>> {
        let mut v: Vec<f32> = (0..n).map(|i| 2.0 + i as f32).collect();
        v[0] = x;
        Ok(st.clone_htod(&v)?)
    };
    let (dq, dk, dv) = (decoy(q1, b * h)?, decoy(k1, b * hkv)?, decoy(v1, b * hkv)?);
    let addr = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
    let full = VarlenTensors {
        v_scale: addr(vs_full.device_ptr(&st)),
        ..c.tensors(&st)
    };
    let one = |o: OneScale| VarlenTensors {
        q_scale: if o.q {
            addr(dq.device_ptr(&st))
        } else {
            full.q_scale
        },
        k_scale: if o.k {
            addr(dk.device_ptr(&st))
        } else {
            full.k_scale
        },
        v_scale: if o.v {
            addr(dv.device_ptr(&st))
        } else {
            full.v_scale
        },
        one_scale: o,
        ..full
    };
    let s = c.shape(true);
    let flags = [
        OneScale::ALL,
        OneScale {
            q: true,
            ..OneScale::default()
        },
        OneScale {
            k: true,
            ..OneScale::default()
        },
        OneScale {
            v: true,
            ..OneScale::default()
        },
    ];
    // Buffers of exactly one element too (under memcheck: nothing reads past them).
    let (sq1, sk1, sv1) = (
        st.clone_htod(&[q1])?,
        st.clone_htod(&[k1])?,
        st.clone_htod(&[v1])?,
    );
    let single = VarlenTensors {
        q_scale: addr(sq1.device_ptr(&st)),
        k_scale: addr(sk1.device_ptr(&st)),
        v_scale: addr(sv1.device_ptr(&st)),
        one_scale: OneScale::ALL,
        ..full
    };
    let mut each = |vl: &mut Varlen, what: &str| -> Result<Option<String>> {
        let good = c.run(gpu, vl, &s, &full)?;
        for f in flags {
            if c.run(gpu, vl, &s, &one(f))? != good {
                return Ok(Some(format!(
                    "{what}, one scale for {f:?}: other bits than the expanded scales"
                )));
            }
        }
        if c.run(gpu, vl, &s, &single)? != good {
            return Ok(Some(format!(
                "{what}, one-element buffers: other bits than the expanded scales"
            )));
        }
        Ok(None)
    };
    for (pack, split) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut vl = Varlen::new();
        vl.pack_heads(pack);
        vl.split_kv(split);
        if let Some(e) = each(&mut vl, &format!("packed heads {pack}, split-KV {split}"))? {
            anyhow::bail!(e);
        }
        ensure!(
            (vl.last_split() > 1) == split,
            "split-KV {split}: {} chunks",
            vl.last_split()
        );
    }
    // Mutants: every scale read per head whatever its bit (the attention's reads; split-KV's prep's copies).
    let (from, to) = ("return one & bit ? I(0) : i;", "return i;");
    let mut vl = Varlen::new();
    vl.split_kv(false);
    vl.use_kernel(Some(composed::varlen_pack_kernel(d).mutated(
        "ragged_units.cuh",
        from,
        to,
    )?));
    ensure!(
        each(&mut vl, "mutant")?.is_some(),
        "mutant `the attention ignores one_scale` went unnoticed"
    );
    let mut vl = Varlen::new();
    vl.use_split_kernels(
        Some(composed::split_kv::prep_kernel().mutated("ragged_units.cuh", from, to)?),
        None,
    );
    ensure!(
        each(&mut vl, "mutant")?.is_some(),
        "mutant `split-KV's prep ignores one_scale` went unnoticed"
    );
    eprintln!(
        "one scale for the batch: the expanded scales' bits in 4 configurations; 2 mutants caught"
    );
    Ok(())
}

/// A packed batch of random E4M3 codes on the device for the mutant tests: the boundaries of `lens` ((Sq, Sk) a
/// sequence), Q, K and V the codes of one [1, H, total, D] problem used as packed tensors (any codes do), Q's scales
/// `qs` (B · H) and one scale for every K and V head; O and the LSE poisoned before each launch.
struct Codes {
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    dims: [usize; 3],
    qz: fixtures::Quantized,
    bufs: [lab::cudarc::driver::CudaSlice<u8>; 3],
    scales: [lab::cudarc::driver::CudaSlice<f32>; 2],
    cu: [lab::cudarc::driver::CudaSlice<i32>; 2],
    o: lab::cudarc::driver::CudaSlice<f16>,
    lse: lab::cudarc::driver::CudaSlice<f32>,
}

impl Codes {
    fn new(
        gpu: &Gpu,
        lens: &[(usize, usize)],
        [h, hkv, d]: [usize; 3],
        seed: u64,
        qs: Vec<f32>,
        ks: f32,
    ) -> Result<Codes> {
        let st = &gpu.stream;
        let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
        for &(a, b) in lens {
            cu_q.push(cu_q.last().unwrap() + a as i32);
            cu_k.push(cu_k.last().unwrap() + b as i32);
        }
        let (tq, tk) = (
            *cu_q.last().unwrap() as usize,
            *cu_k.last().unwrap() as usize,
        );
        let qz = quantize_per_head(&normal(Shape::cross(1, h, tq, tk, d), seed));
        Ok(Codes {
            bufs: [
                st.clone_htod(&qz.q)?,
                st.clone_htod(&qz.k)?,
                st.clone_htod(&qz.v)?,
            ],
            scales: [
                st.clone_htod(&qs)?,
                st.clone_htod(&vec![ks; lens.len() * hkv])?,
            ],
            cu: [st.clone_htod(&cu_q)?, st.clone_htod(&cu_k)?],
            o: st.alloc_zeros::<f16>(tq * h * d)?,
            lse: st.alloc_zeros::<f32>(h * tq)?,
            cu_q,
            cu_k,
            dims: [h, hkv, d],
            qz,
        })
    }

    fn totals(&self) -> (usize, usize) {
        (
            *self.cu_q.last().unwrap() as usize,
            *self.cu_k.last().unwrap() as usize,
        )
    }

    fn shape(&self, causal: bool) -> VarlenShape {
        let ([h, hkv, d], (tq, tk)) = (self.dims, self.totals());
        VarlenShape {
            batch: self.cu_q.len() - 1,
            h,
            hkv,
            d,
            total_q: tq,
            total_k: tk,
            causal,
            window: fixtures::Window::NONE,
        }
    }

    fn tensors(&self, st: &std::sync::Arc<lab::cudarc::driver::CudaStream>) -> VarlenTensors {
        let addr = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
        VarlenTensors {
            q: addr(self.bufs[0].device_ptr(st)),
            k: addr(self.bufs[1].device_ptr(st)),
            v: addr(self.bufs[2].device_ptr(st)),
            q_scale: addr(self.scales[0].device_ptr(st)),
            k_scale: addr(self.scales[1].device_ptr(st)),
            v_scale: addr(self.scales[1].device_ptr(st)),
            o: addr(self.o.device_ptr(st)),
            lse: addr(self.lse.device_ptr(st)),
            cu_q: addr(self.cu[0].device_ptr(st)),
            cu_k: addr(self.cu[1].device_ptr(st)),
            strides: None,
            paged: None,
            one_scale: composed::OneScale::default(),
        }
    }

    /// One launch by `vl` of `s` over `t` (this batch's tensors, or its keys from elsewhere): O's and the LSE's bits.
    fn run(
        &mut self,
        gpu: &Gpu,
        vl: &mut Varlen,
        s: &VarlenShape,
        t: &VarlenTensors,
    ) -> Result<(Vec<u16>, Vec<u32>)> {
        let st = &gpu.stream;
        st.memcpy_htod(&lab::numerics::poisoned::<f16>(self.o.len()), &mut self.o)?;
        st.memcpy_htod(
            &lab::numerics::poisoned::<f32>(self.lse.len()),
            &mut self.lse,
        )?;
        vl.launch(gpu, st, s, 0.125, OutDtype::F16, t)?;
        Ok((
            st.clone_dtoh(&self.o)?
                .iter()
                .map(|x| x.to_bits())
                .collect(),
            st.clone_dtoh(&self.lse)?
                .iter()
                .map(|x| x.to_bits())
                .collect(),
        ))
    }
}
