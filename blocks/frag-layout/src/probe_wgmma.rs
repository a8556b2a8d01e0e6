// Probing wgmma on the device: the accumulator through the arithmetic, then register A and every shared-memory layout.
use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, ensure};
use lab::Gpu;
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{check_written, poisoned};

use crate::kernels::wgmma_probe;
use crate::model::{DType, Entry, LAYOUTS, Layout, LayoutId, Op, Operand, WGMMA_NS};
use crate::probe::{exact_bits, pack};
use crate::smem::{Desc, SmemLayout, SmemLayoutId, SmemOperand, Swizzle, smem_layouts};

/// The K of one instruction for an input type.
pub fn wgmma_k(dtype: DType) -> u32 {
    match dtype {
        DType::F16 | DType::Bf16 => 16,
        _ => 32,
    }
}

fn elem_bytes(dtype: DType) -> u32 {
    32 / wgmma_k(dtype)
}

/// One run of the probe kernel: A's registers (128 threads × 4 words) or A's image, and B's image.
#[derive(Debug, Clone)]
struct Run {
    a_words: Vec<u32>,
    a_img: Vec<u8>,
    b_img: Vec<u8>,
}

/// An image of `bytes` bytes (rounded up to 1024) holding `f(row, k)` where `desc` puts each element.
fn image(
    desc: &Desc,
    rows: u32,
    dtype: DType,
    bytes: u32,
    f: impl Fn(u32, u32) -> f32,
) -> Result<Vec<u8>> {
    let eb = elem_bytes(dtype);
    let mut img = vec![0u8; bytes.next_multiple_of(1024) as usize];
    for row in 0..rows {
        for k in 0..wgmma_k(dtype) {
            let at = desc.byte_of(row, k * eb) as usize;
            let bits = exact_bits(f(row, k), dtype)?;
            for b in 0..eb as usize {
                img[at + b] = (bits >> (8 * b)) as u8;
            }
        }
    }
    Ok(img)
}

/// Register A words placed by a layout table: the value of (row, k) in the slot that holds it.
fn a_words(layout: &Layout, f: impl Fn(u32, u32) -> f32) -> Result<Vec<u32>> {
    let regs = layout.id.regs() as usize;
    let mut vals = vec![0.0f32; 128 * regs];
    for e in &layout.entries {
        vals[e.lane as usize * regs + e.reg as usize] = f(e.row, e.col);
    }
    let mut words = Vec::with_capacity(128 * 4);
    for t in vals.chunks(regs) {
        words.extend(pack(t, 4, layout.id.dtype)?);
    }
    Ok(words)
}

/// Runs the probe kernel once per run: D as `[run][thread][reg]`.
fn launch(
    gpu: &Gpu,
    dtype: DType,
    n: u32,
    a_regs: bool,
    a_desc: u64,
    b_desc: u64,
    runs: &[Run],
) -> Result<Vec<f32>> {
    let spec = wgmma_probe(dtype, n, a_regs)?;
    let k = gpu.load(&spec)?;
    let s = &gpu.stream;
    let a_bytes = runs[0].a_img.len();
    let b_bytes = runs[0].b_img.len();
    ensure!(
        runs.iter().all(|r| r.a_img.len() == a_bytes
            && r.b_img.len() == b_bytes
            && r.a_words.len() == 512),
        "probe runs differ in size"
    );
    let cat =
        |f: &dyn Fn(&Run) -> &[u8]| runs.iter().flat_map(|r| f(r).to_vec()).collect::<Vec<u8>>();
    let words: Vec<u32> = runs.iter().flat_map(|r| r.a_words.clone()).collect();
    let (dw, da, db) = (
        s.clone_htod(&words)?,
        s.clone_htod(&cat(&|r| &r.a_img))?,
        s.clone_htod(&cat(&|r| &r.b_img))?,
    );
    let regs = (n / 2) as usize;
    let mut out = s.clone_htod(&poisoned::<f32>(runs.len() * 128 * regs))?;
    let (ab, bb) = (a_bytes as i32, b_bytes as i32);
    let cfg = LaunchConfig {
        grid_dim: (runs.len() as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: (a_bytes + b_bytes + 1024) as u32,
    };
    // SAFETY: probe(a_words[runs][128][4], a_img[runs][a_bytes], a_bytes, a_desc, b_img[runs][b_bytes],
    // b_bytes, b_desc, out[runs][128][n/2]); one warpgroup per run, the images in dynamic shared memory.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&dw)
            .arg(&da)
            .arg(&ab)
            .arg(&a_desc)
            .arg(&db)
            .arg(&bb)
            .arg(&b_desc)
            .arg(&mut out)
            .launch(cfg)?
    };
    let out = s.clone_dtoh(&out)?;
    check_written(&out, spec.name)?;
    Ok(out)
}

