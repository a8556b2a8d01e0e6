// quickstart: one FP8 attention call on tensors already on the GPU, checked against the f64 reference.
use fp8_attention::{Attention, Config, Fp8, Gpu, OutDtype, Raw, Shape, quantize_per_head};

fn main() -> anyhow::Result<()> {
    let gpu = Gpu::get()?;
    // E4M3 codes with one scale per (batch, head): here quantized on the host from random values.
    let s = Shape::new(1, 8, 512, 64);
    let qz = quantize_per_head(&Raw::random(s, 7, 1.0));
    let st = gpu.stream.clone();
    let (q, k, v) = (
        st.clone_htod(&qz.q)?,
        st.clone_htod(&qz.k)?,
        st.clone_htod(&qz.v)?,
    );
    let (qs, ks, vs) = (
        st.clone_htod(&qz.q_scale)?,
        st.clone_htod(&qz.k_scale)?,
        st.clone_htod(&qz.v_scale)?,
    );
    let mut op = Attention::new(
        gpu,
        Config {
            out_dtype: OutDtype::Bf16,
            ..Config::default()
        },
    )?;
    let f = |codes, scales| Fp8 { codes, scales };
    let out = op.forward(gpu, &st, s, f(&q, &qs), f(&k, &ks), f(&v, &vs))?;
    let host = out.to_host(&st)?;
    let want = fixtures::reference(&qz);
    let worst = host
        .o
        .iter()
        .zip(&want.o)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    println!(
        "{} on {}: O [1, 8, 512, 64] in bf16, max |O − f64 reference| = {worst:.2e}",
        op.stage().name(),
        gpu.name
    );
    Ok(())
}
