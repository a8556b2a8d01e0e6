// fp8_attention._core: checked launches of the lab's FP8 attention over device addresses on the caller's stream.
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use composed::{Stage, Tensors, Workspace};
use fixtures::{OutDtype, Shape};
use fp8_attention::{Error, Lengths, check_inputs};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod varlen;

/// A bad input is a ValueError naming it; what the device or the driver said is a RuntimeError.
pub(crate) fn py_err(e: Error) -> PyErr {
    match e {
        Error::Device(e) => PyRuntimeError::new_err(format!("{e:#}")),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// A sliding window's sides as Python passes them ((left, right): keys, -1 for unbounded).
pub(crate) fn window_of((left, right): (i64, i64)) -> PyResult<fp8_attention::Window> {
    let side = |name: &str, x: i64| match x {
        -1 => Ok(None),
        x if x >= 0 => Ok(Some(x as usize)),
        x => Err(PyValueError::new_err(format!(
            "window {name} = {x}: a number of keys (0 or more) or -1 for unbounded"
        ))),
    };
    Ok(fp8_attention::Window {
        left: side("left", left)?,
        right: side("right", right)?,
    })
}

/// The problem's shape, checked: B, H query heads, Hkv key/value heads, Sq, Sk, D, causal, window.
#[allow(clippy::too_many_arguments)]
fn shape(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    window: (i64, i64),
) -> PyResult<Shape> {
    let s = Shape {
        hkv,
        causal,
        window: window_of(window)?,
        ..Shape::cross(b, h, sq, sk, d)
    };
    check_inputs(&s, &Lengths::of(&s), 1.0).map_err(py_err)?;
    Ok(s)
}

/// Where compiled kernels are kept across processes: $FP8_ATTENTION_CACHE (`off`: nowhere), else
/// $XDG_CACHE_HOME/fp8_attention, else ~/.cache/fp8_attention.
fn cache_dir() -> Option<std::path::PathBuf> {
    fp8_attention::default_kernel_cache("FP8_ATTENTION_CACHE", "fp8_attention")
}

/// The device (index 0) and its stage for long sequences (a call's is `stage_for_shape`'s); the disk cache of
/// kernels set on first use.
pub(crate) fn gpu() -> PyResult<(&'static lab::Gpu, Stage)> {
    static CACHE: std::sync::Once = std::sync::Once::new();
    CACHE.call_once(|| {
        if let Some(dir) = cache_dir() {
            fp8_attention::cache_kernels_in(dir);
        }
    });
    let gpu = lab::Gpu::get()
        .map_err(|e| PyRuntimeError::new_err(format!("fp8_attention needs a CUDA GPU: {e:#}")))?;
    Ok((gpu, fp8_attention::stage_for(gpu)))
}

/// The caller's CUDA stream `stream` (torch's current one) as a cudarc stream of `gpu`.
pub(crate) fn borrowed(
    gpu: &lab::Gpu,
    stream: usize,
) -> std::sync::Arc<lab::cudarc::driver::CudaStream> {
    // SAFETY: `stream` is a CUDA stream of this device's primary context (the caller's current one), alive for the
    // call; the wrapper neither destroys nor synchronises it on drop.
    unsafe {
        gpu.ctx
            .wrap_borrowed_stream(stream as lab::cudarc::driver::sys::CUstream)
    }
}

/// One workspace (Vᵀ, the schedule's table) per CUDA stream: launches on a stream run in its order.
fn workspaces() -> &'static Mutex<HashMap<usize, Workspace>> {
    static W: OnceLock<Mutex<HashMap<usize, Workspace>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// Rows O (D wide) and the LSE must hold for a call on this shape: B·H·Sq, and room for the kernel's partial
/// results after them.
#[pyfunction]
#[pyo3(signature = (b, h, hkv, sq, sk, d, causal, window=(-1, -1)))]
#[allow(clippy::too_many_arguments)]
fn output_rows(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    window: (i64, i64),
) -> PyResult<usize> {
    let s = shape(b, h, hkv, sq, sk, d, causal, window)?;
    let (gpu, base) = gpu()?;
    let stage = fp8_attention::stage_for_shape(base, &s);
    if s.group() > 1 && !stage.gqa() || s.causal && !stage.causal() {
        return Err(PyValueError::new_err(format!(
            "causal masking and grouped-query heads need an sm_90 GPU; {} is {}",
            gpu.name, gpu.arch
        )));
    }
    if s.window.is_bounded() && !stage.windows() {
        return Err(PyValueError::new_err(format!(
            "a sliding window (window {}) runs on stage 8, at D = 64 or 128 on an sm_90 GPU; this call runs {} ({} is \
             {})",
            s.window,
            stage.name(),
            gpu.name,
            gpu.arch
        )));
    }
    Workspace::new()
        .output_rows(gpu, stage, &s)
        .map_err(|e| py_err(e.into()))
}

/// Queues the attention of E4M3 q over k and v (device addresses of contiguous [B, H|Hkv, S, D] codes and of f32
/// scales, one per (batch, head)) into o and lse (`output_rows` rows each) on the CUDA stream `stream`.
#[pyfunction]
#[pyo3(signature = (q, k, v, q_scale, k_scale, v_scale, o, lse, b, h, hkv, sq, sk, d, causal, softmax_scale, out_dtype, stream, window=(-1, -1)))]
#[allow(clippy::too_many_arguments)]
fn launch(
    q: u64,
    k: u64,
    v: u64,
    q_scale: u64,
    k_scale: u64,
    v_scale: u64,
    o: u64,
    lse: u64,
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
    softmax_scale: f32,
    out_dtype: &str,
    stream: usize,
    window: (i64, i64),
) -> PyResult<()> {
    let s = shape(b, h, hkv, sq, sk, d, causal, window)?;
    if !(softmax_scale.is_finite() && softmax_scale > 0.0) {
        return Err(py_err(Error::SoftmaxScale(softmax_scale)));
    }
    let out = out_dtype
        .parse::<OutDtype>()
        .map_err(|e| PyValueError::new_err(format!("out_dtype: {e:#}")))?;
    for (name, p) in [
        ("q", q),
        ("k", k),
        ("v", v),
        ("q_scale", q_scale),
        ("k_scale", k_scale),
        ("v_scale", v_scale),
        ("o", o),
        ("lse", lse),
    ] {
        check_address(name, p)?;
    }
    let (gpu, base) = gpu()?;
    run(
        gpu,
        fp8_attention::stage_for_shape(base, &s),
        &s,
        softmax_scale,
        out,
        &t_of(q, k, v, q_scale, k_scale, v_scale, o, lse),
        stream,
    )
}

/// The alignment a call's device address needs: TMA reads the codes and the epilogue stores O in 16-byte pieces;
/// the scales, the LSE and cu_seqlens are read and written one 4-byte element at a time (a slice of a scale vector
/// is a valid input).
fn alignment_of(name: &str) -> u64 {
    match name {
        "q" | "k" | "v" | "o" => 16,
        _ => 4,
    }
}

/// A null or misaligned device address, named before any launch.
pub(crate) fn check_address(name: &str, p: u64) -> PyResult<()> {
    let a = alignment_of(name);
    if p == 0 || !p.is_multiple_of(a) {
        return Err(PyValueError::new_err(format!(
            "`{name}` is at address {p:#x}: it must be a device address aligned to {a} bytes"
        )));
    }
    Ok(())
}

/// The eight device addresses of a call.
#[allow(clippy::too_many_arguments)]
fn t_of(
    q: u64,
    k: u64,
    v: u64,
    q_scale: u64,
    k_scale: u64,
    v_scale: u64,
    o: u64,
    lse: u64,
) -> Tensors {
    Tensors {
        q,
        k,
        v,
        q_scale,
        k_scale,
        v_scale,
        o,
        lse,
        strides: None,
    }
}

/// Queues the attention on `stream` through this stream's workspace.
fn run(
    gpu: &lab::Gpu,
    stage: Stage,
    s: &Shape,
    softmax_scale: f32,
    out: OutDtype,
    t: &Tensors,
    stream: usize,
) -> PyResult<()> {
    let st = borrowed(gpu, stream);
    let mut ws = workspaces()
        .lock()
        .map_err(|_| PyRuntimeError::new_err("fp8_attention: workspace lock poisoned"))?;
    let w = ws.entry(stream).or_insert_with(|| {
        let mut w = Workspace::new();
        w.remake_vt(true);
        w
    });
    w.launch(gpu, stage, &st, s, softmax_scale, out, t)
        .map_err(|e| py_err(e.into()))
}

/// Queues, on the CUDA stream `stream`, the per-(batch, head) E4M3 quantization of three real-valued views
/// (`dtype` "f32", "f16" or "bf16"; q [B, H, Sq, D], k and v [B, Hkv, Sk, D], each at an address with element
/// strides (B, heads, S), D contiguous) into `codes` (q's, then k's, then v's, contiguous), `scales` (q's at
/// `scales[0]`, k's and v's at the addresses given) and `amax` (B·H + 2·B·Hkv u32, zero on entry). Every view is
/// checked before anything is queued.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn quantize(
    views: [(u64, [usize; 3]); 3],
    dtype: &str,
    codes: [u64; 3],
    scales: [u64; 3],
    amax: u64,
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    stream: usize,
) -> PyResult<()> {
    let dtype = match dtype {
        "f32" => fp8_codec::Real::F32,
        "f16" => fp8_codec::Real::F16,
        "bf16" => fp8_codec::Real::Bf16,
        other => {
            return Err(PyValueError::new_err(format!(
                "dtype {other:?}: f32, f16 or bf16"
            )));
        }
    };
    let dims = [[b, h, sq, d], [b, hkv, sk, d], [b, hkv, sk, d]];
    let mut vs = Vec::with_capacity(3);
    for (i, ((addr, strides), dims)) in views.into_iter().zip(dims).enumerate() {
        let v = fp8_codec::View {
            addr,
            dtype,
            dims,
            strides,
        };
        v.check(["q", "k", "v"][i])
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        vs.push(v);
    }
    let (gpu, _) = gpu()?;
    let st = borrowed(gpu, stream);
    let vq = fp8_codec::ViewQuantizer::default();
    let mut at = amax;
    for (i, v) in vs.iter().enumerate() {
        // SAFETY: the views are torch tensors' (inside their storage); codes, scales and amax are torch buffers
        // the caller allocated for them, of the sizes named above, alive while the stream runs the kernels.
        unsafe {
            vq.run(
                gpu,
                &st,
                ["q", "k", "v"][i],
                v,
                fp8_codec::ViewOut {
                    codes: codes[i],
                    scales: scales[i],
                    amax: at,
                },
            )
        }
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        at += (v.dims[0] * v.dims[1] * 4) as u64;
    }
    Ok(())
}

/// The extension: `output_rows`, `quantize`, `launch` and `launch_varlen`; `fp8_attention.sdpa` and `sdpa_varlen` are
/// the API.
/// Compiles and loads, ahead of the first call, every kernel a call at head dimension `d` can launch on this device:
/// the attention stage's (with its merge and V's transposes where it reads Vᵀ), stage 8's packed kernel and plan
/// where the device runs stage 8, and the quantizer's for f32, f16 and bf16 inputs. Kept in the process and in the disk cache.
#[pyfunction]
fn warm(d: usize) -> PyResult<()> {
    let (gpu, stage) = gpu()?;
    let op =
        |stage| fp8_attention::Attention::with_stage(gpu, fp8_attention::Config::default(), stage);
    op(stage).and_then(|op| op.warm(gpu, d)).map_err(py_err)?;
    // Packed and paged batches run on stage 8 where the device has it (sm_90) and it takes this D.
    if stage != Stage::S8
        && Stage::S8.dims().contains(&d)
        && let Ok(eight) = op(Stage::S8)
    {
        eight.warm(gpu, d).map_err(py_err)?;
    }
    let vq = fp8_codec::ViewQuantizer::default();
    for spec in vq.amax.iter().chain(&vq.quantize) {
        gpu.load(spec)
            .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
    }
    Ok(())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(output_rows, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(varlen::launch_varlen, m)?)?;
    m.add_class::<varlen::KeptPlan>()?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(warm, m)?)?;
    Ok(())
}
