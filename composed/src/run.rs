// Checked inputs and the launch of a stage: every bad input is refused with a clear error before any launch.
use anyhow::{Context, Result, bail, ensure};
use fixtures::{Attention, OutDtype, Quantized};
use half::{bf16, f16};
use lab::Gpu;
use lab::cudarc::driver::sys::CUfunction_attribute;
use lab::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use lab::numerics::{check_written, poisoned};

use crate::stages::{DIMS, Stage};

/// Why a shape is refused: a zero size, or a head dimension the stages are not built for.
pub fn validate_shape(s: &fixtures::Shape) -> Result<()> {
    ensure!(
        s.sq >= 1 && s.sk >= 1,
        "sequence length must be at least 1 (Sq = {}, Sk = {})",
        s.sq,
        s.sk
    );
    ensure!(
        s.b >= 1 && s.h >= 1,
        "batch and heads must be at least 1 (B = {}, H = {})",
        s.b,
        s.h
    );
    ensure!(
        DIMS.contains(&s.d),
        "head dimension D = {} is not supported: the stages are built for D = 64 and 128",
        s.d
    );
    Ok(())
}

/// Why an input is refused: named tensor, first bad index.
pub fn validate(qz: &Quantized) -> Result<()> {
    let s = qz.shape;
    validate_shape(&s)?;
    for (name, t, heads, rows) in [
        ("q", &qz.q, s.h, s.sq),
        ("k", &qz.k, s.hkv, s.sk),
        ("v", &qz.v, s.hkv, s.sk),
    ] {
        let want = s.b * heads * rows * s.d;
        ensure!(
            t.len() == want,
            "tensor `{name}` has {} elements, [B, H, S, D] = [{}, {heads}, {rows}, {}] needs {want}",
            t.len(),
            s.b,
            s.d
        );
        // Chunks folded without an early exit vectorise: gigabyte tensors are scanned in well under a second.
        let nan = |c: u8| fp8_codec::Format::E4M3.is_nan(c);
        if let Some(chunk) = t
            .chunks(1 << 16)
            .position(|c| c.iter().fold(false, |a, &x| a | nan(x)))
        {
            let i = (chunk << 16) + t[chunk << 16..].iter().position(|&c| nan(c)).unwrap_or(0);
            bail!("tensor `{name}` holds an E4M3 NaN code at index {i}");
        }
    }
    for (name, sc, heads) in [
        ("q_scale", &qz.q_scale, s.heads()),
        ("k_scale", &qz.k_scale, s.kv_heads()),
        ("v_scale", &qz.v_scale, s.kv_heads()),
    ] {
        ensure!(
            sc.len() == heads,
            "`{name}` has {} entries, one per (batch, head) = {heads} needed",
            sc.len()
        );
        if let Some(i) = sc.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
            bail!("`{name}`[{i}] = {} is not a positive finite scale", sc[i]);
        }
    }
    ensure!(
        qz.softmax_scale.is_finite() && qz.softmax_scale > 0.0,
        "softmax scale {} is not positive and finite",
        qz.softmax_scale
    );
    // The kernels scale raw scores by this product (times log2 e) in f32: it must not underflow to 0 or a
    // subnormal, where masked keys (−inf · 0) would turn into NaN.
    for h in 0..s.heads() {
        let kv = s.kv_head(h);
        let c = qz.softmax_scale * qz.q_scale[h] * qz.k_scale[kv] * std::f32::consts::LOG2_E;
        ensure!(
            c.is_normal(),
            "softmax_scale · q_scale[{h}] · k_scale[{kv}] · log2(e) = {c:e} is not a normal f32: the scores' scale underflows"
        );
    }
    Ok(())
}

