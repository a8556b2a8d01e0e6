// `sdpa bench --varlen TOKENS`: a packed batch on stage 8 beside dense stages 7 and 8 at the same query×key pairs.
use anyhow::{Context, Result, ensure};
use composed::{Stage, Varlen, VarlenShape, VarlenTensors};
use fixtures::{OutDtype, Raw, Shape, quantize_per_head};
use lab::cudarc::driver::DevicePtr;
use lab::cudarc::driver::sys::CUevent_flags;

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

/// Times a packed batch of `tokens` query tokens (Sq = Sk a sequence, lengths from 100 to `s.sq`) with `s`'s heads and
/// D on stage 8's packed kernel (the device plan included: every kernel of a call), back to back, and stage 8 and
/// stage 7 (with V's transpose) on a dense [1, H, S, D] problem of about the same query×key pairs; prints TFLOP/s and
/// the packed batch's against dense stage 7's.
pub fn bench_varlen(s: Shape, tokens: usize, iters: usize) -> Result<()> {
    ensure!(tokens > 0, "--varlen {tokens}: at least one token");
    ensure!(s.sq >= 1, "--varlen: the shape's S is the longest sequence");
    let gpu = lab::Gpu::get().context("sdpa bench --varlen needs a CUDA GPU")?;
    let lens = lengths(tokens, s.sq, 1);
    let (h, hkv, d) = (s.h, s.hkv, s.d);
    let pairs: f64 = lens.iter().map(|&l| (l * l) as f64).sum();
    let flops = 4.0 * (h * d) as f64 * pairs * if s.causal { 0.5 } else { 1.0 };
    // Realistic codes (unit normals quantized per head), one [1, H, 4096, D] problem's tiled over the packed tensors.
    let seed = quantize_per_head(&Raw::random(
        Shape::new(1, h, 4096, d).with_kv_heads(hkv)?,
        3,
        1.0,
    ));
    let tile =
        |codes: &[u8], n: usize| -> Vec<u8> { codes.iter().copied().cycle().take(n).collect() };
    let st = gpu.stream.clone();
    let (dq, dk, dv) = (
        st.clone_htod(&tile(&seed.q, tokens * h * d))?,
        st.clone_htod(&tile(&seed.k, tokens * hkv * d))?,
        st.clone_htod(&tile(&seed.v, tokens * hkv * d))?,
    );
    let b = lens.len();
    let scales = |x: &[f32], n: usize| -> Vec<f32> { x.iter().copied().cycle().take(n).collect() };
    let (qs, ks, vs) = (
        st.clone_htod(&scales(&seed.q_scale, b * h))?,
        st.clone_htod(&scales(&seed.k_scale, b * hkv))?,
        st.clone_htod(&scales(&seed.v_scale, b * hkv))?,
    );
    let o = st.alloc_zeros::<u16>(tokens * h * d)?;
    let lse = st.alloc_zeros::<f32>(h * tokens)?;
    let mut cu = vec![0i32];
    for &l in &lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    let dcu = st.clone_htod(&cu)?;
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
        cu_q: at(dcu.device_ptr(&st)),
        cu_k: at(dcu.device_ptr(&st)),
        strides: None,
        paged: None,
    };
    let shape = VarlenShape {
        batch: b,
        h,
        hkv,
        d,
        total_q: tokens,
        total_k: tokens,
        causal: s.causal,
    };
    let mut vl = Varlen::new();
    let scale = 1.0 / (d as f32).sqrt();
    for _ in 0..3 {
        vl.launch(gpu, &st, &shape, scale, OutDtype::Bf16, &t)?;
    }
    let mut us = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let e0 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        vl.launch(gpu, &st, &shape, scale, OutDtype::Bf16, &t)?;
        let e1 = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        st.synchronize()?;
        us.push(f64::from(e0.elapsed_ms(&e1)?) * 1e3);
    }
    us.sort_by(f64::total_cmp);
    let packed_us = us[us.len() / 2];
    // Dense at about the same pairs: S = √(Σ L²), a multiple of 128.
    let side = ((pairs.sqrt() / 128.0).round().max(1.0) as usize) * 128;
    let dense = Shape::new(1, h, side, d)
        .with_kv_heads(hkv)?
        .with_causal(s.causal);
    let whole = quantize_per_head(&Raw::random(dense, 7, 1.0));
    let mut p = fp8_attention::Problem::upload(gpu, &whole, OutDtype::Bf16)?;
    let eight = p.time(gpu, Stage::S8, 2, 10)?;
    let seven = p.time(gpu, Stage::S7, 2, 10)?;
    let tf = |f: f64, us: f64| f / (us * 1e-6) / 1e12;
    let dense_flops = dense.flops();
    println!(
        "varlen on stage8: {b} sequences of 100…{} tokens ({tokens} in all), H = {h}, Hkv = {hkv}, D = {d}{}: {packed_us:.1} µs a \
         call (plan and kernel; median of {}), {:.1} TFLOP/s",
        s.sq,
        if s.causal { ", causal" } else { "" },
        us.len(),
        tf(flops, packed_us)
    );
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

#[cfg(test)]
mod tests {
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
