// A stage's launch on a resident problem: checks, the schedule's table, Vᵀ, the tensor maps, the kernel and its merge.
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use fixtures::OutDtype;
use half::{bf16, f16};
use lab::cudarc::driver::sys::CUfunction_attribute;
use lab::cudarc::driver::{CudaStream, DevicePtr, LaunchConfig, PushKernelArg, SyncOnDrop};
use lab::numerics::poisoned;
use lab::{Gpu, Kernel, KernelSpec};

use crate::device::{OBuf, OnDevice};
use crate::plan::{SplitPlan, grid, schedule_section};
use crate::prep;
use crate::stages::Stage;
use crate::tables::{Params, out_dtype_code};

impl OnDevice {
    /// Launch `spec` (a variant of the stage's own kernel: same name, parameters and geometry) from now on;
    /// `None` goes back to the stage's kernel.
    pub fn use_kernel(&mut self, spec: Option<KernelSpec>) {
        self.kernel = spec;
    }

    /// Launch a persistent stage with `blocks` blocks from now on (`None`: one an SM).
    pub fn use_blocks(&mut self, blocks: Option<usize>) {
        self.blocks = blocks;
    }

    /// Order causal stage 7's units in sections of `heads` heads from now on (`None`: `schedule_section`'s).
    pub fn use_section(&mut self, heads: Option<usize>) {
        self.section = heads;
    }

    /// With `on`, every launch of a TMA stage first transposes V again (`prep_vt`, or `prep_vt_tiles`), so that a
    /// timing of the stage includes the work its layout of V costs: cuDNN's FP8 SDPA reads V as it is.
    pub fn time_vt_prep(&mut self, on: bool) {
        self.vt_each_launch = on;
    }

    /// How a launch of `stage` on this problem splits its tail (`SplitPlan`), with the block count set now.
    pub fn split_plan(&self, gpu: &Gpu, stage: Stage) -> Result<SplitPlan> {
        let rows = stage.rows_for(&self.shape, gpu.sms);
        let grid_dim = grid(stage, &self.shape, rows, gpu.sms, self.blocks)?;
        Ok(SplitPlan::of(stage, &self.shape, rows, grid_dim.0 as usize))
    }

    /// Queues one launch of `stage` on the device's stream.
    pub fn launch(&mut self, gpu: &Gpu, stage: Stage) -> Result<()> {
        let st = gpu.stream.clone();
        self.launch_on(gpu, stage, &st)
    }

