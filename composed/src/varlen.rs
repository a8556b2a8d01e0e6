// A packed (variable-length) batch on stage 8: the plan made on the device from cu_seqlens, then one persistent launch.
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use fixtures::OutDtype;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig};

use crate::strides::Strides;
use lab::{Gpu, KernelSpec};
use ragged_plan::{DevicePlan, Geometry, Planner};

use crate::packed::{VarlenShape, VarlenTensors};
use crate::split_kv;
use crate::stages::{KERNELS, Stage};
use crate::tables::{Params, SplitHead, out_dtype_code};
use crate::workspace::load_with_smem;

/// What a packed batch's launches keep: the device plan (its table sized for the last geometry) and the schedule's
/// counter; whether grouped-query heads are packed (`pack_heads`).
#[derive(Debug)]
pub struct Varlen {
    planner: Planner,
    plan: Option<DevicePlan>,
    sched: Option<CudaSlice<i32>>,
    kernel: Option<KernelSpec>,
    pack: bool,
    split: bool,
    last_parts: usize,
    scratch: split_kv::Scratch,
    /// [`Varlen::keep_plan`]: on, and the batch (shape, boundaries' addresses, packing, split) the kept plan is for.
    keep: bool,
    kept: Option<PlanKey>,
    plans: usize,
    /// Ordinary launches of the attention kernel instead of programmatic dependent ones (`use_programmatic`).
    serial: bool,
}

/// What a kept ragged plan was made for: the batch's shape and boundaries' addresses, and how it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    shape: VarlenShape,
    cu: [u64; 2],
    packed: bool,
    parts: usize,
}

/// Stage 8's kernel over packed batches at head dimension `d`.
pub fn varlen_kernel(d: usize) -> KernelSpec {
    KernelSpec::find(KERNELS, &format!("stage8_varlen_d{d}"))
}

/// Stage 8's kernel over packed batches with packed grouped-query heads (`stage8_varlen_pack_dD`).
pub fn varlen_pack_kernel(d: usize) -> KernelSpec {
    KernelSpec::find(KERNELS, &format!("stage8_varlen_pack_d{d}"))
}

/// Whether a batch of `s` can pack its grouped-query heads into a unit's rows: G = H / Hkv > 1 query heads a K/V head,
/// G dividing 64 (a consumer's 64 rows hold whole tokens), no sliding window (the packed kernel has none).
pub fn packs_heads(s: &VarlenShape) -> bool {
    let g = s.h / s.hkv.max(1);
    g > 1 && 64 % g == 0 && !s.window.is_bounded()
}

/// The packed kernel a batch of `s` runs: [`varlen_kernel`], or its windowed form (`stage8w_varlen_dD`) under a
/// sliding window.
pub fn varlen_kernel_for(s: &VarlenShape) -> KernelSpec {
    if s.window.is_bounded() {
        KernelSpec::find(KERNELS, &format!("stage8w_varlen_d{}", s.d))
    } else {
        varlen_kernel(s.d)
    }
}

impl Default for Varlen {
    fn default() -> Varlen {
        Varlen {
            planner: Planner::default(),
            plan: None,
            sched: None,
            kernel: None,
            pack: true,
            split: true,
            last_parts: 1,
            scratch: split_kv::Scratch::default(),
            keep: false,
            kept: None,
            plans: 0,
            serial: false,
        }
    }
}

impl Varlen {
    /// Grouped-query heads packed where a batch allows it ([`Varlen::pack_heads`]).
    pub fn new() -> Varlen {
        Varlen::default()
    }

    /// Launch `spec` (a variant of the packed kernel: same name and parameters) from now on; `None` goes back to
    /// `varlen_kernel`'s.
    pub fn use_kernel(&mut self, spec: Option<KernelSpec>) {
        self.kernel = spec;
    }

    /// With `on` (the default), the attention kernel goes as a programmatic dependent launch: it may start while the
    /// kernel before it (the plan's, split-KV's prep, or the caller's) runs, up to its `griddepcontrol.wait`.
    pub fn use_programmatic(&mut self, on: bool) {
        self.serial = !on;
    }