/// The launch grid of `stage` on `s` with blocks of `rows` query rows on a device of `sms` SMs, or why it cannot
/// be launched. Stage 7 (`Stage::persistent`) gets one block an SM in x, at most one a work unit (`blocks` asks
/// for another count: `sdpa bench --blocks`). The others get (B·H, query tiles): x holds up to 2^31 − 1 blocks and y up to 65535, so B·H goes
/// in x (decode batches of 1024 × 64 heads and more) and the query tiles in y (Sq up to 65535 tiles of `rows`
/// rows: `Stage::rows_for`).
pub fn grid(
    stage: Stage,
    s: &fixtures::Shape,
    rows: usize,
    sms: usize,
    blocks: Option<usize>,
) -> Result<(u32, u32, u32)> {
    let tiles = s.sq.div_ceil(rows);
    ensure!(
        s.heads() <= i32::MAX as usize,
        "B·H = {} heads: a launch holds at most 2^31 − 1 (B = {}, H = {})",
        s.heads(),
        s.b,
        s.h
    );
    if stage.persistent() {
        let work = s.heads() * tiles;
        ensure!(
            work <= i32::MAX as usize,
            "B·H = {} heads × {tiles} query tiles of {rows} rows = {work} work units for {}, more than 2^31 − 1",
            s.heads(),
            stage.name()
        );
        let b = blocks.unwrap_or(sms);
        ensure!(b > 0, "{}: a launch of 0 blocks", stage.name());
        return Ok((b.min(work) as u32, 1, 1));
    }
    ensure!(
        blocks.is_none(),
        "{} is not persistent: its grid is one block a query tile (a block count applies to stage7)",
        stage.name(),
    );
    ensure!(
        tiles <= 65535,
        "Sq = {} needs {tiles} query tiles of {} rows for {}, more than a grid's 65535",
        s.sq,
        rows,
        stage.name()
    );
    Ok((s.heads() as u32, tiles as u32, 1))
}

/// Stage 7's split tail (`sdpa::SplitTable`, in the schedule's buffer): with G blocks sharing equal units, the
/// busiest block runs ⌈U / G⌉ of them where the average is U / G — at (4, 16, 4096, 128), 2048 units on 132 SMs, 16
/// against 15.5 (ncu: 1984 units cost what 2048 do, 1920 6.4% less; docs/ladder.md, sixteenth pass). So the last R
/// units (R = U mod G, or U mod G + G where that is at most G / 2, so that no piece is under half a unit) are cut, as
/// one run of R · T key tiles, into G pieces of near-equal length; each block runs its G-strided whole units, then
/// its piece. A part of a unit writes its O and LSE, as a unit would, to a virtual unit past the real ones, and
/// `stage7_merge_dD` combines each split unit's (O, LSE) pairs. Not for causal units (longest first already
/// balances them), nor where a unit is one key tile, Sq is under a full query tile, or the blocks would not first
/// run a whole wave of whole units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Work units, (head, query tile) pairs.
    pub units: usize,
    /// The first unit of the split tail (`units`: no split).
    pub split: usize,
    /// Pieces the tail is cut into (0: no split), one a block.
    pub pieces: usize,
    /// Key tiles a unit.
    pub unit_tiles: usize,
}

impl SplitPlan {
    /// The plan of a launch of `stage` on `s` with blocks of `rows` query rows and a grid of `blocks` (`grid`'s x):
    /// none but for stage 7, which is persistent.
    pub fn of(stage: Stage, s: &fixtures::Shape, rows: usize, blocks: usize) -> SplitPlan {
        let units = s.heads() * s.sq.div_ceil(rows);
        if stage.persistent() {
            SplitPlan::new(
                units,
                blocks,
                s.sk.div_ceil(stage.bc(s.d)),
                s.causal,
                s.sq / rows,
            )
        } else {
            SplitPlan::new(units, units, 1, s.causal, 0)
        }
    }

