// The Attention op: one configuration, called many times on tensors already on the device, on the caller's stream.
use std::sync::Arc;

use composed::{Stage, Strides, Tensors, Workspace};
use fixtures::{OutDtype, Shape};
use half::{bf16, f16};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::checks::{Lengths, check_inputs, check_strides};
use crate::error::{Error, Result};
use crate::warm::warm_list;

/// One E4M3 tensor on the device: its codes, [B, heads, S, D] contiguous (row-major), and its f32 dequantization
/// scales, one per (batch, head): element x ≈ decode(code) · scale.
#[derive(Debug, Clone, Copy)]
pub struct Fp8<'a> {
    /// The E4M3 codes, one byte an element.
    pub codes: &'a CudaSlice<u8>,
    /// One f32 dequantization scale per (batch, head).
    pub scales: &'a CudaSlice<f32>,
}

/// How an [`Attention`] op computes: causal masking (bottom-right aligned: query row i sees key j when
/// j ≤ i + Sk − Sq), O's dtype, the softmax scale (None: 1/√D), and a sliding window (bottom-right aligned too: row i
/// sees keys i + Sk − Sq − left ≤ j ≤ i + Sk − Sq + right; `Window::NONE`: none; stage 8 only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Causal masking, bottom-right aligned.
    pub causal: bool,
    /// What O is written as.
    pub out_dtype: OutDtype,
    /// The softmax scale; None: 1/√D.
    pub softmax_scale: Option<f32>,
    /// A sliding window; `Window::NONE` (the default): none.
    pub window: fixtures::Window,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            causal: false,
            out_dtype: OutDtype::Bf16,
            softmax_scale: None,
            window: fixtures::Window::NONE,
        }
    }
}

/// O on the device, in the dtype the op was configured for.
#[derive(Debug)]
pub enum OutBuf {
    /// f16 O.
    F16(CudaSlice<f16>),
    /// bf16 O.
    Bf16(CudaSlice<bf16>),
    /// f32 O.
    F32(CudaSlice<f32>),
}

impl OutBuf {
    /// The buffer's device address for writes on `stream`, and the guard that records them.
    pub(crate) fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (u64, SyncOnDrop<'a>) {
        match self {
            OutBuf::F16(b) => b.device_ptr_mut(stream),
            OutBuf::Bf16(b) => b.device_ptr_mut(stream),
            OutBuf::F32(b) => b.device_ptr_mut(stream),
        }
    }
}

/// What a call returns: O [B, H, Sq, D] and the LSE [B, H, Sq] (natural log of Σ exp(scale · q·k) over the
/// dequantized inputs, f32), on the device. The buffers can be longer than that (room for the kernel's own
/// partial results): the result is their first [`Output::o_len`] and [`Output::lse_len`] elements.
#[derive(Debug)]
pub struct Output {
    /// The problem the outputs are of.
    pub shape: Shape,
    /// O, [B, H, Sq, D] first.
    pub o: OutBuf,
    /// The LSE, [B, H, Sq] first.
    pub lse: CudaSlice<f32>,
}

impl Output {
    /// Elements of O: B·H·Sq·D.
    pub fn o_len(&self) -> usize {
        self.shape.heads() * self.shape.sq * self.shape.d
    }
    /// Elements of the LSE: B·H·Sq.
    pub fn lse_len(&self) -> usize {
        self.shape.heads() * self.shape.sq
    }
    /// O widened to f32 (exactly) and the LSE, copied to the host on `stream` (which it waits for).
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<fixtures::Attention<f32>> {
        let n = self.o_len();
        let o = match &self.o {
            OutBuf::F16(b) => stream
                .clone_dtoh(&b.slice(0..n))
                .map_err(anyhow::Error::from)?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            OutBuf::Bf16(b) => stream
                .clone_dtoh(&b.slice(0..n))
                .map_err(anyhow::Error::from)?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            OutBuf::F32(b) => stream
                .clone_dtoh(&b.slice(0..n))
                .map_err(anyhow::Error::from)?,
        };
        let lse = stream
            .clone_dtoh(&self.lse.slice(0..self.lse_len()))
            .map_err(anyhow::Error::from)?;
        Ok(fixtures::Attention { o, lse })
    }
}