fn layout(id: LayoutId, entries: Vec<Entry>) -> Layout {
    Layout { id, entries }.normalized()
}

fn acc_id(n: u32, k: u32) -> LayoutId {
    LayoutId {
        op: Op::Wgmma { n, k },
        operand: Operand::Acc,
        dtype: DType::F32,
    }
}

fn a_id(dtype: DType) -> LayoutId {
    LayoutId {
        op: Op::Wgmma {
            n: 64,
            k: wgmma_k(dtype),
        },
        operand: Operand::A(None),
        dtype,
    }
}

/// The no-swizzle B tile of `rows` rows the register-A probes read: K-step 0 of a 32-byte tile.
fn plain_b(rows: u32) -> (Desc, u32) {
    (
        Desc::k_major(Swizzle::None, rows, 32, 0),
        Desc::tile_bytes(Swizzle::None, rows, 32),
    )
}

const DIGITS_A: u32 = 4; // slot ids < 2048 in base 8
const DIGITS_BYTE: u32 = 5; // byte offsets < 32768 in base 8

fn digit(v: u32, p: u32) -> f32 {
    ((v >> (3 * p)) & 7) as f32
}

/// D's layout for `dtype` inputs and width `n`. A and B are placed by the model so that D[m][n] = m + 64·n:
/// A[m][k] = 2^k·bit_k(m), B[n][k] = 1 for k < 6; A[m][6+j] = 64, B[n][6+j] = 2^j·bit_j(n) for j < 8.
/// Every value is exact in every input type, and D is a bijection only if the placements were right.
pub fn probe_acc(gpu: &Gpu, dtype: DType, n: u32) -> Result<Layout> {
    let k = wgmma_k(dtype);
    let (bd, bbytes) = plain_b(n);
    let a_model = a_id(dtype).model();
    let run = Run {
        a_words: a_words(&a_model, |m, kk| match kk {
            0..6 => (((m >> kk) & 1) << kk) as f32,
            6..14 => 64.0,
            _ => 0.0,
        })?,
        a_img: vec![0; 1024],
        b_img: image(&bd, n, dtype, bbytes, |nn, kk| match kk {
            0..6 => 1.0,
            6..14 => (((nn >> (kk - 6)) & 1) << (kk - 6)) as f32,
            _ => 0.0,
        })?,
    };
    let d = launch(gpu, dtype, n, true, 0, bd.encode(0), &[run])?;
    let regs = n / 2;
    let mut entries = Vec::new();
    for t in 0..128u32 {
        for i in 0..regs {
            let v = d[(t * regs + i) as usize];
            ensure!(
                v.fract() == 0.0 && v >= 0.0 && v < (64 * n) as f32,
                "D probe ({}, n = {n}): thread {t} d[{i}] = {v}",
                dtype.name()
            );
            let v = v as u32;
            entries.push(Entry {
                lane: t,
                reg: i,
                row: v % 64,
                col: v / 64,
            });
        }
    }
    let l = layout(acc_id(n, k), entries);
    l.check_coverage()
        .map_err(|e| anyhow!("probed D is not a bijection, so nothing else can be read: {e}"))?;
    Ok(l)
}

