// fp8-attention's test binary: the Attention op on device tensors against the lab's own path, bit for bit.
mod real;
mod ring;
mod stage8;

use std::sync::Arc;

use anyhow::{Result, ensure};
use composed::OnDevice;
use fixtures::{Quantized, Raw, Shape, quantize_per_head};
use fp8_attention::{Attention, Config, Fp8, OutDtype, Output};
use lab::cudarc::driver::{CudaSlice, CudaStream};
use lab::{Gpu, Suite};

/// A problem's inputs on the device, as a model would hold them.
#[derive(Debug)]
pub struct Inputs {
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    qs: CudaSlice<f32>,
    ks: CudaSlice<f32>,
    vs: CudaSlice<f32>,
}

pub fn inputs(st: &Arc<CudaStream>, qz: &Quantized) -> Result<Inputs> {
    Ok(Inputs {
        q: st.clone_htod(&qz.q)?,
        k: st.clone_htod(&qz.k)?,
        v: st.clone_htod(&qz.v)?,
        qs: st.clone_htod(&qz.q_scale)?,
        ks: st.clone_htod(&qz.k_scale)?,
        vs: st.clone_htod(&qz.v_scale)?,
    })
}

pub fn forward(
    op: &mut Attention,
    gpu: &Gpu,
    st: &Arc<CudaStream>,
    s: Shape,
    x: &Inputs,
) -> Result<Output> {
    let f = |codes, scales| Fp8 { codes, scales };
    Ok(op.forward(gpu, st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs))?)
}

/// `op`'s call on `x` read through `strides` (`Attention::forward_strided`), into new outputs.
pub fn forward_strided(
    op: &mut Attention,
    gpu: &Gpu,
    st: &Arc<CudaStream>,
    s: Shape,
    x: &Inputs,
    strides: fp8_attention::Strides,
) -> Result<Output> {
    let f = |codes, scales| Fp8 { codes, scales };
    let mut o = op.alloc_output(gpu, st, &s)?;
    op.forward_strided(
        gpu,
        st,
        s,
        f(&x.q, &x.qs),
        f(&x.k, &x.ks),
        f(&x.v, &x.vs),
        strides,
        &mut o,
    )?;
    Ok(o)
}

/// The lab's own path (upload, launch, download with every element checked written) on the same problem.
pub fn lab_path(gpu: &Gpu, qz: &Quantized, out: OutDtype) -> Result<fixtures::Attention<f32>> {
    lab_path_on(gpu, qz, out, fp8_attention::fastest_stage(gpu, &qz.shape)?)
}

/// The lab's launch of `stage` on the same codes (composed's `OnDevice`), downloaded.
pub fn lab_path_on(
    gpu: &Gpu,
    qz: &Quantized,
    out: OutDtype,
    stage: fp8_attention::Stage,
) -> Result<fixtures::Attention<f32>> {
    let mut d = OnDevice::upload_as(gpu, qz, out)?;
    d.launch(gpu, stage)?;
    d.download(gpu)
}

pub fn same_bits(a: &fixtures::Attention<f32>, b: &fixtures::Attention<f32>) -> bool {
    a.o.len() == b.o.len()
        && a.lse.len() == b.lse.len()
        && a.o
            .iter()
            .zip(&b.o)
            .all(|(x, y)| x.to_bits() == y.to_bits())
        && a.lse
            .iter()
            .zip(&b.lse)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The op's cases (name, shape, Hkv, causal, O's dtype): the mission shape; causal grouped-query heads at D = 128; a
/// split tail (256 units on the H100's 132 SMs, 5 key tiles each); f32 O at D = 64 with Sq ≠ Sk; causal grouped-query
/// heads at D = 256.
pub const CASES: [(&str, Shape, usize, bool, OutDtype); 5] = [
    (
        "mission_1x8x512x64",
        Shape::new(1, 8, 512, 64),
        8,
        false,
        OutDtype::Bf16,
    ),
    (
        "causal_gqa_2x8q2kv_300x700x128",
        Shape::cross(2, 8, 300, 700, 128),
        2,
        true,
        OutDtype::F16,
    ),
    (
        "split_tail_2x16x1024x128",
        Shape::new(2, 16, 1024, 128),
        16,
        false,
        OutDtype::Bf16,
    ),
    (
        "f32_1x4_100x333x64",
        Shape::cross(1, 4, 100, 333, 64),
        4,
        false,
        OutDtype::F32,
    ),
    (
        "causal_gqa_1x8q2kv_300x500x256",
        Shape::cross(1, 8, 300, 500, 256),
        2,
        true,
        OutDtype::Bf16,
    ),
];