/// Scaled-dot-product attention over E4M3 inputs on the device, built once per configuration and called many
/// times. Each call checks its inputs ([`check_inputs`]), queues V's transpose and the attention kernel (and, where
/// the work splits, a merge) on the caller's stream, and returns O and the LSE in new buffers on that stream; it
/// does not wait for the device. The op keeps what its launches share (V's transposed copy, the schedule's
/// table), so calls on one op go on one stream at a time (`&mut self`).
#[derive(Debug)]
pub struct Attention {
    cfg: Config,
    /// The device's stage ([`crate::stage_for`]), or the one [`Attention::with_stage`] fixed.
    stage: Stage,
    /// Whether every call runs `stage`; else each picks by its shape ([`crate::stage_for_shape`]).
    fixed: bool,
    ws: Workspace,
    pub(crate) staging: crate::staging::Staging,
    /// What packed batches' calls keep (`forward_varlen`): the device plan's buffers, the schedule's counter.
    pub(crate) varlen: composed::Varlen,
}

impl Attention {
    /// The op for `gpu`: on Hopper (sm_90: causal, grouped-query heads, D = 64, 128 or 256) each call runs stage 8 up
    /// to [`crate::STAGE8_MAX_KEYS`] keys at D = 64 and 128 (one launch, V read as given) and stage 7 otherwise (V's
    /// transpose, then the attention): [`crate::stage_for_shape`]; stage 4 elsewhere (sm_80 / sm_89, neither causal
    /// nor grouped); a configuration the device cannot run is refused here.
    pub fn new(gpu: &Gpu, cfg: Config) -> Result<Attention> {
        if let Some(x) = cfg.softmax_scale
            && !(x.is_finite() && x > 0.0)
        {
            return Err(Error::SoftmaxScale(x));
        }
        let stage = crate::stage_for(gpu);
        if cfg.window.is_bounded() && stage != Stage::S7 {
            return Err(Error::Unsupported(format!(
                "a sliding window (window {} asked) needs an sm_90 GPU (stage 8); {} is {}",
                cfg.window, gpu.name, gpu.arch
            )));
        }
        if cfg.causal && !stage.causal() {
            return Err(Error::Unsupported(format!(
                "causal masking needs an sm_90 GPU (stage 7); {} is {}",
                gpu.name, gpu.arch
            )));
        }
        let mut ws = Workspace::new();
        // The caller's V may change between calls at the same address: Vᵀ is made from it every call.
        ws.remake_vt(true);
        Ok(Attention {
            cfg,
            stage,
            fixed: false,
            ws,
            staging: Default::default(),
            varlen: Default::default(),
        })
    }

    /// The op on `stage` rather than the device's default: [`Stage::S8`] reads V as the caller has it (no transpose
    /// kernel before the attention: one launch a call) and takes strided inputs ([`Attention::forward_strided`]).
    /// Refused by name where the device or the stage cannot run `cfg`.
    pub fn with_stage(gpu: &Gpu, cfg: Config, stage: Stage) -> Result<Attention> {
        let mut op = Attention::new(gpu, cfg)?;
        let hopper = matches!(gpu.arch, lab::Arch::Sm90 | lab::Arch::Sm90a);
        if stage.kernel(64).archs == [lab::Arch::Sm90a] && !hopper {
            return Err(Error::Unsupported(format!(
                "{} needs an sm_90 GPU; {} is {}",
                stage.name(),
                gpu.name,
                gpu.arch
            )));
        }
        if cfg.causal && !stage.causal() {
            return Err(Error::Unsupported(format!(
                "{} has no causal masking: stage7 and stage8 have",
                stage.name()
            )));
        }
        if cfg.window.is_bounded() && !stage.windows() {
            return Err(Error::Unsupported(format!(
                "{} has no sliding window (window {} asked): stage8 has",
                stage.name(),
                cfg.window
            )));
        }
        op.stage = stage;
        op.fixed = true;
        Ok(op)
    }

