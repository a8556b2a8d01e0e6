// Probing layouts on the device: wmma through its load/store API, mma.sync through the arithmetic itself.
use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail, ensure};
use half::{bf16, f16};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, check_written, poisoned};
use lab::{Gpu, KernelSpec};

use crate::kernels::*;
use crate::model::{DType, Entry, LAYOUTS, Layout, LayoutId, Major, Op, Operand};

const ONE_WARP: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (32, 1, 1),
    shared_mem_bytes: 0,
};

fn layout(id: LayoutId, entries: Vec<Entry>) -> Layout {
    Layout { id, entries }.normalized()
}

/// wmma: accumulators through `store_matrix_sync`, operands through `load_matrix_sync`.
pub fn probe_wmma(gpu: &Gpu, id: LayoutId) -> Result<Layout> {
    ensure!(id.op == Op::Wmma16x16x16, "{id} is not a wmma layout");
    let s = &gpu.stream;
    match id.operand {
        Operand::Acc => {
            let codes: Vec<f64> = if id.dtype == DType::F32 {
                let k = gpu.load(&PROBE_WMMA_ACC_F32)?;
                let mut out = s.clone_htod(&poisoned::<f32>(256))?;
                // SAFETY: probe_wmma_acc_f32(float* out[256]), one warp.
                unsafe { s.launch_builder(&k.func).arg(&mut out).launch(ONE_WARP)? };
                let out = s.clone_dtoh(&out)?;
                check_written(&out, "wmma accumulator f32 probe")?;
                out.iter().map(|&v| v as f64).collect()
            } else {
                let k = gpu.load(&PROBE_WMMA_ACC_F16)?;
                let mut out = s.clone_htod(&poisoned::<f16>(256))?;
                // SAFETY: probe_wmma_acc_f16(__half* out[256]), one warp.
                unsafe { s.launch_builder(&k.func).arg(&mut out).launch(ONE_WARP)? };
                let out = s.clone_dtoh(&out)?;
                check_written(&out, "wmma accumulator f16 probe")?;
                out.iter().map(|v| v.to_f64()).collect()
            };
            let mut entries = Vec::new();
            for (cell, &code) in codes.iter().enumerate() {
                let code = code as u32;
                entries.push(Entry {
                    lane: code / 8,
                    reg: code % 8,
                    row: cell as u32 / 16,
                    col: cell as u32 % 16,
                });
            }
            Ok(layout(id, entries))
        }
        Operand::A(major) | Operand::B(major) => {
            let is_a = matches!(id.operand, Operand::A(_));
            let spec = match (is_a, major) {
                (true, Some(Major::Row)) => PROBE_WMMA_A_ROW,
                (true, Some(Major::Col)) => PROBE_WMMA_A_COL,
                (false, Some(Major::Row)) => PROBE_WMMA_B_ROW,
                (false, Some(Major::Col)) => PROBE_WMMA_B_COL,
                _ => bail!("{id}: a wmma operand needs a memory layout"),
            };
            // Cell (r, c) holds r*16 + c wherever the memory layout puts it.
            let mut tile = vec![f16::ZERO; 256];
            for r in 0..16 {
                for c in 0..16 {
                    let at = if major == Some(Major::Row) {
                        r * 16 + c
                    } else {
                        c * 16 + r
                    };
                    tile[at] = f16::from_f32((r * 16 + c) as f32);
                }
            }
            let k = gpu.load(&spec)?;
            let t = s.clone_htod(&tile)?;
            let mut out = s.clone_htod(&poisoned::<f32>(32 * 32))?;
            let mut count = s.clone_htod(&poisoned::<i32>(1))?;
            // SAFETY: probe_operand(const __half* tile[256], float* out[32*32], int* count), one warp.
            unsafe {
                s.launch_builder(&k.func)
                    .arg(&t)
                    .arg(&mut out)
                    .arg(&mut count)
                    .launch(ONE_WARP)?
            };
            let (out, count) = (s.clone_dtoh(&out)?, s.clone_dtoh(&count)?);
            check_written(&count, "num_elements")?;
            let n = count[0] as usize;
            ensure!((1..=32).contains(&n), "{id}: num_elements = {n}");
            let mut entries = Vec::new();
            for lane in 0..32 {
                let x = &out[lane * 32..lane * 32 + n];
                check_written(x, &format!("{id} lane {lane}"))?;
                for (reg, &v) in x.iter().enumerate() {
                    let code = v as u32;
                    entries.push(Entry {
                        lane: lane as u32,
                        reg: reg as u32,
                        row: code / 16,
                        col: code % 16,
                    });
                }
            }
            Ok(layout(id, entries))
        }
    }
}