    /// `q_full`: full query tiles a head (a part's virtual unit is one of them; none: no split).
    pub fn new(
        units: usize,
        blocks: usize,
        unit_tiles: usize,
        causal: bool,
        q_full: usize,
    ) -> SplitPlan {
        let none = SplitPlan {
            units,
            split: units,
            pieces: 0,
            unit_tiles,
        };
        if causal
            || unit_tiles < 2
            || units <= blocks
            || units.is_multiple_of(blocks)
            || q_full == 0
        {
            return none;
        }
        let mut tail = units % blocks;
        if 2 * tail <= blocks {
            tail += blocks;
        }
        // A block's first unit is whole (the consumers read no slot for it): at least a wave of whole units.
        if units - tail < blocks {
            return none;
        }
        SplitPlan {
            units,
            split: units - tail,
            pieces: blocks,
            unit_tiles,
        }
    }
    /// Key tiles of the split tail.
    pub fn tail_tiles(&self) -> usize {
        (self.units - self.split) * self.unit_tiles
    }
    /// Work items: the whole units, then the pieces.
    pub fn work(&self) -> usize {
        self.split + self.pieces
    }
    /// Tail tiles piece `q` starts at (`pieces`: the tail's end), as `sdpa::tail_bound`.
    pub fn bound(&self, q: usize) -> usize {
        q * self.tail_tiles() / self.pieces
    }
    /// The parts of piece `q`: (unit, first key tile, end key tile), as the producer walks them.
    pub fn parts(&self, q: usize) -> Vec<(usize, usize, usize)> {
        let (mut t, end) = (self.bound(q), self.bound(q + 1));
        let mut out = vec![];
        while t < end {
            let (u, k0) = (self.split + t / self.unit_tiles, t % self.unit_tiles);
            let k1 = self.unit_tiles.min(k0 + end - t);
            out.push((u, k0, k1));
            t += k1 - k0;
        }
        out
    }
    /// Virtual units a part writes its O and LSE to (`sdpa::SplitTable`): slot k (2q for piece q's part that starts
    /// in its unit, 2q + 1 for the one that reaches it from the unit before) is full query tile k % `q_full` of
    /// virtual head B·H + k / `q_full` (full tiles only: the TMA store clips rows past Sq).
    pub fn virtual_heads(&self, q_full: usize) -> usize {
        (2 * self.pieces).div_ceil(q_full.max(1))
    }
    /// `sdpa::Params::sched` as `sdpa::SplitTable` reads it: the counter and done count (zero), split, pieces, the
    /// offsets of the parts and of the merge lists; each piece's first part (G + 1 of them); the parts as (unit, k0,
    /// key tiles or −1, virtual unit or −1); per split unit its parts' count (0: run whole) and virtual units.
    /// `q_tiles` query tiles a head, `q_full` of them full.
    pub fn table(&self, q_tiles: usize, q_full: usize) -> Vec<i32> {
        let i = |x: usize| x as i32;
        let mut first = vec![];
        let mut parts: Vec<[i32; 4]> = vec![];
        let mut merged = vec![vec![]; self.units - self.split];
        for q in 0..self.pieces {
            first.push(i(parts.len()));
            for (u, k0, k1) in self.parts(q) {
                if k1 - k0 == self.unit_tiles {
                    parts.push([i(u), 0, -1, -1]);
                    continue;
                }
                let u0 = (u - self.split) * self.unit_tiles;
                let k = 2 * q + usize::from(self.bound(q) < u0);
                let v = self.units.next_multiple_of(q_tiles) + (k / q_full) * q_tiles + k % q_full;
                parts.push([i(u), i(k0), i(k1 - k0), i(v)]);
                merged[u - self.split].push(i(v));
            }
        }
        first.push(i(parts.len()));
        let parts_at = (8 + first.len()).next_multiple_of(4);
        let merged_at = parts_at + 4 * parts.len();
        let mut t = vec![
            0,
            0,
            i(self.split),
            i(self.pieces),
            i(parts_at),
            i(merged_at),
            0,
            0,
        ];
        t.extend(&first);
        t.resize(parts_at, 0);
        t.extend(parts.iter().flatten());
        for m in merged {
            let mut row = [0i32; 8];
            if m.len() > 1 {
                row[0] = i(m.len());
                row[1..=m.len()].copy_from_slice(&m);
            }
            t.extend(row);
        }
        t
    }
}

