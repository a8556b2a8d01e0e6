// A problem resident on the device: inputs uploaded once, outputs poisoned, downloads checked for unwritten elements.
use anyhow::{Context, Result, ensure};
use fixtures::{Attention, OutDtype, Quantized};
use half::{bf16, f16};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use lab::numerics::{check_written, poisoned};

use crate::validate::validate;
use crate::workspace::Workspace;

/// O on the device, in the dtype the stage was asked to write.
#[derive(Debug)]
pub(crate) enum OBuf {
    F16(CudaSlice<f16>),
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
}

/// Inputs and outputs of one problem, resident on the device, for repeated launches.
#[derive(Debug)]
pub struct OnDevice {
    /// The problem's shape and softmax scale (the inputs themselves live on the device only).
    pub shape: fixtures::Shape,
    pub softmax_scale: f32,
    pub(crate) q: CudaSlice<u8>,
    pub(crate) k: CudaSlice<u8>,
    pub(crate) v: CudaSlice<u8>,
    pub(crate) scales: [CudaSlice<f32>; 3],
    pub(crate) o: OBuf,
    pub lse: CudaSlice<f32>,
    /// softmax_scale·q·μ per query row when K was smoothed (`OnDevice::prepare`): added to the LSE on the way
    /// back, so that callers get the LSE of the problem they gave.
    pub(crate) lse_shift: Option<CudaSlice<f32>>,
    /// What launches keep between them: Vᵀ, the schedule's table and its plan, the lab's knobs.
    pub(crate) ws: Workspace,
    /// Q's, K's and V's layout on the device: None, [B, H, S, D]; or [B, S, H, D] (`use_bshd_inputs`).
    pub(crate) strides: Option<crate::Strides>,
}

impl OnDevice {
    /// Checks and uploads; the outputs start poisoned; O will be f16.
    pub fn upload(gpu: &Gpu, qz: &Quantized) -> Result<Self> {
        Self::upload_as(gpu, qz, OutDtype::F16)
    }

