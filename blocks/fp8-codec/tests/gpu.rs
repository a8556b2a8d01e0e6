// fp8-codec's test binary: the model against cuda_fp8.h on the device, bit for bit, and the quantizer round trip.
use anyhow::{Result, bail, ensure};
use fp8_codec::*;
use half::{bf16, f16};
use lab::cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, check_written, poisoned};
use lab::{Gpu, KernelSpec, Suite};

const COLUMNS: [(Format, Saturation); 4] = [
    (Format::E4M3, Saturation::SatFinite),
    (Format::E4M3, Saturation::NoSat),
    (Format::E5M2, Saturation::SatFinite),
    (Format::E5M2, Saturation::NoSat),
];

fn grid(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(threads), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Every f32 the encoder is checked on: both formats' boundaries and 200 000 random bit patterns.
fn encode_inputs() -> Vec<f32> {
    let mut x = boundary_inputs(Format::E4M3);
    x.extend(boundary_inputs(Format::E5M2));
    x.extend(
        Inputs::seeded(11)
            .bits_u32(200_000)
            .into_iter()
            .map(f32::from_bits),
    );
    // Random magnitudes near the formats' range, where random bit patterns rarely land.
    x.extend(Inputs::seeded(12).normal(50_000, 0.0, 100.0));
    x
}

/// The device's four codes for each input.
fn device_encode(gpu: &Gpu, x: &[f32]) -> Result<Vec<u8>> {
    let k = gpu.load(&ENCODE_ALL)?;
    let s = &gpu.stream;
    let dx = s.clone_htod(x)?;
    // u8 has no NaN to poison with; 0xA5 is a code, so "written" is checked by a second launch over 0x5A.
    let mut outs = Vec::new();
    for fill in [0xA5u8, 0x5A] {
        let mut out = s.clone_htod(&vec![fill; 4 * x.len()])?;
        let n = x.len() as i32;
        // SAFETY: encode_all(const float* x[n], unsigned char* out[4n], int n).
        unsafe {
            s.launch_builder(&k.func)
                .arg(&dx)
                .arg(&mut out)
                .arg(&n)
                .launch(grid(x.len(), 256))?
        };
        outs.push(s.clone_dtoh(&out)?);
    }
    ensure!(
        outs[0] == outs[1],
        "encode_all left some outputs unwritten (they kept the fill byte)"
    );
    Ok(outs.remove(0))
}

/// Compares `model` with the device over all inputs and columns; returns the mismatches (at most `keep`).
fn encode_mismatches(
    x: &[f32],
    dev: &[u8],
    model: impl Fn(f32, Saturation, Format) -> u8,
    keep: usize,
) -> (usize, Vec<String>) {
    let (mut n, mut shown) = (0, Vec::new());
    for (i, &v) in x.iter().enumerate() {
        for (c, &(f, sat)) in COLUMNS.iter().enumerate() {
            let (d, m) = (dev[4 * i + c], model(v, sat, f));
            if d != m {
                n += 1;
                if shown.len() < keep {
                    shown.push(format!(
                        "{} {sat:?} of {v:e} ({:#010x}): device {d:#04x}, model {m:#04x}",
                        f.name(),
                        v.to_bits()
                    ));
                }
            }
        }
    }
    (n, shown)
}

/// A [B, H, S, D] tensor whose heads differ in magnitude by orders, one head all zero.
fn tensor() -> (Vec<f32>, usize) {
    let (b, h, s, d) = (2, 3, 37, 64);
    let per_head = s * d;
    let mut x = Vec::with_capacity(b * h * per_head);
    for head in 0..b * h {
        let std = [1.0, 0.01, 300.0, 0.0, 5e-5, 20.0][head];
        x.extend(
            Inputs::seeded(head as u64)
                .normal(per_head, 0.0, 1.0)
                .into_iter()
                .map(|v| v * std),
        );
    }
    (x, per_head)
}

fn device_quantize(
    gpu: &Gpu,
    spec: &KernelSpec,
    x: &[f32],
    scales: &[f32],
    per_head: usize,
) -> Result<Vec<u8>> {
    let k = gpu.load(spec)?;
    let s = &gpu.stream;
    let (dx, ds) = (s.clone_htod(x)?, s.clone_htod(scales)?);
    let mut q = s.clone_htod(&vec![0xA5u8; x.len()])?;
    let (ph, n) = (per_head as i64, x.len() as i64);
    // SAFETY: quantize_e4m3(const float* x[n], const float* scales, long long per_head, unsigned char* q[n], long long n).
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dx)
            .arg(&ds)
            .arg(&ph)
            .arg(&mut q)
            .arg(&n)
            .launch(grid(x.len(), 256))?
    };
    Ok(s.clone_dtoh(&q)?)
}