    /// With `on`, a batch whose heads can be packed ([`packs_heads`]) runs [`varlen_pack_kernel`]: a unit is one
    /// (sequence, K/V head, 128 rows of its tokens' query heads, a token's heads in consecutive rows), so a K/V head's
    /// G query heads share one pass over its keys (pack-gqa: for decode, where a token's unit would otherwise hold one
    /// row). The same bits as unpacked, row for row. On by default (decode at B = 64, Hq = 32, Hkv = 8 ran in a third of
    /// the time, prefill level or faster); other batches run unpacked either way.
    pub fn pack_heads(&mut self, on: bool) {
        self.pack = on;
    }

    /// Whether [`Varlen::pack_heads`] is on.
    pub fn heads_packed(&self) -> bool {
        self.pack
    }

    /// With `on` (the default), a batch whose units would leave more than half the SMs idle (decode of a few long
    /// sequences) runs split-KV: each sequence's keys in up to [`split_kv::MAX_SPLIT`] chunks as virtual sequences,
    /// their f32 parts merged (`split_kv`). Not bit for bit the unsplit result (each chunk's P is quantized against
    /// its own running max); as close to the f64 reference.
    pub fn split_kv(&mut self, on: bool) {
        self.split = on;
    }

    /// Whether [`Varlen::split_kv`] is on.
    pub fn splits_kv(&self) -> bool {
        self.split
    }

    /// With `on`, a launch reuses the ragged plan (the device's unit table, three kernels) that an earlier launch of the
    /// same batch made — same shape, same boundaries' addresses — instead of planning again: plan once, run once a
    /// layer. The caller promises the boundaries' values have not changed since that plan, and calls
    /// [`Varlen::replan`] when they do (a new batch in the same buffers). Off by default: every launch plans.
    pub fn keep_plan(&mut self, on: bool) {
        self.keep = on;
        self.kept = None;
    }

    /// Forgets the kept plan: the next launch plans again ([`Varlen::keep_plan`]).
    pub fn replan(&mut self) {
        self.kept = None;
    }

    /// Ragged plans this launcher has queued (each launch's, or fewer under [`Varlen::keep_plan`]).
    pub fn plans_made(&self) -> usize {
        self.plans
    }

    /// Chunks a sequence's keys were cut into at the last launch (1: no split).
    pub fn last_split(&self) -> usize {
        self.last_parts
    }

    /// Launch `prep` and `merge` (variants of `split_kv_prep` and `split_kv_merge_dD`: same names and parameters) from
    /// now on; `None` goes back to the lab's.
    pub fn use_split_kernels(&mut self, prep: Option<KernelSpec>, merge: Option<KernelSpec>) {
        self.scratch.kernels = [prep, merge];
    }

