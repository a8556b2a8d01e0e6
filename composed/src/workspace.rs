// One launch of a stage over device tensors: checks, the schedule's table, Vᵀ, the tensor maps, the kernel, its merge.
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use fixtures::OutDtype;
use lab::cudarc::driver::sys::CUfunction_attribute;
use lab::cudarc::driver::{CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use lab::{Gpu, Kernel, KernelSpec};

use lab::cudarc::driver::CudaSlice;

use crate::plan::{SplitPlan, blocks_leaving, grid, schedule_section};
use crate::prep;
use crate::stages::Stage;
use crate::strides::{FlatHeads, Strides};
use crate::tables::{Params, out_dtype_code};

/// Where one launch reads and writes: device addresses of E4M3 Q [B, H, Sq, D], K and V [B, Hkv, Sk, D] (contiguous,
/// or at `strides`: any for stage 8, `Strides::flat_heads` for stages 6 and 7), their f32 scales (one per (batch, head)), O in the launch's dtype and the f32 LSE, each
/// with room for [`Workspace::output_rows`] rows of O and LSE. Borrowed: the caller keeps them alive until the launch
/// has run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tensors {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub v_scale: u64,
    pub o: u64,
    pub lse: u64,
    /// Q's, K's and V's element strides; None: contiguous [B, H, S, D].
    pub strides: Option<Strides>,
}