    /// Device memory a problem of `s` takes: Q, K, V (E4M3), O in `out`, LSE and the scales, in bytes.
    pub fn bytes_needed(s: &fixtures::Shape, out: OutDtype) -> [(&'static str, usize); 5] {
        let (q, kv) = (s.heads() * s.sq * s.d, s.kv_heads() * s.sk * s.d);
        [
            ("Q", q),
            ("K and V", 2 * kv),
            ("O", q * out.size()),
            ("LSE", s.heads() * s.sq * 4),
            ("scales", (s.heads() + 2 * s.kv_heads()) * 4),
        ]
    }

    /// Fails, naming how much is needed and how much is free, when the device cannot hold the problem.
    pub fn check_fits(gpu: &Gpu, s: &fixtures::Shape, out: OutDtype) -> Result<()> {
        Self::check_fits_with(gpu, s, out, &[])
    }

    /// As [`OnDevice::check_fits`], with `extra` named buffers (the f32 staging of device quantization).
    pub fn check_fits_with(
        gpu: &Gpu,
        s: &fixtures::Shape,
        out: OutDtype,
        extra: &[(&'static str, usize)],
    ) -> Result<()> {
        let mut parts = Self::bytes_needed(s, out).to_vec();
        parts.extend_from_slice(extra);
        let need: usize = parts.iter().map(|p| p.1).sum();
        let (free, total) = gpu
            .ctx
            .mem_get_info()
            .context("asking the device for its free memory")?;
        let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
        ensure!(
            need <= free,
            "[B, H, Sq, Sk, D] = [{}, {}, {}, {}, {}] with O in {out} needs {:.2} GiB on the GPU ({}), and {} has {:.2} GiB free of {:.2} GiB",
            s.b,
            s.h,
            s.sq,
            s.sk,
            s.d,
            gib(need),
            parts
                .iter()
                .map(|(n, b)| format!("{n} {:.2} GiB", gib(*b)))
                .collect::<Vec<_>>()
                .join(", "),
            gpu.name,
            gib(free),
            gib(total)
        );
        Ok(())
    }

    /// Checks and uploads; the outputs start poisoned; the stages will write O as `out`.
    pub fn upload_as(gpu: &Gpu, qz: &Quantized, out: OutDtype) -> Result<Self> {
        validate(qz)?;
        Self::check_fits(gpu, &qz.shape, out)?;
        let st = &gpu.stream;
        Self::assemble(
            gpu,
            qz.shape,
            qz.softmax_scale,
            [
                st.clone_htod(&qz.q)?,
                st.clone_htod(&qz.k)?,
                st.clone_htod(&qz.v)?,
            ],
            [
                st.clone_htod(&qz.q_scale)?,
                st.clone_htod(&qz.k_scale)?,
                st.clone_htod(&qz.v_scale)?,
            ],
            out,
            None,
        )
    }

    /// A problem from inputs already on the device; O and LSE allocated poisoned.
    pub(crate) fn assemble(
        gpu: &Gpu,
        shape: fixtures::Shape,
        softmax_scale: f32,
        [q, k, v]: [CudaSlice<u8>; 3],
        scales: [CudaSlice<f32>; 3],
        out: OutDtype,
        lse_shift: Option<CudaSlice<f32>>,
    ) -> Result<Self> {
        let st = &gpu.stream;
        let s = shape;
        let n = s.heads() * s.sq * s.d;
        Ok(OnDevice {
            shape,
            softmax_scale,
            q,
            k,
            v,
            scales,
            o: match out {
                OutDtype::F16 => OBuf::F16(st.clone_htod(&poisoned::<f16>(n))?),
                OutDtype::Bf16 => OBuf::Bf16(st.clone_htod(&poisoned::<bf16>(n))?),
                OutDtype::F32 => OBuf::F32(st.clone_htod(&poisoned::<f32>(n))?),
            },
            lse: st.clone_htod(&poisoned::<f32>(s.heads() * s.sq))?,
            lse_shift,
            ws: Workspace::new(),
            strides: None,
        })
    }

    /// Poisons O and the LSE again, so that a download after the next launch fails on any element it did not write.
    pub fn poison_outputs(&mut self, gpu: &Gpu) -> Result<()> {
        let st = &gpu.stream;
        match &mut self.o {
            OBuf::F16(b) => st.memcpy_htod(&poisoned::<f16>(b.len()), b)?,
            OBuf::Bf16(b) => st.memcpy_htod(&poisoned::<bf16>(b.len()), b)?,
            OBuf::F32(b) => st.memcpy_htod(&poisoned::<f32>(b.len()), b)?,
        }
        st.memcpy_htod(&poisoned::<f32>(self.lse.len()), &mut self.lse)?;
        Ok(())
    }

    /// Q's codes on the device ([B, H, Sq, D] E4M3, or the layout `use_bshd_inputs` set), for a test's own kernel
    /// to write before a launch reads them.
    pub fn q_codes_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.q
    }

    /// The dtype the stages write O as.
    pub fn out_dtype(&self) -> OutDtype {
        match self.o {
            OBuf::F16(_) => OutDtype::F16,
            OBuf::Bf16(_) => OutDtype::Bf16,
            OBuf::F32(_) => OutDtype::F32,
        }
    }

    /// Elements `at .. at + n` of O, widened to f32 (exactly); fails if one was never written.
    fn o_range(&self, st: &std::sync::Arc<CudaStream>, at: usize, n: usize) -> Result<Vec<f32>> {
        fn copy<T: DeviceRepr + Default + Clone + lab::numerics::Poison>(
            st: &std::sync::Arc<CudaStream>,
            buf: &CudaSlice<T>,
            at: usize,
            n: usize,
        ) -> Result<Vec<T>> {
            let mut h = vec![T::default(); n];
            st.memcpy_dtoh(&buf.slice(at..at + n), &mut h)?;
            check_written(&h, "O")?;
            Ok(h)
        }
        Ok(match &self.o {
            OBuf::F16(b) => copy(st, b, at, n)?.iter().map(|x| x.to_f32()).collect(),
            OBuf::Bf16(b) => copy(st, b, at, n)?.iter().map(|x| x.to_f32()).collect(),
            OBuf::F32(b) => copy(st, b, at, n)?,
        })
    }

    /// LSE elements `at .. at + n` (with the smoothing shift added back); fails if one was never written.
    fn lse_range(&self, st: &std::sync::Arc<CudaStream>, at: usize, n: usize) -> Result<Vec<f32>> {
        let mut h = vec![0.0f32; n];
        st.memcpy_dtoh(&self.lse.slice(at..at + n), &mut h)?;
        check_written(&h, "LSE")?;
        if self.lse_shift.is_some() {
            let sh = self.shift_range(st, at, n)?;
            h.iter_mut().zip(&sh).for_each(|(l, s)| *l += s);
        }
        Ok(h)
    }

    /// LSE shift elements `at .. at + n` (zeros without smoothing).
    fn shift_range(
        &self,
        st: &std::sync::Arc<CudaStream>,
        at: usize,
        n: usize,
    ) -> Result<Vec<f32>> {
        let mut sh = vec![0.0f32; n];
        if let Some(shift) = &self.lse_shift {
            st.memcpy_dtoh(&shift.slice(at..at + n), &mut sh)?;
        }
        Ok(sh)
    }

    /// The LSE shift of the given rows (zero without smoothing): what the stage's own LSE lacks.
    pub fn lse_shift_rows(&self, gpu: &Gpu, rows: &[usize]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(rows.len());
        for (at, n) in row_runs(rows) {
            out.extend(self.shift_range(&gpu.stream, at, n)?);
        }
        Ok(out)
    }

    /// From now on Q, K and V sit on the device as [B, S, H, D] (the same values, moved), and launches read them
    /// through those strides (`Tensors::strides`: stage 8 at any B, stages 6 and 7 at B = 1 — `Strides::flat_heads`;
    /// the others refuse them by name).
    pub fn use_bshd_inputs(&mut self, gpu: &Gpu) -> Result<()> {
        if self.strides.is_some() {
            return Ok(());
        }
        let st = &gpu.stream;
        let s = self.shape;
        self.q = st.clone_htod(&swap_s_h(&st.clone_dtoh(&self.q)?, s.b, s.h, s.sq, s.d))?;
        self.k = st.clone_htod(&swap_s_h(&st.clone_dtoh(&self.k)?, s.b, s.hkv, s.sk, s.d))?;
        self.v = st.clone_htod(&swap_s_h(&st.clone_dtoh(&self.v)?, s.b, s.hkv, s.sk, s.d))?;
        self.strides = Some(crate::Strides::bshd(&s));
        Ok(())
    }

    /// The E4M3 inputs and scales as the device holds them (after device quantization: what the reference on
    /// the dequantized inputs needs), as [B, H, S, D] whatever their layout there.
    pub fn quantized(&self, gpu: &Gpu) -> Result<Quantized> {
        let st = &gpu.stream;
        let s = self.shape;
        let back = |x: Vec<u8>, h: usize, rows: usize| {
            if self.strides.is_some() {
                swap_s_h(&x, s.b, rows, h, s.d)
            } else {
                x
            }
        };
        Ok(Quantized {
            shape: self.shape,
            q: back(st.clone_dtoh(&self.q)?, s.h, s.sq),
            k: back(st.clone_dtoh(&self.k)?, s.hkv, s.sk),
            v: back(st.clone_dtoh(&self.v)?, s.hkv, s.sk),
            q_scale: st.clone_dtoh(&self.scales[0])?,
            k_scale: st.clone_dtoh(&self.scales[1])?,
            v_scale: st.clone_dtoh(&self.scales[2])?,
            softmax_scale: self.softmax_scale,
        })
    }

    /// O and LSE of the given global query rows (head · Sq + row) only, O widened to f32: what a sampled check
    /// needs of outputs too large to bring back whole. Consecutive rows come back in one copy each of O and
    /// LSE. Fails if any element was never written.
    pub fn download_rows(&self, gpu: &Gpu, rows: &[usize]) -> Result<Attention<f32>> {
        let st = &gpu.stream;
        let d = self.shape.d;
        let mut out = Attention {
            o: Vec::with_capacity(rows.len() * d),
            lse: Vec::with_capacity(rows.len()),
        };
        for (at, n) in row_runs(rows) {
            out.o.extend(self.o_range(st, at * d, n * d)?);
            out.lse.extend(self.lse_range(st, at, n)?);
        }
        Ok(out)
    }

    /// O (widened to f32, exactly) and LSE back on the host; fails if any element was never written.
    pub fn download(&self, gpu: &Gpu) -> Result<Attention<f32>> {
        let rows = self.shape.heads() * self.shape.sq;
        Ok(Attention {
            o: self.o_range(&gpu.stream, 0, rows * self.shape.d)?,
            lse: self.lse_range(&gpu.stream, 0, rows)?,
        })
    }
}

/// `rows` as runs of consecutive indices, (first, length), in order: what one copy each brings back.
fn row_runs(rows: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = *rows.get(i)?;
        let n = 1 + rows[i + 1..]
            .iter()
            .zip(&rows[i..])
            .take_while(|(next, prev)| **next == **prev + 1)
            .count();
        i += n;
        Some((first, n))
    })
}

