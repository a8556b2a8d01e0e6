// A problem's launch from its own buffers: OnDevice's knobs and `launch_on`, through its Workspace.
use std::sync::Arc;

use anyhow::Result;
use half::{bf16, f16};
use lab::Gpu;
use lab::KernelSpec;
use lab::cudarc::driver::{CudaStream, DevicePtr, SyncOnDrop};
use lab::numerics::poisoned;

use crate::device::{OBuf, OnDevice};
use crate::plan::SplitPlan;
use crate::stages::Stage;
use crate::workspace::{Tensors, stage_supports};

impl OnDevice {
    /// Launch `spec` (a variant of the stage's own kernel: same name, parameters and geometry) from now on;
    /// `None` goes back to the stage's kernel.
    pub fn use_kernel(&mut self, spec: Option<KernelSpec>) {
        self.ws.use_kernel(spec);
    }

    /// Launch a persistent stage with `blocks` blocks from now on (`None`: one an SM).
    pub fn use_blocks(&mut self, blocks: Option<usize>) {
        self.ws.use_blocks(blocks);
    }

    /// Split a persistent launch's last wave among its blocks (`on`, the default) or take every unit whole from
    /// the counter (`Workspace::use_split_tail`).
    pub fn use_split_tail(&mut self, on: bool) {
        self.ws.use_split_tail(on);
    }

    /// Take a split tail's pieces from the counter instead of dealing them (`Workspace::take_split_tail`).
    pub fn take_split_tail(&mut self, on: bool) {
        self.ws.take_split_tail(on);
    }

    /// Order causal stage 7's units in sections of `heads` heads from now on (`None`: `schedule_section`'s).
    pub fn use_section(&mut self, heads: Option<usize>) {
        self.ws.use_section(heads);
    }

    /// With `on` (the default), stages 7 and 8 go as programmatic dependent launches (`Workspace::use_programmatic`).
    pub fn use_programmatic(&mut self, on: bool) {
        self.ws.use_programmatic(on);
    }

    /// With `on`, every launch of a TMA stage first transposes V again (`prep_vt`, or `prep_vt_tiles`), so that a
    /// timing of the stage includes the work its layout of V costs: cuDNN's FP8 SDPA reads V as it is.
    pub fn time_vt_prep(&mut self, on: bool) {
        self.ws.remake_vt(on);
    }

    /// How a launch of `stage` on this problem splits its tail (`SplitPlan`), with the block count set now.
    pub fn split_plan(&self, gpu: &Gpu, stage: Stage) -> Result<SplitPlan> {
        self.ws.plan(gpu, stage, &self.shape)
    }

    /// Queues one launch of `stage` on the device's stream.
    pub fn launch(&mut self, gpu: &Gpu, stage: Stage) -> Result<()> {
        let st = gpu.stream.clone();
        self.launch_on(gpu, stage, &st)
    }

    /// Queues one launch of `stage` on `st` (the timing stream, which graphs are captured on), and the split tail's
    /// merge after it where the plan splits. O and the LSE grow, poisoned, by the split tail's virtual heads first.
    pub fn launch_on(&mut self, gpu: &Gpu, stage: Stage, st: &Arc<CudaStream>) -> Result<()> {
        let s = self.shape;
        stage_supports(stage, &s)?;
        let rows = self.ws.output_rows(gpu, stage, &s)?;
        if self.lse.len() < rows {
            self.lse = st.clone_htod(&poisoned::<f32>(rows))?;
            let n = rows * s.d;
            self.o = match self.o {
                OBuf::F16(_) => OBuf::F16(st.clone_htod(&poisoned::<f16>(n))?),
                OBuf::Bf16(_) => OBuf::Bf16(st.clone_htod(&poisoned::<bf16>(n))?),
                OBuf::F32(_) => OBuf::F32(st.clone_htod(&poisoned::<f32>(n))?),
            };
        }
        let out = self.out_dtype();
        let mut guards: Vec<SyncOnDrop> = Vec::with_capacity(8);
        let mut at = |(ptr, g)| {
            guards.push(g);
            ptr
        };
        let t = Tensors {
            q: at(self.q.device_ptr(st)),
            k: at(self.k.device_ptr(st)),
            v: at(self.v.device_ptr(st)),
            q_scale: at(self.scales[0].device_ptr(st)),
            k_scale: at(self.scales[1].device_ptr(st)),
            v_scale: at(self.scales[2].device_ptr(st)),
            o: at(match &self.o {
                OBuf::F16(b) => b.device_ptr(st),
                OBuf::Bf16(b) => b.device_ptr(st),
                OBuf::F32(b) => b.device_ptr(st),
            }),
            lse: at(self.lse.device_ptr(st)),
            strides: self.strides,
        };
        // The guards order the buffers' uses across streams; they are dropped once the launch is queued.
        let r = self
            .ws
            .launch(gpu, stage, st, &s, self.softmax_scale, out, &t);
        drop(guards);
        r
    }
}