    /// Queues the plan of the batch whose boundaries are on the device at `t.cu_q`, `t.cu_k` (B + 1 entries each,
    /// i32; valid: the caller checks a host copy with `ragged::validate_cu_seqlens`, the device trusts them), then
    /// stage 8's packed kernel over it, on `st`. `softmax_scale`: the problem's; `out`: O's dtype.
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        st: &Arc<CudaStream>,
        s: &VarlenShape,
        softmax_scale: f32,
        out: OutDtype,
        t: &VarlenTensors,
    ) -> Result<()> {
        let stage = Stage::S8;
        ensure!(
            stage.dims().contains(&s.d),
            "a packed batch of head dimension D = {} on stage8: it takes D = {:?}",
            s.d,
            stage.dims()
        );
        ensure!(
            s.h > 0 && s.hkv > 0 && s.h.is_multiple_of(s.hkv),
            "H = {} query heads and Hkv = {} key/value heads: H must be a positive multiple of Hkv",
            s.h,
            s.hkv
        );
        ensure!(
            s.total_q <= i32::MAX as usize && s.total_k <= i32::MAX as usize,
            "{} query and {} key tokens: more than 2^31 − 1",
            s.total_q,
            s.total_k
        );
        let (packed, bc) = (self.pack && packs_heads(s), stage.bc(s.d));
        let parts = if self.split {
            split_kv::split_parts(gpu.sms, s, packed, bc)
        } else {
            1
        };
        self.last_parts = parts;
        let key = PlanKey {
            shape: *s,
            cu: [t.cu_q, t.cu_k],
            packed,
            parts,
        };
        let plan = !(self.keep && self.kept == Some(key));
        self.kept = None;
        if parts > 1 {
            ensure!(
                parts * s.total_q <= i32::MAX as usize,
                "{} query tokens in {parts} chunks: more than 2^31 − 1 rows",
                s.total_q
            );
            // The virtual batch's boundaries (in the scratch) follow from the batch's: its kept plan stays valid.
            let (s2, t2, past) = self.scratch.prepare(gpu, st, s, t, parts, bc)?;
            self.launch_batch(gpu, st, &s2, softmax_scale, OutDtype::F32, &t2, past, plan)?;
            self.scratch.merge(gpu, st, s, t, parts, out)?;
        } else {
            self.launch_batch(gpu, st, s, softmax_scale, out, t, 0, plan)?;
        }
        // Kept only once a launch has queued all of it: one that failed part-way plans again next time.
        self.kept = self.keep.then_some(key);
        Ok(())
    }

    /// The plan of batch `s` (unless `plan` is false and the kept one is for it) and stage 8's packed kernel over it,
    /// on `st` (launch's checks made). `past`: the device address of each sequence's keys past its end (split-KV's
    /// virtual batch, B i32), or 0; with it the plan counts every key tile of a sequence (the rows' causal limits,
    /// moved by `past`, are the kernel's alone).
    #[allow(clippy::too_many_arguments)]
    fn launch_batch(
        &mut self,
        gpu: &Gpu,
        st: &Arc<CudaStream>,
        s: &VarlenShape,
        softmax_scale: f32,
        out: OutDtype,
        t: &VarlenTensors,
        past: u64,
        plan: bool,
    ) -> Result<()> {
        let stage = Stage::S8;
        let (bc, d) = (stage.bc(s.d), s.d);
        let packed = self.pack && packs_heads(s);
        let group = if packed { s.h / s.hkv } else { 1 };
        let g = Geometry {
            batch: s.batch,
            heads: if packed { s.hkv } else { s.h },
            tile_rows: 128,
            bc,
            causal: s.causal && past == 0,
            left: s.window.left,
            right: s.window.right,
            total_q: s.total_q,
            total_k: s.total_k,
            group,
        };
        let (made, fresh) = match self.plan.take() {
            Some(p) if p.geometry == g => (p, false),
            _ => (self.planner.alloc(st, g)?, true),
        };
        let kept = self.plan.insert(made);
        if plan || fresh {
            self.planner.run(gpu, st, t.cu_q, t.cu_k, kept)?;
            self.plans += 1;
        }
        let plan = kept;
        let sched = match self.sched.take() {
            Some(b) => b,
            None => st.alloc_zeros::<i32>(size_of::<SplitHead>() / 4)?,
        };
        let sched = self.sched.insert(sched);
        let spec = self.kernel.unwrap_or_else(|| {
            if packed {
                varlen_pack_kernel(s.d)
            } else {
                varlen_kernel_for(s)
            }
        });
        let smem = stage.smem_bytes(d);
        let k = load_with_smem(gpu, &spec, smem)?;
        let (table, _g1) = plan.table.device_ptr(st);
        let (sched_at, _g2) = sched.device_ptr(st);
        let (cq, ck) = (t.cu_q, t.cu_k);
        let p = Params {
            q: t.q,
            k: t.k,
            v: t.v,
            q_scale: t.q_scale,
            k_scale: t.k_scale,
            v_scale: t.v_scale,
            o: t.o,
            lse: t.lse,
            sq: s.total_q as i32,
            sk: s.total_k as i32,
            softmax_scale,
            o_dtype: out_dtype_code(out),
            causal: i32::from(s.causal),
            group: (s.h / s.hkv) as i32,
            q_rows: 128,
            q_tiles: 0,
            work: 0,
            section: 1,
            vt_tiles: 0,
            sched: sched_at,
        };
        let mut maps = packed_maps(s, bc, [t.q, t.k, t.v], t.strides)?;
        if packed {
            maps[0] = grouped_q_map(s, t.q, t.strides)?;
        }
        let (mut table_at, mut max_pages, mut shift, mut box_rows, mut oob) =
            (0u64, 0i32, 0i32, 0i32, 0i32);
        if let Some(pk) = t.paged {
            ensure!(
                pk.page_size.is_power_of_two() && (16..=256).contains(&pk.page_size),
                "page size {}: the kernels take a power of two from 16 to 256",
                pk.page_size
            );
            let rows = pk.num_pages * pk.page_size;
            ensure!(
                rows < i32::MAX as usize
                    && pk.max_pages <= i32::MAX as usize
                    && pk.block_table != 0,
                "a pool of {} pages of {} rows (or a table of {} pages a sequence) the kernel cannot address",
                pk.num_pages,
                pk.page_size,
                pk.max_pages
            );
            // No box crosses a page: gcd(BC, page size) rows a box (the key tile a whole number of boxes).
            let b = gcd(bc, pk.page_size);
            let [km, vm] = pool_maps(s, b, [t.k, t.v], rows)?;
            maps[1] = km;
            maps[2] = vm;
            (table_at, max_pages, shift, box_rows, oob) = (
                pk.block_table,
                pk.max_pages as i32,
                pk.page_size.trailing_zeros() as i32,
                b as i32,
                rows as i32,
            );
        }
        let (heads, total_q, one_scale) = (s.h as i32, s.total_q as i32, t.one_scale.bits());
        let blocks = gpu.sms.min(g.max_units().max(1)) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (stage.threads() as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut b = lab::Args::new();
        b.arg(&p)
            .arg(&maps[0])
            .arg(&maps[1])
            .arg(&maps[2])
            .arg(&maps[0])
            .arg(&heads)
            .arg(&table)
            .arg(&cq)
            .arg(&ck)
            .arg(&total_q)
            .arg(&table_at)
            .arg(&max_pages)
            .arg(&shift)
            .arg(&box_rows)
            .arg(&oob)
            .arg(&past)
            .arg(&one_scale);
        // The windowed kernel's sides (−1: unbounded).
        let (win_left, win_right) = s.window.kernel_sides();
        if spec.name.starts_with("stage8w_") {
            b.arg(&win_left).arg(&win_right);
        }
        // SAFETY: stage8_varlen_dD(Params, maps q, k, v, o (not read), int heads, const int* table, cu_q, cu_k, int
        // total_q, const int* block_table, int max_pages, page_shift, box, oob_row, const int* past, int one_scale;
        // stage8w_: int win_left, win_right) with the block it was written for; `past` null or B entries (the
        // scratch's); a scale named in `one_scale` holds at least one entry, the others one per (sequence, head);
        // the plan's table holds the units the planner just queued on this stream (room for every unit of the
        // geometry); the caller's tensors hold the packed extents, and its block table every page its sequences'
        // lengths reach (the kernel reads no entry past a sequence's length). The packed kernels are stage 8's
        // (Stage::programmatic): they wait for the plan's kernels before they read its table.
        let order = lab::Order::programmatic_if(!self.serial);
        unsafe { lab::launch_ex(&k.func, cfg, st, &mut b, order) }
            .with_context(|| format!("launching {}", spec.name))?;
        Ok(())
    }
}

