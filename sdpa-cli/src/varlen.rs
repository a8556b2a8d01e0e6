// `sdpa bench --varlen TOKENS`: a packed batch on stage 8 beside dense stages 7 and 8 at the same query×key pairs, or
// (at most 16 new tokens a sequence) decode's bytes a second against a device-to-device copy's.
use anyhow::{Context, Result, ensure};
use composed::{PagedKv, Stage, Varlen, VarlenShape, VarlenTensors};
use fixtures::{OutDtype, Raw, Shape, quantize_per_head};
use lab::cudarc::driver::DevicePtr;
use lab::cudarc::driver::sys::CUevent_flags;

use crate::args::Mode;
use crate::shape_text;

/// Sequence lengths drawn from 100 … `longest` (a fixed seed) until they hold `tokens` in all (the last cut to fit).
pub fn lengths(tokens: usize, longest: usize, seed: u64) -> Vec<usize> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![];
    let mut left = tokens;
    let lo = 100.min(longest);
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let l = (lo + (x % (longest - lo + 1) as u64) as usize).min(left);
        out.push(l);
        left -= l;
    }
    out
}

/// `sdpa bench --mode`'s batch as `bench_varlen` takes it: (tokens, prefix, page). Varlen: `tokens` tokens (required;
/// no pages, Sq = Sk); decode: B · Sq tokens, Sq ≤ 16 new tokens over Sk keys a sequence (prefix Sk − Sq), pages
/// optional; paged: B · Sq tokens over Sk keys from pages (required). Each wrong combination named.
pub fn serving_batch(
    mode: Mode,
    s: &Shape,
    tokens: Option<usize>,
    page: Option<usize>,
) -> Result<(usize, usize, Option<usize>)> {
    let over_keys = |what: &str| -> Result<usize> {
        ensure!(
            tokens.is_none(),
            "--mode {what} takes its tokens from --shape B,H,Sq,Sk,D (B · Sq), not --tokens"
        );
        ensure!(
            s.sk >= s.sq && s.sq >= 1 && s.b >= 1,
            "--mode {what}: --shape {} needs B ≥ 1 sequences of Sq ≥ 1 new tokens over Sk ≥ Sq keys",
            shape_text(s)
        );
        Ok(s.sk - s.sq)
    };
    match mode {
        Mode::Varlen => {
            let tokens =
                tokens.context("--mode varlen needs --tokens: the batch's tokens in all")?;
            ensure!(
                page.is_none(),
                "--mode varlen packs its keys: --mode paged reads them from pages"
            );
            ensure!(
                s.sq == s.sk,
                "--mode varlen: sequences of 100 to S tokens, Sq = Sk (--shape B,H,S,D), not Sq {} and Sk {}",
                s.sq,
                s.sk
            );
            Ok((tokens, 0, None))
        }
        Mode::Decode => {
            let prefix = over_keys("decode")?;
            ensure!(
                s.sq <= 16,
                "--mode decode: {} new tokens a sequence; decode takes 1 to 16 (--mode paged for more)",
                s.sq
            );
            Ok((s.b * s.sq, prefix, page))
        }
        Mode::Paged => {
            let prefix = over_keys("paged")?;
            let page =
                page.context("--mode paged needs --page: the cache's rows a page (16 to 256)")?;
            Ok((s.b * s.sq, prefix, Some(page)))
        }
    }
}

