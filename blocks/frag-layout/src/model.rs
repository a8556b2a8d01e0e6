// The fragment-layout model: (lane, register) → (row, col) for every wmma / mma.sync fragment the lab uses.
use std::collections::BTreeMap;
use std::fmt;

use lab::Arch;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Op {
    /// `nvcuda::wmma`, 16×16×16. Its fragment layouts are unspecified by NVIDIA: this lab's are probed.
    Wmma16x16x16,
    /// `mma.sync.aligned.m16n8k16`, f16/bf16 in, f32 accumulate (PTX ISA "Matrix Fragments for mma.m16n8k16").
    Mma16x8x16,
    /// `mma.sync.aligned.m16n8k32`, e4m3/e5m2 in, f32 accumulate; sm_89 and later.
    Mma16x8x32,
    /// `wgmma.mma_async.sync.aligned.m64nNkK` (sm_90a): one warpgroup of 128 threads; K = 32 for e4m3/e5m2,
    /// 16 for f16/bf16. Its register layouts are indexed by the thread of the warpgroup (warp = thread / 32).
    Wgmma { n: u32, k: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Major {
    Row,
    Col,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Operand {
    /// wmma `matrix_a` / mma `a`. For wmma, the memory layout it is loaded from.
    A(Option<Major>),
    B(Option<Major>),
    /// wmma `accumulator` / mma `c` (= `d`).
    Acc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum DType {
    F16,
    Bf16,
    F32,
    E4m3,
    E5m2,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::E4m3 => "e4m3",
            DType::E5m2 => "e5m2",
        }
    }
}

/// One layout: an instruction's operand of one element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayoutId {
    pub op: Op,
    pub operand: Operand,
    pub dtype: DType,
}

/// Every layout the lab relies on.
pub const LAYOUTS: &[LayoutId] = {
    use DType::*;
    use Major::*;
    use Op::*;
    use Operand::*;
    const fn l(op: Op, operand: Operand, dtype: DType) -> LayoutId {
        LayoutId { op, operand, dtype }
    }
    &[
        l(Wmma16x16x16, A(Some(Row)), F16),
        l(Wmma16x16x16, A(Some(Col)), F16),
        l(Wmma16x16x16, B(Some(Row)), F16),
        l(Wmma16x16x16, B(Some(Col)), F16),
        l(Wmma16x16x16, Acc, F32),
        l(Wmma16x16x16, Acc, F16),
        l(Mma16x8x16, A(None), F16),
        l(Mma16x8x16, A(None), Bf16),
        l(Mma16x8x16, B(None), F16),
        l(Mma16x8x16, B(None), Bf16),
        l(Mma16x8x16, Acc, F32),
        l(Mma16x8x32, A(None), E4m3),
        l(Mma16x8x32, A(None), E5m2),
        l(Mma16x8x32, B(None), E4m3),
        l(Mma16x8x32, B(None), E5m2),
        l(Mma16x8x32, Acc, F32),
        l(Wgmma { n: 64, k: 32 }, Acc, F32),
        l(Wgmma { n: 128, k: 32 }, Acc, F32),
        l(Wgmma { n: 256, k: 32 }, Acc, F32),
        l(Wgmma { n: 64, k: 16 }, Acc, F32),
        l(Wgmma { n: 128, k: 16 }, Acc, F32),
        l(Wgmma { n: 256, k: 16 }, Acc, F32),
        // The register A operand does not depend on N; it is recorded (and probed) at N = 64.
        l(Wgmma { n: 64, k: 32 }, A(None), E4m3),
        l(Wgmma { n: 64, k: 32 }, A(None), E5m2),
        l(Wgmma { n: 64, k: 16 }, A(None), F16),
        l(Wgmma { n: 64, k: 16 }, A(None), Bf16),
    ]
};

/// The N of every wgmma accumulator layout the lab records.
pub const WGMMA_NS: [u32; 3] = [64, 128, 256];

/// The architectures whose layouts the lab records. sm_90 and sm_90a (wgmma) are probed on the device; the
/// others come from the model until their hardware is at hand.
pub const ARCHS: [Arch; 4] = [Arch::Sm80, Arch::Sm89, Arch::Sm90, Arch::Sm90a];

/// The architecture whose mma.sync / wmma layouts are probed on the device machine (an H100).
pub const PROBED_ARCH: Arch = Arch::Sm90;

/// The architectures whose layouts the device machine (an H100) probes: sm_90, and sm_90a for wgmma.
pub fn is_probed(arch: Arch) -> bool {
    matches!(arch, Arch::Sm90 | Arch::Sm90a)
}

impl LayoutId {
    pub fn op_name(&self) -> String {
        match self.op {
            Op::Wmma16x16x16 => "wmma.m16n16k16".into(),
            Op::Mma16x8x16 => "mma.m16n8k16".into(),
            Op::Mma16x8x32 => "mma.m16n8k32".into(),
            Op::Wgmma { n, k } => format!("wgmma.m64n{n}k{k}"),
        }
    }

    pub fn is_wgmma(&self) -> bool {
        matches!(self.op, Op::Wgmma { .. })
    }

    /// Threads that hold the fragment together: a warp, or a warpgroup for wgmma.
    pub fn threads(&self) -> u32 {
        if self.is_wgmma() { 128 } else { 32 }
    }

    pub fn operand_name(&self) -> &'static str {
        let wmma = self.op == Op::Wmma16x16x16;
        match (self.operand, wmma) {
            (Operand::A(Some(Major::Row)), _) => "matrix_a.row_major",
            (Operand::A(Some(Major::Col)), _) => "matrix_a.col_major",
            (Operand::B(Some(Major::Row)), _) => "matrix_b.row_major",
            (Operand::B(Some(Major::Col)), _) => "matrix_b.col_major",
            (Operand::A(None), _) => "a",
            (Operand::B(None), _) => "b",
            (Operand::Acc, true) => "accumulator",
            (Operand::Acc, false) if self.is_wgmma() => "d",
            (Operand::Acc, false) => "c",
        }
    }

    /// A file-name-safe key: `mma.m16n8k16__a__f16`.
    pub fn key(&self) -> String {
        format!(
            "{}__{}__{}",
            self.op_name(),
            self.operand_name(),
            self.dtype.name()
        )
    }

    /// (rows, cols) of the tile. A is M×K, B is K×N, the accumulator M×N.
    pub fn shape(&self) -> (u32, u32) {
        let (m, n, k) = match self.op {
            Op::Wmma16x16x16 => (16, 16, 16),
            Op::Mma16x8x16 => (16, 8, 16),
            Op::Mma16x8x32 => (16, 8, 32),
            Op::Wgmma { n, k } => (64, n, k),
        };
        match self.operand {
            Operand::A(_) => (m, k),
            Operand::B(_) => (k, n),
            Operand::Acc => (m, n),
        }
    }

    /// Elements each lane holds (`fragment::num_elements` for wmma, the PTX element count for mma).
    pub fn regs(&self) -> u32 {
        match (self.op, self.operand) {
            // wmma f16 operand fragments hold 16 halves per lane on sm_80+: each cell twice (probed on sm_90).
            (Op::Wmma16x16x16, Operand::A(_) | Operand::B(_)) => 16,
            (Op::Wmma16x16x16, Operand::Acc) => 8,
            (Op::Mma16x8x16, Operand::A(_)) => 8,
            (Op::Mma16x8x16, Operand::B(_)) => 4,
            (Op::Mma16x8x32, Operand::A(_)) => 16,
            (Op::Mma16x8x32, Operand::B(_)) => 8,
            // Four 32-bit registers of A per thread: 16 fp8 or 8 f16 elements.
            (Op::Wgmma { k, .. }, Operand::A(_)) => 4 * 32 / (256 / k),
            (Op::Wgmma { .. }, Operand::B(_)) => 0,
            (Op::Wgmma { n, .. }, Operand::Acc) => n / 2,
            (_, Operand::Acc) => 4,
        }
    }

    /// How many (lane, reg) slots hold each cell: slots / cells.
    pub fn multiplicity(&self) -> u32 {
        let (r, c) = self.shape();
        self.threads() * self.regs() / (r * c)
    }

    /// Whether `arch` has the instruction at all. wgmma layouts are recorded under sm_90a alone, the others
    /// under sm_80 / sm_89 / sm_90.
    pub fn exists_on(&self, arch: Arch) -> bool {
        match self.op {
            Op::Wgmma { .. } => arch == Arch::Sm90a,
            Op::Mma16x8x32 => matches!(arch, Arch::Sm89 | Arch::Sm90),
            _ => arch != Arch::Sm90a,
        }
    }

    /// The model: where `x[reg]` of `lane` sits in the tile. Mirrors `cuda/frag_layout.cuh` exactly.
    pub fn coord(&self, lane: u32, reg: u32) -> (u32, u32) {
        assert!(
            lane < self.threads() && reg < self.regs(),
            "{}: lane {lane} reg {reg} out of range",
            self.key()
        );
        let (g, t, i) = ((lane & 31) >> 2, lane & 3, reg);
        // wgmma: warp w of the warpgroup holds rows 16w .. 16w + 15, laid out like an m16 mma fragment.
        let w16 = 16 * (lane >> 5);
        match (self.op, self.operand) {
            (Op::Wgmma { .. }, Operand::Acc) => {
                (w16 + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1))
            }
            (Op::Wgmma { k: 32, .. }, Operand::A(_)) => (
                w16 + g + 8 * ((i >> 2) & 1),
                4 * t + (i & 3) + 16 * (i >> 3),
            ),
            (Op::Wgmma { .. }, Operand::A(_)) => {
                (w16 + g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))
            }
            (Op::Wgmma { .. }, Operand::B(_)) => {
                unreachable!("wgmma's B operand is in shared memory: see SmemLayout")
            }
            // wmma on sm_80+ is two mma.m16n8k16 side by side: x[0..4] is the left n8 tile, x[4..8] the right.
            (Op::Wmma16x16x16, Operand::Acc)
            | (Op::Mma16x8x16, Operand::Acc)
            | (Op::Mma16x8x32, Operand::Acc) => {
                (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))
            }
            (Op::Wmma16x16x16, Operand::A(_)) => {
                let j = i & 7;
                (g + 8 * ((j >> 1) & 1), 2 * t + (j & 1) + 8 * (j >> 2))
            }
            (Op::Wmma16x16x16, Operand::B(_)) => {
                let j = i & 7;
                (2 * t + (j & 1) + 8 * ((j >> 1) & 1), g + 8 * (j >> 2))
            }
            (Op::Mma16x8x16, Operand::A(_)) => {
                (g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2))
            }
            (Op::Mma16x8x16, Operand::B(_)) => (2 * t + (i & 1) + 8 * (i >> 1), g),
            (Op::Mma16x8x32, Operand::A(_)) => {
                (g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3))
            }
            (Op::Mma16x8x32, Operand::B(_)) => (4 * t + (i & 3) + 16 * (i >> 2), g),
        }
    }

    /// The function prefix of this layout in `frag_layout.cuh` (`<prefix>_row`, `<prefix>_col`).
    pub fn header_fn(&self) -> &'static str {
        match (self.op, self.operand) {
            (Op::Wmma16x16x16, Operand::A(_)) => "frag::wmma_a",
            (Op::Wmma16x16x16, Operand::B(_)) => "frag::wmma_b",
            (Op::Wmma16x16x16, Operand::Acc) => "frag::wmma_acc",
            (Op::Mma16x8x16, Operand::A(_)) => "frag::m16n8k16_a",
            (Op::Mma16x8x16, Operand::B(_)) => "frag::m16n8k16_b",
            (Op::Mma16x8x32, Operand::A(_)) => "frag::m16n8k32_a",
            (Op::Mma16x8x32, Operand::B(_)) => "frag::m16n8k32_b",
            (Op::Wgmma { .. }, Operand::Acc) => "frag::wgmma_d",
            (Op::Wgmma { k: 32, .. }, _) => "frag::wgmma_a_k32",
            (Op::Wgmma { .. }, _) => "frag::wgmma_a_k16",
            (_, Operand::Acc) => "frag::mma_c",
        }
    }

    /// The model's table.
    pub fn model(&self) -> Layout {
        let mut entries = Vec::new();
        for lane in 0..self.threads() {
            for reg in 0..self.regs() {
                let (row, col) = self.coord(lane, reg);
                entries.push(Entry {
                    lane,
                    reg,
                    row,
                    col,
                });
            }
        }
        Layout { id: *self, entries }
    }
}

