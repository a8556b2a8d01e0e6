// The op on stage 8: one launch a call (V read as the caller has it), the lab's stage 8 bits, inputs read in place at any strides.
use anyhow::ensure;
use fixtures::{OutDtype, Raw, Shape, quantize_per_head};
use fp8_attention::{Attention, Config, Fp8, OutBuf, Packed, PagedCache, Real, Stage, Strides};
use lab::Suite;

use crate::{CASES, Inputs, forward, forward_strided, inputs, lab_path_on, same_bits};

/// [B, H, S, D] (row-major) as [B, S, H, D].
fn bshd(a: &[u8], b: usize, h: usize, s: usize, d: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let at = ((bi * h + hi) * s + si) * d;
                out.extend_from_slice(&a[at..at + d]);
            }
        }
    }
    out
}

/// `qz`'s codes on the device as [B, S, H, D] (its scales as they are).
fn bshd_inputs(
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    qz: &fixtures::Quantized,
) -> anyhow::Result<Inputs> {
    let s = qz.shape;
    inputs(
        st,
        &fixtures::Quantized {
            q: bshd(&qz.q, s.b, s.h, s.sq, s.d),
            k: bshd(&qz.k, s.b, s.hkv, s.sk, s.d),
            v: bshd(&qz.v, s.b, s.hkv, s.sk, s.d),
            ..qz.clone()
        },
    )
}