/// Reads base-8 digits of ids out of D: `runs` results, D placed by `acc`, cell (m, n) → id.
fn read_ids(d: &[f32], acc: &Layout, digits: u32, cells: &[(u32, u32)]) -> Result<Vec<u32>> {
    let regs = acc.id.regs() as usize;
    let per_run = 128 * regs;
    let pos: BTreeMap<(u32, u32), (u32, u32)> = acc
        .entries
        .iter()
        .map(|e| ((e.row, e.col), (e.lane, e.reg)))
        .collect();
    let mut ids = Vec::with_capacity(cells.len());
    for &(m, n) in cells {
        let (t, i) = pos[&(m, n)];
        let mut id = 0u32;
        for p in 0..digits {
            let v = d[p as usize * per_run + t as usize * regs + i as usize];
            ensure!(
                v.fract() == 0.0 && (0.0..8.0).contains(&v),
                "digit {p} at D({m}, {n}) = {v}"
            );
            id += (v as u32) << (3 * p);
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Register A: each slot holds its own id (thread·regs + reg) in base-8 digits, one run per digit; B selects
/// column n of A into column n of D (B[n][k] = [k = n]).
pub fn probe_a_regs(gpu: &Gpu, dtype: DType, acc64: &Layout) -> Result<Layout> {
    let id = a_id(dtype);
    let (k, regs) = (wgmma_k(dtype), id.regs());
    let (bd, bbytes) = plain_b(64);
    let b_img = image(&bd, 64, dtype, bbytes, |nn, kk| (nn == kk) as u32 as f32)?;
    let mut runs = Vec::new();
    for p in 0..DIGITS_A {
        let vals: Vec<f32> = (0..128 * regs).map(|slot| digit(slot, p)).collect();
        let mut words = Vec::new();
        for t in vals.chunks(regs as usize) {
            words.extend(pack(t, 4, dtype)?);
        }
        runs.push(Run {
            a_words: words,
            a_img: vec![0; 1024],
            b_img: b_img.clone(),
        });
    }
    let d = launch(gpu, dtype, 64, true, 0, bd.encode(0), &runs)?;
    let cells: Vec<(u32, u32)> = (0..64).flat_map(|m| (0..k).map(move |c| (m, c))).collect();
    let ids = read_ids(&d, acc64, DIGITS_A, &cells)?;
    let entries = cells
        .iter()
        .zip(ids)
        .map(|(&(m, c), slot)| Entry {
            lane: slot / regs,
            reg: slot % regs,
            row: m,
            col: c,
        })
        .collect();
    let l = layout(id, entries);
    l.check_coverage().map_err(|e| anyhow!("{e}"))?;
    Ok(l)
}

/// A shared-memory layout: the tile's bytes hold their own offset in base-8 digits (an f16 element holds its
/// first byte's), and the other operand selects it into D. B: A[m][k] = [k = m] in registers, so
/// D[m][n] = B[n][m]. A: B[n][k] = [k = n] in a plain tile, so D[m][n] = A[m][n].
pub fn probe_smem(gpu: &Gpu, id: SmemLayoutId, acc64: &Layout) -> Result<SmemLayout> {
    ensure!(id.rows == 64, "the probe reads 64-row tiles");
    let (dtype, k) = (id.dtype, id.k_elems());
    let desc = id.desc();
    let tile = id.tile_bytes().next_multiple_of(1024);
    let eb = id.elem_bytes();
    let digits_img = |p: u32| -> Result<Vec<u8>> {
        let mut img = vec![0u8; tile as usize];
        for at in (0..tile).step_by(eb as usize) {
            let bits = exact_bits(digit(at, p), dtype)?;
            for b in 0..eb {
                img[(at + b) as usize] = (bits >> (8 * b)) as u8;
            }
        }
        Ok(img)
    };
    let a_model = a_id(dtype).model();
    let (bd, bbytes) = plain_b(64);
    let mut runs = Vec::new();
    for p in 0..DIGITS_BYTE {
        runs.push(match id.operand {
            SmemOperand::B => Run {
                a_words: a_words(&a_model, |m, kk| (m == kk) as u32 as f32)?,
                a_img: vec![0; 1024],
                b_img: digits_img(p)?,
            },
            SmemOperand::A => Run {
                a_words: vec![0; 512],
                a_img: digits_img(p)?,
                b_img: image(&bd, 64, dtype, bbytes, |nn, kk| (nn == kk) as u32 as f32)?,
            },
        });
    }
    let d = match id.operand {
        SmemOperand::B => launch(gpu, dtype, 64, true, 0, desc.encode(0), &runs)?,
        SmemOperand::A => launch(gpu, dtype, 64, false, desc.encode(0), bd.encode(0), &runs)?,
    };
    // Cell (row, k) of the operand is D(k, row) for B and D(row, k) for A.
    let cells: Vec<(u32, u32)> = (0..64).flat_map(|r| (0..k).map(move |c| (r, c))).collect();
    let d_cells: Vec<(u32, u32)> = cells
        .iter()
        .map(|&(r, c)| match id.operand {
            SmemOperand::B => (c, r),
            SmemOperand::A => (r, c),
        })
        .collect();
    let bytes = read_ids(&d, acc64, DIGITS_BYTE, &d_cells)?;
    let l = SmemLayout {
        id,
        entries: cells.into_iter().zip(bytes).collect(),
    };
    l.check_injective().map_err(|e| anyhow!("{e}"))?;
    Ok(l)
}

/// Everything the wgmma probes found, once per process.
#[derive(Debug)]
pub struct WgmmaProbes {
    pub regs: BTreeMap<LayoutId, Layout>,
    pub smem: BTreeMap<SmemLayoutId, SmemLayout>,
}

impl WgmmaProbes {
    /// Probed cells in all, and how many equal the model.
    pub fn cells_equal_to_model(&self) -> (usize, usize) {
        let (mut all, mut eq) = (0, 0);
        for (id, l) in &self.regs {
            all += l.entries.len();
            eq += l.entries.len() - l.diff(&id.model()).len().min(l.entries.len());
        }
        for (id, l) in &self.smem {
            all += l.entries.len();
            eq += l.entries.len() - l.diff(&id.model()).len().min(l.entries.len());
        }
        (all, eq)
    }
}

pub fn probe_wgmma_all(gpu: &Gpu) -> Result<&'static WgmmaProbes> {
    static ALL: OnceLock<std::result::Result<WgmmaProbes, String>> = OnceLock::new();
    ALL.get_or_init(|| probe_uncached(gpu).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

fn probe_uncached(gpu: &Gpu) -> Result<WgmmaProbes> {
    let mut regs = BTreeMap::new();
    for dtype in [DType::E4m3, DType::E5m2, DType::F16, DType::Bf16] {
        for n in WGMMA_NS {
            let l = probe_acc(gpu, dtype, n)
                .with_context(|| format!("probing wgmma D, {} inputs, n = {n}", dtype.name()))?;
            // D is one layout per (N, K): every input type must find the same one.
            if let Some(prev) = regs.get(&l.id) {
                let d = l.diff(prev);
                ensure!(
                    d.is_empty(),
                    "{}: D differs between input types: {}",
                    l.id,
                    d.join("; ")
                );
            } else {
                regs.insert(l.id, l);
            }
        }
    }
    for dtype in [DType::E4m3, DType::E5m2, DType::F16, DType::Bf16] {
        let acc64 = regs[&acc_id(64, wgmma_k(dtype))].clone();
        let l = probe_a_regs(gpu, dtype, &acc64)
            .with_context(|| format!("probing wgmma register A, {}", dtype.name()))?;
        regs.insert(l.id, l);
    }
    ensure!(
        LAYOUTS
            .iter()
            .filter(|l| l.is_wgmma())
            .all(|l| regs.contains_key(l)),
        "a recorded wgmma layout was not probed"
    );
    let mut smem = BTreeMap::new();
    for id in smem_layouts() {
        let acc64 = &regs[&acc_id(64, wgmma_k(id.dtype))];
        let l = probe_smem(gpu, id, acc64).with_context(|| format!("probing {id}"))?;
        smem.insert(id, l);
    }
    Ok(WgmmaProbes { regs, smem })
}