fn check_quantize(
    gpu: &Gpu,
    spec: &KernelSpec,
    x: &[f32],
    scales: &[f32],
    per_head: usize,
    what: &str,
) -> Result<()> {
    let (dev, want) = (
        device_quantize(gpu, spec, x, scales, per_head)?,
        quantize(x, scales, per_head),
    );
    if let Some(i) = (0..x.len()).find(|&i| dev[i] != want[i]) {
        bail!(
            "{what}: element {i} = {:e} / {:e}: device {:#04x}, model {:#04x}",
            x[i],
            scales[i / per_head],
            dev[i],
            want[i]
        );
    }
    Ok(())
}

/// Tensors for the whole-tensor quantizer: `tensor()`; one head holding every E4M3 rounding boundary at scale 1
/// (its amax is 448) beside a head whose largest magnitude is negative; 3000 short heads; one long head (several
/// blocks fold its amax, the largest value last).
fn tensor_cases() -> Vec<(String, Vec<f32>, usize)> {
    let mut cases = Vec::new();
    let (x, per_head) = tensor();
    cases.push(("6 heads of 37×64, one all zero".to_string(), x, per_head));
    let mut edges: Vec<f32> = boundary_inputs(Format::E4M3)
        .into_iter()
        .filter(|v| v.is_finite() && v.abs() <= 448.0)
        .collect();
    edges.push(448.0);
    let len = edges.len().next_multiple_of(16);
    edges.resize(len, 0.0);
    let mut neg = Inputs::seeded(5).normal(len, 0.0, 3.0);
    neg[len / 2 + 3] = -1000.0;
    edges.extend(neg);
    cases.push(("rounding boundaries; a negative amax".into(), edges, len));
    cases.push((
        "3000 heads of 2×64".into(),
        Inputs::seeded(6).normal(3000 * 128, 0.0, 2.0),
        128,
    ));
    let mut long = Inputs::seeded(7).normal((1 << 20) + 48, 0.0, 1.0);
    *long.last_mut().expect("non-empty") = -77.0;
    let n = long.len();
    cases.push(("one head of 2^20 + 48".into(), long, n));
    cases
}

/// The device quantizer against the model on every case and both granularities; the first difference.
fn check_tensor_quantizer(gpu: &Gpu, tq: &TensorQuantizer) -> Result<()> {
    for (what, x, head_len) in tensor_cases() {
        let dx = gpu.stream.clone_htod(&x)?;
        for per in [Granularity::PerHead, Granularity::PerTensor] {
            let (q, s) = tq.run(gpu, &dx, x.len() / head_len, head_len, per)?;
            let (q, s) = (gpu.stream.clone_dtoh(&q)?, gpu.stream.clone_dtoh(&s)?);
            let (wq, ws) = quantize_tensor(&x, head_len, per);
            if let Some(h) = (0..ws.len()).find(|&h| s[h].to_bits() != ws[h].to_bits()) {
                bail!(
                    "{what}, {}: scale of head {h}: device {:e}, model {:e}",
                    per.name(),
                    s[h],
                    ws[h]
                );
            }
            if let Some(i) = (0..x.len()).find(|&i| q[i] != wq[i]) {
                bail!(
                    "{what}, {}: element {i} = {:e}: device {:#04x}, model {:#04x}",
                    per.name(),
                    x[i],
                    q[i],
                    wq[i]
                );
            }
        }
    }
    Ok(())
}

