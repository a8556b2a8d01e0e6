// The view quantizer on the device (cuda/quantize_tensor.cu): strided [B, H, S, D] of f32/f16/bf16 to E4M3 per head.
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use lab::cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::kernels::{VIEW_AMAX, VIEW_QUANTIZE};

/// The element type of a real-valued view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Real {
    F32,
    F16,
    Bf16,
}

impl Real {
    /// Bytes an element.
    pub fn size(self) -> usize {
        match self {
            Real::F32 => 4,
            Real::F16 | Real::Bf16 => 2,
        }
    }
    /// The index of this type's kernel in [`VIEW_AMAX`] and [`VIEW_QUANTIZE`].
    fn index(self) -> usize {
        match self {
            Real::F32 => 0,
            Real::F16 => 1,
            Real::Bf16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Real::F32 => "f32",
            Real::F16 => "f16",
            Real::Bf16 => "bf16",
        }
    }
}

/// A [B, H, S, D] tensor on the device: element (b, h, s, d) is at `addr` + (b·strides[0] + h·strides[1] +
/// s·strides[2] + d) elements of `dtype` (D is contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub addr: u64,
    pub dtype: Real,
    pub dims: [usize; 4],
    pub strides: [usize; 3],
}

impl View {
    /// A contiguous (row-major) [B, H, S, D] at `addr`.
    pub fn contiguous(addr: u64, dtype: Real, dims: [usize; 4]) -> View {
        let [_, h, s, d] = dims;
        View {
            addr,
            dtype,
            dims,
            strides: [h * s * d, s * d, d],
        }
    }

    /// One past the last element the view reaches, in elements from `addr`.
    pub fn extent(&self) -> usize {
        let [b, h, s, d] = self.dims;
        if b * h * s * d == 0 {
            return 0;
        }
        (b - 1) * self.strides[0] + (h - 1) * self.strides[1] + (s - 1) * self.strides[2] + d
    }

    /// Why the quantizer cannot read this view: the first thing wrong, named (`what` names the tensor).
    pub fn check(&self, what: &str) -> Result<()> {
        let [b, h, s, d] = self.dims;
        ensure!(
            b * h * s * d > 0,
            "`{what}` {:?}: every size must be at least 1",
            self.dims
        );
        ensure!(
            d.is_multiple_of(8),
            "`{what}`: D = {d} is not a multiple of 8"
        );
        let size = self.dtype.size();
        ensure!(
            self.addr != 0 && self.addr.is_multiple_of(16),
            "`{what}` is at address {:#x}: it must be a device address aligned to 16 bytes",
            self.addr
        );
        for (name, st) in ["B", "H", "S"].iter().zip(self.strides) {
            ensure!(
                (st * size).is_multiple_of(16),
                "`{what}`: the {name} stride of {st} elements is not a multiple of 16 bytes (make the tensor \
                 contiguous)"
            );
        }
        ensure!(
            self.strides[2] >= d,
            "`{what}`: the S stride {} is less than D = {d}: rows overlap",
            self.strides[2]
        );
        ensure!(
            b * h <= i32::MAX as usize && s * d / 8 <= i32::MAX as usize,
            "`{what}` {:?}: more heads, or more elements a head, than one grid holds",
            self.dims
        );
        Ok(())
    }
}

/// Where [`ViewQuantizer::run`] writes (device addresses): E4M3 `codes`, contiguous [B, H, S, D], one byte an
/// element, 8-byte aligned; `scales`, one f32 per (b, h); `amax`, B·H u32 of scratch, zero on entry (left holding
/// the amax bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewOut {
    pub codes: u64,
    pub scales: u64,
    pub amax: u64,
}

/// The two kernels of [`ViewQuantizer::run`], by input type; a mutant replaces them together.
#[derive(Debug, Clone, Copy)]
pub struct ViewQuantizer {
    pub amax: [KernelSpec; 3],
    pub quantize: [KernelSpec; 3],
}

impl Default for ViewQuantizer {
    fn default() -> Self {
        ViewQuantizer {
            amax: VIEW_AMAX,
            quantize: VIEW_QUANTIZE,
        }
    }
}

/// Threads a block of both steps.
const THREADS: u32 = 256;

impl ViewQuantizer {
    /// The same kernels with one header edit (a mutation test).
    pub fn mutated(&self, header: &str, from: &str, to: &str) -> Result<Self> {
        let m = |k: &[KernelSpec; 3]| -> Result<[KernelSpec; 3]> {
            Ok([
                k[0].mutated(header, from, to)?,
                k[1].mutated(header, from, to)?,
                k[2].mutated(header, from, to)?,
            ])
        };
        Ok(ViewQuantizer {
            amax: m(&self.amax)?,
            quantize: m(&self.quantize)?,
        })
    }