/// Times a packed batch of `tokens` query tokens with `s`'s heads and D on stage 8's packed kernel (the device plan
/// included: every kernel of a call), back to back: sequences of 100 to S tokens (Sq = Sk), or with `prefix` every
/// sequence S new tokens over `prefix` cached ones (Sk = S + prefix). With `page`, the same keys again from a paged cache
/// of pages of that many rows (in reverse order in the pool), against the packed keys' time. Beside them, dense stages
/// 8 and 7 on a [1, H, S', D] problem of about the same query×key pairs; prints TFLOP/s and the ratios. Decode (a
/// prefix and S ≤ 16 new tokens a sequence, so `tokens / S` sequences): the bytes a call moves a second instead,
/// against a device-to-device copy's rate. Each `variants` source variant (`sdpa bench --variant`) of the kernel the
/// paged cache runs is timed beside it, planned once, in interleaved rounds.
pub fn bench_varlen(
    s: Shape,
    tokens: usize,
    prefix: usize,
    page: Option<usize>,
    variants: &[String],
    iters: usize,
) -> Result<()> {
    ensure!(tokens > 0, "--varlen {tokens}: at least one token");
    ensure!(
        variants.is_empty() || page.is_some(),
        "--variant with --varlen or --mode: variants are timed on a paged cache (--page or --mode decode|paged)"
    );
    ensure!(s.sq >= 1, "--varlen: the shape's S is the longest sequence");
    let gpu = lab::Gpu::get().context("sdpa bench --varlen needs a CUDA GPU")?;
    let lens_q = if prefix > 0 {
        vec![s.sq; (tokens / s.sq).max(1)]
    } else {
        lengths(tokens, s.sq, 1)
    };
    let lens_k: Vec<usize> = lens_q.iter().map(|&l| l + prefix).collect();
    let (tq, tk): (usize, usize) = (lens_q.iter().sum(), lens_k.iter().sum());
    let (h, hkv, d) = (s.h, s.hkv, s.d);
    // Query×key pairs each row sees (causal: bottom-right per sequence).
    let pairs: f64 = lens_q
        .iter()
        .zip(&lens_k)
        .map(|(&q, &k)| {
            if s.causal {
                (q * (k - q) + q * (q + 1) / 2) as f64
            } else {
                (q * k) as f64
            }
        })
        .sum();
    let flops = 4.0 * (h * d) as f64 * pairs;
    // Realistic codes (unit normals quantized per head), one [1, H, 4096, D] problem's tiled over the packed tensors.
    let seed = quantize_per_head(&Raw::random(
        Shape::new(1, h, 4096, d).with_kv_heads(hkv)?,
        3,
        1.0,
    ));
    let tile =
        |codes: &[u8], n: usize| -> Vec<u8> { codes.iter().copied().cycle().take(n).collect() };
    let st = gpu.stream.clone();
    let (hk, hv) = (tile(&seed.k, tk * hkv * d), tile(&seed.v, tk * hkv * d));
    let (dq, dk, dv) = (
        st.clone_htod(&tile(&seed.q, tq * h * d))?,
        st.clone_htod(&hk)?,
        st.clone_htod(&hv)?,
    );
    let b = lens_q.len();
    let scales = |x: &[f32], n: usize| -> Vec<f32> { x.iter().copied().cycle().take(n).collect() };
    let (qs, ks, vs) = (
        st.clone_htod(&scales(&seed.q_scale, b * h))?,
        st.clone_htod(&scales(&seed.k_scale, b * hkv))?,
        st.clone_htod(&scales(&seed.v_scale, b * hkv))?,
    );
    let o = st.alloc_zeros::<u16>(tq * h * d)?;
    let lse = st.alloc_zeros::<f32>(h * tq)?;
    let cu = |l: &[usize]| -> Vec<i32> {
        let mut c = vec![0i32];
        for &x in l {
            c.push(c.last().unwrap() + x as i32);
        }
        c
    };
    let (cq, ck) = (cu(&lens_q), cu(&lens_k));
    let (dcq, dck) = (st.clone_htod(&cq)?, st.clone_htod(&ck)?);
    let at = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
    let t = VarlenTensors {
        q: at(dq.device_ptr(&st)),
        k: at(dk.device_ptr(&st)),
        v: at(dv.device_ptr(&st)),
        q_scale: at(qs.device_ptr(&st)),
        k_scale: at(ks.device_ptr(&st)),
        v_scale: at(vs.device_ptr(&st)),
        o: at(o.device_ptr(&st)),
        lse: at(lse.device_ptr(&st)),
        cu_q: at(dcq.device_ptr(&st)),
        cu_k: at(dck.device_ptr(&st)),
        strides: None,
        paged: None,
        one_scale: composed::OneScale::default(),
    };
    let shape = VarlenShape {
        batch: b,
        h,
        hkv,
        d,
        total_q: tq,
        total_k: tk,
        causal: s.causal,
        window: fixtures::Window::NONE,
    };
    let mut vl = Varlen::new();
    let scale = 1.0 / (d as f32).sqrt();
    // Timed unpacked, then (where the grouped heads can be packed into a unit's rows: composed::packs_heads) packed.
    let packs = composed::packs_heads(&shape);
    // Split-KV as the library plans it (Varlen::split_kv), or off; the chunks the last timing used.
    let mut time_split = |t: &VarlenTensors, pack: bool, split: bool| -> Result<(f64, usize)> {
        vl.pack_heads(pack);
        vl.split_kv(split);
        let us = median_us(&st, iters, || {
            vl.launch(gpu, &st, &shape, scale, OutDtype::Bf16, t)
        })?;
        Ok((us, vl.last_split()))
    };
    let mut splits = vec![];
    let mut time = |t: &VarlenTensors, pack: bool| -> Result<f64> {
        let (us, parts) = time_split(t, pack, true)?;
        if parts > 1 {
            let (off, _) = time_split(t, pack, false)?;
            splits.push((pack, parts, us, off));
        }
        Ok(us)
    };
    let packed_us = time(&t, false)?;
    let tf = |f: f64, us: f64| f / (us * 1e-6) / 1e12;
    println!(
        "varlen on stage8: {b} sequences, {tq} query and {tk} key tokens, H = {h}, Hkv = {hkv}, D = {d}{}: {packed_us:.1} µs \
         a call (plan and kernel; median of {iters}), {:.1} TFLOP/s",
        if s.causal { ", causal" } else { "" },
        tf(flops, packed_us)
    );
    // Decode (at most 16 new tokens a sequence): the bytes a call must move, against a device-to-device copy's rate.
    let mut decode_us = vec![("packed keys", packed_us, 0usize)];
    if packs {
        let us = time(&t, true)?;
        decode_us.push(("packed keys, heads packed", us, 0));
        println!(
            "  with each K/V head's {} query heads packed into a unit's rows (pack-gqa): {us:.1} µs ({:.1} TFLOP/s), \
             {:.3}× unpacked",
            h / hkv,
            tf(flops, us),
            us / packed_us
        );
    }
    if let Some(page) = page {
        // The same keys in a paged cache: each sequence's keys in pages of `page` rows, the pages in reverse order.
        let row = hkv * d;
        let pages_of = |i: usize| lens_k[i].div_ceil(page);
        let max_pages = (0..b).map(pages_of).max().unwrap_or(1);
        let num_pages: usize = (0..b).map(pages_of).sum();
        let (mut pk, mut pv) = (
            vec![0u8; num_pages * page * row],
            vec![0u8; num_pages * page * row],
        );
        let mut table = vec![-1i32; b * max_pages];
        let mut next = num_pages;
        for i in 0..b {
            for j in 0..pages_of(i) {
                next -= 1;
                table[i * max_pages + j] = next as i32;
                let n = page.min(lens_k[i] - j * page) * row;
                let (from, to) = ((ck[i] as usize + j * page) * row, next * page * row);
                pk[to..to + n].copy_from_slice(&hk[from..from + n]);
                pv[to..to + n].copy_from_slice(&hv[from..from + n]);
            }
        }
        let (dpk, dpv, dt) = (
            st.clone_htod(&pk)?,
            st.clone_htod(&pv)?,
            st.clone_htod(&table)?,
        );
        let paged = VarlenTensors {
            k: at(dpk.device_ptr(&st)),
            v: at(dpv.device_ptr(&st)),
            paged: Some(PagedKv {
                block_table: at(dt.device_ptr(&st)),
                max_pages,
                page_size: page,
                num_pages,
            }),
            ..t
        };
        let paged_us = time(&paged, false)?;
        decode_us.push(("paged cache", paged_us, table.len() * 4));
        println!(
            "  from a paged cache of {page}-row pages: {paged_us:.1} µs ({:.1} TFLOP/s), {:.3}× the packed keys' time \
             (issue 34's target: within 1.10×)",
            tf(flops, paged_us),
            paged_us / packed_us
        );
        if packs {
            let us = time(&paged, true)?;
            decode_us.push(("paged cache, heads packed", us, table.len() * 4));
            println!(
                "  the paged cache with the heads packed: {us:.1} µs ({:.1} TFLOP/s)",
                tf(flops, us)
            );
        }
        // Planned once and run per layer (Varlen::keep_plan, what PagedPlan does): the attention's launches alone,
        // from the paged cache and from the packed keys — the two sides of issue 34's paged target without the plan's
        // launches in either.
        let kept_as = |t: &VarlenTensors,
                       spec: Option<lab::KernelSpec>,
                       serial: bool|
         -> Result<(f64, usize)> {
            let mut kept = Varlen::new();
            kept.pack_heads(packs);
            kept.keep_plan(true);
            kept.use_kernel(spec);
            kept.use_programmatic(!serial);
            let us = median_us(&st, iters, || {
                kept.launch(gpu, &st, &shape, scale, OutDtype::Bf16, t)
            })?;
            Ok((us, kept.plans_made()))
        };
        let kept_us = |t: &VarlenTensors| kept_as(t, None, false);
        let (us, plans) = kept_us(&paged)?;
        let (packed_kept, _) = kept_us(&t)?;
        decode_us.push(("paged cache, plan kept", us, table.len() * 4));
        println!(
            "  the paged cache, planned once ({plans} device plan for {} launches): {us:.1} µs ({:.1} TFLOP/s); the \
             packed keys planned once {packed_kept:.1} µs: {:.3}× (issue 34's target: within 1.10×)",
            iters + 3,
            tf(flops, us),
            us / packed_kept
        );
        // The kernel as built, as ordinary launches (each after the kernel before it has finished, not the
        // programmatic dependent launches it goes as), and each variant, planned once: two interleaved rounds, the
        // better median of each.
        let base = if packs {
            composed::varlen_pack_kernel(d)
        } else {
            composed::varlen_kernel_for(&shape)
        };
        let mut runs = vec![
            ("as built".to_string(), None, false),
            ("as ordinary launches".to_string(), None, true),
        ];
        for v in variants {
            let (label, spec) = crate::bench::variant_of(base, v)?;
            runs.push((format!("variant {label}"), Some(spec), false));
        }
        let mut best = vec![f64::INFINITY; runs.len()];
        for _round in 0..2 {
            for (i, (_, spec, serial)) in runs.iter().enumerate() {
                best[i] = best[i].min(kept_as(&paged, *spec, *serial)?.0);
            }
        }
        for ((label, _, _), us) in runs.iter().zip(&best) {
            println!(
                "  the paged cache planned once, {label} ({}): {us:.1} µs, {:.3}× as built",
                base.name,
                us / best[0]
            );
        }
    }
    for (pack, parts, us, off) in splits {
        println!(
            "  split-KV ({parts} chunks a sequence{}): {us:.1} µs against {off:.1} µs unsplit ({:.2}×)",
            if pack { ", heads packed" } else { "" },
            off / us
        );
    }
    if s.sq <= 16 && prefix > 0 {
        // K and V codes, Q codes, O (bf16), the LSE, the scales and the cumulative lengths; the table where paged.
        let moved = 2 * tk * hkv * d
            + tq * h * d
            + 2 * tq * h * d
            + 4 * tq * h
            + 4 * b * (h + 2 * hkv)
            + 8 * (b + 1);
        let copy = copy_gbps(&st, (2 * tk * hkv * d).max(1 << 28), iters)?;
        for (what, us, extra) in decode_us {
            let gbps = (moved + extra) as f64 / (us * 1e-6) / 1e9;
            println!(
                "decode from the {what}: {:.1} MB moved in {us:.1} µs, {gbps:.0} GB/s = {:.3}× a device-to-device copy's                  {copy:.0} GB/s (issue 34's targets: ≥ 0.85 at B = 64, ≥ 0.70 at B = 1 with Sk = 131072)",
                (moved + extra) as f64 / 1e6,
                gbps / copy
            );
        }
        return Ok(());
    }
    // Dense at about the same pairs: S' = √(pairs / (causal ? 1/2 : 1)), a multiple of 128.
    let square = if s.causal { 2.0 * pairs } else { pairs };
    let side = ((square.sqrt() / 128.0).round().max(1.0) as usize) * 128;
    let dense = Shape::new(1, h, side, d)
        .with_kv_heads(hkv)?
        .with_causal(s.causal);
    let whole = quantize_per_head(&Raw::random(dense, 7, 1.0));
    let mut p = fp8_attention::Problem::upload(gpu, &whole, OutDtype::Bf16)?;
    let eight = p.time(gpu, Stage::S8, 2, 10)?;
    let seven = p.time(gpu, Stage::S7, 2, 10)?;
    let dense_flops = dense.flops();
    println!(
        "dense {}: stage8 {:.1} µs ({:.1} TFLOP/s), stage7 {:.1} µs ({:.1} TFLOP/s, Vᵀ made once)",
        shape_text(&dense),
        eight.p50_us,
        tf(dense_flops, eight.p50_us),
        seven.p50_us,
        tf(dense_flops, seven.p50_us)
    );
    println!(
        "varlen ÷ dense stage 7 TFLOP/s: {:.3} (issue 34's target: ≥ 0.95)",
        tf(flops, packed_us) / tf(dense_flops, seven.p50_us)
    );
    Ok(())
}