    /// With `on` (the default), a persistent stage's launch whose work units do not fill its last wave splits that
    /// wave's units among its blocks, each block dealt its share ahead. Turn it off for calls that share the GPU
    /// with other kernels (a communication library's, as in ring attention's steps): a block that starts late then
    /// takes fewer units from the launch's counter instead of holding up the share it was dealt.
    pub fn set_split_tail(&mut self, on: bool) {
        self.ws.use_split_tail(on);
    }

    /// With `on`, a split tail's pieces are taken from the launch's counter after the whole units (which are taken
    /// from it too) instead of dealt ahead: a block that starts late takes fewer, and the last wave is still split.
    /// The same bits as dealt. Off by default.
    pub fn set_split_taken(&mut self, on: bool) {
        self.ws.take_split_tail(on);
    }

    /// Leave `free` SMs to other kernels (0, the default: none): a persistent stage's launch then takes at most the
    /// others, and where its units are equal the fewest blocks that run them in as many waves
    /// ([`composed::blocks_leaving`]). For calls beside a communication library's kernels (NCCL's during a ring step),
    /// which would otherwise wait for an SM until the launch's blocks end.
    pub fn set_free_sms(&mut self, free: usize) {
        self.ws.leave_sms(free);
    }

    /// With `on`, packed batches ([`Attention::forward_varlen`], [`Attention::forward_paged`]) whose grouped-query
    /// heads can be packed (G = H / Hkv > 1 dividing 64, no sliding window) put a token's G query heads in consecutive
    /// rows of one unit, so they share one pass over their K/V head's keys (FlashAttention-3's PackGQA; for decode,
    /// where a unit would otherwise hold a token's one row). Row for row the same bits. On by default.
    pub fn set_pack_heads(&mut self, on: bool) {
        self.varlen.pack_heads(on);
    }

    /// With `on` (the default), packed batches whose units would leave more than half the SMs idle (decode over a few
    /// long sequences) run split-KV: each sequence's keys in chunks, their parts merged (`composed::split_kv`).
    pub fn set_split_kv(&mut self, on: bool) {
        self.varlen.split_kv(on);
    }

    /// Launch `spec` instead of the stage's kernel from now on (`None`: the stage's): a variant with the same
    /// parameters and geometry (ring attention's accumulating stage 7, `Stage::accumulating_kernel`).
    pub(crate) fn set_kernel(&mut self, spec: Option<lab::KernelSpec>) {
        self.ws.use_kernel(spec);
    }

    /// The op's configuration.
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// The stage the op launches: the one [`Attention::with_stage`] fixed, or, for an op that picks by shape
    /// ([`Attention::new`]), the device's stage for long sequences ([`Attention::stage_for_call`] says which a call runs).
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// `s` with the op's causal flag and window (what every call and output buffer is made for).
    fn configured(&self, s: &Shape) -> Shape {
        Shape {
            causal: self.cfg.causal,
            window: self.cfg.window,
            ..*s
        }
    }

    /// The stage a call on `s` runs (contiguous inputs; strided ones run stage 8).
    pub fn stage_for_call(&self, s: &Shape) -> Stage {
        if self.fixed {
            self.stage
        } else {
            crate::stage_for_shape(self.stage, s)
        }
    }

    /// The stage a strided call on `s` runs: an op that picks by shape takes stage 7 where a contiguous call would
    /// ([`crate::stage_for_shape`]) and the views' heads are evenly spaced (`Strides::flat_heads`: B = 1, or a
    /// [B, H, S, D]-like view), and stage 8 otherwise (its tensor maps take any strides); an op fixed on a stage runs
    /// it.
    fn strided_stage(&self, s: &Shape, strides: &Strides) -> Stage {
        if self.fixed || self.stage != Stage::S7 {
            return self.stage;
        }
        let s = self.configured(s);
        if self.stage_for_call(&s) == Stage::S7 && strides.flat_heads(&s).is_ok() {
            Stage::S7
        } else {
            Stage::S8
        }
    }