/// Stage 8's maps over packed tensors: Q [total_q, H, D] and K, V [total_k, Hkv, D] (or at `strides`), each (D, total,
/// heads, 1) in boxes of one K panel × 64 query rows or `bc` keys.
fn packed_maps(
    s: &VarlenShape,
    bc: usize,
    [q, k, v]: [u64; 3],
    strides: Option<Strides>,
) -> Result<[tma_ring::TensorMap; 3]> {
    use tma_ring::{Elem, MapSpec};
    let sw = swizzle_of(s.d);
    let d = s.d as u64;
    let map =
        |name: &str, at: u64, heads: usize, total: usize, rows: usize, st: Option<[usize; 3]>| {
            let (h, n) = (heads as u64, total.max(1) as u64);
            let st = st.map_or([h * d, d, n * h * d], |x| x.map(|e| e as u64));
            MapSpec::strided(Elem::U8, [1, h, n, d], st, rows as u32, sw)
                .encode(at)
                .with_context(|| {
                    format!("packed {name}: {total} tokens of {heads} heads at strides {st:?}")
                })
        };
    Ok([
        map("q", q, s.h, s.total_q, 64, strides.map(|x| x.q))?,
        map("k", k, s.hkv, s.total_k, bc, strides.map(|x| x.k))?,
        map("v", v, s.hkv, s.total_k, bc, strides.map(|x| x.v))?,
    ])
}