pub fn add(t: &mut Suite) {
    // The op's first three cases: the mission shape, causal GQA at D = 128, a split tail.
    for &(name, shape, hkv, causal, out) in &CASES[..3] {
        t.gpu(&format!("stage8::{name}::bits_of_the_lab_stage8"), move |gpu| {
            let s = shape.with_kv_heads(hkv)?.with_causal(causal);
            let qz = quantize_per_head(&Raw::random(s, 19, 1.0));
            let st = gpu.ctx.new_stream()?;
            let x = inputs(&st, &qz)?;
            let cfg = Config {
                causal,
                out_dtype: out,
                softmax_scale: None,
                window: fp8_attention::Window::NONE,
            };
            let mut op = Attention::with_stage(gpu, cfg, Stage::S8)?;
            ensure!(op.stage() == Stage::S8, "the op runs {}", op.stage().name());
            let got = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            ensure!(
                same_bits(&got, &lab_path_on(gpu, &qz, out, Stage::S8)?),
                "{name}: stage 8's op differs from the lab's stage 8 launch"
            );
            // [B, S, H, D] copies of the same codes, read in place through their strides.
            let o = forward_strided(&mut op, gpu, &st, s, &bshd_inputs(&st, &qz)?, Strides::bshd(&s))?;
            ensure!(
                same_bits(&o.to_host(&st)?, &got),
                "{name}: [B, S, H, D] inputs give other bits"
            );
            eprintln!(
                "{name}: stage 8's op gives the lab's stage 8 bits, from [B, H, S, D] and from [B, S, H, D]"
            );
            Ok(())
        });
    }
    t.gpu(
        "stage8::window::bits_of_the_lab_launch_and_refusals",
        |gpu| {
            // An op with a sliding window runs stage 8's windowed kernel (the default op picks stage 8 for any length under
            // a window): the lab's launch's bits. An op fixed on stage 7 refuses the window by name, before any launch.
            let st = gpu.ctx.new_stream()?;
            let w = fp8_attention::Window {
                left: Some(100),
                right: Some(0),
            };
            for (s, causal) in [
                (Shape::new(1, 4, 3000, 128), true),
                (Shape::cross(2, 2, 300, 500, 64), false),
            ] {
                let s = s.with_causal(causal).with_window(w);
                let qz = quantize_per_head(&Raw::random(s, 37, 1.0));
                let x = inputs(&st, &qz)?;
                let cfg = Config {
                    causal,
                    out_dtype: OutDtype::Bf16,
                    softmax_scale: None,
                    window: w,
                };
                let mut op = Attention::new(gpu, cfg)?;
                ensure!(
                    op.stage_for_call(&s) == Stage::S8,
                    "{s:?}: picks {}",
                    op.stage_for_call(&s).name()
                );
                let got = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
                ensure!(
                    same_bits(&got, &lab_path_on(gpu, &qz, OutDtype::Bf16, Stage::S8)?),
                    "{s:?}: the windowed op differs from the lab's stage 8 launch"
                );
            }
            let e = Attention::with_stage(
                gpu,
                Config {
                    window: w,
                    ..Config::default()
                },
                Stage::S7,
            )
            .unwrap_err()
            .to_string();
            ensure!(
                e.contains("stage7 has no sliding window") && e.contains("stage8 has"),
                "{e}"
            );
            eprintln!("a windowed op: the lab's stage 8 bits; stage 7 refuses `{e}`");
            Ok(())
        },
    );
    t.gpu("stage8::the_default_op_picks_by_shape", |gpu| {
        // Attention::new runs stage 8 up to STAGE8_MAX_KEYS keys (D = 64, 128) and stage 7 past them: each call's bits
        // are those of the op fixed on the stage it picked; a strided call whose heads are evenly spaced picks the same
        // (stage 7 reads such views), and [B, S, H, D] with B > 1 runs stage 8 at any length.
        let st = gpu.ctx.new_stream()?;
        for (s, want) in [
            (Shape::new(1, 4, 300, 64), Stage::S8),
            (
                Shape::cross(1, 4, 64, fp8_attention::STAGE8_MAX_KEYS, 128),
                Stage::S8,
            ),
            (
                Shape::cross(1, 4, 64, fp8_attention::STAGE8_MAX_KEYS + 1, 128),
                Stage::S7,
            ),
            (Shape::new(1, 2, 128, 256), Stage::S7),
        ] {
            let qz = quantize_per_head(&Raw::random(s, 29, 1.0));
            let x = inputs(&st, &qz)?;
            let mut auto = Attention::new(gpu, Config::default())?;
            ensure!(
                auto.stage_for_call(&s) == want,
                "{s:?}: picks {}",
                auto.stage_for_call(&s).name()
            );
            let got = forward(&mut auto, gpu, &st, s, &x)?.to_host(&st)?;
            let mut fixed = Attention::with_stage(gpu, Config::default(), want)?;
            ensure!(
                same_bits(&got, &forward(&mut fixed, gpu, &st, s, &x)?.to_host(&st)?),
                "{s:?}: the default op's bits are not {}'s",
                want.name()
            );
            let o = forward_strided(&mut auto, gpu, &st, s, &x, Strides::contiguous(&s))?;
            ensure!(
                same_bits(&o.to_host(&st)?, &got),
                "{s:?}: the default op's strided call (contiguous strides) is not {}'s",
                want.name()
            );
        }
        // [B, S, H, D] at B = 2 past STAGE8_MAX_KEYS: heads of two batches not evenly spaced, so stage 8 reads it.
        let s = Shape::cross(2, 2, 64, fp8_attention::STAGE8_MAX_KEYS + 1, 128);
        let qz = quantize_per_head(&Raw::random(s, 31, 1.0));
        let mut auto = Attention::new(gpu, Config::default())?;
        let o = forward_strided(
            &mut auto,
            gpu,
            &st,
            s,
            &bshd_inputs(&st, &qz)?,
            Strides::bshd(&s),
        )?;
        let mut eight = Attention::with_stage(gpu, Config::default(), Stage::S8)?;
        ensure!(
            same_bits(
                &o.to_host(&st)?,
                &forward(&mut eight, gpu, &st, s, &inputs(&st, &qz)?)?.to_host(&st)?
            ),
            "{s:?} as [B, S, H, D]: the default op's strided call is not stage 8's"
        );
        eprintln!(
            "the default op: stage 8 up to {} keys, stage 7 past them and at D = 256",
            fp8_attention::STAGE8_MAX_KEYS
        );
        Ok(())
    });
    t.gpu("stage8::strided_inputs_refused_by_name", |gpu| {
        let s = Shape::new(1, 2, 64, 64);
        let qz = quantize_per_head(&Raw::random(s, 23, 1.0));
        let st = gpu.stream.clone();
        let x = inputs(&st, &qz)?;
        let f = |codes, scales| Fp8 { codes, scales };
        // An op fixed on stage 7 reads [B, S, H, D] at B = 1 (its heads evenly spaced): stage 7's bits.
        let mut seven = Attention::with_stage(gpu, Config::default(), Stage::S7)?;
        let mut o = forward_strided(
            &mut seven,
            gpu,
            &st,
            s,
            &bshd_inputs(&st, &qz)?,
            Strides::bshd(&s),
        )?;
        ensure!(
            same_bits(
                &o.to_host(&st)?,
                &forward(&mut seven, gpu, &st, s, &x)?.to_host(&st)?
            ),
            "stage 7 on [B, S, H, D] at B = 1 differs from [B, H, S, D]"
        );
        // At B = 2 its heads are not evenly spaced: refused by name (strides only: the buffers are not read).
        let two = Shape::new(2, 2, 32, 64);
        let e = seven
            .forward_strided(
                gpu,
                &st,
                two,
                f(&x.q, &x.qs),
                f(&x.k, &x.ks),
                f(&x.v, &x.vs),
                Strides::bshd(&two),
                &mut o,
            )
            .err()
            .ok_or_else(|| anyhow::anyhow!("stage 7 took [B, S, H, D] at B = 2"))?
            .to_string();
        ensure!(
            e.contains("q at strides") && e.contains("runs stage7"),
            "{e}"
        );
        // The error `op` gives for these strides (each of these calls must be refused).
        let mut refused = |op: &mut Attention, strides: Strides| -> anyhow::Result<String> {
            let r = op.forward_strided(
                gpu,
                &st,
                s,
                f(&x.q, &x.qs),
                f(&x.k, &x.ks),
                f(&x.v, &x.vs),
                strides,
                &mut o,
            );
            Ok(r.err()
                .ok_or_else(|| anyhow::anyhow!("strides {strides:?} were taken"))?
                .to_string())
        };
        let mut eight = Attention::with_stage(gpu, Config::default(), Stage::S8)?;
        let wide = Strides {
            k: [2 * 64 + 16, 64, 64 * 2 * 64],
            ..Strides::bshd(&s)
        };
        let e = refused(&mut eight, wide)?;
        // S stride 144: the view's last element is 64 + 63·144 + 64 = 9200 elements in, past the 8192 k holds.
        ensure!(
            e.contains("`k` holds 8192 elements") && e.contains("needs 9200"),
            "{e}"
        );
        let odd = Strides {
            q: [2 * 64, 72, 64 * 2 * 64],
            ..Strides::bshd(&s)
        };
        let e = refused(&mut eight, odd)?;
        ensure!(e.contains("`q`: its stride of H is 72"), "{e}");
        let big = Shape::new(1, 2, 64, 256);
        let e = forward(
            &mut eight,
            gpu,
            &st,
            big,
            &inputs(&st, &quantize_per_head(&Raw::random(big, 1, 1.0)))?,
        )
        .unwrap_err()
        .to_string();
        ensure!(e.contains("stage8 takes D = [64, 128]"), "{e}");
        Ok(())
    });
    t.gpu("stage8::forward_varlen::each_sequence_s_bits", |gpu| {
        // A packed batch through the op: each sequence's O and LSE bit for bit the op's (stage 8) on that sequence
        // alone; causal grouped-query heads, a sequence with no queries, D = 128.
        let (h, hkv, d) = (8, 2, 128);
        let lens = [(300usize, 300usize), (0, 50), (129, 700), (1, 1)];
        let (mut cq, mut ck) = (vec![0i32], vec![0i32]);
        for &(a, b) in &lens {
            cq.push(cq.last().unwrap() + a as i32);
            ck.push(ck.last().unwrap() + b as i32);
        }
        let (tq, tk) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize);
        let st = gpu.stream.clone();
        let cfg = Config { causal: true, out_dtype: OutDtype::F16, softmax_scale: None, window: fp8_attention::Window::NONE };
        let mut op = Attention::with_stage(gpu, cfg, Stage::S8)?;
        // Unpacked first (each sequence alone's bits), packed heads (the default) further down; never split-KV (its
        // merged parts are other bits).
        op.set_pack_heads(false);
        op.set_split_kv(false);
        let (mut q, mut k, mut v) = (vec![0u8; tq * h * d], vec![0u8; tk * hkv * d], vec![0u8; tk * hkv * d]);
        let (mut qs, mut ks, mut vs) = (vec![1f32; 4 * h], vec![1f32; 4 * hkv], vec![1f32; 4 * hkv]);
        let mut alone = vec![];
        for (i, &(sq, sk)) in lens.iter().enumerate() {
            if sq == 0 {
                alone.push(None);
                continue;
            }
            let s = Shape::cross(1, h, sq, sk, d).with_kv_heads(hkv)?.with_causal(true);
            let qz = quantize_per_head(&Raw::random(s, 40 + i as u64, 1.0));
            for (dst, src, heads, rows, row0) in [
                (&mut q, &qz.q, h, sq, cq[i] as usize),
                (&mut k, &qz.k, hkv, sk, ck[i] as usize),
                (&mut v, &qz.v, hkv, sk, ck[i] as usize),
            ] {
                for hi in 0..heads {
                    for r in 0..rows {
                        let (from, to) = ((hi * rows + r) * d, ((row0 + r) * heads + hi) * d);
                        dst[to..to + d].copy_from_slice(&src[from..from + d]);
                    }
                }
            }
            qs[i * h..(i + 1) * h].copy_from_slice(&qz.q_scale);
            ks[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.k_scale);
            vs[i * hkv..(i + 1) * hkv].copy_from_slice(&qz.v_scale);
            alone.push(Some(forward(&mut op, gpu, &st, s, &inputs(&st, &qz)?)?.to_host(&st)?));
        }
        let (dq, dk, dv) = (st.clone_htod(&q)?, st.clone_htod(&k)?, st.clone_htod(&v)?);
        let (dqs, dks, dvs) = (st.clone_htod(&qs)?, st.clone_htod(&ks)?, st.clone_htod(&vs)?);
        let f = |codes, scales| Fp8 { codes, scales };
        let b = Packed { h, hkv, d, cu_seqlens_q: &cq, cu_seqlens_k: &ck };
        let out = op.forward_varlen(gpu, &st, &b, f(&dq, &dqs), f(&dk, &dks), f(&dv, &dvs))?;
        let OutBuf::F16(o) = &out.o else { anyhow::bail!("O is not f16") };
        let (o, lse) = (st.clone_dtoh(o)?, st.clone_dtoh(&out.lse)?);
        for (i, a) in alone.iter().enumerate() {
            let Some(a) = a else { continue };
            let sq = lens[i].0;
            for hi in 0..h {
                for r in 0..sq {
                    let row = cq[i] as usize + r;
                    ensure!(
                        lse[hi * tq + row].to_bits() == a.lse[hi * sq + r].to_bits(),
                        "sequence {i} head {hi} row {r}: the LSE differs from the sequence alone"
                    );
                    for c in 0..d {
                        ensure!(
                            o[(row * h + hi) * d + c].to_f32().to_bits() == a.o[(hi * sq + r) * d + c].to_bits(),
                            "sequence {i} head {hi} row {r} column {c}: O differs from the sequence alone"
                        );
                    }
                }
            }
        }
        // The same keys in a paged cache of 64-row pages (in reverse order in the pool): the same bits.
        let page = 64;
        let pages_of = |i: usize| lens[i].1.div_ceil(page);
        let max_pages = (0..lens.len()).map(pages_of).max().unwrap_or(1);
        let num_pages: usize = (0..lens.len()).map(pages_of).sum();
        let mut table = vec![-1i32; lens.len() * max_pages];
        let (mut pk, mut pv) = (vec![0u8; num_pages * page * hkv * d], vec![0u8; num_pages * page * hkv * d]);
        let mut next = num_pages;
        for (i, &(_, sk)) in lens.iter().enumerate() {
            for j in 0..pages_of(i) {
                next -= 1;
                table[i * max_pages + j] = next as i32;
                let rows = page.min(sk - j * page);
                let (from, to, n) = ((ck[i] as usize + j * page) * hkv * d, next * page * hkv * d, rows * hkv * d);
                pk[to..to + n].copy_from_slice(&k[from..from + n]);
                pv[to..to + n].copy_from_slice(&v[from..from + n]);
            }
        }
        let seq_lens: Vec<i32> = lens.iter().map(|x| x.1 as i32).collect();
        let cache = PagedCache { num_pages, page_size: page, max_pages, block_table: &table, seq_lens: &seq_lens };
        let (dpk, dpv) = (st.clone_htod(&pk)?, st.clone_htod(&pv)?);
        let out2 = op.forward_paged(gpu, &st, &b, &cache, f(&dq, &dqs), f(&dpk, &dks), f(&dpv, &dvs))?;
        let OutBuf::F16(o2) = &out2.o else { anyhow::bail!("O is not f16") };
        ensure!(st.clone_dtoh(o2)? == o && st.clone_dtoh(&out2.lse)? == lse, "the paged cache gives other bits");
        // The grouped heads packed into a unit's rows (4 query heads a K/V head): the same bits, from the packed keys
        // and from the pages.
        op.set_pack_heads(true);
        let bits = |o: &OutBuf, l: &lab::cudarc::driver::CudaSlice<f32>| -> anyhow::Result<(Vec<u16>, Vec<u32>)> {
            let OutBuf::F16(o) = o else { anyhow::bail!("O is not f16") };
            Ok((
                st.clone_dtoh(o)?.iter().map(|x| x.to_bits()).collect(),
                st.clone_dtoh(l)?.iter().map(|x| x.to_bits()).collect(),
            ))
        };
        let want = (o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        let out3 = op.forward_varlen(gpu, &st, &b, f(&dq, &dqs), f(&dk, &dks), f(&dv, &dvs))?;
        ensure!(bits(&out3.o, &out3.lse)? == want, "packed heads give other bits");
        let out4 = op.forward_paged(gpu, &st, &b, &cache, f(&dq, &dqs), f(&dpk, &dks), f(&dpv, &dvs))?;
        ensure!(bits(&out4.o, &out4.lse)? == want, "packed heads over the paged cache give other bits");
        // Planned once, run per layer (PagedPlan): forward_paged's bits for each layer's pools (a second layer: the
        // pools swapped), one device plan for the batch.
        let mut plan = op.plan_paged(&st, &b, &cache)?;
        for (kp, vp) in [(&dpk, &dpv), (&dpv, &dpk), (&dpk, &dpv)] {
            let want = op.forward_paged(gpu, &st, &b, &cache, f(&dq, &dqs), f(kp, &dks), f(vp, &dvs))?;
            let got = op.run_paged(gpu, &st, &mut plan, f(&dq, &dqs), f(kp, &dks), f(vp, &dvs))?;
            ensure!(bits(&got.o, &got.lse)? == bits(&want.o, &want.lse)?, "a planned run's bits are not forward_paged's");
        }
        ensure!(plan.plans_made() == 1, "{} device plans for one batch", plan.plans_made());
        // A pool too short for the plan's pages: named, nothing launched.
        let short = st.clone_htod(&pk[..pk.len() - 1])?;
        let e = op
            .run_paged(gpu, &st, &mut plan, f(&dq, &dqs), f(&short, &dks), f(&dpv, &dvs))
            .unwrap_err()
            .to_string();
        ensure!(e.contains("`k` holds"), "{e}");
        op.set_pack_heads(false);
        // A table entry outside the pool: named, nothing launched.
        let mut bad_table = table.clone();
        bad_table[0] = num_pages as i32;
        let e = op
            .forward_paged(gpu, &st, &b, &PagedCache { block_table: &bad_table, ..cache }, f(&dq, &dqs), f(&dpk, &dks), f(&dpv, &dvs))
            .unwrap_err()
            .to_string();
        ensure!(e.contains("block_table[0][0]") && e.contains("outside the pool"), "{e}");
        // Boundaries that decrease: named, nothing launched.
        let bad = [0, 300, 200, 429, 430];
        let e = op
            .forward_varlen(gpu, &st, &Packed { cu_seqlens_q: &bad, ..b }, f(&dq, &dqs), f(&dk, &dks), f(&dv, &dvs))
            .unwrap_err()
            .to_string();
        ensure!(e.contains("`cu_seqlens_q`") && e.contains("decreases"), "{e}");
        eprintln!(
            "forward_varlen: {} sequences bit for bit as each alone, paged and with the heads packed; decreasing \
             boundaries named",
            lens.len()
        );
        Ok(())
    });
    t.gpu("stage8::forward_varlen_real::the_codes_of_quantize_per_head", |gpu| {
        // Real-valued packed tokens quantized on the device, one scale a head over all tokens: the same O and LSE bits
        // as forward_varlen on fixtures' per-head codes of the [1, heads, total, D] tensors with those scales repeated
        // for every sequence (the device quantizer's codes are quantize_per_head's bit for bit). Then a short k named.
        let (h, hkv, d) = (4, 2, 64);
        let (cq, ck) = ([0i32, 37, 37, 200, 201], [0i32, 90, 130, 330, 331]);
        let (tq, tk, batch) = (201usize, 331usize, 4usize);
        let raw = Raw::random(Shape::cross(1, h, tq, tk, d).with_kv_heads(hkv)?, 61, 1.0);
        let qz = quantize_per_head(&raw);
        // [1, heads, total, D] (fixtures' layout) as packed [total, heads, D].
        fn packed<T: Copy>(x: &[T], heads: usize, total: usize, d: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(x.len());
            for t in 0..total {
                for hi in 0..heads {
                    out.extend_from_slice(&x[(hi * total + t) * d..(hi * total + t + 1) * d]);
                }
            }
            out
        }
        let st = gpu.stream.clone();
        let cfg = Config { causal: true, out_dtype: OutDtype::F32, softmax_scale: None, window: fp8_attention::Window::NONE };
        let mut op = Attention::with_stage(gpu, cfg, Stage::S8)?;
        let b = Packed { h, hkv, d, cu_seqlens_q: &cq, cu_seqlens_k: &ck };
        let up = |x: Vec<u8>| st.clone_htod(&x);
        let (dq, dk, dv) = (up(packed(&qz.q, h, tq, d))?, up(packed(&qz.k, hkv, tk, d))?, up(packed(&qz.v, hkv, tk, d))?);
        let rep = |x: &[f32]| st.clone_htod(&x.repeat(batch));
        let (dqs, dks, dvs) = (rep(&qz.q_scale)?, rep(&qz.k_scale)?, rep(&qz.v_scale)?);
        let f = |codes, scales| Fp8 { codes, scales };
        let want = op.forward_varlen(gpu, &st, &b, f(&dq, &dqs), f(&dk, &dks), f(&dv, &dvs))?;
        let (rq, rk, rv) = (
            st.clone_htod(&packed(&raw.q, h, tq, d))?,
            st.clone_htod(&packed(&raw.k, hkv, tk, d))?,
            st.clone_htod(&packed(&raw.v, hkv, tk, d))?,
        );
        let got = op.forward_varlen_real(gpu, &st, &b, Real::contiguous(&rq), Real::contiguous(&rk), Real::contiguous(&rv))?;
        let host = |o: &OutBuf| -> anyhow::Result<Vec<f32>> {
            let OutBuf::F32(x) = o else { anyhow::bail!("O is not f32") };
            Ok(st.clone_dtoh(x)?)
        };
        let (wo, go) = (host(&want.o)?, host(&got.o)?);
        let n = tq * h * d;
        ensure!(
            wo[..n].iter().zip(&go[..n]).all(|(a, c)| a.to_bits() == c.to_bits()),
            "O from real tokens differs from O from quantize_per_head's codes"
        );
        let (wl, gl) = (st.clone_dtoh(&want.lse)?, st.clone_dtoh(&got.lse)?);
        ensure!(
            wl[..h * tq].iter().zip(&gl[..h * tq]).all(|(a, c)| a.to_bits() == c.to_bits()),
            "the LSE from real tokens differs"
        );
        // The same tokens at (·, heads, tokens) strides inside a wider buffer: [total, heads + 1, D], the extra head
        // poison; the same bits.
        let wide = |x: &[f32], heads: usize, total: usize| -> Vec<f32> {
            let mut out = vec![f32::NAN; total * (heads + 1) * d];
            for t in 0..total {
                for hi in 0..heads {
                    let from = (hi * total + t) * d;
                    let to = (t * (heads + 1) + hi) * d;
                    out[to..to + d].copy_from_slice(&x[from..from + d]);
                }
            }
            out
        };
        let (wq, wk, wv) = (
            st.clone_htod(&wide(&raw.q, h, tq))?,
            st.clone_htod(&wide(&raw.k, hkv, tk))?,
            st.clone_htod(&wide(&raw.v, hkv, tk))?,
        );
        let strided = |x, heads: usize| Real::strided(x, 0, [0, d, (heads + 1) * d]);
        let third = op.forward_varlen_real(gpu, &st, &b, strided(&wq, h), strided(&wk, hkv), strided(&wv, hkv))?;
        ensure!(
            host(&third.o)?[..n].iter().zip(&go[..n]).all(|(a, c)| a.to_bits() == c.to_bits()),
            "strided real tokens give other bits"
        );
        // k one token short of cu_seqlens_k's total: named, nothing launched.
        let short = st.clone_htod(&packed(&raw.k, hkv, tk, d)[..(tk - 1) * hkv * d])?;
        let e = op
            .forward_varlen_real(gpu, &st, &b, Real::contiguous(&rq), Real::contiguous(&short), Real::contiguous(&rv))
            .unwrap_err()
            .to_string();
        ensure!(e.contains("`k`") && e.contains("past the"), "{e}");
        eprintln!("forward_varlen_real: quantize_per_head's bits, contiguous and strided; a short k named");
        Ok(())
    });
}
