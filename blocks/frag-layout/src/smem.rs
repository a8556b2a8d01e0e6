// wgmma's shared-memory operands: the matrix descriptor, its 64-bit encoding, and (row, k) → byte for each swizzle.
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::model::DType;

/// The descriptor's swizzle mode. A K-major operand row is `bytes()` wide (none: 16-byte core-matrix rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    pub const ALL: [Swizzle; 4] = [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128];

    pub fn name(self) -> &'static str {
        match self {
            Swizzle::None => "none",
            Swizzle::B32 => "sw32",
            Swizzle::B64 => "sw64",
            Swizzle::B128 => "sw128",
        }
    }

    /// The row pitch of a swizzled K-major tile (the swizzle width); 16 for none (one core-matrix row).
    pub fn row_bytes(self) -> u32 {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// The descriptor's bits 62–63 (PTX ISA, "Matrix Descriptor Format").
    pub fn mode_bits(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    /// How many address bits above bit 7 are XORed into bits 4.. (CuTe's Swizzle<B, 4, 3>).
    pub fn xor_bits(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        }
    }

    /// The address a swizzled access lands on: bits [4, 4+B) XOR bits [7, 7+B) of the shared-memory address.
    /// It acts on the absolute address, so tiles start on a multiple of `repeat_bytes()`.
    pub fn apply(self, addr: u32) -> u32 {
        let b = self.xor_bits();
        addr ^ (((addr >> 7) & ((1 << b) - 1)) << 4)
    }

    /// The period of the pattern: 8 rows of the swizzle width (1024 bytes for 128B).
    pub fn repeat_bytes(self) -> u32 {
        8 * self.row_bytes().max(16)
    }

    /// The TMA swizzle that writes this layout (`CU_TENSOR_MAP_SWIZZLE_*`: 0 none, 1 32B, 2 64B, 3 128B).
    pub fn tma_code(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        }
    }
}

/// A wgmma matrix descriptor: start address (bytes from a `repeat_bytes`-aligned base), leading byte offset
/// (core matrix to core matrix along K), stride byte offset (8-row group to 8-row group), swizzle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Desc {
    pub start: u32,
    pub lbo: u32,
    pub sbo: u32,
    pub swizzle: Swizzle,
}

impl Desc {
    /// The lab's canonical K-major tile of `rows` rows and `k_bytes` bytes of K, addressed at K-step `step`
    /// (32 bytes of K: one wgmma). Swizzled: rows `row_bytes` apart, 8-row groups `8·row_bytes` apart, K
    /// beyond the swizzle width in further `rows × row_bytes` panels. None: 8×16-byte core matrices, K-adjacent
    /// ones `rows/8 · 128` bytes apart (LBO), row-adjacent ones 128 apart (SBO).
    pub fn k_major(swizzle: Swizzle, rows: u32, k_bytes: u32, step: u32) -> Desc {
        assert!(rows.is_multiple_of(8) && k_bytes.is_multiple_of(32) && step < k_bytes / 32);
        match swizzle {
            Swizzle::None => {
                let lbo = rows / 8 * 128;
                Desc {
                    start: step * 2 * lbo,
                    lbo,
                    sbo: 128,
                    swizzle,
                }
            }
            _ => {
                let w = swizzle.row_bytes();
                let per_panel = w / 32;
                let panel = step / per_panel;
                Desc {
                    start: panel * rows * w + (step % per_panel) * 32,
                    // Unused for K-major swizzled operands (one instruction's K fits the swizzle width).
                    lbo: 16,
                    sbo: 8 * w,
                    swizzle,
                }
            }
        }
    }

    /// Where byte `kb` (any K) of row `row` of the canonical tile of `k_major(swizzle, rows, k_bytes, _)` sits,
    /// from its aligned base: where ordinary stores must write it (the device's `wgmma::tile_byte`).
    pub fn tile_byte(swizzle: Swizzle, rows: u32, k_bytes: u32, row: u32, kb: u32) -> u32 {
        Desc::k_major(swizzle, rows, k_bytes, kb / 32).byte_of(row, kb % 32)
    }

    /// Bytes of shared memory the canonical tile of `k_major(swizzle, rows, k_bytes, _)` occupies.
    pub fn tile_bytes(swizzle: Swizzle, rows: u32, k_bytes: u32) -> u32 {
        match swizzle {
            Swizzle::None => rows * k_bytes,
            s => rows * s.row_bytes() * k_bytes.div_ceil(s.row_bytes()),
        }
    }