/// Q's map for packed heads: (D, G, total_q, Hkv) over Q [total_q, H, D] (or at `strides`: a head `sh` and a token
/// `ss` elements apart), boxes of one K panel × G heads × 64 / G tokens (a consumer's 64 rows, a token's heads in
/// order: `produce_q_grouped`).
fn grouped_q_map(s: &VarlenShape, q: u64, strides: Option<Strides>) -> Result<tma_ring::TensorMap> {
    use tma_ring::{Elem, MapSpec};
    let sw = swizzle_of(s.d);
    let g = s.h / s.hkv;
    let [ss, sh, _] = strides.map_or([s.h * s.d, s.d, 0], |x| x.q);
    let (g64, sh64) = (g as u64, sh as u64);
    MapSpec {
        elem: Elem::U8,
        dims: [s.d as u64, g64, s.total_q.max(1) as u64, s.hkv as u64],
        strides: [sh64, ss as u64, g64 * sh64],
        boxes: [sw.row_bytes(), g as u32, (64 / g) as u32, 1],
        swizzle: sw,
    }
    .encode(q)
    .with_context(|| {
        format!(
            "packed q with {g} heads a K/V head: {} tokens of {} heads at strides {:?}",
            s.total_q,
            s.h,
            [ss, sh]
        )
    })
}

/// K's and V's maps over a paged cache's pools ([num_pages · page_size rows, Hkv, D]), boxes of `box` rows.
fn pool_maps(
    s: &VarlenShape,
    box_rows: usize,
    [k, v]: [u64; 2],
    rows: usize,
) -> Result<[tma_ring::TensorMap; 2]> {
    use tma_ring::{Elem, MapSpec};
    let sw = swizzle_of(s.d);
    let (h, d, n) = (s.hkv as u64, s.d as u64, rows as u64);
    let map = |name: &str, at: u64| {
        MapSpec::strided(
            Elem::U8,
            [1, h, n, d],
            [h * d, d, n * h * d],
            box_rows as u32,
            sw,
        )
        .encode(at)
        .with_context(|| {
            format!(
                "the paged cache's {name} pool: {rows} rows of {} heads",
                s.hkv
            )
        })
    };
    Ok([map("k", k)?, map("v", v)?])
}

/// The swizzle of a row of `d` E4M3 codes in stage 8's tiles: 64 bytes at D = 64, else 128.
fn swizzle_of(d: usize) -> frag_layout::Swizzle {
    if d == 64 {
        frag_layout::Swizzle::B64
    } else {
        frag_layout::Swizzle::B128
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn boxes_never_cross_a_page() {
        for (bc, page, want) in [
            (224, 16, 16),
            (224, 32, 32),
            (224, 64, 32),
            (224, 256, 32),
            (128, 64, 64),
            (128, 256, 128),
        ] {
            let b = super::gcd(bc, page);
            assert_eq!(b, want);
            assert!(
                page.is_multiple_of(b) && bc.is_multiple_of(b) && b.is_multiple_of(8),
                "{bc} {page}: {b}"
            );
        }
    }
}
