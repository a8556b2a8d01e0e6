// Packed batches of real-valued tokens (f32, f16, bf16) quantized to E4M3 on the device, one scale a head, then attended.
use std::sync::Arc;

use fp8_codec::{View, ViewOut, ViewQuantizer};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::attention::{Attention, Fp8};
use crate::error::{Error, Result};
use crate::real::{Real, RealElem};
use crate::staging::grown;
use crate::varlen::{Packed, PackedOutput, check_packed};

/// The [1, heads, total, D] view of a packed real tensor `x` ([total, heads, D] row-major, or at `x.strides`' (·,
/// heads, tokens) element strides), checked against its buffer and the quantizer's rules.
fn packed_view<'a, T: RealElem>(
    tensor: &'static str,
    x: &Real<'a, T>,
    heads: usize,
    total: usize,
    d: usize,
    stream: &'a Arc<CudaStream>,
    guards: &mut Vec<SyncOnDrop<'a>>,
) -> Result<View> {
    let (base, g) = x.data.device_ptr(stream);
    guards.push(g);
    let strides = x.strides.unwrap_or([total * heads * d, d, heads * d]);
    let view = View {
        addr: base + (x.offset * T::DTYPE.size()) as u64,
        dtype: T::DTYPE,
        dims: [1, heads, total, d],
        strides,
    };
    let layout = |why: String| Error::Layout { tensor, why };
    if x.offset + view.extent() > x.data.len() {
        return Err(layout(format!(
            "the packed view [{total}, {heads}, {d}] with (token, head) strides ({}, {}) from element {} reaches \
             element {}, past the {} the buffer holds",
            strides[2],
            strides[1],
            x.offset,
            x.offset + view.extent(),
            x.data.len()
        )));
    }
    view.check(tensor).map_err(|e| layout(format!("{e:#}")))?;
    Ok(view)
}

/// `n` f32 at `buf` repeated until it holds `times · n` (copies of doubling size, on `stream`).
fn repeat_scales(
    buf: &mut CudaSlice<f32>,
    n: usize,
    times: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    debug_assert!(buf.len() >= n * times);
    let (base, _g) = buf.device_ptr_mut(stream);
    let mut have = 1;
    while have < times {
        let copy = have.min(times - have);
        // SAFETY: [0, copy·n) and [have·n, (have + copy)·n) lie inside `buf` (have + copy ≤ times) and do not overlap
        // (copy ≤ have); the copy is queued on `stream`, in order with the kernels that write and read `buf`.
        unsafe {
            lab::cudarc::driver::result::memcpy_dtod_async(
                base + (have * n * 4) as u64,
                base,
                copy * n * 4,
                stream.cu_stream(),
            )
        }
        .map_err(|e| Error::Device(anyhow::Error::from(e)))?;
        have += copy;
    }
    Ok(())
}

impl Attention {
    /// Attention over a packed batch of real-valued tokens: `q` [total_q, H, D], `k` and `v` [total_k, Hkv, D]
    /// (`Real::contiguous`, or `Real::strided` with (·, heads, tokens) element strides), sequence i's rows from
    /// `b.cu_seqlens_q[i]` and `b.cu_seqlens_k[i]`. Each tensor is quantized to E4M3 on `stream` with one scale a head
    /// over all its tokens (the scale every sequence's (sequence, head) then uses; its codes and scales bit for bit
    /// `fixtures::quantize_per_head`'s of the [1, heads, total, D] tensor), then attended as
    /// [`Attention::forward_varlen`] does. Every view and boundary is checked before anything is queued; a batch with
    /// no query or no key tokens is refused.
    pub fn forward_varlen_real<T: RealElem>(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        b: &Packed,
        q: Real<T>,
        k: Real<T>,
        v: Real<T>,
    ) -> Result<PackedOutput> {
        let (batch, tq, tk, d) = (b.batch(), b.total_q(), b.total_k(), b.d);
        let counts = [(tq, b.h), (tk, b.hkv), (tk, b.hkv)];
        check_packed(
            b,
            counts.map(|(t, h)| t * h * d),
            counts.map(|(_, h)| batch * h),
        )?;
        for (tensor, total) in [("q", tq), ("k", tk)] {
            if total == 0 {
                return Err(Error::Layout {
                    tensor,
                    why: "the batch has no tokens of it: there is nothing to quantize (skip the call, or pass E4M3 \
                          codes to forward_varlen)"
                        .into(),
                });
            }
        }
        let mut guards: Vec<SyncOnDrop> = Vec::with_capacity(12);
        let mut views = Vec::with_capacity(3);
        for ((tensor, x), (total, heads)) in
            [("q", &q), ("k", &k), ("v", &v)].into_iter().zip(counts)
        {
            views.push(packed_view(
                tensor,
                x,
                heads,
                total,
                d,
                stream,
                &mut guards,
            )?);
        }
        let mut st = std::mem::take(&mut self.staging);
        for (i, &(total, heads)) in counts.iter().enumerate() {
            grown(&mut st.codes[i], stream, total * heads * d)?;
            grown(&mut st.scales[i], stream, batch * heads)?;
        }
        grown(&mut st.amax, stream, b.h + 2 * b.hkv)?;
        let result = (|| {
            let amax = st.amax.as_mut().expect("grown above");
            stream.memset_zeros(amax).map_err(anyhow::Error::from)?;
            let (amax0, g) = amax.device_ptr_mut(stream);
            guards.push(g);
            let vq = ViewQuantizer::default();
            let mut at = amax0;
            for (i, view) in views.iter().enumerate() {
                let (codes, g1) = st.codes[i]
                    .as_mut()
                    .expect("grown above")
                    .device_ptr_mut(stream);
                let (scales, g2) = st.scales[i]
                    .as_mut()
                    .expect("grown above")
                    .device_ptr_mut(stream);
                // SAFETY: the view lies inside its slice (checked above); codes, scales and the amax range are this
                // op's own buffers, each at least the view's size, distinct from the inputs and from each other;
                // all outlive the kernels (the slices are dropped only in stream order).
                unsafe {
                    vq.run(
                        gpu,
                        stream,
                        ["q", "k", "v"][i],
                        view,
                        ViewOut {
                            codes,
                            scales,
                            amax: at,
                        },
                    )
                }?;
                drop((g1, g2));
                at += (counts[i].1 * 4) as u64;
                // Scales per (sequence, head): the heads' scales repeated for every sequence.
                repeat_scales(
                    st.scales[i].as_mut().expect("grown above"),
                    counts[i].1,
                    batch,
                    stream,
                )?;
            }
            drop(guards);
            let f = |i: usize| Fp8 {
                codes: st.codes[i].as_ref().expect("grown above"),
                scales: st.scales[i].as_ref().expect("grown above"),
            };
            // The codes are [1, heads, total, D]: a token's row D elements on, a head's total·D.
            let at = |(total, _): (usize, usize)| [d, total.max(1) * d, (total.max(1) * d).max(1)];
            let strides = composed::Strides {
                q: at(counts[0]),
                k: at(counts[1]),
                v: at(counts[2]),
            };
            self.packed_launch(gpu, stream, b, f(0), f(1), f(2), None, Some(strides))
        })();
        self.staging = st;
        result
    }
}