    /// The 64-bit descriptor for a tile whose base is at shared-memory address `base` (PTX ISA: bits 0–13
    /// start >> 4, 16–29 LBO >> 4, 32–45 SBO >> 4, 49–51 base offset = 0, 62–63 swizzle).
    pub fn encode(&self, base: u32) -> u64 {
        let f = |v: u32| ((v >> 4) & 0x3FFF) as u64;
        f(base + self.start)
            | f(self.lbo) << 16
            | f(self.sbo) << 32
            | self.swizzle.mode_bits() << 62
    }

    /// The byte, from the aligned base, that the instruction reads for (row, byte `kb` of this K-step).
    pub fn byte_of(&self, row: u32, kb: u32) -> u32 {
        debug_assert!(kb < 32);
        match self.swizzle {
            Swizzle::None => {
                self.start + (row / 8) * self.sbo + (kb / 16) * self.lbo + (row % 8) * 16 + kb % 16
            }
            s => s.apply(self.start + (row / 8) * self.sbo + (row % 8) * s.row_bytes() + kb),
        }
    }
}

/// Which operand of the instruction reads shared memory: A (64 rows of M) or B (N rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SmemOperand {
    A,
    B,
}

/// One shared-memory operand layout: operand, element type, swizzle, rows, and the K-step addressed within a
/// tile of `k_bytes` (steps past the first move the start address, the classic place for an off-by-32 bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmemLayoutId {
    pub operand: SmemOperand,
    pub dtype: DType,
    pub swizzle: Swizzle,
    pub rows: u32,
    pub k_bytes: u32,
    pub step: u32,
}

/// Every shared-memory layout probed: B (N = 64) and A (M = 64) for each swizzle, at K-step 0 of a tile one
/// swizzle width wide (64 bytes for none), and B at every further K-step.
pub fn smem_layouts() -> Vec<SmemLayoutId> {
    let mut v = Vec::new();
    for dtype in [DType::E4m3, DType::F16] {
        for swizzle in Swizzle::ALL {
            let k_bytes = swizzle.row_bytes().max(64);
            for operand in [SmemOperand::B, SmemOperand::A] {
                let steps = if operand == SmemOperand::B {
                    k_bytes / 32
                } else {
                    1
                };
                for step in 0..steps {
                    v.push(SmemLayoutId {
                        operand,
                        dtype,
                        swizzle,
                        rows: 64,
                        k_bytes,
                        step,
                    });
                }
            }
        }
    }
    v
}

impl SmemLayoutId {
    pub fn elem_bytes(&self) -> u32 {
        match self.dtype {
            DType::F16 | DType::Bf16 => 2,
            _ => 1,
        }
    }

    /// Elements of K one instruction reads: 32 bytes.
    pub fn k_elems(&self) -> u32 {
        32 / self.elem_bytes()
    }

    pub fn desc(&self) -> Desc {
        Desc::k_major(self.swizzle, self.rows, self.k_bytes, self.step)
    }

    /// Bytes the tile occupies (what the probe fills).
    pub fn tile_bytes(&self) -> u32 {
        Desc::tile_bytes(self.swizzle, self.rows, self.k_bytes)
    }

    /// `wgmma_smem__b__e4m3__sw128__r64__k128__step1`
    pub fn key(&self) -> String {
        format!(
            "wgmma_smem__{}__{}__{}__r{}__k{}__step{}",
            match self.operand {
                SmemOperand::A => "a",
                SmemOperand::B => "b",
            },
            self.dtype.name(),
            self.swizzle.name(),
            self.rows,
            self.k_bytes,
            self.step
        )
    }

    /// The model's table: every (row, k element) → the byte offset of its first byte.
    pub fn model(&self) -> SmemLayout {
        let d = self.desc();
        let mut entries = BTreeMap::new();
        for row in 0..self.rows {
            for k in 0..self.k_elems() {
                entries.insert((row, k), d.byte_of(row, k * self.elem_bytes()));
            }
        }
        SmemLayout { id: *self, entries }
    }
}

impl fmt::Display for SmemLayoutId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key())
    }
}

/// A shared-memory layout as data: (row, k element) → byte offset from the aligned base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmemLayout {
    pub id: SmemLayoutId,
    pub entries: BTreeMap<(u32, u32), u32>,
}

impl SmemLayout {
    /// Differences, cell by cell, as lines naming the cell and both bytes.
    pub fn diff(&self, other: &SmemLayout) -> Vec<String> {
        let mut d = Vec::new();
        for (cell, b) in &self.entries {
            match other.entries.get(cell) {
                Some(b2) if b2 == b => {}
                Some(b2) => d.push(format!(
                    "(row {}, k {}): byte {b} here, {b2} there",
                    cell.0, cell.1
                )),
                None => d.push(format!("(row {}, k {}): absent there", cell.0, cell.1)),
            }
        }
        for cell in other.entries.keys() {
            if !self.entries.contains_key(cell) {
                d.push(format!("(row {}, k {}): absent here", cell.0, cell.1));
            }
        }
        d
    }