/// What launches of the stages keep between them: Vᵀ in the layout the TMA stages read (made from the launch's V,
/// once or at every launch: [`Workspace::remake_vt`]), the schedule's buffer with the split plan its table holds,
/// and the lab's knobs (a kernel variant, a block count, a schedule section). One workspace serves one stream's
/// launches in order; launches on other streams need their own.
#[derive(Debug, Default)]
pub struct Workspace {
    /// V transposed ([B·Hkv, D, Sk rounded up to 32], keys in P's register order) for the stages that read it by
    /// tensor map, and Vᵀ as tile images (`prep_vt_tiles`) for the one that loads them by bulk copy.
    vt: Option<CudaSlice<u8>>,
    vt_img: Option<CudaSlice<u8>>,
    /// The shape and V (address and layout) the Vᵀ above were made for.
    vt_of: Option<(fixtures::Shape, (u64, FlatHeads))>,
    /// Make Vᵀ again at every launch, whatever V it was made from.
    vt_each_launch: bool,
    /// Stage 7's schedule buffer (`sdpa::SplitHead` and the split table): its counters zero between launches.
    sched: Option<CudaSlice<i32>>,
    /// The split plan the schedule's table holds, written when a launch's plan differs.
    plan: Option<SplitPlan>,
    kernel: Option<KernelSpec>,
    blocks: Option<usize>,
    /// SMs a persistent launch leaves to other kernels (`leave_sms`).
    free_sms: usize,
    section: Option<usize>,
    /// Plan no split tail: every unit whole and taken from the counter (`use_split_tail`).
    no_split: bool,
    /// A split tail's pieces taken from the counter after the whole units, not dealt (`take_split_tail`).
    taken: bool,
    /// Launch stages 7 and 8 as ordinary launches, not programmatic dependent ones (`use_programmatic`).
    serial: bool,
    /// The last launch's kernel, loaded with its shared memory allowed (the kernel's name and source, the bytes):
    /// a launch of the same one asks neither the kernel cache nor the driver again.
    loaded: Option<((&'static str, usize, usize), Kernel)>,
    /// The last launch's tensor maps and what they were encoded for: encoded again only when that differs.
    maps: Option<(MapsKey, [tma_ring::TensorMap; 4])>,
}

/// What a launch's tensor maps describe: the shape, the key tile, the addresses of Q, K, V or Vᵀ (the third map's)
/// and O (its map's), and the split tail's virtual heads O's map reaches.
type MapsKey = (
    fixtures::Shape,
    usize,
    u64,
    u64,
    prep::VMap,
    Option<u64>,
    usize,
    Option<Strides>,
);

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// Launch `spec` (a variant of the stage's own kernel: same name, parameters and geometry) from now on;
    /// `None` goes back to the stage's kernel.
    pub fn use_kernel(&mut self, spec: Option<KernelSpec>) {
        self.kernel = spec;
    }

    /// Launch a persistent stage with `blocks` blocks from now on (`None`: one an SM).
    pub fn use_blocks(&mut self, blocks: Option<usize>) {
        self.blocks = blocks;
    }

    /// Leave `free` SMs to other kernels from now on (0, the default: none): a persistent stage's launch takes
    /// `plan::blocks_leaving`'s blocks, unless `use_blocks` set a count. For launches beside a communication library's
    /// kernels (NCCL's during a ring step), which otherwise wait for an SM until the launch's blocks end.
    pub fn leave_sms(&mut self, free: usize) {
        self.free_sms = free;
    }

    /// The block count a persistent launch of `stage` on `s` (units of `rows` rows) asks for: `use_blocks`'s, else
    /// `leave_sms`'s, else none (one an SM).
    fn blocks_for(
        &self,
        stage: Stage,
        s: &fixtures::Shape,
        rows: usize,
        sms: usize,
    ) -> Option<usize> {
        if self.blocks.is_some() || self.free_sms == 0 || !stage.persistent() {
            return self.blocks;
        }
        let units = s.heads() * s.sq.div_ceil(rows);
        Some(blocks_leaving(units, sms, self.free_sms, !s.causal))
    }

    /// With `on` (the default), a persistent launch whose units do not fill its last wave splits that wave's units
    /// among the blocks (`SplitPlan`), each block dealt its share ahead. Without, every unit is whole and taken from
    /// the counter: for launches that share the device with other kernels (NCCL's during a ring step), where a block
    /// that starts late would hold up its dealt share, but only takes fewer units from a counter.
    pub fn use_split_tail(&mut self, on: bool) {
        self.no_split = !on;
    }

    /// With `on`, a split tail's pieces are taken from the counter after the whole units, which are taken from it
    /// too ([`SplitPlan::taken`]), instead of dealt: for launches beside other kernels that a split tail should still
    /// balance (a ring step's beside NCCL's). The same parts and merge as dealt, so the same bits. Off by default;
    /// stages whose kernels deal them (`Stage::takes_pieces`) go on dealing.
    pub fn take_split_tail(&mut self, on: bool) {
        self.taken = on;
    }

    /// The split plan of a launch of `stage` on `s` with blocks of `rows` rows, a grid of `blocks`.
    fn split_plan(
        &self,
        stage: Stage,
        s: &fixtures::Shape,
        rows: usize,
        blocks: usize,
    ) -> SplitPlan {
        let plan = SplitPlan::of(stage, s, rows, blocks);
        match (self.no_split, self.taken && stage.takes_pieces()) {
            (true, _) => plan.unsplit(),
            (false, true) => plan.taken(),
            (false, false) => plan,
        }
    }

    /// Order causal stage 7's units in sections of `heads` heads from now on (`None`: `schedule_section`'s).
    pub fn use_section(&mut self, heads: Option<usize>) {
        self.section = heads;
    }

    /// With `on` (the default), stages 7 and 8 are launched as programmatic dependent launches
    /// (`Stage::programmatic`): a launch may start while the kernel before it runs, up to its `griddepcontrol.wait`.
    pub fn use_programmatic(&mut self, on: bool) {
        self.serial = !on;
    }

    /// With `on`, every launch of a TMA stage first transposes V again (`prep_vt`, or `prep_vt_tiles`); without,
    /// Vᵀ is made again only when the launch's shape or V address differs from the last one's.
    pub fn remake_vt(&mut self, on: bool) {
        self.vt_each_launch = on;
    }

    /// How a launch of `stage` on `s` splits its tail, with the block count set now.
    pub fn plan(&self, gpu: &Gpu, stage: Stage, s: &fixtures::Shape) -> Result<SplitPlan> {
        Ok(self.grid_of(gpu, stage, s)?.2)
    }

    /// A launch's query rows a unit, its grid and its split plan, with the block count set now (`plan::grid`; a
    /// halved plan's grid is two blocks a unit).
    fn grid_of(
        &self,
        gpu: &Gpu,
        stage: Stage,
        s: &fixtures::Shape,
    ) -> Result<(usize, (u32, u32, u32), SplitPlan)> {
        let rows = stage.rows_for(s, gpu.sms);
        let blocks = self.blocks_for(stage, s, rows, gpu.sms);
        let g = grid(stage, s, rows, gpu.sms, blocks)?;
        // Units are halved over the SMs only at the default block count (one an SM, none left free).
        let most = if stage.persistent() && blocks.is_none() {
            gpu.sms
        } else {
            g.0 as usize
        };
        let plan = self.split_plan(stage, s, rows, most);
        Ok((rows, (plan.blocks(g.0 as usize) as u32, g.1, g.2), plan))
    }

    /// Rows of O (each D wide) and of the LSE a launch of `stage` on `s` writes: B·H·Sq, and the split tail's
    /// parts on virtual heads past them.
    pub fn output_rows(&self, gpu: &Gpu, stage: Stage, s: &fixtures::Shape) -> Result<usize> {
        let rows = stage.rows_for(s, gpu.sms);
        Ok((s.heads() + self.plan(gpu, stage, s)?.virtual_heads(s.sq / rows)) * s.sq)
    }

    /// Queues one launch of `stage` on `st` over `t` (which [`Workspace::output_rows`] sized), and the split
    /// tail's merge after it where the plan splits. `s` and `softmax_scale` are the problem's; `out` is O's dtype.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        stage: Stage,
        st: &Arc<CudaStream>,
        s: &fixtures::Shape,
        softmax_scale: f32,
        out: OutDtype,
        t: &Tensors,
    ) -> Result<()> {
        stage_supports(stage, s)?;
        ensure!(
            t.strides.is_none() || stage.tma(),
            "{} reads contiguous [B, H, S, D] inputs: strided Q, K, V take a TMA stage (6, 7, 8)",
            stage.name()
        );
        // Stages 6 and 7 (and V's transpose) read each tensor as B·H heads evenly spaced; stage 8 any strides.
        let flat = match t.strides {
            Some(st) if !stage.transposes_v() => st.flat_heads(s)?,
            _ => [
                FlatHeads::contiguous(s.sq, s.d),
                FlatHeads::contiguous(s.sk, s.d),
                FlatHeads::contiguous(s.sk, s.d),
            ],
        };
        // Checked first: it bounds the work units and query tiles the parameters carry as i32.
        let (rows, grid_dim, plan) = self.grid_of(gpu, stage, s)?;
        let spec = self.kernel.unwrap_or_else(|| stage.kernel_for(s));
        let spec = if plan.halved {
            stage.halved_kernel(s, spec.source)
        } else {
            spec
        };
        // A halved plan's kernel has its own tiles (`Stage::halved_bc`): its maps' boxes and shared memory follow them.
        let bc = if plan.halved {
            stage.halved_bc(s.d, s.sk)
        } else {
            stage.bc(s.d)
        };
        let smem = if plan.halved {
            stage.tma_smem_bc(s.d, bc)
        } else {
            stage.smem_bytes(s.d)
        };
        let key = (spec.name, std::ptr::from_ref(spec.source) as usize, smem);
        let k = match &self.loaded {
            Some((at, k)) if *at == key => k.clone(),
            _ => {
                let k = load_with_smem(gpu, &spec, smem)?;
                self.loaded = Some((key, k.clone()));
                k
            }
        };
        self.write_schedule(st, s, plan, rows)?;
        self.make_vt(gpu, stage, st, s, (t.v, flat[2]))?;
        let section = self.section.unwrap_or_else(|| schedule_section(s));
        ensure!(
            (1..=s.heads()).contains(&section),
            "a schedule section of {section} heads: it takes 1 to B·H = {}",
            s.heads()
        );
        let (vt_tiles, _gimg) = match &self.vt_img {
            Some(img) if stage.vt_image(s.d) => {
                let (a, g) = img.device_ptr(st);
                (a, Some(g))
            }
            _ => (0, None),
        };
        let (sched, _gs) = match &self.sched {
            Some(b) => {
                let (a, g) = b.device_ptr(st);
                (a, Some(g))
            }
            None => (0, None),
        };
        let p = Params {
            q: t.q,
            k: t.k,
            v: t.v,
            q_scale: t.q_scale,
            k_scale: t.k_scale,
            v_scale: t.v_scale,
            o: t.o,
            lse: t.lse,
            sq: s.sq as i32,
            sk: s.sk as i32,
            softmax_scale,
            o_dtype: out_dtype_code(out),
            causal: i32::from(s.causal),
            group: s.group() as i32,
            q_rows: rows as i32,
            q_tiles: s.sq.div_ceil(rows) as i32,
            work: plan.units as i32,
            section: section as i32,
            vt_tiles,
            sched,
        };
        // Vᵀ as tile images comes by bulk copy (Params::vt_tiles), not through the third map; f32 O is written
        // directly, not through the fourth. O's map reaches the split tail's virtual heads too.
        let o_map = (stage.tma_store() && out != OutDtype::F32).then_some(p.o);
        let o_extra = plan.virtual_heads(s.sq / rows);
        let vt_map = match (&self.vt, stage.reads_vt() && !stage.vt_image(s.d)) {
            (Some(vt), true) => Some(vt.device_ptr(st)),
            _ => None,
        };
        let maps = if stage.tma() {
            let v = match &vt_map {
                _ if stage.transposes_v() => prep::VMap::V(p.v),
                Some((a, _)) => prep::VMap::Vt(*a),
                None => prep::VMap::Unread,
            };
            let key: MapsKey = (*s, bc, p.q, p.k, v, o_map, o_extra, t.strides);
            match &self.maps {
                Some((at, m)) if *at == key => Some(*m),
                _ => {
                    let m = if stage.transposes_v() {
                        let strides = t.strides.unwrap_or_else(|| Strides::contiguous(s));
                        prep::tma_maps_strided(s, bc, [p.q, p.k, p.v], strides, o_map, o_extra)?
                    } else {
                        prep::tma_maps(s, bc, [(p.q, flat[0]), (p.k, flat[1])], v, o_map, o_extra)?
                    };
                    self.maps = Some((key, m));
                    Some(m)
                }
            }
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (stage.threads() as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = lab::Args::new();
        b.arg(&p);
        if let Some(m) = &maps {
            b.arg(&m[0]).arg(&m[1]).arg(&m[2]);
            if stage.tma_store() {
                b.arg(&m[3]);
            }
        }
        // Stage 8's maps are (D, S, H, B): a head's coordinates are (h, b), and the kernel takes H.
        let heads = s.h as i32;
        if stage.transposes_v() {
            b.arg(&heads);
        }
        // The windowed kernel's sides (−1: unbounded).
        let (win_left, win_right) = s.window.kernel_sides();
        if spec.name.starts_with("stage8w_") {
            b.arg(&win_left).arg(&win_right);
        }
        let order = lab::Order::programmatic_if(stage.programmatic() && !self.serial);
        // SAFETY: stageN_dD(sdpa::Params[, tma::Map q, k, vt or v[, o]][, int heads]) with the grid and block it was
        // written for;
        // the caller's tensors hold the extents of `s` (Tensors' contract; validate() checks uploaded ones), O and
        // the LSE `output_rows` rows; each map describes its tensor (tma_maps). A programmatic stage's kernel waits
        // (griddepcontrol.wait) before it touches global memory.
        unsafe { lab::launch_ex(&k.func, cfg, st, &mut b, order) }
            .with_context(|| format!("launching {}", spec.name))?;
        if plan.pieces > 0 {
            launch_merge(gpu, st, &spec, &plan, s.d, &p)?;
        }
        Ok(())
    }

    /// The schedule's counters and the plan's table: written only when the plan changes (outside a timing's graph
    /// capture, whose launches repeat the warm-up's).
    fn write_schedule(
        &mut self,
        st: &Arc<CudaStream>,
        s: &fixtures::Shape,
        plan: SplitPlan,
        rows: usize,
    ) -> Result<()> {
        ensure!(
            plan.tail_tiles() <= i32::MAX as usize,
            "a split tail of {} key tiles: more than 2^31 − 1",
            plan.tail_tiles()
        );
        if self.plan == Some(plan) && self.sched.is_some() {
            return Ok(());
        }
        let table = plan.table(s.sq.div_ceil(rows), s.sq / rows).words();
        let sched = match self.sched.take() {
            Some(b) if b.len() >= table.len() => b,
            _ => st.alloc_zeros::<i32>(table.len())?,
        };
        let mut sched = sched;
        st.memcpy_htod(&table, &mut sched.slice_mut(0..table.len()))?;
        self.sched = Some(sched);
        self.plan = Some(plan);
        Ok(())
    }

    /// Vᵀ in the layout `stage` reads (tile images, or the transposed tensor behind the third map), from the V at
    /// `v`: made when the shape or V differ from the last launch's, or at every launch under `remake_vt`.
    fn make_vt(
        &mut self,
        gpu: &Gpu,
        stage: Stage,
        st: &Arc<CudaStream>,
        s: &fixtures::Shape,
        v: (u64, FlatHeads),
    ) -> Result<()> {
        if !stage.reads_vt() {
            return Ok(());
        }
        let bc = stage.bc(s.d);
        let fresh = self.vt_of != Some((*s, v));
        if stage.vt_image(s.d) {
            let bytes = prep::vt_tiles_bytes(s, bc);
            match &mut self.vt_img {
                Some(img) if img.len() == bytes => {
                    if fresh || self.vt_each_launch {
                        prep::launch_vt_tiles(gpu, &prep::VT_TILES, st, v, s, bc, img)?
                    }
                }
                _ => self.vt_img = Some(prep::vt_tiles_with(gpu, &prep::VT_TILES, st, v, s, bc)?),
            }
        } else {
            let bytes = s.kv_heads() * s.d * prep::vt_keys(s.sk);
            match &mut self.vt {
                Some(vt) if vt.len() == bytes => {
                    if fresh || self.vt_each_launch {
                        prep::launch_transpose_v(gpu, &prep::TRANSPOSE_V, st, v, s, vt)?
                    }
                }
                _ => self.vt = Some(prep::transpose_v_with(gpu, &prep::TRANSPOSE_V, st, v, s)?),
            }
        }
        self.vt_of = Some((*s, v));
        Ok(())
    }
}

/// Why `stage` cannot run `s` (causal masking, grouped-query heads or a sliding window it lacks); checked before
/// anything is loaded.
pub fn stage_supports(stage: Stage, s: &fixtures::Shape) -> Result<()> {
    ensure!(
        !s.window.is_bounded() || stage.windows(),
        "{} has no sliding window (window {} asked): stage8 has",
        stage.name(),
        s.window
    );
    ensure!(
        stage.dims().contains(&s.d),
        "{} is not built for head dimension D = {}: it takes D = {:?}, stage7 takes 64, 128 and 256",
        stage.name(),
        s.d,
        stage.dims()
    );
    ensure!(
        !s.causal || stage.causal(),
        "{} has no causal masking: stage7 and stage8 have (run one of them, or without --causal)",
        stage.name()
    );
    ensure!(
        s.group() == 1 || stage.gqa(),
        "{} has no grouped-query attention (H = {} query heads, Hkv = {} key/value heads): stage7 and stage8 have",
        stage.name(),
        s.h,
        s.hkv
    );
    Ok(())
}

/// `spec` loaded, with `smem` bytes of dynamic shared memory allowed.
pub(crate) fn load_with_smem(gpu: &Gpu, spec: &KernelSpec, smem: usize) -> Result<Kernel> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use fixtures::{Shape, Window};

    #[test]
    fn a_sliding_window_takes_stage8_and_every_other_stage_refuses_it_by_name() {
        let s = Shape::cross(1, 2, 128, 128, 64).with_window(Window {
            left: Some(64),
            right: Some(0),
        });
        for stage in Stage::ALL {
            if stage == Stage::S8 {
                assert!(stage.windows() && stage_supports(stage, &s).is_ok());
                assert_eq!(stage.kernel_for(&s).name, "stage8w_d64");
                assert_eq!(
                    stage.kernel_for(&s.with_window(Window::NONE)).name,
                    "stage8_d64"
                );
                continue;
            }
            let e = stage_supports(stage, &s).unwrap_err().to_string();
            assert!(
                e.contains(stage.name())
                    && e.contains("no sliding window (window (64, 0) asked): stage8 has"),
                "{e}"
            );
            // Unbounded on both sides is no window at all.
            let open = s.with_window(Window::NONE);
            assert!(stage.dims().contains(&64) && stage_supports(stage, &open).is_ok());
        }
    }
}