/// A view-quantizer case: [B, H, S, D] `dims` with element `strides`, starting `start` elements into `buf`.
struct ViewCase {
    what: &'static str,
    dims: [usize; 4],
    strides: [usize; 3],
    start: usize,
    buf: Vec<f32>,
}

/// Contiguous heads of very different magnitudes (one all zero); a [B, S, H, D] tensor read as [B, H, S, D]; the
/// k slice of a fused [B, S, 3, H, D] projection; heads holding every E4M3 rounding boundary beside a negative
/// amax; one long head (64 blocks fold its amax, the largest magnitude last).
fn view_cases() -> Vec<ViewCase> {
    let (x, _) = tensor();
    let mut cases = vec![ViewCase {
        what: "contiguous [2, 3, 37, 64]",
        dims: [2, 3, 37, 64],
        strides: [3 * 37 * 64, 37 * 64, 64],
        start: 0,
        buf: x,
    }];
    let (b, h, s, d) = (2, 5, 40, 128);
    cases.push(ViewCase {
        what: "[B, S, H, D] storage as [2, 5, 40, 128]",
        dims: [b, h, s, d],
        strides: [s * h * d, d, h * d],
        start: 0,
        buf: Inputs::seeded(11).normal(b * s * h * d, 0.0, 4.0),
    });
    let (b, h, s, d) = (2, 4, 33, 64);
    let mut fused = Inputs::seeded(12).normal(b * s * 3 * h * d, 0.0, 1.0);
    fused[s * 3 * h * d + 7 * 3 * h * d + h * d + 2 * d + 5] = -90.0; // k of batch 1, row 7, head 2
    cases.push(ViewCase {
        what: "k of a fused [B, S, 3, H, D] projection, [2, 4, 33, 64]",
        dims: [b, h, s, d],
        strides: [s * 3 * h * d, d, 3 * h * d],
        start: h * d,
        buf: fused,
    });
    let mut edges: Vec<f32> = boundary_inputs(Format::E4M3)
        .into_iter()
        .filter(|v| v.is_finite() && v.abs() <= 448.0)
        .collect();
    edges.push(448.0);
    let len = edges.len().next_multiple_of(64);
    edges.resize(len, 0.0);
    let mut neg = Inputs::seeded(5).normal(len, 0.0, 3.0);
    neg[len / 2 + 3] = -1000.0;
    edges.extend(neg);
    cases.push(ViewCase {
        what: "rounding boundaries; a negative amax",
        dims: [1, 2, len / 64, 64],
        strides: [2 * len, len, 64],
        start: 0,
        buf: edges,
    });
    let mut long = Inputs::seeded(7).normal(8192 * 128, 0.0, 1.0);
    *long.last_mut().expect("non-empty") = -77.0;
    cases.push(ViewCase {
        what: "one head of 8192 × 128",
        dims: [1, 1, 8192, 128],
        strides: [8192 * 128, 8192 * 128, 128],
        start: 0,
        buf: long,
    });
    cases
}

/// `x` as the device holds it in `dtype`, widened back to f32 (exact).
fn as_dtype(x: &[f32], dtype: Real) -> Vec<f32> {
    match dtype {
        Real::F32 => x.to_vec(),
        Real::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        Real::Bf16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
    }
}

