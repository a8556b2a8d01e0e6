// Real-valued inputs (f32, f16, bf16; strided [B, H, S, D] views) quantized to E4M3 on the device, then attended.
use std::sync::Arc;

use fixtures::Shape;
use fp8_codec::View;
use half::{bf16, f16};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, SyncOnDrop};

use crate::attention::{Attention, Fp8, Output};
use crate::error::{Error, Result};
use crate::staging::Staging;

pub use fp8_codec::Real as RealDtype;

/// An element type a model's tensors hold: f32, f16 or bf16.
pub trait RealElem: lab::cudarc::driver::DeviceRepr {
    /// The element type as the quantizer names it.
    const DTYPE: RealDtype;
}
impl RealElem for f32 {
    const DTYPE: RealDtype = RealDtype::F32;
}
impl RealElem for f16 {
    const DTYPE: RealDtype = RealDtype::F16;
}
impl RealElem for bf16 {
    const DTYPE: RealDtype = RealDtype::Bf16;
}

/// A real-valued [B, heads, S, D] tensor on the device: element (b, h, s, d) is `data[offset + b·strides[0] +
/// h·strides[1] + s·strides[2] + d]` (D contiguous; `strides` None: row-major [B, heads, S, D]). A [B, S, H, D]
/// tensor is `strides: Some([S·H·D, D, H·D])`; the q of a fused [B, S, 3, H, D] projection adds nothing else.
#[derive(Debug, Clone, Copy)]
pub struct Real<'a, T> {
    /// The buffer the tensor lies in.
    pub data: &'a CudaSlice<T>,
    /// Its first element's index in `data`.
    pub offset: usize,
    /// Element strides of B, heads and S (D is contiguous); None: row-major.
    pub strides: Option<[usize; 3]>,
}

impl<'a, T> Real<'a, T> {
    /// A row-major [B, heads, S, D] tensor: the whole of `data`.
    pub fn contiguous(data: &'a CudaSlice<T>) -> Self {
        Real {
            data,
            offset: 0,
            strides: None,
        }
    }
    /// The tensor with element strides (B, heads, S), starting `offset` elements into `data`.
    pub fn strided(data: &'a CudaSlice<T>, offset: usize, strides: [usize; 3]) -> Self {
        Real {
            data,
            offset,
            strides: Some(strides),
        }
    }
}

/// The quantizer's view of `x` with `dims` ([B, heads, S, D]) at `x.strides` (`default` where it has none), checked
/// against its buffer and the quantizer's rules; `x`'s guard goes to `guards` (held until the kernels are queued).
pub(crate) fn checked_view<'a, T: RealElem>(
    tensor: &'static str,
    x: &Real<'a, T>,
    dims: [usize; 4],
    default: [usize; 3],
    stream: &'a Arc<CudaStream>,
    guards: &mut Vec<SyncOnDrop<'a>>,
) -> Result<View> {
    let (base, g) = x.data.device_ptr(stream);
    guards.push(g);
    let view = View {
        addr: base + (x.offset * T::DTYPE.size()) as u64,
        dtype: T::DTYPE,
        dims,
        strides: x.strides.unwrap_or(default),
    };
    let layout = |why: String| Error::Layout { tensor, why };
    if x.offset + view.extent() > x.data.len() {
        return Err(layout(format!(
            "the view {dims:?} with strides {:?} from element {} reaches element {}, past the {} the buffer holds",
            view.strides,
            x.offset,
            x.offset + view.extent(),
            x.data.len()
        )));
    }
    view.check(tensor).map_err(|e| layout(format!("{e:#}")))?;
    Ok(view)
}

/// Tensor `i`'s codes and scales in `st`, as the attention takes them (after `Staging::quantize`).
pub(crate) fn staged(st: &Staging, i: usize) -> Fp8<'_> {
    Fp8 {
        codes: st.codes[i].as_ref().expect("grown by quantize"),
        scales: st.scales[i].as_ref().expect("grown by quantize"),
    }
}

impl Attention {
    /// Attention of real-valued `q` over `k` and `v` (shape `s` as [`Attention::forward`] takes it): each tensor
    /// quantized to E4M3 on `stream` with one scale per (batch, head) — the codes and scales bit for bit those of
    /// `fixtures::quantize_per_head` — then attended as [`Attention::forward`] does. Every view is checked before
    /// anything is queued. The op keeps the codes between calls (calls on one op go on one stream at a time).
    pub fn forward_real<T: RealElem>(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        q: Real<T>,
        k: Real<T>,
        v: Real<T>,
    ) -> Result<Output> {
        let (s, scale, stage) = self.checked(gpu, s, &crate::Lengths::of(&s), None)?;
        let dims = [
            [s.b, s.h, s.sq, s.d],
            [s.b, s.hkv, s.sk, s.d],
            [s.b, s.hkv, s.sk, s.d],
        ];
        let mut guards: Vec<SyncOnDrop> = Vec::with_capacity(3);
        let mut views = Vec::with_capacity(3);
        for ((tensor, x), dims) in [("q", &q), ("k", &k), ("v", &v)].into_iter().zip(dims) {
            let [_, h, s, d] = dims;
            let contiguous = [h * s * d, s * d, d];
            views.push(checked_view(
                tensor,
                x,
                dims,
                contiguous,
                stream,
                &mut guards,
            )?);
        }
        let mut st = std::mem::take(&mut self.staging);
        let result = (|| {
            let views: [View; 3] = views.try_into().expect("three views");
            st.quantize(gpu, stream, &views, [0; 3])?;
            drop(guards);
            self.launch(
                gpu,
                stream,
                s,
                scale,
                stage,
                staged(&st, 0),
                staged(&st, 1),
                staged(&st, 2),
            )
        })();
        self.staging = st;
        result
    }
}