fn main() {
    let mut t = Suite::new();
    for (name, shape, hkv, causal, out) in CASES {
        t.gpu(&format!("forward::{name}::bits_of_the_lab_path"), move |gpu| {
            let s = shape.with_kv_heads(hkv)?.with_causal(causal);
            let qz = quantize_per_head(&Raw::random(s, 17, 1.0));
            // On a stream of the caller's own, not the device's default one.
            let st = gpu.ctx.new_stream()?;
            let x = inputs(&st, &qz)?;
            let mut op = Attention::new(
                gpu,
                Config {
                    causal,
                    out_dtype: out,
                    softmax_scale: None,
                    window: fp8_attention::Window::NONE,
                },
            )?;
            op.warm(gpu, s.d)?;
            let got = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            let want = lab_path(gpu, &qz, out)?;
            ensure!(
                same_bits(&got, &want),
                "{name}: O or the LSE differ from the lab's path"
            );
            // The same op again on the same buffers: the same bits (the schedule's counters were left at zero).
            let again = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            ensure!(same_bits(&again, &want), "{name}: a second call differs");
            eprintln!(
                "{name}: {} O elements and {} LSE values bit-identical to the lab's path, twice",
                got.o.len(),
                got.lse.len()
            );
            Ok(())
        });
    }
    t.gpu(
        "forward::fewer_blocks_beside_free_sms_give_the_same_bits",
        |gpu| {
            // Units are whole and taken from the counter (no split tail), so a grid that leaves SMs to other kernels
            // (Attention::set_free_sms: 512 units on the SMs less 8, in the fewest blocks with as many waves) gives
            // every unit's bits as the full grid does; causal too (every SM but the free ones).
            for causal in [false, true] {
                let s = Shape::new(1, 16, 4096, 128).with_causal(causal);
                let qz = quantize_per_head(&Raw::random(s, 23, 1.0));
                let st = gpu.stream.clone();
                let x = inputs(&st, &qz)?;
                let cfg = Config {
                    causal,
                    ..Config::default()
                };
                let mut full = Attention::new(gpu, cfg)?;
                full.set_split_tail(false);
                let mut fewer = Attention::new(gpu, cfg)?;
                fewer.set_split_tail(false);
                fewer.set_free_sms(8);
                let a = forward(&mut full, gpu, &st, s, &x)?.to_host(&st)?;
                let b = forward(&mut fewer, gpu, &st, s, &x)?.to_host(&st)?;
                ensure!(
                    same_bits(&a, &b),
                    "causal {causal}: 8 SMs left free changes O or the LSE"
                );
            }
            Ok(())
        },
    );
    t.gpu("forward::new_values_in_the_same_v_buffer_are_read", |gpu| {
        // A model reuses its activation buffers: V rewritten in place must give the new problem's O (V's
        // transposed copy made again), not the old one's.
        let s = Shape::new(1, 4, 256, 128);
        let (a, b) = (
            quantize_per_head(&Raw::random(s, 1, 1.0)),
            quantize_per_head(&Raw::random(s, 2, 1.0)),
        );
        let st = gpu.stream.clone();
        let mut x = inputs(&st, &a)?;
        let mut op = Attention::new(gpu, Config::default())?;
        let first = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
        ensure!(
            same_bits(&first, &lab_path(gpu, &a, OutDtype::Bf16)?),
            "the first problem differs"
        );
        st.memcpy_htod(&b.v, &mut x.v)?;
        st.memcpy_htod(&b.v_scale, &mut x.vs)?;
        let mixed = Quantized {
            v: b.v.clone(),
            v_scale: b.v_scale.clone(),
            ..a.clone()
        };
        let second = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
        ensure!(
            same_bits(&second, &lab_path(gpu, &mixed, OutDtype::Bf16)?),
            "V rewritten in place: O is not the new problem's"
        );
        Ok(())
    });
    t.gpu("forward::bad_inputs_are_refused_before_any_launch", |gpu| {
        let s = Shape::new(1, 2, 64, 64);
        let qz = quantize_per_head(&Raw::random(s, 3, 1.0));
        let st = gpu.stream.clone();
        let x = inputs(&st, &qz)?;
        let mut op = Attention::new(gpu, Config::default())?;
        let e = forward(&mut op, gpu, &st, Shape { sq: 65, ..s }, &x)
            .unwrap_err()
            .to_string();
        ensure!(
            e.contains("`q` holds 8192 elements") && e.contains("needs 8320"),
            "{e}"
        );
        let e = forward(&mut op, gpu, &st, Shape { d: 80, ..s }, &x)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("D = 80"), "{e}");
        let bad = Attention::new(
            gpu,
            Config {
                softmax_scale: Some(-1.0),
                ..Config::default()
            },
        )
        .unwrap_err();
        ensure!(bad.to_string().contains("softmax scale -1"), "{bad}");
        Ok(())
    });
    t.gpu("forward_into::caller_outputs_get_the_same_bits", |gpu| {
        let s = Shape::cross(2, 8, 300, 700, 128).with_kv_heads(2)?.with_causal(true);
        let qz = quantize_per_head(&Raw::random(s, 29, 1.0));
        let st = gpu.ctx.new_stream()?;
        let x = inputs(&st, &qz)?;
        let cfg = Config {
            causal: true,
            out_dtype: OutDtype::F16,
            softmax_scale: None,
            window: fp8_attention::Window::NONE,
        };
        let mut op = Attention::new(gpu, cfg)?;
        let f = |codes, scales| Fp8 { codes, scales };
        let mut out = op.alloc_output(gpu, &st, &s)?;
        for _ in 0..2 {
            op.forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut out)?;
        }
        let want = lab_path(gpu, &qz, OutDtype::F16)?;
        ensure!(same_bits(&out.to_host(&st)?, &want), "forward_into differs from the lab's path");
        let mut other = Attention::new(gpu, Config { out_dtype: OutDtype::Bf16, ..cfg })?;
        let e = other
            .forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut out)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("O is F16") && e.contains("writes Bf16"), "{e}");
        let mut small = op.alloc_output(gpu, &st, &Shape { sq: 100, ..s })?;
        let e = op
            .forward_into(gpu, &st, s, f(&x.q, &x.qs), f(&x.k, &x.ks), f(&x.v, &x.vs), &mut small)
            .unwrap_err()
            .to_string();
        ensure!(e.contains("this call needs") && e.contains("output_rows"), "{e}");
        eprintln!("forward_into: caller-provided O and LSE bit-identical to the lab's path; wrong dtype and short buffers named");
        Ok(())
    });
    real::add(&mut t);
    ring::add(&mut t);
    stage8::add(&mut t);
    t.run()
}