    /// Compiles and loads the kernels of `dtype`.
    pub fn warm(&self, gpu: &Gpu, dtype: Real) -> Result<()> {
        gpu.load(&self.amax[dtype.index()])?;
        gpu.load(&self.quantize[dtype.index()])?;
        Ok(())
    }

    /// Queues on `stream` the E4M3 codes of `x` and one scale per (b, h) into `out`, as [`crate::quantize_tensor`]
    /// per head computes them from the values widened to f32, bit for bit. `x` is checked ([`View::check`]) before
    /// anything is queued; `what` names it in errors.
    ///
    /// # Safety
    /// `x`'s addresses up to [`View::extent`], and `out`'s (B·H·S·D bytes of codes, B·H scales and B·H amax) must
    /// be device memory of `gpu`'s context, alive until the kernels finish; `out`'s buffers must not overlap `x` or
    /// each other.
    pub unsafe fn run(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        what: &str,
        x: &View,
        out: ViewOut,
    ) -> Result<()> {
        x.check(what)?;
        let ViewOut {
            codes,
            scales,
            amax,
        } = out;
        if !codes.is_multiple_of(8) || !scales.is_multiple_of(4) || !amax.is_multiple_of(4) {
            bail!(
                "`{what}`: the codes, scales and amax buffers must be aligned (8, 4 and 4 bytes)"
            );
        }
        let [b, h, s, d] = x.dims;
        let (heads, rows, dd) = (h as i32, s as i32, d as i32);
        let [sb, sh, ss] = x.strides.map(|v| v as i64);
        let chunks_per_head = s * d / 8;
        // Step 1: about 16 chunks a thread (four rounds of four loads in flight); step 2: about 4 (two rounds of two).
        let parts = |per_thread: usize| {
            chunks_per_head
                .div_ceil(THREADS as usize * per_thread)
                .clamp(1, 65535) as u32
        };
        let amax_k = gpu.load(&self.amax[x.dtype.index()])?;
        let quant_k = gpu.load(&self.quantize[x.dtype.index()])?;
        let cfg = |parts: u32| LaunchConfig {
            grid_dim: ((b * h) as u32, parts, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: fp8_view_amax_T(const T* x, long long sb, sh, ss, int heads, rows, d, unsigned* amax), a grid of
        // (B·H) × parts blocks; the caller vouches for the addresses, the view was checked above.
        unsafe {
            stream
                .launch_builder(&amax_k.func)
                .arg(&x.addr)
                .arg(&sb)
                .arg(&sh)
                .arg(&ss)
                .arg(&heads)
                .arg(&rows)
                .arg(&dd)
                .arg(&amax)
                .launch(cfg(parts(16)))
        }
        .with_context(|| format!("launching {} on `{what}`", self.amax[x.dtype.index()].name))?;
        // SAFETY: fp8_view_quantize_T(view..., const unsigned* amax, uint2* q, float* scales), (B·H) × parts blocks.
        unsafe {
            stream
                .launch_builder(&quant_k.func)
                .arg(&x.addr)
                .arg(&sb)
                .arg(&sh)
                .arg(&ss)
                .arg(&heads)
                .arg(&rows)
                .arg(&dd)
                .arg(&amax)
                .arg(&codes)
                .arg(&scales)
                .launch(cfg(parts(4)))
        }
        .with_context(|| {
            format!(
                "launching {} on `{what}`",
                self.quantize[x.dtype.index()].name
            )
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_checked_with_names() {
        let v = View::contiguous(1 << 20, Real::Bf16, [2, 4, 100, 64]);
        assert!(v.check("q").is_ok());
        assert_eq!(v.extent(), 2 * 4 * 100 * 64);
        let e = |v: View| v.check("k").unwrap_err().to_string();
        assert!(e(View { addr: 8, ..v }).contains("aligned to 16 bytes"));
        assert!(
            e(View {
                dims: [2, 4, 100, 60],
                ..v
            })
            .contains("D = 60")
        );
        assert!(
            e(View {
                dims: [2, 0, 100, 64],
                ..v
            })
            .contains("at least 1")
        );
        let strided = View {
            strides: [100 * 3 * 4 * 64, 64, 3 * 4 * 64],
            ..v
        };
        assert!(
            strided.check("q").is_ok(),
            "a [B, S, 3, H, D] view of a fused projection"
        );
        assert_eq!(
            strided.extent(),
            100 * 3 * 4 * 64 + 3 * 64 + 99 * 3 * 4 * 64 + 64
        );
        let odd = View {
            strides: [v.strides[0], v.strides[1], 68],
            ..v
        };
        assert!(e(odd).contains("S stride of 68 elements"));
    }
}
