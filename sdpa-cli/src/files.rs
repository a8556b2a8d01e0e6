// `sdpa run`'s files: safetensors in (E4M3 with scales, or real values), every check with a named error, O and LSE out.
use anyhow::{Context, Result, bail, ensure};
use fixtures::{OutDtype, Quantized, Raw, Scheme, Shape};
use half::{bf16, f16};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

use composed::DIMS;

/// What an input file held: E4M3 tensors with their scales, or real-valued tensors (quantized on the device by
/// a [`Scheme`], and kept to report the error against the unquantized inputs too).
#[derive(Debug)]
pub enum Loaded {
    Fp8(Quantized),
    Real(Raw),
}

impl Loaded {
    pub fn shape(&self) -> Shape {
        match self {
            Loaded::Fp8(qz) => qz.shape,
            Loaded::Real(raw) => raw.shape,
        }
    }
    /// The problem's shape, to set what the file cannot say (the causal mask).
    pub fn shape_mut(&mut self) -> &mut Shape {
        match self {
            Loaded::Fp8(qz) => &mut qz.shape,
            Loaded::Real(raw) => &mut raw.shape,
        }
    }
}

pub(crate) fn tensor<'a>(st: &'a SafeTensors<'a>, name: &str) -> Result<TensorView<'a>> {
    st.tensor(name).map_err(|_| {
        let mut have: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        have.sort();
        anyhow::anyhow!(
            "missing tensor `{name}` (the file holds: {})",
            have.join(", ")
        )
    })
}

fn shape4(name: &str, t: &TensorView) -> Result<[usize; 4]> {
    let s = t.shape();
    ensure!(
        s.len() == 4,
        "tensor `{name}` has shape {s:?}: expected [B, H, S, D]"
    );
    Ok([s[0], s[1], s[2], s[3]])
}

/// Real-valued data as f32; NaN or Inf is refused with the tensor's name and the first index.
pub(crate) fn real(name: &str, t: &TensorView) -> Result<Vec<f32>> {
    let d = t.data();
    let v: Vec<f32> = match t.dtype() {
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => d
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => bail!(
            "tensor `{name}` has dtype {other:?}: expected F16, BF16 or F32 (or F8_E4M3 with scales)"
        ),
    };
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        bail!(
            "tensor `{name}` holds {} at {}",
            v[i],
            composed::index_text(i, t.shape())
        );
    }
    Ok(v)
}

/// A scale tensor: one per (batch, head), or one for the whole tensor; every value positive and finite.
pub(crate) fn scales(st: &SafeTensors, name: &str, heads: usize) -> Result<Vec<f32>> {
    let t = tensor(st, name)?;
    let v = real(name, &t)?;
    if let Some(i) = v.iter().position(|x| *x <= 0.0) {
        bail!("`{name}`[{i}] = {} is not a positive scale", v[i]);
    }
    match v.len() {
        1 => Ok(vec![v[0]; heads]),
        n if n == heads => Ok(v),
        n => bail!("`{name}` has {n} values: expected 1 (per tensor) or B·H = {heads} (per head)"),
    }
}

/// Reads `q`, `k`, `v` (F16 / BF16 / F32, to be quantized by `scheme`) or E4M3 `q`, `k`, `v` with `q_scale`,
/// `k_scale`, `v_scale` (`scheme` must then be the default: the file's codes are used as they are). Every
/// problem is an error naming what is wrong; nothing is launched.
pub fn load(bytes: &[u8], scheme: Scheme) -> Result<Loaded> {
    let st = SafeTensors::deserialize(bytes).context("not a safetensors file")?;
    let (q, k, v) = (tensor(&st, "q")?, tensor(&st, "k")?, tensor(&st, "v")?);
    let ([b, h, sq, d], [bk, hk, sk, dk], sv) =
        (shape4("q", &q)?, shape4("k", &k)?, shape4("v", &v)?);
    ensure!(
        sv == [bk, hk, sk, dk],
        "tensors `k` {:?} and `v` {sv:?} must have the same shape",
        [bk, hk, sk, dk]
    );
    ensure!(
        [b, d] == [bk, dk] && hk >= 1 && h.is_multiple_of(hk),
        "`q` is [{b}, {h}, {sq}, {d}] but `k` is [{bk}, {hk}, {sk}, {dk}]: B and D must agree, and H must be a multiple of k's heads (grouped-query attention)"
    );
    ensure!(
        sq >= 1 && sk >= 1,
        "sequence length 0 (Sq = {sq}, Sk = {sk}): there is nothing to attend"
    );
    scheme.rotate.rotation(d).context("--rotate")?;
    ensure!(
        DIMS.contains(&d),
        "head dimension D = {d} is not supported: the stages are built for D = 64 and 128 (stage7 also 256)"
    );
    let shape = Shape::cross(b, h, sq, sk, d).with_kv_heads(hk)?;
    let fp8 = [&q, &k, &v]
        .iter()
        .filter(|t| t.dtype() == Dtype::F8_E4M3)
        .count();
    if fp8 == 3 {
        ensure!(
            scheme == Scheme::default(),
            "--scales, --smooth-k and --rotate apply to real-valued inputs; this file holds E4M3 codes with their scales ({} asked)",
            scheme.name()
        );
        let qz = Quantized {
            shape,
            q: q.data().to_vec(),
            k: k.data().to_vec(),
            v: v.data().to_vec(),
            q_scale: scales(&st, "q_scale", b * h)?,
            k_scale: scales(&st, "k_scale", b * hk)?,
            v_scale: scales(&st, "v_scale", b * hk)?,
            softmax_scale: 1.0 / (d as f32).sqrt(),
        };
        composed::validate(&qz)?;
        return Ok(Loaded::Fp8(qz));
    }
    ensure!(
        fp8 == 0,
        "`q`, `k` and `v` must all be F8_E4M3 (with scales) or all real-valued; {fp8} of 3 are F8_E4M3"
    );
    let raw = Raw {
        shape,
        q: real("q", &q)?,
        k: real("k", &k)?,
        v: real("v", &v)?,
    };
    Ok(Loaded::Real(raw))
}