impl fmt::Display for LayoutId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}",
            self.op_name(),
            self.operand_name(),
            self.dtype.name()
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Entry {
    pub lane: u32,
    pub reg: u32,
    pub row: u32,
    pub col: u32,
}

/// A layout as data: one entry per (lane, reg) slot, from the model or from a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub id: LayoutId,
    pub entries: Vec<Entry>,
}

impl Layout {
    /// Sorted by (lane, reg): the canonical order, so two layouts compare as tables.
    pub fn normalized(mut self) -> Self {
        self.entries.sort();
        self
    }

    /// The inverse map: each cell → the slots that hold it.
    pub fn inverse(&self) -> BTreeMap<(u32, u32), Vec<(u32, u32)>> {
        let mut inv: BTreeMap<(u32, u32), Vec<(u32, u32)>> = BTreeMap::new();
        for e in &self.entries {
            inv.entry((e.row, e.col)).or_default().push((e.lane, e.reg));
        }
        for v in inv.values_mut() {
            v.sort();
        }
        inv
    }

    /// Cell by cell: the differences between `self` (e.g. a probe) and `other` (e.g. the model), as lines
    /// naming the slot and both coordinates. Empty when they agree.
    pub fn diff(&self, other: &Layout) -> Vec<String> {
        let a: BTreeMap<(u32, u32), (u32, u32)> = self
            .entries
            .iter()
            .map(|e| ((e.lane, e.reg), (e.row, e.col)))
            .collect();
        let b: BTreeMap<(u32, u32), (u32, u32)> = other
            .entries
            .iter()
            .map(|e| ((e.lane, e.reg), (e.row, e.col)))
            .collect();
        let mut d = Vec::new();
        for (slot, rc) in &a {
            match b.get(slot) {
                Some(rc2) if rc2 == rc => {}
                Some(rc2) => d.push(format!(
                    "lane {} x[{}]: ({}, {}) here, ({}, {}) there",
                    slot.0, slot.1, rc.0, rc.1, rc2.0, rc2.1
                )),
                None => d.push(format!(
                    "lane {} x[{}]: ({}, {}) here, absent there",
                    slot.0, slot.1, rc.0, rc.1
                )),
            }
        }
        for (slot, rc) in &b {
            if !a.contains_key(slot) {
                d.push(format!(
                    "lane {} x[{}]: absent here, ({}, {}) there",
                    slot.0, slot.1, rc.0, rc.1
                ));
            }
        }
        d
    }