fn fp8_value(code: u8, dtype: DType) -> Option<f32> {
    let (ebits, mbits, bias) = if dtype == DType::E4m3 {
        (4, 3, 7)
    } else {
        (5, 2, 15)
    };
    let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> mbits) & ((1 << ebits) - 1)) as i32;
    let m = (code & ((1 << mbits) - 1)) as f32 / (1 << mbits) as f32;
    if e == (1 << ebits) - 1 && (dtype == DType::E5m2 || code & 7 == 7) {
        return None; // NaN / Inf codes
    }
    Some(
        s * if e == 0 {
            m * 2f32.powi(1 - bias)
        } else {
            (1.0 + m) * 2f32.powi(e - bias)
        },
    )
}

/// The bits of `v` in `dtype`, which must hold it exactly: probes use only small integers and powers of two.
pub fn exact_bits(v: f32, dtype: DType) -> Result<u32> {
    let bits = match dtype {
        DType::F16 => f16::from_f32(v).to_bits() as u32,
        DType::Bf16 => bf16::from_f32(v).to_bits() as u32,
        DType::E4m3 | DType::E5m2 => (0u8..=255)
            .find(|&c| fp8_value(c, dtype) == Some(v) && !(v == 0.0 && c != 0))
            .ok_or_else(|| anyhow!("{v} is not exact in {}", dtype.name()))?
            as u32,
        DType::F32 => bail!("f32 is not an mma input here"),
    };
    let back = match dtype {
        DType::F16 => f16::from_bits(bits as u16).to_f32(),
        DType::Bf16 => bf16::from_bits(bits as u16).to_f32(),
        _ => fp8_value(bits as u8, dtype).unwrap_or(f32::NAN),
    };
    ensure!(back == v, "{v} is not exact in {}", dtype.name());
    Ok(bits)
}

/// A lane's elements packed low to high into `words` 32-bit registers.
pub(crate) fn pack(vals: &[f32], words: usize, dtype: DType) -> Result<Vec<u32>> {
    let per = vals.len() / words;
    let bits = 32 / per;
    let mut out = vec![0u32; words];
    for (j, &v) in vals.iter().enumerate() {
        out[j / per] |= exact_bits(v, dtype)? << (bits * (j % per));
    }
    Ok(out)
}

