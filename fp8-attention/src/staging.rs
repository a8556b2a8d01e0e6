// The op's staging buffers for real-valued inputs: E4M3 codes, scales and the quantizer's amax, kept across calls.
use std::sync::Arc;

use fp8_codec::{View, ViewOut, ViewQuantizer};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use crate::error::Result;

/// The E4M3 codes and scales of a call's real-valued inputs, kept by the op across calls (grown when a call needs
/// more), and the quantizer's amax scratch.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    pub(crate) codes: [Option<CudaSlice<u8>>; 3],
    pub(crate) scales: [Option<CudaSlice<f32>>; 3],
    pub(crate) amax: Option<CudaSlice<u32>>,
}

impl Staging {
    /// q's, k's and v's `views` quantized to E4M3 on `stream`, one scale per (b, h) of each view, into this staging's
    /// codes (contiguous [B, H, S, D]) and scales (room for `scales[i]` at least: a caller may repeat them after).
    /// The views must lie inside buffers that stay alive, unwritten, until the kernels have read them (their
    /// callers hold the buffers' guards across this call).
    pub(crate) fn quantize(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        views: &[View; 3],
        scales: [usize; 3],
    ) -> Result<()> {
        let heads = views.map(|v| v.dims[0] * v.dims[1]);
        for (i, v) in views.iter().enumerate() {
            grown(&mut self.codes[i], stream, v.dims.iter().product())?;
            grown(&mut self.scales[i], stream, heads[i].max(scales[i]))?;
        }
        grown(&mut self.amax, stream, heads.iter().sum())?;
        let amax = self.amax.as_mut().expect("grown above");
        stream.memset_zeros(amax).map_err(anyhow::Error::from)?;
        let (mut at, _g) = amax.device_ptr_mut(stream);
        let vq = ViewQuantizer::default();
        for (i, view) in views.iter().enumerate() {
            let (codes, _g1) = self.codes[i]
                .as_mut()
                .expect("grown above")
                .device_ptr_mut(stream);
            let (scales, _g2) = self.scales[i]
                .as_mut()
                .expect("grown above")
                .device_ptr_mut(stream);
            // SAFETY: the views are checked by the callers to lie inside their buffers, alive across the kernels;
            // codes, scales and the amax range are this staging's own buffers, each at least the view's size, distinct
            // from the inputs and from each other; all outlive the kernels (dropped only in stream order).
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
            at += (heads[i] * 4) as u64;
        }
        Ok(())
    }
}

/// `buf` holding at least `n` elements, reallocated on `stream` when it holds fewer.
pub(crate) fn grown<T: lab::cudarc::driver::DeviceRepr + lab::cudarc::driver::ValidAsZeroBits>(
    buf: &mut Option<CudaSlice<T>>,
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<()> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = Some(
            stream
                .alloc_zeros::<T>(n.max(1))
                .map_err(anyhow::Error::from)?,
        );
    }
    Ok(())
}