/// A [b, x, y, d] tensor (row-major) as [b, y, x, d]: [B, H, S, D] to [B, S, H, D] (x = H, y = S), and back (x = S,
/// y = H).
pub(crate) fn swap_s_h<T: Copy>(a: &[T], b: usize, x: usize, y: usize, d: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len());
    for bi in 0..b {
        for yi in 0..y {
            for xi in 0..x {
                let at = ((bi * x + xi) * y + yi) * d;
                out.extend_from_slice(&a[at..at + d]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{row_runs, swap_s_h};

    #[test]
    fn rows_come_back_in_runs_of_consecutive_indices() {
        let runs: Vec<_> = row_runs(&[0, 1, 2, 7, 9, 10]).collect();
        assert_eq!(runs, vec![(0, 3), (7, 1), (9, 2)]);
        assert_eq!(row_runs(&[]).count(), 0);
    }

    #[test]
    fn swapping_s_and_h_twice_gives_the_tensor_back() {
        let a: Vec<u32> = (0..2 * 3 * 5 * 4).collect();
        let t = swap_s_h(&a, 2, 3, 5, 4);
        // [B, S, H, D] element (b 1, s 4, h 2, d 3) is [B, H, S, D]'s (1, 2, 4, 3).
        assert_eq!(t[((5 + 4) * 3 + 2) * 4 + 3], a[((3 + 2) * 5 + 4) * 4 + 3]);
        assert_eq!(swap_s_h(&t, 2, 5, 3, 4), a);
    }
}