    /// No two cells read the same bytes, and every byte read lies in the tile.
    pub fn check_injective(&self) -> Result<(), String> {
        let eb = self.id.elem_bytes();
        let mut seen = BTreeMap::new();
        for (cell, &b) in &self.entries {
            if b + eb > self.id.tile_bytes() {
                return Err(format!(
                    "{}: {cell:?} reads byte {b}, past the tile",
                    self.id
                ));
            }
            if !b.is_multiple_of(eb) {
                return Err(format!("{}: {cell:?} reads misaligned byte {b}", self.id));
            }
            if let Some(prev) = seen.insert(b, *cell) {
                return Err(format!(
                    "{}: {prev:?} and {cell:?} both read byte {b}",
                    self.id
                ));
            }
        }
        Ok(())
    }

    /// The grid a reviewer reads: rows × K elements, each cell the byte offset it is read from.
    pub fn draw(&self) -> String {
        let d = self.id.desc();
        let mut s = format!(
            "{} — {} rows × {} {} elements (32 bytes of K); descriptor start {} B, LBO {} B, SBO {} B, swizzle {}; \
             cell = byte offset from the {}-byte-aligned tile base\n",
            self.id,
            self.id.rows,
            self.id.k_elems(),
            self.id.dtype.name(),
            d.start,
            d.lbo,
            d.sbo,
            d.swizzle.name(),
            d.swizzle.repeat_bytes().max(128)
        );
        let w = self
            .entries
            .values()
            .map(|b| b.to_string().len())
            .max()
            .unwrap_or(1)
            .max(3);
        s.push_str(&format!("{:>4} ", ""));
        for k in 0..self.id.k_elems() {
            s.push_str(&format!(" {:>w$}", format!("k{k}")));
        }
        s.push('\n');
        for row in 0..self.id.rows {
            s.push_str(&format!("{:>4} ", format!("r{row}")));
            for k in 0..self.id.k_elems() {
                let cell = self
                    .entries
                    .get(&(row, k))
                    .map_or("?".to_string(), |b| b.to_string());
                let _ = write!(s, " {cell:>w$}");
            }
            s.push('\n');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_layout_is_injective_and_inside_its_tile() {
        for id in smem_layouts() {
            id.model().check_injective().unwrap();
        }
    }

    #[test]
    fn encoding_matches_the_ptx_field_positions() {
        let d = Desc {
            start: 0x40,
            lbo: 16,
            sbo: 1024,
            swizzle: Swizzle::B128,
        };
        let e = d.encode(0x400);
        assert_eq!(e & 0x3FFF, (0x440 >> 4) as u64);
        assert_eq!((e >> 16) & 0x3FFF, 1);
        assert_eq!((e >> 32) & 0x3FFF, 64);
        assert_eq!(e >> 62, 1);
        assert_eq!(
            Desc {
                swizzle: Swizzle::B32,
                ..d
            }
            .encode(0)
                >> 62,
            3
        );
    }

    #[test]
    fn swizzle_permutes_16_byte_chunks_within_a_row_group() {
        for s in Swizzle::ALL {
            let w = s.row_bytes();
            for row in 0..8u32 {
                let mut chunks: Vec<u32> = (0..w / 16)
                    .map(|c| (s.apply(row * w + c * 16) - row * w) / 16)
                    .collect();
                chunks.sort();
                assert_eq!(chunks, (0..w / 16).collect::<Vec<_>>(), "{s:?} row {row}");
            }
        }
        // 128B: row 1's chunk 0 lands in chunk 1, row 7's in chunk 7.
        assert_eq!(Swizzle::B128.apply(128), 128 + 16);
        assert_eq!(Swizzle::B128.apply(7 * 128), 7 * 128 + 7 * 16);
    }

    #[test]
    fn later_k_steps_read_the_bytes_next_to_the_first() {
        // Without swizzle, K-step 1 of a 64-byte tile reads the core matrices 2·LBO further on.
        let d0 = Desc::k_major(Swizzle::None, 64, 64, 0);
        let d1 = Desc::k_major(Swizzle::None, 64, 64, 1);
        assert_eq!(d1.byte_of(0, 0), d0.byte_of(0, 0) + 2 * d0.lbo);
        // 128B swizzle: step 1 of row 0 reads logical bytes 32..64 of the row, unswizzled for row 0.
        let s1 = Desc::k_major(Swizzle::B128, 64, 128, 1);
        assert_eq!(s1.byte_of(0, 0), 32);
        assert_eq!(s1.byte_of(1, 0), Swizzle::B128.apply(128 + 32));
    }
}