/// K and V bytes a schedule section of causal stage 7 may hold (`sdpa::unit_coord`): a third of the H100's 50 MB L2,
/// so that the section's K and V stay there beside the section before's, whose last units are still running. 4 to
/// 16 MiB measured level there, 32 MiB 6.5% slower (docs/ladder.md, tenth pass).
pub const SECTION_KV_BYTES: usize = 16 << 20;

/// Query heads a section of causal stage 7's schedule (`sdpa::unit_coord`: longest units first within a section):
/// as many whole K/V groups as keep their K and V within `SECTION_KV_BYTES`, at least one group, at most every head.
pub fn schedule_section(s: &fixtures::Shape) -> usize {
    let kv_head = 2 * s.sk * s.d;
    let groups = (SECTION_KV_BYTES / kv_head.max(1)).max(1);
    (groups * s.group()).min(s.heads())
}

/// The value of `sdpa::OutDtype`.
fn dtype_code(d: OutDtype) -> i32 {
    match d {
        OutDtype::F16 => 0,
        OutDtype::Bf16 => 1,
        OutDtype::F32 => 2,
    }
}

/// O on the device, in the dtype the stage was asked to write.
#[derive(Debug)]
enum OBuf {
    F16(CudaSlice<f16>),
    Bf16(CudaSlice<bf16>),
    F32(CudaSlice<f32>),
}

/// The kernel's `sdpa::Params`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Params {
    q: u64,
    k: u64,
    v: u64,
    q_scale: u64,
    k_scale: u64,
    v_scale: u64,
    o: u64,
    lse: u64,
    sq: i32,
    sk: i32,
    softmax_scale: f32,
    o_dtype: i32,
    causal: i32,
    group: i32,
    q_rows: i32,
    q_tiles: i32,
    work: i32,
    section: i32,
    vt_tiles: u64,
    sched: u64,
}
// SAFETY: plain integers and a float in the layout of sdpa::Params (8 × 8 bytes, 10 × 4 bytes, then 2 × 8 bytes).
const _: () = assert!(std::mem::size_of::<Params>() == 120);
unsafe impl DeviceRepr for Params {}

/// Inputs and outputs of one problem, resident on the device, for repeated launches.
#[derive(Debug)]
pub struct OnDevice {
    /// The problem's shape and softmax scale (the inputs themselves live on the device only).
    pub shape: fixtures::Shape,
    pub softmax_scale: f32,
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    scales: [CudaSlice<f32>; 3],
    o: OBuf,
    pub lse: CudaSlice<f32>,
    /// softmax_scale·q·μ per query row when K was smoothed (`OnDevice::prepare`): added to the LSE on the way
    /// back, so that callers get the LSE of the problem they gave.
    pub(crate) lse_shift: Option<CudaSlice<f32>>,
    /// V transposed for the TMA stages ([B·H, D, Sk rounded up to 32], keys in P's register order), made at
    /// the first launch of such a stage.
    vt: Option<CudaSlice<u8>>,
    /// Vᵀ as tile images (`prep_vt_tiles`, tiles of `Stage::bc` keys), for the stage that loads them
    /// (`Stage::vt_image`: stage 7 at D = 128, the one tile width that does), made at its first launch.
    vt_img: Option<CudaSlice<u8>>,
    /// A source variant of the stage's kernel to launch instead (`sdpa bench --variant`: A/B in one process).
    kernel: Option<lab::KernelSpec>,
    /// Blocks to launch a persistent stage with instead of one an SM (`sdpa bench --blocks`).
    blocks: Option<usize>,
    /// Make Vᵀ again before every launch of a TMA stage (`time_vt_prep`).
    vt_each_launch: bool,
    /// Stage 7's unit counter and its count of blocks done (`sdpa::Params::sched`): zeroed here once, then left
    /// zero by every launch that ends. One per problem: its launches are ordered on a stream anyway (they write
    /// the same O).
    sched: CudaSlice<i32>,
    /// The split plan `sched`'s header holds (`SplitPlan::header`), written when a launch's plan differs.
    plan: Option<SplitPlan>,
    /// Heads a section of causal stage 7's schedule instead of `schedule_section`'s (`sdpa bench --section`).
    section: Option<usize>,
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
            vt: None,
            vt_img: None,
            kernel: None,
            blocks: None,
            vt_each_launch: false,
            sched: st.alloc_zeros::<i32>(2)?,
            plan: None,
            section: None,
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

