// Layouts as data for people and tools: the JSON catalogue, SVG pictures, and static_asserts for the header.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{
    ARCHS, LAYOUTS, Layout, LayoutId, Operand, QUAD_XOR_MASKS, is_probed, row_owners,
};
use crate::smem::{Desc, SmemLayout, smem_layouts};

/// One layout of one architecture, as `cargo xtask layouts --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub arch: String,
    pub op: String,
    pub operand: String,
    pub dtype: String,
    /// "probed" where the device tests compare this exact table with the hardware on every GPU run (sm_90,
    /// sm_90a); "model" where no such hardware is at hand.
    pub source: String,
    /// Threads that hold the fragment: 32 (a warp) or 128 (a wgmma warpgroup, `lane` = 32·warp + lane).
    pub threads: u32,
    /// `[lane, reg, row, col]`, sorted by lane then reg.
    pub entries: Vec<[u32; 4]>,
}

impl Record {
    pub fn new(arch: lab::Arch, layout: &Layout) -> Self {
        let mut entries: Vec<[u32; 4]> = layout
            .entries
            .iter()
            .map(|e| [e.lane, e.reg, e.row, e.col])
            .collect();
        entries.sort();
        Record {
            arch: arch.name().into(),
            op: layout.id.op_name(),
            operand: layout.id.operand_name().into(),
            dtype: layout.id.dtype.name().into(),
            source: if is_probed(arch) { "probed" } else { "model" }.into(),
            threads: layout.id.threads(),
            entries,
        }
    }
}

/// Every layout of every recorded architecture on which the instruction exists.
pub fn catalogue() -> Vec<Record> {
    let mut v = Vec::new();
    for arch in ARCHS {
        for id in LAYOUTS.iter().filter(|l| l.exists_on(arch)) {
            v.push(Record::new(arch, &id.model()));
        }
    }
    v
}

/// One wgmma shared-memory operand layout, as `cargo xtask layouts --json` prints it under `smem`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SmemRecord {
    pub arch: String,
    pub key: String,
    pub operand: String,
    pub dtype: String,
    pub swizzle: String,
    pub rows: u32,
    pub k_bytes: u32,
    pub step: u32,
    pub desc: Desc,
    /// "probed": the device tests compare this exact table with the hardware on every GPU run.
    pub source: String,
    /// `[row, k, byte]`: element k of row `row` is read from this byte of the tile.
    pub entries: Vec<[u32; 3]>,
}

impl SmemRecord {
    pub fn new(l: &SmemLayout) -> Self {
        SmemRecord {
            arch: "sm_90a".into(),
            key: l.id.key(),
            operand: format!("{:?}", l.id.operand).to_lowercase(),
            dtype: l.id.dtype.name().into(),
            swizzle: l.id.swizzle.name().into(),
            rows: l.id.rows,
            k_bytes: l.id.k_bytes,
            step: l.id.step,
            desc: l.id.desc(),
            source: "probed".into(),
            entries: l.entries.iter().map(|(&(r, k), &b)| [r, k, b]).collect(),
        }
    }
}

/// Every wgmma shared-memory layout the lab records, from the model (which the device probes equal).
pub fn smem_catalogue() -> Vec<SmemRecord> {
    smem_layouts()
        .iter()
        .map(|id| SmemRecord::new(&id.model()))
        .collect()
}