    /// The structural check: every slot in range, every cell of the tile held by exactly `multiplicity` slots.
    pub fn check_coverage(&self) -> Result<(), String> {
        let (rows, cols) = self.id.shape();
        let m = self.id.multiplicity() as usize;
        if self.entries.len() != (self.id.threads() * self.id.regs()) as usize {
            return Err(format!(
                "{}: {} slots, expected {}",
                self.id,
                self.entries.len(),
                self.id.threads() * self.id.regs()
            ));
        }
        let inv = self.inverse();
        for r in 0..rows {
            for c in 0..cols {
                let n = inv.get(&(r, c)).map_or(0, |v| v.len());
                if n != m {
                    return Err(format!(
                        "{}: cell ({r}, {c}) held by {n} slots, expected {m}",
                        self.id
                    ));
                }
            }
        }
        if inv.len() != (rows * cols) as usize {
            return Err(format!(
                "{}: slots point outside the {rows}×{cols} tile",
                self.id
            ));
        }
        Ok(())
    }

    /// The grid a reviewer reads: one `lane.reg` per slot holding the cell, `/`-separated when several do.
    /// A tile wider than 64 columns (wgmma N = 128, 256) is drawn 64 columns wide when the rest repeats it
    /// with the register shifted by 32 per 64 columns, which is checked here cell by cell and stated; when it
    /// does not repeat, every column is drawn.
    pub fn draw(&self) -> String {
        let (rows, cols) = self.id.shape();
        let inv = self.inverse();
        let slot_text = |r: u32, c: u32| -> String {
            inv.get(&(r, c)).map_or("?".into(), |v| {
                v.iter()
                    .map(|(l, i)| format!("{l}.{i}"))
                    .collect::<Vec<_>>()
                    .join("/")
            })
        };
        let repeats = cols > 64
            && (0..rows).all(|r| {
                (64..cols).all(|c| {
                    let base = inv.get(&(r, c % 64));
                    let here = inv.get(&(r, c));
                    match (base, here) {
                        (Some(b), Some(h)) => {
                            b.iter()
                                .map(|&(l, i)| (l, i + 32 * (c / 64)))
                                .collect::<Vec<_>>()
                                == *h
                        }
                        _ => false,
                    }
                })
            });
        let shown = if repeats { 64 } else { cols };
        let cells: Vec<Vec<String>> = (0..rows)
            .map(|r| (0..shown).map(|c| slot_text(r, c)).collect())
            .collect();
        let w = cells.iter().flatten().map(|s| s.len()).max().unwrap_or(1);
        let who = if self.id.is_wgmma() {
            "cell = thread.reg, thread = 32·warp + lane of the warpgroup"
        } else {
            "cell = lane.reg"
        };
        let mut s = format!(
            "{} — {rows}×{cols}, {} elements per {}, each cell held by {} slot(s); {who}\n",
            self.id,
            self.id.regs(),
            if self.id.is_wgmma() { "thread" } else { "lane" },
            self.id.multiplicity()
        );
        if repeats {
            s.push_str(&format!(
                "columns 64..{cols} repeat columns 0..64 with reg + 32 per 64 columns (checked for every cell)\n"
            ));
        }
        s.push_str(&format!("{:>4} ", ""));
        for c in 0..shown {
            s.push_str(&format!(" {:>w$}", format!("c{c}")));
        }
        s.push('\n');
        for (r, row) in cells.iter().enumerate() {
            s.push_str(&format!("{:>4} ", format!("r{r}")));
            for cell in row {
                s.push_str(&format!(" {cell:>w$}"));
            }
            s.push('\n');
        }
        s
    }
}