/// A device-to-device copy's rate in GB/s (bytes read plus bytes written, per second) on `bytes` bytes: the HBM
/// bandwidth a plain copy reaches on this device now, the decode target's anchor. Median of `iters` after 3 warm-up.
fn copy_gbps(
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    bytes: usize,
    iters: usize,
) -> Result<f64> {
    let src = st.alloc_zeros::<u8>(bytes)?;
    let mut dst = st.alloc_zeros::<u8>(bytes)?;
    let us = median_us(st, iters, || Ok(st.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * bytes as f64 / (us * 1e-6) / 1e9)
}

/// `run`'s time on `st` in µs by CUDA events: the median of `iters` (at least 1) after 3 warm-up runs.
fn median_us(
    st: &std::sync::Arc<lab::cudarc::driver::CudaStream>,
    iters: usize,
    mut run: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..3 {
        run()?;
    }
    let mut us = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let e0 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        run()?;
        let e1 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        st.synchronize()?;
        us.push(f64::from(e0.elapsed_ms(&e1)?) * 1e3);
    }
    us.sort_by(f64::total_cmp);
    Ok(us[us.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::serving_batch;
    use crate::args::Mode;
    use fixtures::Shape;

    #[test]
    fn serving_modes_are_the_varlen_forms() {
        // Issue 34's decode: 64 × 1 token over 8,192 keys = --varlen 64 --prefix 8191 --page 64.
        let decode = Shape::parse("64,32,1,8192,128").unwrap();
        assert_eq!(
            serving_batch(Mode::Decode, &decode, None, Some(64)).unwrap(),
            (64, 8191, Some(64))
        );
        assert_eq!(
            serving_batch(Mode::Decode, &decode, None, None).unwrap(),
            (64, 8191, None)
        );
        // 8 × 512 new tokens onto 8,192 cached = --varlen 4096 --prefix 8192 --page 64.
        let paged = Shape::parse("8,16,512,8704,128").unwrap();
        assert_eq!(
            serving_batch(Mode::Paged, &paged, None, Some(64)).unwrap(),
            (4096, 8192, Some(64))
        );
        let prefill = Shape::parse("1,16,8192,128").unwrap();
        assert_eq!(
            serving_batch(Mode::Varlen, &prefill, Some(65536), None).unwrap(),
            (65536, 0, None)
        );
    }

    #[test]
    fn wrong_serving_combinations_are_named() {
        let err = |m, s: &str, t, p| {
            serving_batch(m, &Shape::parse(s).unwrap(), t, p)
                .unwrap_err()
                .to_string()
        };
        assert!(err(Mode::Varlen, "1,16,8192,128", None, None).contains("needs --tokens"));
        assert!(err(Mode::Varlen, "1,16,8192,128", Some(10), Some(64)).contains("--mode paged"));
        assert!(err(Mode::Varlen, "1,16,512,8192,128", Some(10), None).contains("Sq = Sk"));
        assert!(err(Mode::Decode, "64,32,32,8192,128", None, None).contains("1 to 16"));
        assert!(err(Mode::Decode, "64,32,1,8192,128", Some(64), None).contains("not --tokens"));
        assert!(err(Mode::Decode, "4,32,16,8,128", None, None).contains("Sk ≥ Sq"));
        assert!(err(Mode::Paged, "8,16,512,8704,128", None, None).contains("needs --page"));
        // Variants time the paged cache's kernel: refused without pages, before a GPU is asked for.
        let v = ["x=pingpong_attention.cuh:a=>b".to_string()];
        let e = super::bench_varlen(
            Shape::parse("1,16,8192,128").unwrap(),
            65536,
            0,
            None,
            &v,
            20,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("paged cache"), "{e}");
    }

    #[test]
    fn lengths_hold_the_tokens_within_the_range() {
        let l = super::lengths(65536, 8192, 1);
        assert_eq!(l.iter().sum::<usize>(), 65536);
        assert!(
            l[..l.len() - 1].iter().all(|&x| (100..=8192).contains(&x)),
            "{l:?}"
        );
        assert_eq!(
            super::lengths(65536, 8192, 1),
            l,
            "the same seed, the same lengths"
        );
    }
}
