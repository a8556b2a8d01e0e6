// Stage 7 over views: Q, K and V read through their flat heads' strides, as the ring reads a shard's halves.
use crate::prelude::*;
use composed::{Strides, Tensors, Workspace};
use half::f16;
use lab::cudarc::driver::{CudaSlice, DevicePtr};

/// `x`, `heads` heads of `rows` rows of `d` bytes, placed `off` rows into heads of `rows + 9` rows with NaN codes
/// (0x7f) around them: the buffer, the view's strides (S, H, B) and its first byte's offset.
fn embedded(
    x: &[u8],
    b: usize,
    heads: usize,
    rows: usize,
    d: usize,
    off: usize,
) -> (Vec<u8>, [usize; 3], usize) {
    let pitch = rows + 9;
    let mut buf = vec![0x7fu8; b * heads * pitch * d];
    for bh in 0..b * heads {
        buf[(bh * pitch + off) * d..(bh * pitch + off + rows) * d]
            .copy_from_slice(&x[bh * rows * d..(bh + 1) * rows * d]);
    }
    (buf, [d, pitch * d, heads * pitch * d], off * d)
}

/// Stage 7 launched by a `Workspace` on views of `qz`'s tensors (Q `off_q` rows in, K and V at row 0 and at `off_kv`):
/// O and LSE of the problem's rows.
fn run_on_views(gpu: &Gpu, qz: &Quantized, off_q: usize, off_kv: usize) -> Result<Attention<f32>> {
    let (s, st) = (qz.shape, &gpu.stream);
    let (q, sq, q0) = embedded(&qz.q, s.b, s.h, s.sq, s.d, off_q);
    let (k, sk, k0) = embedded(&qz.k, s.b, s.hkv, s.sk, s.d, 0);
    let (v, sv, v0) = embedded(&qz.v, s.b, s.hkv, s.sk, s.d, off_kv);
    let bufs: Vec<CudaSlice<u8>> = [q, k, v]
        .iter()
        .map(|x| st.clone_htod(x))
        .collect::<Result<_, _>>()?;
    let scales: Vec<CudaSlice<f32>> = [&qz.q_scale, &qz.k_scale, &qz.v_scale]
        .iter()
        .map(|x| st.clone_htod(x.as_slice()))
        .collect::<Result<_, _>>()?;
    let mut ws = Workspace::new();
    let rows = ws.output_rows(gpu, Stage::S7, &s)?;
    let o = st.clone_htod(&lab::numerics::poisoned::<f16>(rows * s.d))?;
    let lse = st.clone_htod(&lab::numerics::poisoned::<f32>(rows))?;
    let a = |b: &CudaSlice<u8>, off: usize| b.device_ptr(st).0 + off as u64;
    let f = |b: &CudaSlice<f32>| b.device_ptr(st).0;
    let t = Tensors {
        q: a(&bufs[0], q0),
        k: a(&bufs[1], k0),
        v: a(&bufs[2], v0),
        q_scale: f(&scales[0]),
        k_scale: f(&scales[1]),
        v_scale: f(&scales[2]),
        o: o.device_ptr(st).0,
        lse: lse.device_ptr(st).0,
        strides: Some(Strides {
            q: sq,
            k: sk,
            v: sv,
        }),
    };
    ws.launch(gpu, Stage::S7, st, &s, qz.softmax_scale, OutDtype::F16, &t)?;
    let n = s.heads() * s.sq;
    let o = st.clone_dtoh(&o.slice(0..n * s.d))?;
    let lse = st.clone_dtoh(&lse.slice(0..n))?;
    lab::numerics::check_written(&o, "O")?;
    lab::numerics::check_written(&lse, "LSE")?;
    Ok(Attention {
        o: o.iter().map(|x| x.to_f32()).collect(),
        lse,
    })
}

pub fn add(t: &mut Suite) {
    for shape in [
        Shape::cross(2, 4, 300, 700, 128)
            .with_kv_heads(2)
            .expect("4 / 2")
            .with_causal(true),
        Shape::cross(2, 3, 200, 333, 64),
        Shape::cross(1, 2, 130, 257, 256),
    ] {
        let name = format!(
            "{}x{}q{}kv_{}x{}x{}{}",
            shape.b,
            shape.h,
            shape.hkv,
            shape.sq,
            shape.sk,
            shape.d,
            if shape.causal { "_causal" } else { "" }
        );
        t.gpu(&format!("stage7::views::{name}"), move |gpu| {
            // The ring's reads of a shard's halves: rows from some row on of heads longer than the view (NaN codes
            // around it); the same bits as contiguous tensors, and Vᵀ (tile images at D = 128) made from the view.
            let qz = quantize_per_head(&normal(shape, 41));
            let plain = run_as(gpu, Stage::S7, &qz, OutDtype::F16)?;
            for (off_q, off_kv) in [(0, 0), (5, 3)] {
                let got = run_on_views(gpu, &qz, off_q, off_kv)?;
                ensure!(
                    bit_identical(&got, &plain),
                    "{name}: stage 7 on views (Q {off_q}, V {off_kv} rows in) differs from contiguous tensors"
                );
            }
            eprintln!("stage7 {name}: views read as contiguous tensors, bit for bit");
            Ok(())
        });
    }
    t.gpu("stage7::views::uneven_batches_refused_by_name", |gpu| {
        // [B, S, H, D] with B = 2: heads of two batches are not evenly spaced, which stage 7's (D, S, B·H) maps need.
        let shape = Shape::new(2, 2, 64, 64);
        let mut d = OnDevice::upload(gpu, &quantize_per_head(&normal(shape, 3)))?;
        d.use_bshd_inputs(gpu)?;
        let e = format!("{:#}", d.launch(gpu, Stage::S7).unwrap_err());
        ensure!(
            e.contains("q at strides") && e.contains("take stage8"),
            "{e}"
        );
        let e = format!("{:#}", d.launch(gpu, Stage::S4).unwrap_err());
        ensure!(e.contains("take a TMA stage"), "{e}");
        Ok(())
    });
}