    /// The stages calls of this op at head dimension `d` may run.
    fn stages_at(&self, d: usize) -> Vec<Stage> {
        let mut v = vec![self.stage];
        if !self.fixed && self.stage == Stage::S7 && Stage::S8.dims().contains(&d) {
            v.push(Stage::S8);
        }
        v
    }

    /// Compiles and loads every kernel a call at head dimension `d` can launch, so that the first call does not
    /// pay for NVRTC (kernels are cached in the process, and on disk under [`lab::cache_cubins_in`]): the stage's, its
    /// split tail's merge, V's transposes where the stage reads Vᵀ, and on stage 8 the packed batches' kernel and
    /// the plan's three ([`Attention::forward_varlen`], [`Attention::forward_paged`]).
    pub fn warm(&self, gpu: &Gpu, d: usize) -> Result<()> {
        if !composed::DIMS.contains(&d) {
            return Err(Error::HeadDim(d));
        }
        if !self.stage.dims().contains(&d) {
            return Err(Error::Unsupported(format!(
                "{} is not built for head dimension D = {d} (it takes {:?}) on {} ({})",
                self.stage.name(),
                self.stage.dims(),
                gpu.name,
                gpu.arch
            )));
        }
        for stage in self.stages_at(d) {
            for spec in warm_list(stage, d) {
                gpu.load(&spec)?;
            }
        }
        // An op that packs grouped heads runs the packed-heads kernel for packed batches.
        if self.varlen.heads_packed() && Stage::S8.dims().contains(&d) {
            gpu.load(&composed::varlen_pack_kernel(d))?;
        }
        // An op with a sliding window runs stage 8's windowed kernels (dense and packed).
        if self.cfg.window.is_bounded() && Stage::S8.dims().contains(&d) {
            let s = Shape::new(1, 1, 1, d).with_window(self.cfg.window);
            gpu.load(&Stage::S8.kernel_for(&s))?;
            gpu.load(&lab::KernelSpec::find(
                composed::KERNELS,
                &format!("stage8w_varlen_d{d}"),
            ))?;
        }
        Ok(())
    }

    /// Attention of `q` over `k` and `v` (shape `s`: B, H query heads, `s.hkv` key/value heads, Sq, Sk, D; the
    /// op's `causal` overrides `s.causal`), queued on `stream`.
    pub fn forward(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        q: Fp8,
        k: Fp8,
        v: Fp8,
    ) -> Result<Output> {
        let lens = Lengths {
            q: q.codes.len(),
            k: k.codes.len(),
            v: v.codes.len(),
            q_scales: q.scales.len(),
            k_scales: k.scales.len(),
            v_scales: v.scales.len(),
        };
        let (s, scale, stage) = self.checked(gpu, s, &lens, None)?;
        self.launch(gpu, stream, s, scale, stage, q, k, v)
    }

    /// `s` with the op's causal flag, the softmax scale and the stage the call runs (`stage`, or the op's for `s`),
    /// once all and the inputs' counts `lens` are checked against what this op and device run.
    pub(crate) fn checked(
        &self,
        gpu: &Gpu,
        s: Shape,
        lens: &Lengths,
        stage: Option<Stage>,
    ) -> Result<(Shape, f32, Stage)> {
        let s = self.configured(&s);
        let scale = self.cfg.softmax_scale.unwrap_or(1.0 / (s.d as f32).sqrt());
        check_inputs(&s, lens, scale)?;
        let stage = stage.unwrap_or_else(|| self.stage_for_call(&s));
        if !stage.dims().contains(&s.d) {
            return Err(Error::Unsupported(format!(
                "head dimension D = {}: {} takes D = {:?} (stage 7 on an sm_90 GPU takes 64, 128 and 256); {} is {}",
                s.d,
                stage.name(),
                stage.dims(),
                gpu.name,
                gpu.arch
            )));
        }
        if s.group() > 1 && !stage.gqa() {
            return Err(Error::Unsupported(format!(
                "grouped-query heads (H = {}, Hkv = {}) need an sm_90 GPU (stage 7); {} is {}",
                s.h, s.hkv, gpu.name, gpu.arch
            )));
        }
        Ok((s, scale, stage))
    }

