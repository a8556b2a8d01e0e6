// fp8_attention._core: checked launches of the lab's FP8 attention over device addresses on the caller's stream.
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use composed::{Stage, Tensors, Workspace};
use fixtures::{OutDtype, Shape};
use fp8_attention::{Error, Lengths, check_inputs};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A bad input is a ValueError naming it; what the device or the driver said is a RuntimeError.
fn py_err(e: Error) -> PyErr {
    match e {
        Error::Device(e) => PyRuntimeError::new_err(format!("{e:#}")),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// The problem's shape, checked: B, H query heads, Hkv key/value heads, Sq, Sk, D, causal.
#[allow(clippy::too_many_arguments)]
fn shape(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
) -> PyResult<Shape> {
    let s = Shape {
        hkv,
        causal,
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

/// The device (index 0) and the stage its kernels run; the disk cache of kernels set on first use.
fn gpu() -> PyResult<(&'static lab::Gpu, Stage)> {
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

/// One workspace (Vᵀ, the schedule's table) per CUDA stream: launches on a stream run in its order.
fn workspaces() -> &'static Mutex<HashMap<usize, Workspace>> {
    static W: OnceLock<Mutex<HashMap<usize, Workspace>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// Rows O (D wide) and the LSE must hold for a call on this shape: B·H·Sq, and room for the kernel's partial
/// results after them.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn output_rows(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
) -> PyResult<usize> {
    let s = shape(b, h, hkv, sq, sk, d, causal)?;
    let (gpu, stage) = gpu()?;
    if s.group() > 1 && !stage.gqa() || s.causal && !stage.causal() {
        return Err(PyValueError::new_err(format!(
            "causal masking and grouped-query heads need an sm_90 GPU; {} is {}",
            gpu.name, gpu.arch
        )));
    }
    Workspace::new()
        .output_rows(gpu, stage, &s)
        .map_err(|e| py_err(e.into()))
}

/// Queues the attention of E4M3 q over k and v (device addresses of contiguous [B, H|Hkv, S, D] codes and of f32
/// scales, one per (batch, head)) into o and lse (`output_rows` rows each) on the CUDA stream `stream`.
#[pyfunction]
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
) -> PyResult<()> {
    let s = shape(b, h, hkv, sq, sk, d, causal)?;
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
        if p == 0 || p % 16 != 0 {
            return Err(PyValueError::new_err(format!(
                "`{name}` is at address {p:#x}: it must be a device address aligned to 16 bytes"
            )));
        }
    }
    let (gpu, stage) = gpu()?;
    // SAFETY: `stream` is a CUDA stream of this device's primary context (the caller's current one), alive for the
    // call; the wrapper neither destroys nor synchronises it on drop.
    let st = unsafe {
        gpu.ctx
            .wrap_borrowed_stream(stream as lab::cudarc::driver::sys::CUstream)
    };
    let t = Tensors {
        q,
        k,
        v,
        q_scale,
        k_scale,
        v_scale,
        o,
        lse,
    };
    let mut ws = workspaces()
        .lock()
        .map_err(|_| PyRuntimeError::new_err("fp8_attention: workspace lock poisoned"))?;
    let w = ws.entry(stream).or_insert_with(|| {
        let mut w = Workspace::new();
        w.remake_vt(true);
        w
    });
    w.launch(gpu, stage, &st, &s, softmax_scale, out, &t)
        .map_err(|e| py_err(e.into()))
}

/// The extension: `output_rows` and `launch`; `fp8_attention.sdpa` is the API.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(output_rows, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    Ok(())
}