    /// Launch `spec` (a variant of the stage's own kernel: same name, parameters and geometry) from now on;
    /// `None` goes back to the stage's kernel.
    pub fn use_kernel(&mut self, spec: Option<lab::KernelSpec>) {
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

    /// With `on`, every launch of a TMA stage first transposes V again (`prep_vt`, or `prep_vt_tiles`), so that a timing of the stage
    /// includes the work its layout of V costs: cuDNN's FP8 SDPA reads V as it is (`docs/ladder.md`).
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

    /// Queues one launch of `stage` on `st` (the timing stream, which graphs are captured on).
    pub fn launch_on(
        &mut self,
        gpu: &Gpu,
        stage: Stage,
        st: &std::sync::Arc<CudaStream>,
    ) -> Result<()> {
        let s = self.shape;
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
        let spec = self.kernel.unwrap_or_else(|| stage.kernel(s.d));
        let k = gpu.load(&spec)?;
        let rows = stage.rows_for(&s, gpu.sms);
        let smem = stage.smem_bytes(s.d);
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
        // Checked first: it bounds the work units and query tiles the parameters carry as i32.
        let grid_dim = grid(stage, &s, rows, gpu.sms, self.blocks)?;
        let plan = SplitPlan::of(stage, &s, rows, grid_dim.0 as usize);
        let units = plan.units;
        ensure!(
            plan.tail_tiles() <= i32::MAX as usize,
            "a split tail of {} key tiles: more than 2^31 − 1",
            plan.tail_tiles()
        );
        // The schedule's counters and the plan's table: grown and rewritten only when the plan changes
        // (outside the timing's graph capture, whose launches repeat the warm-up's plan).
        if self.plan != Some(plan) {
            let table = plan.table(s.sq.div_ceil(rows), s.sq / rows);
            if self.sched.len() < table.len() {
                self.sched = st.alloc_zeros::<i32>(table.len())?;
            }
            st.memcpy_htod(&table, &mut self.sched.slice_mut(0..table.len()))?;
            // O and the LSE with the parts' virtual heads after the real ones (poisoned, as upload leaves them).
            let rows_needed = (s.heads() + plan.virtual_heads(s.sq / rows)) * s.sq;
            if self.lse.len() < rows_needed {
                self.lse = st.clone_htod(&poisoned::<f32>(rows_needed))?;
                self.o = match self.o {
                    OBuf::F16(_) => OBuf::F16(st.clone_htod(&poisoned::<f16>(rows_needed * s.d))?),
                    OBuf::Bf16(_) => {
                        OBuf::Bf16(st.clone_htod(&poisoned::<bf16>(rows_needed * s.d))?)
                    }
                    OBuf::F32(_) => OBuf::F32(st.clone_htod(&poisoned::<f32>(rows_needed * s.d))?),
                };
            }
            self.plan = Some(plan);
        }
        let (q, _gq) = self.q.device_ptr(st);
        let (kk, _gk) = self.k.device_ptr(st);
        let (v, _gv) = self.v.device_ptr(st);
        let (qs, _g1) = self.scales[0].device_ptr(st);
        let (ks, _g2) = self.scales[1].device_ptr(st);
        let (vs, _g3) = self.scales[2].device_ptr(st);
        let (o, _go) = match &self.o {
            OBuf::F16(b) => b.device_ptr(st),
            OBuf::Bf16(b) => b.device_ptr(st),
            OBuf::F32(b) => b.device_ptr(st),
        };
        let (lse, _gl) = self.lse.device_ptr(st);
        let bc = stage.bc(s.d);
        if stage.vt_image(s.d) {
            match &mut self.vt_img {
                None => {
                    self.vt_img = Some(crate::prep::vt_tiles_with(
                        gpu,
                        &crate::prep::VT_TILES,
                        st,
                        &self.v,
                        &s,
                        bc,
                    )?)
                }
                Some(img) if self.vt_each_launch => crate::prep::launch_vt_tiles(
                    gpu,
                    &crate::prep::VT_TILES,
                    st,
                    &self.v,
                    &s,
                    bc,
                    img,
                )?,
                Some(_) => {}
            }
        } else if stage.tma() {
            match &mut self.vt {
                None => self.vt = Some(crate::prep::transpose_v(gpu, st, &self.v, &s)?),
                Some(vt) if self.vt_each_launch => crate::prep::launch_transpose_v(
                    gpu,
                    &crate::prep::TRANSPOSE_V,
                    st,
                    &self.v,
                    &s,
                    vt,
                )?,
                Some(_) => {}
            }
        }
        let (vt_tiles, _gimg) = match &self.vt_img {
            Some(img) if stage.vt_image(s.d) => {
                let (a, g) = img.device_ptr(st);
                (a, Some(g))
            }
            _ => (0, None),
        };
        // Vᵀ as tile images comes by bulk copy (Params::vt_tiles), not through the third map; f32 O is written
        // directly, not through the fourth.
        let o_map = (stage.tma_store() && self.out_dtype() != OutDtype::F32).then_some(o);
        // O's map reaches the split tail's virtual heads too.
        let o_extra = plan.virtual_heads(s.sq / rows);
        let maps = match (&self.vt, stage.tma()) {
            _ if stage.vt_image(s.d) => {
                Some(crate::prep::tma_maps(&s, bc, q, kk, None, o_map, o_extra)?)
            }
            (Some(vt), true) => {
                let (vt, _gvt) = vt.device_ptr(st);
                Some(crate::prep::tma_maps(
                    &s,
                    bc,
                    q,
                    kk,
                    Some(vt),
                    o_map,
                    o_extra,
                )?)
            }
            _ => None,
        };
        let (sched, _gs) = self.sched.device_ptr(st);
        let section = self.section.unwrap_or_else(|| schedule_section(&s));
        ensure!(
            (1..=s.heads()).contains(&section),
            "a schedule section of {section} heads: it takes 1 to B·H = {}",
            s.heads()
        );
        let p = Params {
            q,
            k: kk,
            v,
            q_scale: qs,
            k_scale: ks,
            v_scale: vs,
            o,
            lse,
            sq: s.sq as i32,
            sk: s.sk as i32,
            softmax_scale: self.softmax_scale,
            o_dtype: dtype_code(self.out_dtype()),
            causal: i32::from(s.causal),
            group: s.group() as i32,
            q_rows: rows as i32,
            q_tiles: s.sq.div_ceil(rows) as i32,
            work: units as i32,
            section: section as i32,
            vt_tiles,
            sched,
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
            // The split tail's parts merged into O and the LSE: a block a split unit and 8 columns, a thread a row.
            // From the source the stage ran (a variant's too: `sdpa bench --variant`, the tests' mutants).
            let merge = gpu.load(&lab::KernelSpec {
                source: spec.source,
                ..lab::KernelSpec::find(crate::stages::KERNELS, &format!("stage7_merge_d{}", s.d))
            })?;
            let cfg = LaunchConfig {
                grid_dim: ((plan.units - plan.split) as u32, (s.d / 8) as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = st.launch_builder(&merge.func);
            b.arg(&p);
            // SAFETY: stage7_merge_dD(sdpa::Params) after the stage 7 launch that wrote the parts, on the same
            // stream; its grid is (split units, D / 8) blocks of 128 threads, as merge_split_tail reads it.
            unsafe { b.launch(cfg) }.context("launching stage 7's split-tail merge")?;
        }
        Ok(())
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

    /// The E4M3 inputs and scales as the device holds them (after device quantization: what the reference on
    /// the dequantized inputs needs).
    pub fn quantized(&self, gpu: &Gpu) -> Result<Quantized> {
        let st = &gpu.stream;
        Ok(Quantized {
            shape: self.shape,
            q: st.clone_dtoh(&self.q)?,
            k: st.clone_dtoh(&self.k)?,
            v: st.clone_dtoh(&self.v)?,
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

/// One checked run of `stage` on `qz`, O in f16.
pub fn run(gpu: &Gpu, stage: Stage, qz: &Quantized) -> Result<Attention<f32>> {
    run_as(gpu, stage, qz, OutDtype::F16)
}

/// One checked run of `stage` on `qz`, O written as `out`.
pub fn run_as(gpu: &Gpu, stage: Stage, qz: &Quantized, out: OutDtype) -> Result<Attention<f32>> {
    let mut d = OnDevice::upload_as(gpu, qz, out)?;
    d.launch(gpu, stage)?;
    d.download(gpu)
}

#[cfg(test)]
mod tests {
    use super::{SplitPlan, row_runs};

    /// `sdpa::tail_piece`: the piece of tail tile `t`.
    fn device_piece(p: &SplitPlan, t: usize) -> usize {
        ((t + 1) * p.pieces - 1) / p.tail_tiles()
    }

    /// `sdpa::Parts::slot`'s index: piece q's slot for the unit whose first tail tile is u0.
    fn device_slot(p: &SplitPlan, q: usize, u0: usize) -> usize {
        2 * q + usize::from(p.bound(q) < u0)
    }

    #[test]
    fn split_plans_cover_the_tail_once_in_balanced_pieces() {
        let mut split = 0;
        for units in 1..=160 {
            for blocks in 1..=40 {
                for tiles in 1..=12 {
                    let p = SplitPlan::new(units, blocks, tiles, false, 4);
                    assert_eq!(p, SplitPlan::new(units, blocks, tiles, false, 4));
                    let tail = units % blocks
                        + if 2 * (units % blocks) <= blocks {
                            blocks
                        } else {
                            0
                        };
                    if tiles < 2
                        || units <= blocks
                        || units.is_multiple_of(blocks)
                        || units < tail + blocks
                    {
                        assert_eq!((p.split, p.pieces, p.work()), (units, 0, units), "{p:?}");
                        continue;
                    }
                    assert!(
                        p.split >= blocks,
                        "{p:?}: a block's first unit must be whole"
                    );
                    split += 1;
                    let tail = units - p.split;
                    assert!(
                        2 * tail > blocks && tail < 2 * blocks && tail % blocks == units % blocks,
                        "{p:?}"
                    );
                    assert_eq!((p.pieces, p.work()), (blocks, p.split + blocks), "{p:?}");
                    // The parts, piece by piece, are the tail's tiles in order, each in one unit; a piece is at least
                    // half a unit's tiles, rounded down, and at most 1.5 units' rounded up.
                    let (mut next, mut slots) = (0, std::collections::HashSet::new());
                    for q in 0..p.pieces {
                        let len = p.bound(q + 1) - p.bound(q);
                        assert!(
                            len >= tiles / 2 && 2 * len <= 3 * tiles + 2,
                            "{p:?}: piece {q} of {len}"
                        );
                        for (u, k0, k1) in p.parts(q) {
                            assert!(k0 < k1 && k1 <= tiles && u < units, "{p:?}");
                            let t = (u - p.split) * tiles + k0;
                            assert_eq!(t, next, "{p:?}: piece {q}");
                            next = t + k1 - k0;
                            for t in t..next {
                                assert_eq!(device_piece(&p, t), q, "{p:?}: tile {t}");
                            }
                            // A part short of its unit has a slot no other part has.
                            if k1 - k0 < tiles {
                                assert!(
                                    slots.insert(device_slot(&p, q, (u - p.split) * tiles)),
                                    "{p:?}"
                                );
                            }
                        }
                    }
                    assert_eq!(next, p.tail_tiles(), "{p:?}");
                    // The table the kernel reads: every part once, piece after piece; each split unit's merge list its
                    // parts' virtual units, distinct, in full query tiles of the virtual heads.
                    let (q_tiles, q_full) = (5, 4);
                    let t = p.table(q_tiles, q_full);
                    let (parts_at, merged_at) = (t[4] as usize, t[5] as usize);
                    assert_eq!((t[2], t[3]), (p.split as i32, p.pieces as i32));
                    let mut seen = std::collections::HashSet::new();
                    for q in 0..p.pieces {
                        let (a, b) = (t[8 + q] as usize, t[9 + q] as usize);
                        let want = p.parts(q);
                        assert_eq!(b - a, want.len(), "{p:?}");
                        for (e, &(u, k0, k1)) in
                            t[parts_at + 4 * a..parts_at + 4 * b].chunks(4).zip(&want)
                        {
                            assert_eq!(e[0] as usize, u);
                            if e[3] >= 0 {
                                assert!(seen.insert(e[3]) && (e[3] as usize) >= units, "{p:?}");
                                assert!(((e[3] as usize) % q_tiles) < q_full);
                                assert_eq!((e[1] as usize, e[2] as usize), (k0, k1 - k0));
                            } else {
                                assert_eq!((k0, k1), (0, tiles));
                            }
                        }
                    }
                    for r in 0..tail {
                        let m = &t[merged_at + 8 * r..merged_at + 8 * r + 8];
                        assert!(
                            m[0] == 0 || (2..=4).contains(&m[0]),
                            "{p:?}: unit {r} merges {m:?}"
                        );
                        assert!(m[1..=m[0] as usize].iter().all(|v| seen.contains(v)));
                    }
                    assert_eq!(
                        seen.len(),
                        (0..tail)
                            .map(|r| t[merged_at + 8 * r] as usize)
                            .sum::<usize>()
                    );
                    // sdpa::kMaxParts: the merge kernel takes at most 4 parts of a unit.
                    for u in 0..tail {
                        let parts =
                            device_piece(&p, (u + 1) * tiles - 1) - device_piece(&p, u * tiles) + 1;
                        assert!(parts <= 4, "{p:?}: unit {u} in {parts} parts");
                    }
                    assert!(slots.iter().all(|&k| k < 2 * p.pieces));
                }
            }
        }
        assert!(split > 5_000, "{split} plans split");
        // Causal units are left to the counter's longest-first order.
        assert_eq!(SplitPlan::new(2048, 132, 19, true, 32).pieces, 0);
    }

    #[test]
    fn the_h100_plan_at_4_16_4096_128() {
        // 2048 units of 19 key tiles on 132 SMs: 15 whole units a block, then 68 units' 1292 tiles in 132 pieces.
        let p = SplitPlan::new(2048, 132, 19, false, 32);
        assert_eq!(
            (p.split, p.pieces, p.tail_tiles(), p.work()),
            (1980, 132, 1292, 2112)
        );
        let lens: Vec<_> = (0..132).map(|q| p.bound(q + 1) - p.bound(q)).collect();
        assert_eq!(
            (lens.iter().min(), lens.iter().max()),
            (Some(&9), Some(&10))
        );
        // GQA 32/8 at S = 4096: 4096 units, 4 past 31 waves, so the tail takes a wave more (136 units).
        assert_eq!(SplitPlan::new(4096, 132, 19, false, 32).split, 4096 - 136);
    }

    #[test]
    fn rows_come_back_in_runs_of_consecutive_indices() {
        let runs: Vec<_> = row_runs(&[0, 1, 2, 7, 9, 10]).collect();
        assert_eq!(runs, vec![(0, 3), (7, 1), (9, 2)]);
        assert_eq!(row_runs(&[]).count(), 0);
    }
}