    /// As [`Attention::forward_into`], on E4M3 codes at any element strides ([`Strides`]: the S, H and B dimensions
    /// of Q, K and V, D contiguous: [B, S, H, D], the heads of a fused projection, ...), read in place: on stage 8,
    /// whose tensor maps take any strides, or, where an op that picks by shape would run stage 7 (long keys, D = 256)
    /// and each tensor's heads are evenly spaced (B = 1, or a [B, H, S, D]-like view: `Strides::flat_heads`), on
    /// stage 7, whose maps and V's transpose read such views. No copy is made. Each buffer must hold its view's last
    /// element; each stride must be a positive multiple of 16 bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_strided(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        q: Fp8,
        k: Fp8,
        v: Fp8,
        strides: Strides,
        out: &mut Output,
    ) -> Result<()> {
        let stage = self.strided_stage(&s, &strides);
        if stage == Stage::S7 {
            if let Err(e) = strides.flat_heads(&s) {
                return Err(Error::Unsupported(format!("{e:#}; this op runs stage7")));
            }
        } else if !stage.transposes_v() {
            return Err(Error::Unsupported(format!(
                "strided E4M3 inputs are read in place by stage8 (any strides) or stage7 (heads evenly spaced) \
                 (Attention::with_stage); this op runs {}",
                stage.name()
            )));
        }
        let lens = Lengths {
            q_scales: q.scales.len(),
            k_scales: k.scales.len(),
            v_scales: v.scales.len(),
            ..Lengths::of(&s)
        };
        let (s, scale, stage) = self.checked(gpu, s, &lens, Some(stage))?;
        check_strides(&s, [q.codes.len(), k.codes.len(), v.codes.len()], &strides)?;
        self.launch_into(gpu, stream, s, scale, stage, q, k, v, Some(strides), out)
    }

    /// Rows O (each D wide) and the LSE must hold for a call on `s` ([`Attention::forward_into`]'s outputs): B·H·Sq,
    /// and room for the kernel's partial results after them where the work splits (the most any stage a call on `s`
    /// may run needs: a strided call may run stage 8 where a contiguous one runs stage 7).
    pub fn output_rows(&self, gpu: &Gpu, s: &Shape) -> Result<usize> {
        let s = self.configured(s);
        let mut rows = 0;
        for stage in self.stages_at(s.d) {
            if stage.dims().contains(&s.d) {
                rows = rows.max(self.ws.output_rows(gpu, stage, &s)?);
            }
        }
        Ok(rows.max(s.b * s.h * s.sq))
    }

    /// New buffers (on `stream`, not initialised) for the outputs of calls on `s`, in the op's output dtype, to pass
    /// to [`Attention::forward_into`] call after call.
    pub fn alloc_output(&self, gpu: &Gpu, stream: &Arc<CudaStream>, s: &Shape) -> Result<Output> {
        let rows = self.output_rows(gpu, s)?;
        self.alloc_rows(stream, s, rows)
    }

    /// As [`Attention::alloc_output`], with `rows` rows (at least [`Attention::output_rows`]'s for every call the
    /// buffers will take).
    pub(crate) fn alloc_rows(
        &self,
        stream: &Arc<CudaStream>,
        s: &Shape,
        rows: usize,
    ) -> Result<Output> {
        let n = rows * s.d;
        let alloc = |e: lab::cudarc::driver::DriverError| {
            Error::Device(anyhow::Error::from(e).context(format!(
                "allocating O and the LSE ({rows} rows of D = {})",
                s.d
            )))
        };
        // SAFETY: every element a caller reads (the first o_len / lse_len) is written by a call before it is read
        // in stream order; the rest holds the split tail's parts, written before the merge reads them.
        let o = unsafe {
            match self.cfg.out_dtype {
                OutDtype::F16 => OutBuf::F16(stream.alloc::<f16>(n).map_err(alloc)?),
                OutDtype::Bf16 => OutBuf::Bf16(stream.alloc::<bf16>(n).map_err(alloc)?),
                OutDtype::F32 => OutBuf::F32(stream.alloc::<f32>(n).map_err(alloc)?),
            }
        };
        let lse = unsafe { stream.alloc::<f32>(rows).map_err(alloc)? };
        Ok(Output {
            shape: self.configured(s),
            o,
            lse,
        })
    }

    /// As [`Attention::forward`], into the caller's `out` ([`Attention::alloc_output`], or any buffers of the op's
    /// output dtype holding [`Attention::output_rows`] rows): no allocation in the call. `out.shape` becomes `s`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        q: Fp8,
        k: Fp8,
        v: Fp8,
        out: &mut Output,
    ) -> Result<()> {
        let lens = Lengths {
            q: q.codes.len(),
            k: k.codes.len(),
            v: v.codes.len(),
            q_scales: q.scales.len(),
            k_scales: k.scales.len(),
            v_scales: v.scales.len(),
        };
        let (s, scale, stage) = self.checked(gpu, s, &lens, None)?;
        self.launch_into(gpu, stream, s, scale, stage, q, k, v, None, out)
    }

    /// Queues the call on checked inputs ([`Attention::checked`]) into new outputs; the codes and scales may be
    /// longer than `s` needs (the first elements are read).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        scale: f32,
        stage: Stage,
        q: Fp8,
        k: Fp8,
        v: Fp8,
    ) -> Result<Output> {
        let mut out = self.alloc_output(gpu, stream, &s)?;
        self.launch_into(gpu, stream, s, scale, stage, q, k, v, None, &mut out)?;
        Ok(out)
    }

    /// As [`Attention::launch`], into `out` once its dtype and sizes are checked; `strides`: the inputs' (None:
    /// contiguous).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_into(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        scale: f32,
        stage: Stage,
        q: Fp8,
        k: Fp8,
        v: Fp8,
        strides: Option<Strides>,
        out: &mut Output,
    ) -> Result<()> {
        let mut guards: Vec<SyncOnDrop> = Vec::with_capacity(6);
        let mut at = |(ptr, g)| {
            guards.push(g);
            ptr
        };
        let t = Tensors {
            q: at(q.codes.device_ptr(stream)),
            k: at(k.codes.device_ptr(stream)),
            v: at(v.codes.device_ptr(stream)),
            q_scale: at(q.scales.device_ptr(stream)),
            k_scale: at(k.scales.device_ptr(stream)),
            v_scale: at(v.scales.device_ptr(stream)),
            o: 0,
            lse: 0,
            strides,
        };
        self.launch_views(gpu, stream, s, scale, stage, t, out)
    }

    /// As [`Attention::launch_into`], Q, K, V and their scales at the device addresses and strides of `t` (views the
    /// caller keeps alive and has checked against their buffers; `t.o` and `t.lse` are ignored), O and the LSE into
    /// `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_views(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        s: Shape,
        scale: f32,
        stage: Stage,
        t: Tensors,
        out: &mut Output,
    ) -> Result<()> {
        let rows = self.ws.output_rows(gpu, stage, &s)?;
        let (dtype, o_len) = match &out.o {
            OutBuf::F16(b) => (OutDtype::F16, b.len()),
            OutBuf::Bf16(b) => (OutDtype::Bf16, b.len()),
            OutBuf::F32(b) => (OutDtype::F32, b.len()),
        };
        if dtype != self.cfg.out_dtype {
            return Err(Error::Output(format!(
                "O is {dtype:?}, and the op writes {:?}",
                self.cfg.out_dtype
            )));
        }
        if o_len < rows * s.d || out.lse.len() < rows {
            return Err(Error::Output(format!(
                "O holds {o_len} elements and the LSE {}: this call needs {} and {rows} ({rows} rows of D = {}; \
                 Attention::output_rows)",
                out.lse.len(),
                rows * s.d,
                s.d
            )));
        }
        let (o, o_guard) = out.o.device_ptr_mut(stream);
        let (lse, lse_guard) = out.lse.device_ptr_mut(stream);
        self.ws.launch(
            gpu,
            stage,
            stream,
            &s,
            scale,
            self.cfg.out_dtype,
            &Tensors { o, lse, ..t },
        )?;
        drop((o_guard, lse_guard));
        out.shape = s;
        Ok(())
    }
}