    /// Queues one launch of `stage` on `st` (the timing stream, which graphs are captured on), and the split tail's
    /// merge after it where the plan splits.
    pub fn launch_on(&mut self, gpu: &Gpu, stage: Stage, st: &Arc<CudaStream>) -> Result<()> {
        let s = self.shape;
        stage_supports(stage, &s)?;
        let spec = self.kernel.unwrap_or_else(|| stage.kernel(s.d));
        let smem = stage.smem_bytes(s.d);
        let k = load_with_smem(gpu, &spec, smem)?;
        let rows = stage.rows_for(&s, gpu.sms);
        // Checked first: it bounds the work units and query tiles the parameters carry as i32.
        let grid_dim = grid(stage, &s, rows, gpu.sms, self.blocks)?;
        let plan = SplitPlan::of(stage, &s, rows, grid_dim.0 as usize);
        self.write_schedule(st, plan, rows)?;
        self.make_vt(gpu, stage, st)?;
        let section = self.section.unwrap_or_else(|| schedule_section(&s));
        ensure!(
            (1..=s.heads()).contains(&section),
            "a schedule section of {section} heads: it takes 1 to B·H = {}",
            s.heads()
        );
        let (p, _guards) = self.params(st, stage, rows, plan.units, section);
        let bc = stage.bc(s.d);
        // Vᵀ as tile images comes by bulk copy (Params::vt_tiles), not through the third map; f32 O is written
        // directly, not through the fourth. O's map reaches the split tail's virtual heads too.
        let o_map = (stage.tma_store() && self.out_dtype() != OutDtype::F32).then_some(p.o);
        let o_extra = plan.virtual_heads(s.sq / rows);
        let maps = if stage.vt_image(s.d) {
            Some(prep::tma_maps(&s, bc, p.q, p.k, None, o_map, o_extra)?)
        } else if let (Some(vt), true) = (&self.vt, stage.tma()) {
            let (vt, _gvt) = vt.device_ptr(st);
            Some(prep::tma_maps(&s, bc, p.q, p.k, Some(vt), o_map, o_extra)?)
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (stage.threads() as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = st.launch_builder(&k.func);
        b.arg(&p);
        if let Some(m) = &maps {
            b.arg(&m[0]).arg(&m[1]).arg(&m[2]);
            if stage.tma_store() {
                b.arg(&m[3]);
            }
        }
        // SAFETY: stageN_dD(sdpa::Params[, tma::Map q, k, vt[, o]]) with the grid and block it was written for;
        // every pointer holds the [B, H, S, D] extents validate() checked, each map describes its tensor (tma_maps).
        unsafe { b.launch(cfg) }.with_context(|| format!("launching {}", spec.name))?;
        if plan.pieces > 0 {
            launch_merge(gpu, st, &spec, &plan, s.d, &p)?;
        }
        Ok(())
    }

    /// The schedule's counters and the plan's table, and O and the LSE grown by the split tail's virtual heads:
    /// written only when the plan changes (outside a timing's graph capture, whose launches repeat the warm-up's).
    fn write_schedule(&mut self, st: &Arc<CudaStream>, plan: SplitPlan, rows: usize) -> Result<()> {
        ensure!(
            plan.tail_tiles() <= i32::MAX as usize,
            "a split tail of {} key tiles: more than 2^31 − 1",
            plan.tail_tiles()
        );
        if self.plan == Some(plan) {
            return Ok(());
        }
        let s = self.shape;
        let table = plan.table(s.sq.div_ceil(rows), s.sq / rows).words();
        if self.sched.len() < table.len() {
            self.sched = st.alloc_zeros::<i32>(table.len())?;
        }
        st.memcpy_htod(&table, &mut self.sched.slice_mut(0..table.len()))?;
        // O and the LSE with the parts' virtual heads after the real ones (poisoned, as upload leaves them).
        let rows_needed = (s.heads() + plan.virtual_heads(s.sq / rows)) * s.sq;
        if self.lse.len() < rows_needed {
            self.lse = st.clone_htod(&poisoned::<f32>(rows_needed))?;
            let n = rows_needed * s.d;
            self.o = match self.o {
                OBuf::F16(_) => OBuf::F16(st.clone_htod(&poisoned::<f16>(n))?),
                OBuf::Bf16(_) => OBuf::Bf16(st.clone_htod(&poisoned::<bf16>(n))?),
                OBuf::F32(_) => OBuf::F32(st.clone_htod(&poisoned::<f32>(n))?),
            };
        }
        self.plan = Some(plan);
        Ok(())
    }

    /// Vᵀ in the layout `stage` reads (tile images, or the transposed tensor behind the third map): made at the
    /// first launch, and again at every launch when the timing counts it (`time_vt_prep`).
    fn make_vt(&mut self, gpu: &Gpu, stage: Stage, st: &Arc<CudaStream>) -> Result<()> {
        let s = self.shape;
        let bc = stage.bc(s.d);
        if stage.vt_image(s.d) {
            match &mut self.vt_img {
                None => {
                    self.vt_img = Some(prep::vt_tiles_with(
                        gpu,
                        &prep::VT_TILES,
                        st,
                        &self.v,
                        &s,
                        bc,
                    )?)
                }
                Some(img) if self.vt_each_launch => {
                    prep::launch_vt_tiles(gpu, &prep::VT_TILES, st, &self.v, &s, bc, img)?
                }
                Some(_) => {}
            }
        } else if stage.tma() {
            match &mut self.vt {
                None => self.vt = Some(prep::transpose_v(gpu, st, &self.v, &s)?),
                Some(vt) if self.vt_each_launch => {
                    prep::launch_transpose_v(gpu, &prep::TRANSPOSE_V, st, &self.v, &s, vt)?
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The kernel's parameters for `stage` with blocks of `rows` query rows, `work` units and causal sections of
    /// `section` heads, with the guards that order the buffers' uses across streams: kept until the launch is queued.
    fn params<'a>(
        &'a self,
        st: &'a Arc<CudaStream>,
        stage: Stage,
        rows: usize,
        work: usize,
        section: usize,
    ) -> (Params, Vec<SyncOnDrop<'a>>) {
        let s = self.shape;
        let mut guards = Vec::with_capacity(11);
        let mut at = |(ptr, g): (u64, SyncOnDrop<'a>)| {
            guards.push(g);
            ptr
        };
        let o = at(match &self.o {
            OBuf::F16(b) => b.device_ptr(st),
            OBuf::Bf16(b) => b.device_ptr(st),
            OBuf::F32(b) => b.device_ptr(st),
        });
        let vt_tiles = match &self.vt_img {
            Some(img) if stage.vt_image(s.d) => at(img.device_ptr(st)),
            _ => 0,
        };
        let p = Params {
            q: at(self.q.device_ptr(st)),
            k: at(self.k.device_ptr(st)),
            v: at(self.v.device_ptr(st)),
            q_scale: at(self.scales[0].device_ptr(st)),
            k_scale: at(self.scales[1].device_ptr(st)),
            v_scale: at(self.scales[2].device_ptr(st)),
            o,
            lse: at(self.lse.device_ptr(st)),
            sq: s.sq as i32,
            sk: s.sk as i32,
            softmax_scale: self.softmax_scale,
            o_dtype: out_dtype_code(self.out_dtype()),
            causal: i32::from(s.causal),
            group: s.group() as i32,
            q_rows: rows as i32,
            q_tiles: s.sq.div_ceil(rows) as i32,
            work: work as i32,
            section: section as i32,
            vt_tiles,
            sched: at(self.sched.device_ptr(st)),
        };
        (p, guards)
    }
}

/// Why `stage` cannot run `s` (causal masking or grouped-query heads it lacks); checked before anything is loaded.
pub fn stage_supports(stage: Stage, s: &fixtures::Shape) -> Result<()> {
    ensure!(
        !s.causal || stage.causal(),
        "{} has no causal masking: stage7 has (run it with --stage stage7, or without --causal)",
        stage.name()
    );
    ensure!(
        s.group() == 1 || stage.gqa(),
        "{} has no grouped-query attention (H = {} query heads, Hkv = {} key/value heads): stage7 has",
        stage.name(),
        s.h,
        s.hkv
    );
    Ok(())
}

/// `spec` loaded, with `smem` bytes of dynamic shared memory allowed.
fn load_with_smem(gpu: &Gpu, spec: &KernelSpec, smem: usize) -> Result<Kernel> {
    let k = gpu.load(spec)?;
    k.func
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .with_context(|| {
            format!(
                "{}: {smem} B of shared memory is more than this device gives a block",
                spec.name
            )
        })?;
    Ok(k)
}

/// The split tail's parts merged into O and the LSE (`stage7_merge_dD`, from the source the stage ran: a variant's
/// too), on `st` after the stage: a block a split unit and 8 columns, a thread a row.
fn launch_merge(
    gpu: &Gpu,
    st: &Arc<CudaStream>,
    spec: &KernelSpec,
    plan: &SplitPlan,
    d: usize,
    p: &Params,
) -> Result<()> {
    let merge = gpu.load(&KernelSpec {
        source: spec.source,
        ..KernelSpec::find(crate::stages::KERNELS, &format!("stage7_merge_d{d}"))
    })?;
    let cfg = LaunchConfig {
        grid_dim: ((plan.units - plan.split) as u32, (d / 8) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = st.launch_builder(&merge.func);
    b.arg(p);
    // SAFETY: stage7_merge_dD(sdpa::Params) after the stage 7 launch that wrote the parts, on the same stream; its
    // grid is (split units, D / 8) blocks of 128 threads, as merge_split_tail reads it.
    unsafe { b.launch(cfg) }.context("launching stage 7's split-tail merge")?;
    Ok(())
}
