// Stage 8 over packed (variable-length) batches: every sequence's O and LSE bit for bit as stage 8 gives it alone.
use crate::prelude::*;
use composed::ragged::validate_cu_seqlens;
use composed::{Varlen, VarlenShape, VarlenTensors};
use half::f16;
use lab::cudarc::driver::DevicePtr;

/// A batch: each sequence's (Sq, Sk), H, Hkv, D, causal.
type Case = (&'static str, Vec<(usize, usize)>, usize, usize, usize, bool);

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
        ),
        (
            "prefill_causal_gqa_d128",
            vec![(224, 224), (225, 225), (700, 700), (5, 5), (450, 450)],
            8,
            2,
            128,
            true,
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
        ),
        // Decode-like: 1–16 queries over long keys, grouped heads.
        (
            "decode_like_d64",
            vec![(1, 3000), (16, 777), (4, 4096), (1, 1)],
            8,
            2,
            64,
            false,
        ),
    ]
}

/// [1, H, S, D] (one sequence, row-major) into packed [total, H, D] rows starting at `row0`.
fn pack(dst: &mut [u8], src: &[u8], h: usize, s: usize, d: usize, row0: usize) {
    for hi in 0..h {
        for si in 0..s {
            let from = (hi * s + si) * d;
            let to = ((row0 + si) * h + hi) * d;
            dst[to..to + d].copy_from_slice(&src[from..from + d]);
        }
    }
}

pub fn add(t: &mut Suite) {
    for (name, lens, h, hkv, d, causal) in cases() {
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
                let shape = Shape::cross(1, h, sq, sk, d).with_kv_heads(hkv)?.with_causal(causal);
                let qz = quantize_per_head(&normal(shape, 101 + i as u64));
                pack(&mut q, &qz.q, h, sq, d, cu_q[i] as usize);
                pack(&mut k, &qz.k, hkv, sk, d, cu_k[i] as usize);
                pack(&mut v, &qz.v, hkv, sk, d, cu_k[i] as usize);
                qs[i * h..(i + 1) * h].copy_from_slice(&qz.q_scale);
                ks[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.k_scale);
                vs[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.v_scale);
                alone.push(Some(run_as(gpu, Stage::S8, &qz, OutDtype::F16)?));
            }
            let up8 = |x: &[u8]| st.clone_htod(if x.is_empty() { &[0u8][..] } else { x });
            let (dq, dk, dv) = (up8(&q)?, up8(&k)?, up8(&v)?);
            let (dqs, dks, dvs) = (st.clone_htod(&qs)?, st.clone_htod(&ks)?, st.clone_htod(&vs)?);
            let o = st.clone_htod(&lab::numerics::poisoned::<f16>(tq * h * d))?;
            let lse = st.clone_htod(&lab::numerics::poisoned::<f32>(h * tq))?;
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
            };
            let shape = VarlenShape { batch, h, hkv, d, total_q: tq, total_k: tk, causal };
            let mut vl = Varlen::new();
            let scale = 1.0 / (d as f32).sqrt();
            for launch in 0..2 {
                vl.launch(gpu, &st, &shape, scale, OutDtype::F16, &tensors)?;
                let (o_h, l_h) = (st.clone_dtoh(&o)?, st.clone_dtoh(&lse)?);
                for (i, a) in alone.iter().enumerate() {
                    let Some(a) = a else { continue };
                    let sq = lens[i].0;
                    for hi in 0..h {
                        for r in 0..sq {
                            let row = cu_q[i] as usize + r;
                            let got_l = l_h[hi * tq + row];
                            let want_l = a.lse[hi * sq + r];
                            ensure!(
                                got_l.to_bits() == want_l.to_bits(),
                                "{name}, launch {launch}: sequence {i} head {hi} row {r}: LSE {got_l} where alone {want_l}"
                            );
                            let at = (row * h + hi) * d;
                            for c in 0..d {
                                let got = o_h[at + c].to_f32();
                                let want = a.o[(hi * sq + r) * d + c];
                                ensure!(
                                    got.to_bits() == want.to_bits(),
                                    "{name}, launch {launch}: sequence {i} head {hi} row {r} column {c}: O {got} where alone {want}"
                                );
                            }
                        }
                    }
                }
            }
            eprintln!("varlen {name}: {batch} sequences, every O and LSE bit as each sequence alone, twice");
            Ok(())
        });
    }
}
