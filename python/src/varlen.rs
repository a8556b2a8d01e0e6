// fp8_attention._core's packed batches: one-shot launches (a launcher per stream) and KeptPlan (plan once, run per layer).
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use composed::{PagedKv, Strides, Varlen, VarlenShape, VarlenTensors};
use fixtures::OutDtype;
use fp8_attention::Error;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::{borrowed, check_address, gpu, py_err, window_of};

/// One packed batch's launch state (the device plan's buffers, the schedule's counter) per CUDA stream.
fn varlens() -> &'static Mutex<HashMap<usize, Varlen>> {
    static V: OnceLock<Mutex<HashMap<usize, Varlen>>> = OnceLock::new();
    V.get_or_init(Default::default)
}

/// A packed batch's launch as Python gives it (see `launch_varlen`), checked: its shape, tensors, softmax scale, O's
/// dtype.
struct Call {
    shape: VarlenShape,
    tensors: VarlenTensors,
    softmax_scale: f32,
    out: OutDtype,
}

/// A packed batch as Python passes it, one tuple: ((tensors, cu, strides), (batch, h, hkv, d, total_q, total_k),
/// causal, softmax_scale, out_dtype, paged, window, one_scale) — `launch_varlen`'s and `KeptPlan.launch`'s first
/// argument. `one_scale`: whether Q's, K's and V's scales are one value for the batch (composed::OneScale).
#[derive(FromPyObject)]
pub(crate) struct Batch(
    ([u64; 8], [u64; 2], [[usize; 2]; 3]),
    (usize, usize, usize, usize, usize, usize),
    bool,
    f32,
    String,
    Option<(u64, usize, usize, usize)>,
    (i64, i64),
    (bool, bool, bool),
);

fn call(b: Batch) -> PyResult<Call> {
    let Batch(
        (tensors, cu, strides),
        (batch, h, hkv, d, total_q, total_k),
        causal,
        softmax_scale,
        out_dtype,
        paged,
        window,
        (one_q, one_k, one_v),
    ) = b;
    let window = window_of(window)?;
    if !(softmax_scale.is_finite() && softmax_scale > 0.0) {
        return Err(py_err(Error::SoftmaxScale(softmax_scale)));
    }
    let out = out_dtype
        .parse::<OutDtype>()
        .map_err(|e| PyValueError::new_err(format!("out_dtype: {e:#}")))?;
    // A paged cache: (block table's address, max_pages, page_size, num_pages); k and v are then its pools.
    let paged = paged.map(|(block_table, max_pages, page_size, num_pages)| PagedKv {
        block_table,
        max_pages,
        page_size,
        num_pages,
    });
    let names = ["q", "k", "v", "q_scale", "k_scale", "v_scale", "o", "lse"];
    for (name, p) in names
        .into_iter()
        .zip(tensors)
        .chain([("cu_seqlens_q", cu[0]), ("cu_seqlens_k", cu[1])])
    {
        check_address(name, p)?;
    }
    for (name, [st, sh]) in ["q", "k", "v"].into_iter().zip(strides) {
        if st == 0 || sh == 0 || st % 16 != 0 || sh % 16 != 0 {
            return Err(PyValueError::new_err(format!(
                "`{name}` has strides (token {st}, head {sh}) elements: TMA reads positive multiples of 16 bytes"
            )));
        }
    }
    let at = |[st, sh]: [usize; 2], total: usize| [st, sh, (total.max(1) * st).max(1)];
    let [q, k, v, q_scale, k_scale, v_scale, o, lse] = tensors;
    Ok(Call {
        shape: VarlenShape {
            batch,
            h,
            hkv,
            d,
            total_q,
            total_k,
            causal,
            window,
        },
        tensors: VarlenTensors {
            q,
            k,
            v,
            q_scale,
            k_scale,
            v_scale,
            o,
            lse,
            cu_q: cu[0],
            cu_k: cu[1],
            strides: Some(Strides {
                q: at(strides[0], total_q),
                k: at(strides[1], total_k),
                v: at(strides[2], total_k),
            }),
            paged,
            one_scale: composed::OneScale {
                q: one_q,
                k: one_k,
                v: one_v,
            },
        },
        softmax_scale,
        out,
    })
}

/// `c` through `vl` on the CUDA stream `stream`.
fn run(vl: &mut Varlen, c: &Call, stream: usize) -> PyResult<()> {
    let (gpu, _) = gpu()?;
    let st = borrowed(gpu, stream);
    vl.launch(gpu, &st, &c.shape, c.softmax_scale, c.out, &c.tensors)
        .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))
}

/// Queues a packed (variable-length) batch on stage 8's packed kernel on the CUDA stream `stream`. `batch` (`Batch`):
/// E4M3 q [total_q, H, D], k and v [total_k, Hkv, D] at element strides (token, head) each, D contiguous; f32 scales
/// per (sequence, head), or one where `one_scale` says so; o [total_q, H, D] and lse [H, total_q]; the boundaries cu_q,
/// cu_k (B + 1 int32 on the device, checked by the caller: the device trusts them); a paged cache (block table,
/// max_pages, page_size, num_pages) or None; the window's sides (-1: unbounded). Sizes and strides are checked before
/// anything is queued. `pack_heads`: a K/V head's query heads packed into one unit's rows where the batch allows it
/// (`Varlen::pack_heads`); `split_kv`: each sequence's keys in chunks merged after, where the batch's units would leave
/// SMs idle (`Varlen::split_kv`).
#[pyfunction]
#[pyo3(signature = (batch, stream, pack_heads=true, split_kv=true))]
pub(crate) fn launch_varlen(
    batch: Batch,
    stream: usize,
    pack_heads: bool,
    split_kv: bool,
) -> PyResult<()> {
    let c = call(batch)?;
    let mut vs = varlens()
        .lock()
        .map_err(|_| PyRuntimeError::new_err("fp8_attention: varlen lock poisoned"))?;
    let vl = vs.entry(stream).or_default();
    // Grouped heads packed into a unit's rows where the batch allows it (composed::packs_heads); the same bits.
    vl.pack_heads(pack_heads);
    vl.split_kv(split_kv);
    run(vl, &c, stream)
}

/// A launcher that keeps its batch's plan (`Varlen::keep_plan`): the first launch of a batch plans it on the device,
/// later launches of the same batch (same shape and boundaries' addresses) reuse it — plan once, run once a layer.
/// `replan` forgets it (the boundaries' values changed in place). Its own buffers: one per batch object, used on one
/// stream at a time.
#[pyclass(module = "fp8_attention._core")]
pub(crate) struct KeptPlan {
    vl: Varlen,
}

#[pymethods]
impl KeptPlan {
    #[new]
    #[pyo3(signature = (pack_heads=true, split_kv=true))]
    fn new(pack_heads: bool, split_kv: bool) -> KeptPlan {
        let mut vl = Varlen::new();
        vl.pack_heads(pack_heads);
        vl.split_kv(split_kv);
        vl.keep_plan(true);
        KeptPlan { vl }
    }

    /// The next launch plans again.
    fn replan(&mut self) {
        self.vl.replan();
    }

    /// Device plans queued so far.
    fn plans_made(&self) -> usize {
        self.vl.plans_made()
    }

    /// Chunks a sequence's keys were cut into at the last launch (1: no split).
    fn last_split(&self) -> usize {
        self.vl.last_split()
    }

    /// As `launch_varlen` (without its packing and split flags, the object's).
    fn launch(&mut self, batch: Batch, stream: usize) -> PyResult<()> {
        let c = call(batch)?;
        run(&mut self.vl, &c, stream)
    }
}