/// A picture of a shared-memory layout: rows × K elements, each cell its byte offset, coloured by the 16-byte
/// chunk of its 128-byte line (a bank group), so a conflict-free swizzle shows as a diagonal rainbow.
pub fn smem_svg(l: &SmemLayout) -> String {
    let (rows, cols) = (l.id.rows, l.id.k_elems());
    let (cw, ch, x0, y0) = (40u32, 16u32, 36u32, 44u32);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="monospace" font-size="10">"#,
        x0 + cols * cw + 8,
        y0 + rows * ch + 8
    );
    let _ = writeln!(
        s,
        r#"<text x="4" y="16" font-size="13">{} — cell = byte, colour = 16-byte chunk of its 128-byte line</text>"#,
        l.id
    );
    for c in 0..cols {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">k{c}</text>"#,
            x0 + c * cw + cw / 2,
            y0 - 6
        );
    }
    for r in 0..rows {
        let _ = writeln!(s, r#"<text x="4" y="{}">r{r}</text>"#, y0 + r * ch + 12);
        for c in 0..cols {
            let b = l.entries.get(&(r, c)).copied().unwrap_or(0);
            let (x, y) = (x0 + c * cw, y0 + r * ch);
            let _ = writeln!(
                s,
                r##"<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="hsl({},65%,80%)" stroke="#333"/><text x="{}" y="{}" text-anchor="middle">{b}</text>"##,
                (b / 16 % 8) * 45,
                x + cw / 2,
                y + 12
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// A picture of one layout, cells coloured by lane and labelled `lane.reg`, as CuTe's print_svg draws them.
pub fn svg(layout: &Layout) -> String {
    let (rows, cols) = layout.id.shape();
    let inv = layout.inverse();
    let m = layout.id.multiplicity().max(1);
    let (cw, ch) = (46u32, 18 + 14 * m);
    let (x0, y0) = (36u32, 44u32);
    let (w, h) = (x0 + cols * cw + 8, y0 + rows * ch + 8);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="4" y="16" font-size="13">{} — cell = lane.reg, colour = lane</text>"#,
        layout.id
    );
    for c in 0..cols {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">c{c}</text>"#,
            x0 + c * cw + cw / 2,
            y0 - 6
        );
    }
    for r in 0..rows {
        let _ = writeln!(
            s,
            r#"<text x="4" y="{}">r{r}</text>"#,
            y0 + r * ch + ch / 2 + 4
        );
        for c in 0..cols {
            let slots = inv.get(&(r, c)).cloned().unwrap_or_default();
            let lane = slots.first().map_or(0, |s| s.0);
            let (x, y) = (x0 + c * cw, y0 + r * ch);
            let _ = writeln!(
                s,
                r##"<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="hsl({},65%,82%)" stroke="#333"/>"##,
                lane * 360 / 32
            );
            for (k, (l, i)) in slots.iter().enumerate() {
                let _ = writeln!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="middle">{l}.{i}</text>"#,
                    x + cw / 2,
                    y + 15 + 14 * k as u32
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// CUDA source that `static_assert`s every entry of the model against `frag_layout.cuh`, and the row-ownership
/// helpers against [`row_owners`]: compiling it (NVRTC, no GPU) proves the header and the model agree.
pub fn header_checks() -> String {
    let mut s = String::from(
        "// Generated from the Rust model by frag_layout::header_checks().\n#include \"frag_layout.cuh\"\n",
    );
    let mut per_fn: BTreeMap<&str, &LayoutId> = BTreeMap::new();
    for id in LAYOUTS {
        per_fn.entry(id.header_fn()).or_insert(id);
    }
    for (f, id) in per_fn {
        for e in id.model().entries {
            let _ = writeln!(
                s,
                "static_assert({f}_row({l}, {i}) == {r} && {f}_col({l}, {i}) == {c}, \"{f} lane {l} x[{i}]: the model says ({r}, {c})\");",
                l = e.lane,
                i = e.reg,
                r = e.row,
                c = e.col
            );
        }
    }
    for id in LAYOUTS
        .iter()
        .filter(|l| l.operand == Operand::Acc && l.is_wgmma())
        .take(1)
    {
        let layout = id.model();
        for row in 0..id.shape().0 {
            let o = row_owners(&layout, row);
            let _ = writeln!(
                s,
                "static_assert(frag::wgmma_quad_base({row}) == {}, \"{id}: row {row} quad\");",
                o.lanes[0]
            );
        }
    }
    for id in LAYOUTS
        .iter()
        .filter(|l| l.operand == Operand::Acc && !l.is_wgmma())
    {
        let layout = id.model();
        let (rows, _) = id.shape();
        for row in 0..rows {
            let o = row_owners(&layout, row);
            let _ = writeln!(
                s,
                "static_assert(frag::acc_quad_base({row}) == {}, \"{id}: row {row} quad\");",
                o.lanes[0]
            );
            for &lane in &o.lanes {
                for &reg in &o.regs {
                    let _ = writeln!(
                        s,
                        "static_assert(frag::acc_row({lane}, frag::acc_half({reg})) == {row}, \"{id}: lane {lane} x[{reg}] is in row {row}\");"
                    );
                }
            }
        }
    }
    for (tag, f) in [
        ("frag::WmmaAcc", "frag::wmma_acc"),
        ("frag::MmaC", "frag::mma_c"),
    ] {
        let _ = writeln!(
            s,
            "static_assert({tag}::row(5, 3) == {f}_row(5, 3) && {tag}::col(5, 3) == {f}_col(5, 3), \"{tag} is {f}\");"
        );
    }
    for (k, m) in QUAD_XOR_MASKS.iter().enumerate() {
        let _ = writeln!(
            s,
            "static_assert(frag::kQuadXorMasks[{k}] == {m}, \"quad shuffle mask {k}\");"
        );
    }
    s
}