/// The view quantizer against the model (the view gathered, widened, quantized per head) on every case and input
/// type; the first difference.
fn check_view_quantizer(gpu: &Gpu, vq: &ViewQuantizer) -> Result<()> {
    let st = &gpu.stream;
    for c in view_cases() {
        for dtype in [Real::F32, Real::F16, Real::Bf16] {
            let vals = as_dtype(&c.buf, dtype);
            let [b, h, s, d] = c.dims;
            let mut gathered = Vec::with_capacity(b * h * s * d);
            for (bi, hi, si) in
                (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..s).map(move |si| (bi, hi, si))))
            {
                let at = c.start + bi * c.strides[0] + hi * c.strides[1] + si * c.strides[2];
                gathered.extend_from_slice(&vals[at..at + d]);
            }
            let (wq, ws) = quantize_tensor(&gathered, s * d, Granularity::PerHead);
            let bytes: Vec<u8> = match dtype {
                Real::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
                Real::F16 => vals
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
                Real::Bf16 => vals
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect(),
            };
            let buf = st.clone_htod(&bytes)?;
            let mut codes = st.clone_htod(&vec![0xA5u8; gathered.len()])?;
            let mut scales = st.clone_htod(&poisoned::<f32>(b * h))?;
            let mut amax = st.alloc_zeros::<u32>(b * h)?;
            {
                let (base, _g0) = buf.device_ptr(st);
                let (q, _g1) = codes.device_ptr_mut(st);
                let (sc, _g2) = scales.device_ptr_mut(st);
                let (am, _g3) = amax.device_ptr_mut(st);
                let view = View {
                    addr: base + (c.start * dtype.size()) as u64,
                    dtype,
                    dims: c.dims,
                    strides: c.strides,
                };
                ensure!(
                    c.start + view.extent() <= vals.len(),
                    "{}: the view leaves its buffer",
                    c.what
                );
                // SAFETY: the view lies inside `buf` (checked just above); codes, scales and amax are separate
                // allocations of the sizes run asks for, amax zeroed; all outlive the kernels (synchronised below).
                unsafe {
                    vq.run(
                        gpu,
                        st,
                        "x",
                        &view,
                        ViewOut {
                            codes: q,
                            scales: sc,
                            amax: am,
                        },
                    )?
                };
            }
            let (q, sc) = (st.clone_dtoh(&codes)?, st.clone_dtoh(&scales)?);
            let what = format!("{}, {}", c.what, dtype.name());
            if let Some(i) = (0..ws.len()).find(|&i| sc[i].to_bits() != ws[i].to_bits()) {
                bail!(
                    "{what}: scale of head {i}: device {:e}, model {:e}",
                    sc[i],
                    ws[i]
                );
            }
            if let Some(i) = (0..wq.len()).find(|&i| q[i] != wq[i]) {
                bail!(
                    "{what}: element {i} = {:e}: device {:#04x}, model {:#04x}",
                    gathered[i],
                    q[i],
                    wq[i]
                );
            }
        }
    }
    Ok(())
}

