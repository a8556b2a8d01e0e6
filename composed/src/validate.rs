// Checked inputs: every bad input is refused with a clear error, naming what is wrong, before any launch.
use anyhow::{Result, bail, ensure};
use fixtures::Quantized;

use crate::stages::DIMS;

/// Why a shape is refused: a zero size, or a head dimension the stages are not built for.
pub fn validate_shape(s: &fixtures::Shape) -> Result<()> {
    ensure!(
        s.sq >= 1 && s.sk >= 1,
        "sequence length must be at least 1 (Sq = {}, Sk = {})",
        s.sq,
        s.sk
    );
    ensure!(
        s.b >= 1 && s.h >= 1,
        "batch and heads must be at least 1 (B = {}, H = {})",
        s.b,
        s.h
    );
    ensure!(
        DIMS.contains(&s.d),
        "head dimension D = {} is not supported: the stages are built for D = 64 and 128 (stage7 also 256)",
        s.d
    );
    Ok(())
}

/// Why an input is refused: named tensor, first bad index.
pub fn validate(qz: &Quantized) -> Result<()> {
    let s = qz.shape;
    validate_shape(&s)?;
    for (name, t, heads, rows) in [
        ("q", &qz.q, s.h, s.sq),
        ("k", &qz.k, s.hkv, s.sk),
        ("v", &qz.v, s.hkv, s.sk),
    ] {
        let want = s.b * heads * rows * s.d;
        ensure!(
            t.len() == want,
            "tensor `{name}` has {} elements, [B, H, S, D] = [{}, {heads}, {rows}, {}] needs {want}",
            t.len(),
            s.b,
            s.d
        );
        // Chunks folded without an early exit vectorise: gigabyte tensors are scanned in well under a second.
        let nan = |c: u8| fp8_codec::Format::E4M3.is_nan(c);
        if let Some(chunk) = t
            .chunks(1 << 16)
            .position(|c| c.iter().fold(false, |a, &x| a | nan(x)))
        {
            let i = (chunk << 16) + t[chunk << 16..].iter().position(|&c| nan(c)).unwrap_or(0);
            bail!(
                "tensor `{name}` holds an E4M3 NaN code at {}",
                index_text(i, &[s.b, heads, rows, s.d])
            );
        }
    }
    for (name, sc, heads) in [
        ("q_scale", &qz.q_scale, s.heads()),
        ("k_scale", &qz.k_scale, s.kv_heads()),
        ("v_scale", &qz.v_scale, s.kv_heads()),
    ] {
        ensure!(
            sc.len() == heads,
            "`{name}` has {} entries, one per (batch, head) = {heads} needed",
            sc.len()
        );
        if let Some(i) = sc.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
            bail!("`{name}`[{i}] = {} is not a positive finite scale", sc[i]);
        }
    }
    ensure!(
        qz.softmax_scale.is_finite() && qz.softmax_scale > 0.0,
        "softmax scale {} is not positive and finite",
        qz.softmax_scale
    );
    // The kernels scale raw scores by this product (times log2 e) in f32: it must not underflow to 0 or a
    // subnormal, where masked keys (−inf · 0) would turn into NaN.
    for h in 0..s.heads() {
        let kv = s.kv_head(h);
        let c = qz.softmax_scale * qz.q_scale[h] * qz.k_scale[kv] * std::f32::consts::LOG2_E;
        ensure!(
            c.is_normal(),
            "softmax_scale · q_scale[{h}] · k_scale[{kv}] · log2(e) = {c:e} is not a normal f32: the scores' scale underflows"
        );
    }
    Ok(())
}

/// Flat index `i` of a row-major tensor of `dims` as `[b, h, s, d] = [..]` (4 dims), or its coordinates.
pub fn index_text(i: usize, dims: &[usize]) -> String {
    let mut at = vec![0; dims.len()];
    let mut rest = i;
    for (a, &n) in at.iter_mut().zip(dims).rev() {
        *a = rest % n.max(1);
        rest /= n.max(1);
    }
    let coords = at
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if dims.len() == 4 {
        format!("[b, h, s, d] = [{coords}]")
    } else {
        format!("[{coords}] (flat index {i})")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn flat_indices_become_coordinates() {
        assert_eq!(
            super::index_text(70_000, &[1, 2, 600, 128]),
            "[b, h, s, d] = [0, 0, 546, 112]"
        );
        assert_eq!(super::index_text(7, &[2, 4]), "[1, 3] (flat index 7)");
    }
}