/// Where one accumulator row lives: the quad of lanes and the registers each of them holds it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOwners {
    pub row: u32,
    pub lanes: Vec<u32>,
    pub regs: Vec<u32>,
}

/// Lane masks for `__shfl_xor_sync` that reduce a value across the quad of lanes owning one accumulator row:
/// after xor 1 then xor 2, every lane of the quad holds the quad's reduction.
pub const QUAD_XOR_MASKS: [u32; 2] = [1, 2];

/// Row ownership of an accumulator layout, derived from the table (not from a formula), so it is exactly as
/// right as the table is.
pub fn row_owners(layout: &Layout, row: u32) -> RowOwners {
    let mut lanes: Vec<u32> = layout
        .entries
        .iter()
        .filter(|e| e.row == row)
        .map(|e| e.lane)
        .collect();
    lanes.sort();
    lanes.dedup();
    let mut regs: Vec<u32> = layout
        .entries
        .iter()
        .filter(|e| e.row == row && e.lane == lanes[0])
        .map(|e| e.reg)
        .collect();
    regs.sort();
    RowOwners { row, lanes, regs }
}

/// The orbit of `lane` under the quad shuffle: the lanes whose values one xor-1, xor-2 reduction combines.
pub fn quad_orbit(lane: u32) -> Vec<u32> {
    let mut orbit = vec![lane];
    for m in QUAD_XOR_MASKS {
        let more: Vec<u32> = orbit.iter().map(|l| l ^ m).collect();
        orbit.extend(more);
    }
    orbit.sort();
    orbit.dedup();
    orbit
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_layout_covers_its_tile_with_its_multiplicity() {
        for id in LAYOUTS {
            id.model().check_coverage().unwrap();
            let m = id.multiplicity();
            let want = if matches!(
                (id.op, id.operand),
                (Op::Wmma16x16x16, Operand::A(_) | Operand::B(_))
            ) {
                2
            } else {
                1
            };
            assert_eq!(m, want, "{id}");
        }
    }

    #[test]
    fn accumulators_are_bijections() {
        for id in LAYOUTS.iter().filter(|l| l.operand == Operand::Acc) {
            let inv = id.model().inverse();
            assert!(inv.values().all(|v| v.len() == 1), "{id}");
            assert_eq!(inv.len() as u32, id.threads() * id.regs(), "{id}");
        }
    }

    #[test]
    fn row_ownership_is_a_quad_closed_under_the_shuffle_and_agrees_with_the_map() {
        for id in LAYOUTS.iter().filter(|l| l.operand == Operand::Acc) {
            let layout = id.model();
            let (rows, cols) = id.shape();
            for row in 0..rows {
                let o = row_owners(&layout, row);
                assert_eq!(o.lanes.len(), 4, "{id} row {row}: {o:?}");
                assert_eq!(
                    o.lanes,
                    quad_orbit(o.lanes[0]),
                    "{id} row {row}: the xor shuffle leaves the quad"
                );
                let warp_base = if id.is_wgmma() { 32 * (row / 16) } else { 0 };
                assert_eq!(o.lanes[0], warp_base + 4 * (row % 8), "{id} row {row}");
                // Each owner holds the row in the same registers, and together they hold every column once.
                let mut cols_seen = Vec::new();
                for &lane in &o.lanes {
                    for &reg in &o.regs {
                        let (r, c) = id.coord(lane, reg);
                        assert_eq!(r, row, "{id}: lane {lane} x[{reg}]");
                        cols_seen.push(c);
                    }
                }
                cols_seen.sort();
                assert_eq!(cols_seen, (0..cols).collect::<Vec<_>>(), "{id} row {row}");
            }
        }
    }

    #[test]
    fn diff_catches_two_swapped_registers() {
        let id = LAYOUTS
            .iter()
            .find(|l| l.op == Op::Wmma16x16x16 && l.operand == Operand::Acc)
            .unwrap();
        let good = id.model();
        let mut bad = good.clone();
        for e in bad.entries.iter_mut() {
            e.reg = match e.reg {
                2 => 3,
                3 => 2,
                r => r,
            };
        }
        let bad = bad.normalized();
        let d = bad.diff(&good);
        assert_eq!(d.len(), 64, "two slots in each of 32 lanes: {d:?}");
        assert!(good.diff(&good.clone()).is_empty());
        bad.check_coverage().unwrap(); // a swap keeps coverage: only the cell-by-cell diff catches it
    }

    proptest! {
        #[test]
        fn inverse_after_forward_is_identity(layout in 0..LAYOUTS.len(), lane in 0u32..128, reg in 0u32..128) {
            let id = LAYOUTS[layout];
            let (lane, reg) = (lane % id.threads(), reg % id.regs());
            let (r, c) = id.coord(lane, reg);
            let inv = id.model().inverse();
            prop_assert!(inv[&(r, c)].contains(&(lane, reg)));
            for &(l2, i2) in &inv[&(r, c)] {
                prop_assert_eq!(id.coord(l2, i2), (r, c));
            }
        }
    }
}