fn main() {
    let mut t = Suite::new();
    t.kernels(KERNELS);
    t.gpu("decode_every_code_of_both_formats", |gpu| {
        let k = gpu.load(&DECODE_ALL)?;
        let s = &gpu.stream;
        let mut out = s.clone_htod(&poisoned::<u16>(512))?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: decode_all(unsigned short* out[512]), 256 threads.
        unsafe { s.launch_builder(&k.func).arg(&mut out).launch(cfg)? };
        let out = s.clone_dtoh(&out)?;
        check_written(&out, "decode_all")?;
        for (fi, f) in [Format::E4M3, Format::E5M2].into_iter().enumerate() {
            for c in 0..=255u8 {
                let (d, m) = (out[fi * 256 + c as usize], decode_f16_bits(c, f));
                ensure!(
                    d == m,
                    "{} code {c:#04x}: device f16 {d:#06x}, model {m:#06x}",
                    f.name()
                );
            }
        }
        eprintln!("decode: 512 codes (e4m3, e5m2) bit-exact to the model");
        Ok(())
    });
    t.gpu("encode_boundaries_and_random_bits_both_modes", |gpu| {
        let x = encode_inputs();
        let dev = device_encode(gpu, &x)?;
        let (n, shown) = encode_mismatches(&x, &dev, encode, 20);
        ensure!(
            n == 0,
            "{n} of {} conversions differ:\n{}",
            4 * x.len(),
            shown.join("\n")
        );
        eprintln!(
            "encode: {} inputs × 4 (format, saturation) = {} conversions bit-exact to the model",
            x.len(),
            4 * x.len()
        );
        Ok(())
    });
    t.gpu("mutant_models_are_caught", |gpu| {
        let x = encode_inputs();
        let dev = device_encode(gpu, &x)?;
        // Rounding by truncation: step back toward zero whenever the model rounded away from it.
        let truncating = |v: f32, sat: Saturation, f: Format| {
            let c = encode(v, sat, f);
            let y = decode(c, f);
            if y.is_finite() && y.abs() > v.abs() && c & 0x7F != 0 { c - 1 } else { c }
        };
        // Saturation dropped: satfinite behaves as no-sat.
        let unsaturated = |v: f32, _: Saturation, f: Format| encode(v, Saturation::NoSat, f);
        for (what, n) in [
            ("truncation instead of round-to-nearest-even", encode_mismatches(&x, &dev, truncating, 1).0),
            ("saturation dropped", encode_mismatches(&x, &dev, unsaturated, 1).0),
        ] {
            ensure!(n > 0, "the mutant model `{what}` agreed with the device everywhere: the suite cannot see it");
            eprintln!("mutant model `{what}` caught: {n} conversions differ");
        }
        Ok(())
    });
    t.gpu("head_scales_and_quantize_per_head_and_per_tensor", |gpu| {
        let (x, per_head) = tensor();
        let heads = x.len() / per_head;
        let k = gpu.load(&HEAD_SCALES)?;
        let s = &gpu.stream;
        let dx = s.clone_htod(&x)?;
        let mut ds = s.clone_htod(&poisoned::<f32>(heads))?;
        let ph = per_head as i64;
        let cfg = LaunchConfig {
            grid_dim: (heads as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: head_scales(const float* x, long long per_head, float* scales[heads]), one block per head.
        unsafe {
            s.launch_builder(&k.func)
                .arg(&dx)
                .arg(&ph)
                .arg(&mut ds)
                .launch(cfg)?
        };
        let scales = s.clone_dtoh(&ds)?;
        check_written(&scales, "scales")?;
        let want = head_scales(&x, per_head);
        ensure!(
            scales
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "scales: device {scales:?}, model {want:?}"
        );
        ensure!(want[3] == 1.0, "the all-zero head gets scale 1");
        check_quantize(gpu, &QUANTIZE, &x, &scales, per_head, "per-head")?;
        let tensor_scale = [scale_from_amax(amax(&x))];
        check_quantize(gpu, &QUANTIZE, &x, &tensor_scale, x.len(), "per-tensor")?;
        // A given scale far too small: most values overflow, so saturation decides the codes.
        check_quantize(
            gpu,
            &QUANTIZE,
            &x,
            &[1e-3],
            x.len(),
            "given scale, saturating",
        )?;
        eprintln!(
            "quantize: {} elements × 3 scalings bit-exact; scales {:?}",
            x.len(),
            scales
        );
        Ok(())
    });
    t.gpu("dequantize_from_shared_memory_as_half2", |gpu| {
        let (x, per_head) = tensor();
        let scales = head_scales(&x, per_head);
        let q = quantize(&x, &scales, per_head);
        let k = gpu.load(&DEQUANTIZE)?;
        let s = &gpu.stream;
        let (dq, ds) = (s.clone_htod(&q)?, s.clone_htod(&scales)?);
        let mut h = s.clone_htod(&poisoned::<f16>(q.len()))?;
        let mut f = s.clone_htod(&poisoned::<f32>(q.len()))?;
        let (ph, n) = (per_head as i64, q.len() as i64);
        // SAFETY: dequantize_smem(const u8* q[n], const float* scales, long long per_head, long long n,
        // __half* h[n], float* f[n]); n is a multiple of 16; 4096 codes a block.
        unsafe {
            s.launch_builder(&k.func).arg(&dq).arg(&ds).arg(&ph).arg(&n).arg(&mut h).arg(&mut f).launch(grid(q.len().div_ceil(16), 256).with_blocks(q.len().div_ceil(4096)))?
        };
        let (h, f) = (s.clone_dtoh(&h)?, s.clone_dtoh(&f)?);
        check_written(&h, "half")?;
        check_written(&f, "f32")?;
        let want_f = dequantize(&q, &scales, per_head);
        for i in 0..q.len() {
            ensure!(h[i].to_bits() == decode_f16_bits(q[i], Format::E4M3), "element {i}: half {:#06x} for code {:#04x}", h[i].to_bits(), q[i]);
            ensure!(f[i].to_bits() == want_f[i].to_bits(), "element {i}: {} vs model {}", f[i], want_f[i]);
        }
        // The round trip: half an E4M3 ulp, 2⁻⁴ relative in the normal range, 2⁻¹⁰·scale absolute below it,
        // plus the f32 roundings of x / scale and of the product.
        let mut worst = 0.0f64;
        for (i, (&a, &b)) in x.iter().zip(&want_f).enumerate() {
            let bound = (2f64.powi(-4) * f64::from(a).abs()).max(2f64.powi(-10) * f64::from(scales[i / per_head])) * (1.0 + 2f64.powi(-21));
            let e = f64::from(a - b).abs();
            ensure!(e <= bound, "element {i}: {a} → {b}, error {e:e} > {bound:e}");
            worst = worst.max(e / bound);
        }
        eprintln!("dequantize: {} elements bit-exact (half and scaled f32); round trip at most {worst:.3} of the half-ulp bound", q.len());
        Ok(())
    });
    t.gpu("store2_rounds_to_nearest_even_in_every_output_type", |gpu| {
        let x = encode_inputs();
        let wrong = store_pairs_wrong(gpu, &STORE_PAIRS, &x)?;
        ensure!(wrong.is_empty(), "{}", wrong.join("; "));
        eprintln!("fp8::store2: {} values as f16, bf16 and f32 pairs, bit-exact to the host's round-to-nearest-even", x.len());
        Ok(())
    });
    t.gpu("store2_mutants_are_caught", |gpu| {
        let x = encode_inputs();
        for (what, from, to) in [
            (
                "f16 pair swapped",
                "__floats2half2_rn(a, b)",
                "__floats2half2_rn(b, a)",
            ),
            (
                "bf16 truncated",
                "__floats2bfloat162_rn(a, b)",
                "__floats2bfloat162_rn(__uint_as_float(__float_as_uint(a) & 0xffff0000u), b)",
            ),
        ] {
            let wrong =
                store_pairs_wrong(gpu, &STORE_PAIRS.mutated("fp8_codec.cuh", from, to)?, &x)?;
            ensure!(!wrong.is_empty(), "the mutant `{what}` went unnoticed");
            eprintln!("mutant `{what}` caught: {}", wrong[0]);
        }
        Ok(())
    });
    t.gpu("mutant_quantizer_without_saturation_is_caught", |gpu| {
        let (x, _) = tensor();
        let m = QUANTIZE.mutated(
            "fp8_codec.cuh",
            "__NV_SATFINITE, __NV_E4M3",
            "__NV_NOSAT, __NV_E4M3",
        )?;
        match check_quantize(gpu, &m, &x, &[1e-3], x.len(), "given scale, saturating") {
            Err(e) => {
                eprintln!("mutant quantizer caught: {e}");
                Ok(())
            }
            Ok(()) => bail!("a quantizer without saturation passed"),
        }
    });
    t.gpu("tensor_quantizer_is_bit_exact_per_head_and_per_tensor", |gpu| {
        check_tensor_quantizer(gpu, &TensorQuantizer::default())?;
        eprintln!(
            "tensor quantizer: {} cases × (per head, per tensor): codes and scales bit-exact to the model",
            tensor_cases().len()
        );
        Ok(())
    });
    t.gpu("mutant_tensor_quantizers_are_caught", |gpu| {
        for (what, from, to) in [
            (
                "amax without |x| on one lane",
                "fmaxf(fabsf(v.x), fabsf(v.y))",
                "fmaxf(v.x, fabsf(v.y))",
            ),
            (
                "no warp reduction before the atomic",
                "for (int o = 16; o > 0;",
                "for (int o = 0; o > 0;",
            ),
            (
                "division by a reciprocal",
                "__fdiv_rn(x, scale)",
                "x * (1.0f / scale)",
            ),
            (
                "the next head's scale",
                "scales[i / head_len16]",
                "scales[(i + 1) / head_len16]",
            ),
        ] {
            let m = TensorQuantizer::default().mutated("fp8_codec.cuh", from, to)?;
            match check_tensor_quantizer(gpu, &m) {
                Err(e) => eprintln!("mutant `{what}` caught: {e}"),
                Ok(()) => bail!("the mutant `{what}` passed every case"),
            }
        }
        Ok(())
    });
    t.gpu("view_quantizer_is_bit_exact_for_every_input_type", |gpu| {
        check_view_quantizer(gpu, &ViewQuantizer::default())?;
        eprintln!(
            "view quantizer: {} strided cases × (f32, f16, bf16): codes and scales bit-exact to the model",
            view_cases().len()
        );
        Ok(())
    });
    t.gpu("mutant_view_quantizers_are_caught", |gpu| {
        for (what, from, to) in [
            (
                "rows read at D apart, not at the S stride",
                "head + r * ss +",
                "head + r * d +",
            ),
            (
                "the batch and head strides swapped",
                "(hd / heads) * sb + (hd % heads) * sh",
                "(hd / heads) * sh + (hd % heads) * sb",
            ),
            (
                "amax without |x|",
                "m = fmaxf(m, fabsf(e[j]))",
                "m = fmaxf(m, e[j])",
            ),
            (
                "bf16 pairs swapped when widened",
                "v[2 * j] = f.x; v[2 * j + 1] = f.y;\n  }\n}\n\n// Where",
                "v[2 * j] = f.y; v[2 * j + 1] = f.x;\n  }\n}\n\n// Where",
            ),
        ] {
            let m = ViewQuantizer::default().mutated("fp8_codec.cuh", from, to)?;
            match check_view_quantizer(gpu, &m) {
                Err(e) => eprintln!("mutant `{what}` caught: {e}"),
                Ok(()) => bail!("the mutant `{what}` passed every case"),
            }
        }
        Ok(())
    });
    t.run()
}

trait WithBlocks {
    fn with_blocks(self, n: usize) -> Self;
}
impl WithBlocks for LaunchConfig {
    fn with_blocks(mut self, n: usize) -> Self {
        self.grid_dim = (n as u32, 1, 1);
        self
    }
}

/// `spec` (`store_pairs` or a mutant) over `x` (an even count taken): where its f16, bf16 and f32 outputs differ from
/// the host's round-to-nearest-even conversions (NaN for NaN), the first few.
fn store_pairs_wrong(gpu: &Gpu, spec: &KernelSpec, x: &[f32]) -> Result<Vec<String>> {
    let x = &x[..x.len() / 2 * 2];
    let n = x.len() / 2;
    let k = gpu.load(spec)?;
    let s = &gpu.stream;
    let dx = s.clone_htod(x)?;
    let mut h = s.clone_htod(&poisoned::<f16>(x.len()))?;
    let mut b = s.clone_htod(&poisoned::<half::bf16>(x.len()))?;
    let mut f = s.clone_htod(&poisoned::<f32>(x.len()))?;
    let ni = n as i32;
    // SAFETY: store_pairs(const float* x[2n], int n, __half* out16[2n], __nv_bfloat16* outbf[2n], float* out32[2n]);
    // a grid-stride loop.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dx)
            .arg(&ni)
            .arg(&mut h)
            .arg(&mut b)
            .arg(&mut f)
            .launch(grid(n, 256))?
    };
    let (h, b, f) = (s.clone_dtoh(&h)?, s.clone_dtoh(&b)?, s.clone_dtoh(&f)?);
    let mut wrong = vec![];
    for (i, &v) in x.iter().enumerate() {
        let same = |got: u32, want: u32, nan: bool| if v.is_nan() { nan } else { got == want };
        let (wh, wb) = (f16::from_f32(v), half::bf16::from_f32(v));
        if !same(h[i].to_bits().into(), wh.to_bits().into(), h[i].is_nan()) {
            wrong.push(format!(
                "x[{i}] = {v:e}: f16 {:#06x}, want {:#06x}",
                h[i].to_bits(),
                wh.to_bits()
            ));
        }
        if !same(b[i].to_bits().into(), wb.to_bits().into(), b[i].is_nan()) {
            wrong.push(format!(
                "x[{i}] = {v:e}: bf16 {:#06x}, want {:#06x}",
                b[i].to_bits(),
                wb.to_bits()
            ));
        }
        if !same(f[i].to_bits(), v.to_bits(), f[i].is_nan()) {
            wrong.push(format!("x[{i}] = {v:e}: f32 {}", f[i]));
        }
        if wrong.len() >= 4 {
            break;
        }
    }
    Ok(wrong)
}
