// `sdpa run` on a packed (variable-length) or paged file: E4M3 codes with scales per (sequence, head), stage 8, checked.
use anyhow::{Context, Result, bail, ensure};
use fixtures::{OutDtype, Quantized, Shape};
use fp8_attention::{Attention, Config, Fp8, OutBuf, Packed, PagedCache, Real, Stage};
use lab::numerics::{Tolerance, error_stats};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

use crate::files::{real, scales, tensor};

/// A packed batch as a file holds it: E4M3 `q` [total_q, H, D] and `cu_seqlens_q` (I32 [B + 1]) — or F16 / BF16 / F32
/// `q`, `k`, `v` without scales, quantized on the device (packed keys only); the keys either
/// packed (`k`, `v` [total_k, Hkv, D], `cu_seqlens_k`) or a paged cache (`k_cache`, `v_cache` [num_pages,
/// page_size, Hkv, D], `block_table` I32 [B, max_pages], `seq_lens` I32 [B]); `q_scale` (F32, B·H or 1), `k_scale` and
/// `v_scale` (B·Hkv or 1).
#[derive(Debug)]
pub struct PackedFile {
    pub h: usize,
    pub hkv: usize,
    pub d: usize,
    pub q: Vec<u8>,
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    pub q_scale: Vec<f32>,
    pub k_scale: Vec<f32>,
    pub v_scale: Vec<f32>,
    pub cu_q: Vec<i32>,
    /// cu_seqlens_k (packed), or the prefix sums of seq_lens (paged).
    pub cu_k: Vec<i32>,
    /// A paged file's cache.
    pub paged: Option<PagedFile>,
    /// A packed file of real-valued tokens (F16, BF16 or F32): q, k, v as f32, packed as the codes are. The codes and
    /// scales above are then fixtures' per-head quantization of them (one scale a head over all tokens, repeated for
    /// every sequence), bit for bit what the device makes of them.
    pub real: Option<[Vec<f32>; 3]>,
}

/// A paged file's cache: pages, rows a page, page indices a sequence, the block table and the lengths.
#[derive(Debug)]
pub struct PagedFile {
    pub num_pages: usize,
    pub page_size: usize,
    pub max_pages: usize,
    pub block_table: Vec<i32>,
    pub seq_lens: Vec<i32>,
}

/// Whether the file is a packed batch (it names `cu_seqlens_q`).
pub fn is_packed(bytes: &[u8]) -> bool {
    SafeTensors::deserialize(bytes).is_ok_and(|st| st.names().contains(&"cu_seqlens_q"))
}

fn dims(name: &str, t: &TensorView, rank: usize) -> Result<Vec<usize>> {
    ensure!(
        t.shape().len() == rank,
        "tensor `{name}` has shape {:?}: expected rank {rank}",
        t.shape()
    );
    Ok(t.shape().to_vec())
}

fn codes(name: &str, t: &TensorView) -> Result<Vec<u8>> {
    ensure!(
        t.dtype() == Dtype::F8_E4M3 || t.dtype() == Dtype::U8,
        "tensor `{name}` has dtype {:?}: a packed file holds E4M3 codes (F8_E4M3, or U8 bytes) with their scales",
        t.dtype()
    );
    Ok(t.data().to_vec())
}