/// One launch's worth of mma runs: per run, 32 lanes × (A elements, B elements) as values.
struct Runs {
    na: usize,
    nb: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Runs {
    fn push(&mut self, a: Vec<f32>, b: Vec<f32>) {
        debug_assert_eq!((a.len(), b.len()), (32 * self.na, 32 * self.nb));
        self.a.extend(a);
        self.b.extend(b);
    }
    fn len(&self) -> usize {
        self.a.len() / (32 * self.na)
    }
}

/// Values of a matrix placed into registers by a layout table.
fn place(l: &Layout, f: impl Fn(u32, u32) -> f32) -> Vec<f32> {
    let regs = l.id.regs() as usize;
    let mut v = vec![0.0; 32 * regs];
    for e in &l.entries {
        v[e.lane as usize * regs + e.reg as usize] = f(e.row, e.col);
    }
    v
}

fn run_mma(gpu: &Gpu, spec: &KernelSpec, dtype: DType, runs: &Runs) -> Result<Vec<f32>> {
    let n = runs.len();
    let mut a = Vec::with_capacity(n * 32 * 4);
    for lane_vals in runs.a.chunks(runs.na) {
        a.extend(pack(lane_vals, 4, dtype)?);
    }
    let mut b = Vec::with_capacity(n * 32 * 2);
    for lane_vals in runs.b.chunks(runs.nb) {
        b.extend(pack(lane_vals, 2, dtype)?);
    }
    let s = &gpu.stream;
    let k = gpu.load(spec)?;
    let (da, db) = (s.clone_htod(&a)?, s.clone_htod(&b)?);
    let mut dd = s.clone_htod(&poisoned::<f32>(n * 32 * 4))?;
    let ni = n as i32;
    // SAFETY: probe(const unsigned* a[n][32][4], const unsigned* b[n][32][2], float* d[n][32][4], int n).
    unsafe {
        s.launch_builder(&k.func)
            .arg(&da)
            .arg(&db)
            .arg(&mut dd)
            .arg(&ni)
            .launch(ONE_WARP)?
    };
    let d = s.clone_dtoh(&dd)?;
    check_written(&d, spec.name)?;
    Ok(d)
}

/// What one mma.sync probe found.
#[derive(Debug, Clone)]
pub struct MmaProbe {
    pub a: Layout,
    pub b: Layout,
    pub c: Layout,
}

fn mma_ids(op: Op, dtype: DType) -> (LayoutId, LayoutId, LayoutId) {
    let id = |operand| LayoutId { op, operand, dtype };
    (
        id(Operand::A(None)),
        id(Operand::B(None)),
        LayoutId {
            op,
            operand: Operand::Acc,
            dtype: DType::F32,
        },
    )
}

fn mma_spec(op: Op, dtype: DType) -> Result<KernelSpec> {
    Ok(match (op, dtype) {
        (Op::Mma16x8x16, DType::F16) => PROBE_MMA_K16_F16,
        (Op::Mma16x8x16, DType::Bf16) => PROBE_MMA_K16_BF16,
        (Op::Mma16x8x32, DType::E4m3) => PROBE_MMA_K32_E4M3,
        (Op::Mma16x8x32, DType::E5m2) => PROBE_MMA_K32_E5M2,
        _ => bail!("no mma probe for {op:?} {}", dtype.name()),
    })
}

const DIGITS: u32 = 3; // slot ids < 512 in base 8: digits 0..7 are exact even in e5m2

/// mma.sync probe. C: A and B are placed (by the model) so that A·B = 8·row + col, and each D register's value
/// says where it sits. A: registers hold their own slot id (in base-8 digits, one run per digit), B is a
/// selection matrix, so D's cells reveal which slot reached each cell of A. B: the same with the roles swapped.
pub fn probe_mma(gpu: &Gpu, op: Op, dtype: DType) -> Result<MmaProbe> {
    let (a_id, b_id, c_id) = mma_ids(op, dtype);
    let (ma, mb) = (a_id.model(), b_id.model());
    let (na, nb) = (a_id.regs() as usize, b_id.regs() as usize);
    let k = a_id.shape().1;
    let digit = |id: usize, p: u32| ((id >> (3 * p)) & 7) as f32;
    let mut runs = Runs {
        na,
        nb,
        a: Vec::new(),
        b: Vec::new(),
    };
    runs.push(
        place(&ma, |m, kk| {
            if kk < 4 {
                ((m >> kk) & 1) as f32
            } else if kk == 4 {
                1.0
            } else {
                0.0
            }
        }),
        place(&mb, |kk, n| {
            if kk < 4 {
                (8u32 << kk) as f32
            } else if kk == 4 {
                n as f32
            } else {
                0.0
            }
        }),
    );
    for j in 0..k / 8 {
        for p in 0..DIGITS {
            runs.push(
                (0..32 * na).map(|id| digit(id, p)).collect(),
                place(&mb, |kk, n| (kk == n + 8 * j) as u32 as f32),
            );
        }
    }
    for j in 0..k / 16 {
        for p in 0..DIGITS {
            runs.push(
                place(&ma, |m, kk| (kk == m + 16 * j) as u32 as f32),
                (0..32 * nb).map(|id| digit(id, p)).collect(),
            );
        }
    }
    let d = run_mma(gpu, &mma_spec(op, dtype)?, dtype, &runs)?;
    let at = |run: usize, lane: u32, i: u32| d[(run * 32 + lane as usize) * 4 + i as usize];

    let mut c_entries = Vec::new();
    for lane in 0..32 {
        for i in 0..4 {
            let v = at(0, lane, i);
            ensure!(
                v.fract() == 0.0 && (0.0..128.0).contains(&v),
                "C probe: lane {lane} d[{i}] = {v}"
            );
            c_entries.push(Entry {
                lane,
                reg: i,
                row: v as u32 / 8,
                col: v as u32 % 8,
            });
        }
    }
    let c = layout(c_id, c_entries);
    c.check_coverage()
        .map_err(|e| anyhow!("probed C is not a bijection, so A and B cannot be read: {e}"))?;
    let pos: BTreeMap<(u32, u32), (u32, u32)> = c
        .entries
        .iter()
        .map(|e| ((e.row, e.col), (e.lane, e.reg)))
        .collect();
    let read_id = |first_run: usize, m: u32, n: u32| -> Result<usize> {
        let (lane, i) = pos[&(m, n)];
        let mut id = 0usize;
        for p in 0..DIGITS {
            let v = at(first_run + p as usize, lane, i);
            ensure!(
                v.fract() == 0.0 && (0.0..8.0).contains(&v),
                "digit {p} at ({m}, {n}) = {v}"
            );
            id += (v as usize) << (3 * p);
        }
        Ok(id)
    };
    let mut a_entries = Vec::new();
    for j in 0..k / 8 {
        for m in 0..16 {
            for n in 0..8 {
                let id = read_id(1 + (j * DIGITS) as usize, m, n)?;
                a_entries.push(Entry {
                    lane: (id / na) as u32,
                    reg: (id % na) as u32,
                    row: m,
                    col: n + 8 * j,
                });
            }
        }
    }
    let b_first = 1 + (k / 8 * DIGITS) as usize;
    let mut b_entries = Vec::new();
    for j in 0..k / 16 {
        for m in 0..16 {
            for n in 0..8 {
                let id = read_id(b_first + (j * DIGITS) as usize, m, n)?;
                b_entries.push(Entry {
                    lane: (id / nb) as u32,
                    reg: (id % nb) as u32,
                    row: m + 16 * j,
                    col: n,
                });
            }
        }
    }
    Ok(MmaProbe {
        a: layout(a_id, a_entries),
        b: layout(b_id, b_entries),
        c,
    })
}

/// The three tables used together: random integer A and B placed by `a` and `b`, D read by `c`, against the
/// exact product. Any wrong entry in any of the three shows up as wrong cells. Returns the wrong cells.
pub fn mma_product_errors(
    gpu: &Gpu,
    a: &Layout,
    b: &Layout,
    c: &Layout,
    seed: u64,
) -> Result<Vec<String>> {
    let (op, dtype) = (a.id.op, a.id.dtype);
    let (m_, k_) = a.id.shape();
    let n_ = b.id.shape().1;
    let mut inp = Inputs::seeded(seed);
    let am = inp.integers((m_ * k_) as usize, -2, 2);
    let bm = inp.integers((k_ * n_) as usize, -2, 2);
    let mut runs = Runs {
        na: a.id.regs() as usize,
        nb: b.id.regs() as usize,
        a: Vec::new(),
        b: Vec::new(),
    };
    runs.push(
        place(a, |r, cc| am[(r * k_ + cc) as usize]),
        place(b, |r, cc| bm[(r * n_ + cc) as usize]),
    );
    let d = run_mma(gpu, &mma_spec(op, dtype)?, dtype, &runs)?;
    let mut errors = Vec::new();
    for e in &c.entries {
        let want: f32 = (0..k_)
            .map(|kk| am[(e.row * k_ + kk) as usize] * bm[(kk * n_ + e.col) as usize])
            .sum();
        let got = d[e.lane as usize * 4 + e.reg as usize];
        if got != want {
            errors.push(format!(
                "D({}, {}) read from lane {} d[{}] = {got}, A·B = {want}",
                e.row, e.col, e.lane, e.reg
            ));
        }
    }
    Ok(errors)
}

/// Every layout of [`LAYOUTS`] probed once per process (a test binary's tests share it).
pub fn probe_all(gpu: &Gpu) -> Result<&'static BTreeMap<LayoutId, Layout>> {
    static ALL: OnceLock<std::result::Result<BTreeMap<LayoutId, Layout>, String>> = OnceLock::new();
    ALL.get_or_init(|| probe_all_uncached(gpu).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

fn probe_all_uncached(gpu: &Gpu) -> Result<BTreeMap<LayoutId, Layout>> {
    let mut all = BTreeMap::new();
    for id in LAYOUTS.iter().filter(|l| l.exists_on(gpu.arch)) {
        if id.op == Op::Wmma16x16x16 {
            all.insert(
                *id,
                probe_wmma(gpu, *id).with_context(|| format!("probing {id}"))?,
            );
        }
    }
    for (op, dtype) in [
        (Op::Mma16x8x16, DType::F16),
        (Op::Mma16x8x16, DType::Bf16),
        (Op::Mma16x8x32, DType::E4m3),
        (Op::Mma16x8x32, DType::E5m2),
    ] {
        let p = probe_mma(gpu, op, dtype)
            .with_context(|| format!("probing mma {op:?} {}", dtype.name()))?;
        all.insert(p.a.id, p.a);
        all.insert(p.b.id, p.b);
        // C is one layout per instruction shape: every input type must find the same one.
        if let Some(prev) = all.get(&p.c.id) {
            let d = p.c.diff(prev);
            ensure!(
                d.is_empty(),
                "C of {op:?} differs between input types: {}",
                d.join("; ")
            );
        } else {
            all.insert(p.c.id, p.c);
        }
    }
    Ok(all)
}

/// One evaluation of a header function on the device: `(fn, lane, i, row, col)`.
pub type HeaderEntry = (&'static str, u32, u32, u32, u32);

/// The header's functions evaluated on the device, in [`HEADER_FNS`] order.
pub fn header_on_device(gpu: &Gpu) -> Result<Vec<HeaderEntry>> {
    let s = &gpu.stream;
    let k = gpu.load(&HEADER_TABLE)?;
    let n = HEADER_FNS.len() * 32 * 16 * 2;
    let mut out = s.clone_htod(&vec![-1i32; n])?;
    // SAFETY: header_table(int* out[fns][32][16][2]), one warp.
    unsafe { s.launch_builder(&k.func).arg(&mut out).launch(ONE_WARP)? };
    let out = s.clone_dtoh(&out)?;
    let mut v = Vec::new();
    for (f, (name, regs)) in HEADER_FNS.iter().enumerate() {
        for lane in 0..32u32 {
            for i in 0..*regs {
                let at = ((f * 32 + lane as usize) * 16 + i as usize) * 2;
                ensure!(
                    out[at] >= 0 && out[at + 1] >= 0,
                    "{name} lane {lane} x[{i}] not written"
                );
                v.push((*name, lane, i, out[at] as u32, out[at + 1] as u32));
            }
        }
    }
    Ok(v)
}

/// `quad_rowmax`: each lane's two row maxima after the quad shuffle, `out[lane * 2 + half]`.
pub fn quad_rowmax(gpu: &Gpu) -> Result<Vec<f32>> {
    let s = &gpu.stream;
    let k = gpu.load(&QUAD_ROWMAX)?;
    let mut out = s.clone_htod(&poisoned::<f32>(64))?;
    // SAFETY: quad_rowmax(float* out[64]), one warp.
    unsafe { s.launch_builder(&k.func).arg(&mut out).launch(ONE_WARP)? };
    let out = s.clone_dtoh(&out)?;
    check_written(&out, "quad_rowmax")?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_values_are_exact_in_every_input_type() {
        for dtype in [DType::F16, DType::Bf16, DType::E4m3, DType::E5m2] {
            for v in [
                0.0, 1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 8.0, 16.0, 32.0, 64.0, -1.0, -2.0,
            ] {
                exact_bits(v, dtype).unwrap();
            }
        }
        assert!(
            exact_bits(9.0, DType::E5m2).is_err(),
            "9 needs 3 mantissa bits"
        );
        assert_eq!(exact_bits(1.0, DType::E4m3).unwrap(), 0x38);
        assert_eq!(exact_bits(1.0, DType::E5m2).unwrap(), 0x3C);
        assert_eq!(fp8_value(0x7E, DType::E4m3), Some(448.0));
        assert_eq!(fp8_value(0x7F, DType::E4m3), None);
        assert_eq!(fp8_value(0x7B, DType::E5m2), Some(57344.0));
    }

    #[test]
    fn packing_puts_element_zero_in_the_low_bits() {
        let w = pack(&[1.0, 2.0], 1, DType::F16).unwrap();
        assert_eq!(w, vec![0x3C00 | (0x4000 << 16)]);
        let w = pack(&[1.0, 0.0, 0.0, 2.0], 1, DType::E4m3).unwrap();
        assert_eq!(w, vec![0x38 | (0x40 << 24)]);
    }
}