/// `o` ([B, H, Sq, D] in `out`: the values the stage wrote, exactly) and `lse` (F32 [B, H, Sq]) as safetensors
/// bytes.
pub fn save(shape: Shape, o: &[f32], lse: &[f32], out: OutDtype) -> Result<Vec<u8>> {
    save_as(
        o,
        &[shape.b, shape.h, shape.sq, shape.d],
        lse,
        &[shape.b, shape.h, shape.sq],
        out,
    )
}

/// `o` in `out` with dims `o_dims` and `lse` (F32) with dims `lse_dims`, as safetensors bytes.
pub(crate) fn save_as(
    o: &[f32],
    o_dims: &[usize],
    lse: &[f32],
    lse_dims: &[usize],
    out: OutDtype,
) -> Result<Vec<u8>> {
    let (dtype, ob): (Dtype, Vec<u8>) = match out {
        OutDtype::F16 => (
            Dtype::F16,
            o.iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
        OutDtype::Bf16 => (
            Dtype::BF16,
            o.iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        ),
        OutDtype::F32 => (Dtype::F32, o.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let lb: Vec<u8> = lse.iter().flat_map(|x| x.to_le_bytes()).collect();
    let ov = TensorView::new(dtype, o_dims.to_vec(), &ob)?;
    let lv = TensorView::new(Dtype::F32, lse_dims.to_vec(), &lb)?;
    Ok(safetensors::serialize([("o", ov), ("lse", lv)], None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixtures::{Granularity, Rotate};

    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(&str, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn f32s(n: usize, x: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| (x + i as f32 * 1e-3).to_le_bytes())
            .collect()
    }

    fn qkv(shape: [usize; 4], dtype: Dtype) -> Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)> {
        let n: usize = shape.iter().product();
        let bytes = match dtype {
            Dtype::F16 => (0..n)
                .flat_map(|i| f16::from_f32(i as f32 * 1e-3).to_le_bytes())
                .collect(),
            _ => f32s(n, 0.5),
        };
        ["q", "k", "v"]
            .iter()
            .map(|&name| (name, dtype, shape.to_vec(), bytes.clone()))
            .collect()
    }

    fn err(tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>) -> String {
        format!(
            "{:#}",
            load(&file(&tensors), Scheme::default()).unwrap_err()
        )
    }

    #[test]
    fn good_inputs_load_in_every_dtype() {
        for dt in [Dtype::F16, Dtype::F32] {
            let l = load(&file(&qkv([1, 2, 5, 64], dt)), Scheme::default()).unwrap();
            assert_eq!(l.shape(), Shape::new(1, 2, 5, 64));
            assert!(matches!(l, Loaded::Real(_)));
        }
        let mut t = qkv([1, 2, 5, 64], Dtype::F32);
        for x in t.iter_mut() {
            x.1 = Dtype::F8_E4M3;
            x.3 = vec![0x38; 640];
        }
        for name in ["q_scale", "k_scale", "v_scale"] {
            t.push((name, Dtype::F32, vec![2], f32s(2, 0.5)));
        }
        let l = load(&file(&t), Scheme::default()).unwrap();
        assert!(matches!(l, Loaded::Fp8(qz) if qz.q_scale == vec![0.5, 0.501]));
    }

    #[test]
    fn schemes_that_cannot_apply_are_named() {
        let rot = Scheme {
            rotate: Rotate::Hadamard,
            ..Scheme::default()
        };
        let e = format!(
            "{:#}",
            load(&file(&qkv([1, 1, 4, 96], Dtype::F32)), rot).unwrap_err()
        );
        assert!(
            e.contains("--rotate") && e.contains("D = 96") && e.contains("power of two"),
            "{e}"
        );
        let mut t = qkv([1, 1, 4, 64], Dtype::F32);
        for x in t.iter_mut() {
            x.1 = Dtype::F8_E4M3;
            x.3 = vec![0x38; 256];
        }
        for name in ["q_scale", "k_scale", "v_scale"] {
            t.push((name, Dtype::F32, vec![1], f32s(1, 0.5)));
        }
        let smooth = Scheme {
            smooth_k: true,
            per: Granularity::PerTensor,
            ..Scheme::default()
        };
        let e = format!("{:#}", load(&file(&t), smooth).unwrap_err());
        assert!(
            e.contains("apply to real-valued inputs") && e.contains("per-tensor+smooth-k"),
            "{e}"
        );
    }

    #[test]
    fn grouped_query_inputs_load() {
        let mut t = qkv([1, 4, 5, 64], Dtype::F32);
        t[1] = ("k", Dtype::F32, vec![1, 2, 7, 64], f32s(2 * 7 * 64, 0.1));
        t[2] = ("v", Dtype::F32, vec![1, 2, 7, 64], f32s(2 * 7 * 64, 0.1));
        let l = load(&file(&t), Scheme::default()).unwrap();
        assert_eq!((l.shape().h, l.shape().hkv, l.shape().group()), (4, 2, 2));
    }

    #[test]
    fn a_missing_tensor_is_named() {
        let mut t = qkv([1, 1, 4, 64], Dtype::F32);
        t.remove(1);
        let e = err(t);
        assert!(
            e.contains("missing tensor `k`") && e.contains("q, v"),
            "{e}"
        );
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let mut t = qkv([1, 2, 4, 64], Dtype::F32);
        t[1] = ("k", Dtype::F32, vec![1, 3, 4, 64], f32s(768, 0.1));
        t[2] = ("v", Dtype::F32, vec![1, 3, 4, 64], f32s(768, 0.1));
        assert!(err(t).contains("B and D must agree, and H must be a multiple"));
        let mut t = qkv([1, 2, 4, 64], Dtype::F32);
        t[2] = ("v", Dtype::F32, vec![1, 2, 5, 64], f32s(640, 0.1));
        assert!(err(t).contains("must have the same shape"));
    }

    #[test]
    fn a_wrong_dtype_is_refused() {
        let mut t = qkv([1, 1, 4, 64], Dtype::F32);
        t[0] = ("q", Dtype::I32, vec![1, 1, 4, 64], f32s(256, 0.0));
        let e = err(t);
        assert!(e.contains("`q` has dtype I32"), "{e}");
    }

    #[test]
    fn zero_length_and_unsupported_d_are_refused() {
        assert!(err(qkv([1, 1, 0, 64], Dtype::F32)).contains("sequence length 0"));
        assert!(err(qkv([1, 1, 4, 32], Dtype::F32)).contains("D = 32 is not supported"));
    }

    #[test]
    fn nan_and_inf_name_the_tensor_and_index() {
        let mut t = qkv([1, 1, 4, 64], Dtype::F32);
        t[2].3[4 * 7..4 * 8].copy_from_slice(&f32::NAN.to_le_bytes());
        let e = err(t);
        assert!(
            e.contains("tensor `v` holds NaN at [b, h, s, d] = [0, 0, 0, 7]"),
            "{e}"
        );
        let mut t = qkv([1, 1, 4, 64], Dtype::F32);
        t[0].3[4 * 3..4 * 4].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes());
        let e = err(t);
        assert!(
            e.contains("tensor `q` holds -inf at [b, h, s, d] = [0, 0, 0, 3]"),
            "{e}"
        );
    }

    #[test]
    fn non_positive_scales_are_refused() {
        let mut t = qkv([1, 2, 4, 64], Dtype::F32);
        for x in t.iter_mut() {
            x.1 = Dtype::F8_E4M3;
            x.3 = vec![0x38; 512];
        }
        t.push(("q_scale", Dtype::F32, vec![1], f32s(1, 1.0)));
        t.push((
            "k_scale",
            Dtype::F32,
            vec![2],
            [1.0f32, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
        t.push(("v_scale", Dtype::F32, vec![1], f32s(1, 1.0)));
        let e = err(t);
        assert!(
            e.contains("`k_scale`[1] = 0 is not a positive scale"),
            "{e}"
        );
    }

    #[test]
    fn outputs_round_trip() {
        let s = Shape::new(1, 1, 2, 64);
        for (out, dtype) in [
            (OutDtype::F16, Dtype::F16),
            (OutDtype::Bf16, Dtype::BF16),
            (OutDtype::F32, Dtype::F32),
        ] {
            let bytes = save(s, &vec![0.5; 128], &[1.0, 2.0], out).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let o = st.tensor("o").unwrap();
            assert_eq!(o.dtype(), dtype);
            assert_eq!(o.data().len(), 128 * out.size());
            assert_eq!(st.tensor("lse").unwrap().shape(), &[1, 1, 2]);
        }
    }
}