fn ints(name: &str, t: &TensorView) -> Result<Vec<i32>> {
    ensure!(
        t.dtype() == Dtype::I32,
        "tensor `{name}` has dtype {:?}: expected I32",
        t.dtype()
    );
    Ok(t.data()
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// Reads a packed or paged file; every problem of shapes and dtypes is an error naming the tensor (the boundaries,
/// table and lengths are checked by the library before any launch).
pub fn load(bytes: &[u8]) -> Result<PackedFile> {
    let st = SafeTensors::deserialize(bytes).context("not a safetensors file")?;
    let q = tensor(&st, "q")?;
    let qd = dims("q", &q, 3)?;
    let (h, d) = (qd[1], qd[2]);
    let cu_q = ints("cu_seqlens_q", &tensor(&st, "cu_seqlens_q")?)?;
    ensure!(
        !cu_q.is_empty(),
        "`cu_seqlens_q` is empty: B sequences need B + 1 entries"
    );
    let b = cu_q.len() - 1;
    let names = st.names();
    if q.dtype() != Dtype::F8_E4M3 && q.dtype() != Dtype::U8 {
        ensure!(
            !names.contains(&"block_table"),
            "`q` has dtype {:?}: a paged file holds E4M3 codes (F8_E4M3 or U8) with their scales",
            q.dtype()
        );
        return load_real(&st, qd, cu_q);
    }
    let (k, v, hkv, cu_k, paged) = if names.contains(&"block_table") {
        let (kc, vc) = (tensor(&st, "k_cache")?, tensor(&st, "v_cache")?);
        let kd = dims("k_cache", &kc, 4)?;
        ensure!(
            dims("v_cache", &vc, 4)? == kd,
            "`k_cache` {kd:?} and `v_cache` {:?} must have the same shape",
            vc.shape()
        );
        let bt = tensor(&st, "block_table")?;
        let btd = dims("block_table", &bt, 2)?;
        let lens = ints("seq_lens", &tensor(&st, "seq_lens")?)?;
        ensure!(
            btd[0] == b && lens.len() == b,
            "`cu_seqlens_q` bounds {b} sequences; `block_table` has {} rows and `seq_lens` {} lengths",
            btd[0],
            lens.len()
        );
        let mut cu_k = vec![0i32];
        for &l in &lens {
            cu_k.push(cu_k.last().copied().unwrap_or(0).saturating_add(l));
        }
        (
            codes("k_cache", &kc)?,
            codes("v_cache", &vc)?,
            kd[2],
            cu_k,
            Some(PagedFile {
                num_pages: kd[0],
                page_size: kd[1],
                max_pages: btd[1],
                block_table: ints("block_table", &bt)?,
                seq_lens: lens,
            }),
        )
    } else {
        let (k, v) = (tensor(&st, "k")?, tensor(&st, "v")?);
        let kd = dims("k", &k, 3)?;
        ensure!(
            dims("v", &v, 3)? == kd,
            "`k` {kd:?} and `v` {:?} must have the same shape",
            v.shape()
        );
        let cu_k = ints("cu_seqlens_k", &tensor(&st, "cu_seqlens_k")?)?;
        (codes("k", &k)?, codes("v", &v)?, kd[1], cu_k, None)
    };
    let kd = if paged.is_some() { "k_cache" } else { "k" };
    let d_k = st
        .tensor(kd)
        .map(|t| t.shape()[t.shape().len() - 1])
        .unwrap_or(d);
    ensure!(
        d_k == d,
        "`q` has D = {d} and `{kd}` D = {d_k}: D must agree"
    );
    ensure!(
        hkv >= 1 && h.is_multiple_of(hkv),
        "H = {h} query heads is not a multiple of Hkv = {hkv} key/value heads"
    );
    Ok(PackedFile {
        h,
        hkv,
        d,
        q: codes("q", &q)?,
        k,
        v,
        q_scale: scales(&st, "q_scale", b * h)?,
        k_scale: scales(&st, "k_scale", b * hkv)?,
        v_scale: scales(&st, "v_scale", b * hkv)?,
        cu_q,
        cu_k,
        paged,
        real: None,
    })
}

/// [a, b, D] rows as [b, a, D]: packed [total, heads, D] ↔ [1, heads, total, D].
fn swap_rows<T: Copy + Default>(x: &[T], a: usize, b: usize, d: usize) -> Vec<T> {
    let mut out = vec![T::default(); x.len()];
    for i in 0..a {
        for j in 0..b {
            let (from, to) = ((i * b + j) * d, (j * a + i) * d);
            out[to..to + d].copy_from_slice(&x[from..from + d]);
        }
    }
    out
}

/// A packed file of real-valued `q` [total_q, H, D] (dims `qd`), `k`, `v` [total_k, Hkv, D] and the boundaries; its
/// codes and scales quantized here as the device will.
fn load_real(st: &SafeTensors, qd: Vec<usize>, cu_q: Vec<i32>) -> Result<PackedFile> {
    let (h, d, b) = (qd[1], qd[2], cu_q.len() - 1);
    let (k, v) = (tensor(st, "k")?, tensor(st, "v")?);
    let kd = dims("k", &k, 3)?;
    ensure!(
        dims("v", &v, 3)? == kd,
        "`k` {kd:?} and `v` {:?} must have the same shape",
        v.shape()
    );
    let q = tensor(st, "q")?;
    ensure!(
        k.dtype() == q.dtype() && v.dtype() == q.dtype(),
        "`q`, `k` and `v` must have one dtype: {:?}, {:?}, {:?}",
        q.dtype(),
        k.dtype(),
        v.dtype()
    );
    for name in ["q_scale", "k_scale", "v_scale"] {
        ensure!(
            !st.names().contains(&name),
            "`{name}` is given, but `q` holds real values ({:?}): scales come with E4M3 codes only",
            q.dtype()
        );
    }
    let (hkv, tq, tk) = (kd[1], qd[0], kd[0]);
    ensure!(
        tq > 0 && tk > 0,
        "`q` has {tq} tokens and `k` {tk}: real-valued tokens are quantized a head at a time, and need some"
    );
    ensure!(
        kd[2] == d,
        "`q` has D = {d} and `k` D = {}: D must agree",
        kd[2]
    );
    ensure!(
        hkv >= 1 && h.is_multiple_of(hkv),
        "H = {h} query heads is not a multiple of Hkv = {hkv} key/value heads"
    );
    let cu_k = ints("cu_seqlens_k", &tensor(st, "cu_seqlens_k")?)?;
    let (rq, rk, rv) = (real("q", &q)?, real("k", &k)?, real("v", &v)?);
    let qz = fixtures::quantize_per_head(&fixtures::Raw {
        shape: Shape::cross(1, h, tq, tk, d).with_kv_heads(hkv)?,
        q: swap_rows(&rq, tq, h, d),
        k: swap_rows(&rk, tk, hkv, d),
        v: swap_rows(&rv, tk, hkv, d),
    });
    Ok(PackedFile {
        h,
        hkv,
        d,
        q: swap_rows(&qz.q, h, tq, d),
        k: swap_rows(&qz.k, hkv, tk, d),
        v: swap_rows(&qz.v, hkv, tk, d),
        q_scale: qz.q_scale.repeat(b),
        k_scale: qz.k_scale.repeat(b),
        v_scale: qz.v_scale.repeat(b),
        cu_q,
        cu_k,
        paged: None,
        real: Some([rq, rk, rv]),
    })
}

/// Sequence i of the batch as a dense problem ([1, H, Sq, D] and [1, Hkv, Sk, D] codes, its scales), for the
/// reference.
fn sequence(f: &PackedFile, i: usize, causal: bool) -> Result<Quantized> {
    let (q0, sq) = (f.cu_q[i] as usize, (f.cu_q[i + 1] - f.cu_q[i]) as usize);
    let (k0, sk) = (f.cu_k[i] as usize, (f.cu_k[i + 1] - f.cu_k[i]) as usize);
    let (h, hkv, d) = (f.h, f.hkv, f.d);
    let gather =
        |src: &[u8], heads: usize, rows: usize, row_of: &dyn Fn(usize) -> usize| -> Vec<u8> {
            let mut out = vec![0u8; heads * rows * d];
            for hi in 0..heads {
                for r in 0..rows {
                    let at = (row_of(r) * heads + hi) * d;
                    out[(hi * rows + r) * d..(hi * rows + r + 1) * d]
                        .copy_from_slice(&src[at..at + d]);
                }
            }
            out
        };
    // A key's row: packed from cu_k, or through its page.
    let key_row = |r: usize| -> usize {
        match &f.paged {
            Some(p) => {
                p.block_table[i * p.max_pages + r / p.page_size] as usize * p.page_size
                    + r % p.page_size
            }
            None => k0 + r,
        }
    };
    Ok(Quantized {
        shape: Shape::cross(1, h, sq, sk, d)
            .with_kv_heads(hkv)?
            .with_causal(causal),
        q: gather(&f.q, h, sq, &|r| q0 + r),
        k: gather(&f.k, hkv, sk, &key_row),
        v: gather(&f.v, hkv, sk, &key_row),
        q_scale: f.q_scale[i * h..(i + 1) * h].to_vec(),
        k_scale: f.k_scale[i * hkv..(i + 1) * hkv].to_vec(),
        v_scale: f.v_scale[i * hkv..(i + 1) * hkv].to_vec(),
        softmax_scale: 1.0 / (d as f32).sqrt(),
    })
}

/// Runs a packed or paged file on stage 8 through the library, checks every row against the f64 reference unless
/// `check` is off (`--check sample` checks every row too: a packed batch is read whole), prints the error (and writes `o` [total_q, H, D], `lse` [H, total_q] when `output` is given).
pub fn run(
    bytes: &[u8],
    check: bool,
    causal: bool,
    out: OutDtype,
    output: Option<&std::path::Path>,
) -> Result<()> {
    let f = load(bytes)?;
    let gpu = crate::gpu("run")?;
    let st = gpu.stream.clone();
    let mut op = Attention::with_stage(
        gpu,
        Config {
            causal,
            out_dtype: out,
            softmax_scale: None,
            window: fp8_attention::Window::NONE,
        },
        Stage::S8,
    )?;
    let b = Packed {
        h: f.h,
        hkv: f.hkv,
        d: f.d,
        cu_seqlens_q: &f.cu_q,
        cu_seqlens_k: &f.cu_k,
    };
    // E4M3 codes and their scales uploaded as they are, or (real tokens) the values, quantized on the device: the
    // file's codes are then the host's copy of what it makes, for the reference only.
    let res = if let Some([rq, rk, rv]) = &f.real {
        let (rq, rk, rv) = (st.clone_htod(rq)?, st.clone_htod(rk)?, st.clone_htod(rv)?);
        let r = Real::contiguous;
        op.forward_varlen_real(gpu, &st, &b, r(&rq), r(&rk), r(&rv))?
    } else {
        let up = |x: &[u8]| st.clone_htod(if x.is_empty() { &[0u8][..] } else { x });
        let (dq, dk, dv) = (up(&f.q)?, up(&f.k)?, up(&f.v)?);
        let (qs, ks, vs) = (
            st.clone_htod(&f.q_scale)?,
            st.clone_htod(&f.k_scale)?,
            st.clone_htod(&f.v_scale)?,
        );
        let fp = |codes, scales| Fp8 { codes, scales };
        match &f.paged {
            Some(p) => {
                let cache = PagedCache {
                    num_pages: p.num_pages,
                    page_size: p.page_size,
                    max_pages: p.max_pages,
                    block_table: &p.block_table,
                    seq_lens: &p.seq_lens,
                };
                let (q, k, v) = (fp(&dq, &qs), fp(&dk, &ks), fp(&dv, &vs));
                op.forward_paged(gpu, &st, &b, &cache, q, k, v)?
            }
            None => op.forward_varlen(gpu, &st, &b, fp(&dq, &qs), fp(&dk, &ks), fp(&dv, &vs))?,
        }
    };
    let tq = b.total_q();
    let o: Vec<f32> = match &res.o {
        OutBuf::F16(x) => st.clone_dtoh(x)?.iter().map(|v| v.to_f32()).collect(),
        OutBuf::Bf16(x) => st.clone_dtoh(x)?.iter().map(|v| v.to_f32()).collect(),
        OutBuf::F32(x) => st.clone_dtoh(x)?,
    };
    let lse = st.clone_dtoh(&res.lse)?;
    // Every sequence's rows against the f64 reference of that sequence alone, in the packed order.
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut lse_max = 0f64;
    for i in (0..b.batch()).filter(|_| check) {
        let sq = (f.cu_q[i + 1] - f.cu_q[i]) as usize;
        if sq == 0 {
            continue;
        }
        let r = fixtures::reference(&sequence(&f, i, causal)?);
        for hi in 0..f.h {
            for row in 0..sq {
                let at = ((f.cu_q[i] as usize + row) * f.h + hi) * f.d;
                got.extend_from_slice(&o[at..at + f.d]);
                want.extend_from_slice(&r.o[(hi * sq + row) * f.d..(hi * sq + row + 1) * f.d]);
                let (g, w) = (
                    lse[hi * tq + f.cu_q[i] as usize + row] as f64,
                    r.lse[hi * sq + row],
                );
                if g != w {
                    lse_max = lse_max.max((g - w).abs());
                }
            }
        }
    }
    let e = error_stats(
        &got,
        &want,
        Tolerance {
            atol: 1e-2,
            rtol: 0.0,
        },
    );
    println!(
        "stage8 on {} for a {} batch of {} sequences, {tq} query tokens, H = {}, Hkv = {}, D = {}{}, O in {out}",
        gpu.name,
        match (&f.paged, &f.real) {
            (Some(_), _) => "paged",
            (None, Some(_)) => "packed real-valued (quantized on the device, a scale a head)",
            (None, None) => "packed",
        },
        b.batch(),
        f.h,
        f.hkv,
        f.d,
        if causal { ", causal" } else { "" }
    );
    if check {
        println!("O vs f64 SDPA on the dequantized inputs, every row: {e}");
        println!("LSE vs f64: max_abs={lse_max:.3e}");
    }
    if let Some(path) = output {
        let bytes = crate::files::save_as(
            &o[..tq * f.h * f.d],
            &[tq, f.h, f.d],
            &lse[..f.h * tq],
            &[f.h, tq],
            out,
        )?;
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote o and lse to {}", path.display());
    }
    if o[..tq * f.h * f.d].iter().any(|x| !x.is_finite()) {
        bail!("O holds NaN or Inf");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }
    fn i32s(x: &[i32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
    fn f32s(n: usize) -> Vec<u8> {
        (0..n).flat_map(|_| 0.01f32.to_le_bytes()).collect()
    }

    fn varlen_file(kdt: Dtype, cu_k_len: usize) -> Vec<u8> {
        let (tq, tk, h, hkv, d) = (10, 30, 4, 2, 64);
        file(&[
            ("q", Dtype::F8_E4M3, vec![tq, h, d], vec![56; tq * h * d]),
            (
                "k",
                kdt,
                vec![tk, hkv, d],
                vec![56; tk * hkv * d * if kdt == Dtype::F16 { 2 } else { 1 }],
            ),
            (
                "v",
                Dtype::F8_E4M3,
                vec![tk, hkv, d],
                vec![56; tk * hkv * d],
            ),
            ("q_scale", Dtype::F32, vec![2 * h], f32s(2 * h)),
            ("k_scale", Dtype::F32, vec![1], f32s(1)),
            ("v_scale", Dtype::F32, vec![2 * hkv], f32s(2 * hkv)),
            ("cu_seqlens_q", Dtype::I32, vec![3], i32s(&[0, 4, 10])),
            (
                "cu_seqlens_k",
                Dtype::I32,
                vec![cu_k_len],
                i32s(&[0, 12, 30, 30][..cu_k_len]),
            ),
        ])
    }

    #[test]
    fn packed_files_load_and_their_faults_are_named() {
        let bytes = varlen_file(Dtype::F8_E4M3, 3);
        assert!(is_packed(&bytes));
        let f = load(&bytes).unwrap();
        assert_eq!(
            (f.h, f.hkv, f.d, f.cu_k.clone(), f.k_scale.len()),
            (4, 2, 64, vec![0, 12, 30], 4)
        );
        let e = format!("{:#}", load(&varlen_file(Dtype::F16, 3)).unwrap_err());
        assert!(
            e.contains("tensor `k` has dtype F16") && e.contains("E4M3 codes"),
            "{e}"
        );
        // A wrong boundary count loads (the library names it before any launch).
        assert_eq!(load(&varlen_file(Dtype::F8_E4M3, 4)).unwrap().cu_k.len(), 4);
    }

    #[test]
    fn real_packed_files_are_quantized_as_the_device_does() {
        let (tq, tk, h, hkv, d) = (5, 9, 2, 1, 64);
        let vals =
            |n: usize, k: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * k).sin()).collect() };
        let (q, k, v) = (
            vals(tq * h * d, 0.37),
            vals(tk * hkv * d, 0.11),
            vals(tk * hkv * d, 0.23),
        );
        let b = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|y| y.to_le_bytes()).collect() };
        let base = vec![
            ("q", Dtype::F32, vec![tq, h, d], b(&q)),
            ("k", Dtype::F32, vec![tk, hkv, d], b(&k)),
            ("v", Dtype::F32, vec![tk, hkv, d], b(&v)),
            ("cu_seqlens_q", Dtype::I32, vec![3], i32s(&[0, 2, 5])),
            ("cu_seqlens_k", Dtype::I32, vec![3], i32s(&[0, 4, 9])),
        ];
        let f = load(&file(&base)).unwrap();
        assert_eq!(
            (f.h, f.hkv, f.d, f.q_scale.len(), f.k_scale.len()),
            (2, 1, 64, 4, 2)
        );
        assert!(f.real.is_some() && f.paged.is_none());
        // Head 1's scale is that of its own tokens' amax, the same for both sequences; every code, token-major, decodes
        // to its value within E4M3's rounding.
        let amax1 = (0..tq)
            .flat_map(|t| q[(t * h + 1) * d..(t * h + 2) * d].iter())
            .fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(f.q_scale[1], amax1 / 448.0);
        assert_eq!(f.q_scale[3], f.q_scale[1]);
        for (codes, x, scale, heads) in [(&f.q, &q, &f.q_scale, h), (&f.k, &k, &f.k_scale, hkv)] {
            for (i, (&c, &want)) in codes.iter().zip(x.iter()).enumerate() {
                let sc = scale[(i / d) % heads];
                let got = fp8_codec::decode(c, fp8_codec::Format::E4M3) * sc;
                assert!(
                    (got - want).abs() <= want.abs() / 16.0 + sc / 512.0,
                    "element {i}: {got} for {want}"
                );
            }
        }
        // Scales with real values, or a mixed dtype: named.
        let mut with_scale = base.clone();
        with_scale.push(("k_scale", Dtype::F32, vec![1], f32s(1)));
        let e = format!("{:#}", load(&file(&with_scale)).unwrap_err());
        assert!(
            e.contains("`k_scale` is given") && e.contains("E4M3 codes only"),
            "{e}"
        );
        let mut mixed = base.clone();
        mixed[1] = ("k", Dtype::F16, vec![tk, hkv, d], vec![0; tk * hkv * d * 2]);
        let e = format!("{:#}", load(&file(&mixed)).unwrap_err());
        assert!(e.contains("must have one dtype"), "{e}");
    }

    #[test]
    fn paged_files_load_and_their_faults_are_named() {
        let (tq, h, hkv, d, pages, page) = (5, 2, 1, 64, 6, 16);
        let mk = |rows: usize, lens: &[i32]| {
            file(&[
                ("q", Dtype::F8_E4M3, vec![tq, h, d], vec![56; tq * h * d]),
                (
                    "k_cache",
                    Dtype::F8_E4M3,
                    vec![pages, page, hkv, d],
                    vec![56; pages * page * hkv * d],
                ),
                (
                    "v_cache",
                    Dtype::F8_E4M3,
                    vec![pages, page, hkv, d],
                    vec![56; pages * page * hkv * d],
                ),
                ("q_scale", Dtype::F32, vec![1], f32s(1)),
                ("k_scale", Dtype::F32, vec![1], f32s(1)),
                ("v_scale", Dtype::F32, vec![1], f32s(1)),
                ("cu_seqlens_q", Dtype::I32, vec![3], i32s(&[0, 1, 5])),
                (
                    "block_table",
                    Dtype::I32,
                    vec![rows, 3],
                    i32s(&vec![0; rows * 3]),
                ),
                ("seq_lens", Dtype::I32, vec![lens.len()], i32s(lens)),
            ])
        };
        let f = load(&mk(2, &[20, 33])).unwrap();
        assert_eq!(f.cu_k, vec![0, 20, 53]);
        assert_eq!(
            f.paged
                .as_ref()
                .map(|p| (p.num_pages, p.page_size, p.max_pages)),
            Some((6, 16, 3))
        );
        let e = format!("{:#}", load(&mk(3, &[20, 33])).unwrap_err());
        assert!(
            e.contains("bounds 2 sequences") && e.contains("`block_table` has 3 rows"),
            "{e}"
        );
        let e = format!("{:#}", load(&mk(2, &[20])).unwrap_err());
        assert!(e.contains("`seq_lens` 1 lengths"), "{e}");
    }
}
