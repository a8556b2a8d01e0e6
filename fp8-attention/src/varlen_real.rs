// Packed batches of real-valued tokens (f32, f16, bf16) quantized to E4M3 on the device, one scale a head, then attended.
use std::sync::Arc;

use fp8_codec::View;
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, SyncOnDrop};

use crate::attention::Attention;
use crate::error::{Error, Result};
use crate::real::{Real, RealElem, checked_view, staged};
use crate::varlen::{Packed, PackedOutput, check_packed};

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
            // [total, heads, D] as [1, heads, total, D]; row-major unless the caller gives (·, heads, tokens) strides.
            let tokens_major = [total * heads * d, d, heads * d];
            views.push(checked_view(
                tensor,
                x,
                [1, heads, total, d],
                tokens_major,
                stream,
                &mut guards,
            )?);
        }
        let mut st = std::mem::take(&mut self.staging);
        let result = (|| {
            let views: [View; 3] = views.try_into().expect("three views");
            st.quantize(gpu, stream, &views, counts.map(|(_, heads)| batch * heads))?;
            drop(guards);
            // Scales per (sequence, head): the heads' scales repeated for every sequence.
            for (i, &(_, heads)) in counts.iter().enumerate() {
                repeat_scales(
                    st.scales[i].as_mut().expect("grown by quantize"),
                    heads,
                    batch,
                    stream,
                )?;
            }
            // The codes are [1, heads, total, D]: a token's row D elements on, a head's total·D.
            let at = |(total, _): (usize, usize)| [d, total.max(1) * d, (total.max(1) * d).max(1)];
            let strides = composed::Strides {
                q: at(counts[0]),
                k: at(counts[1]),
                v: at(counts[2]),
            };
            self.packed_launch(
                gpu,
                stream,
                b,
                staged(&st, 0),
                staged(&st, 1),
                staged(&st, 2),
                None,
                Some(strides),
            )
        })();
        self.staging = st;
        result
    }
}
