// The op's staging buffers for real-valued inputs: E4M3 codes, scales and the quantizer's amax, kept across calls.
use std::sync::Arc;

use lab::cudarc::driver::{CudaSlice, CudaStream};

use crate::error::Result;

/// The E4M3 codes and scales of a call's real-valued inputs, kept by the op across calls (grown when a call needs
/// more), and the quantizer's amax scratch.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    pub(crate) codes: [Option<CudaSlice<u8>>; 3],
    pub(crate) scales: [Option<CudaSlice<f32>>; 3],
    pub(crate) amax: Option<CudaSlice<u32>>,
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
