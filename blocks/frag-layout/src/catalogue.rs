// Layouts as data for people and tools: the JSON catalogue, SVG pictures, and static_asserts for the header.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{
    ARCHS, LAYOUTS, Layout, LayoutId, Operand, PROBED_ARCH, QUAD_XOR_MASKS, row_owners,
};

/// One layout of one architecture, as `cargo xtask layouts --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub arch: String,
    pub op: String,
    pub operand: String,
    pub dtype: String,
    /// "probed" where the device tests compare this exact table with the hardware on every GPU run (sm_90);
    /// "model" where no such hardware is at hand.
    pub source: String,
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
            op: layout.id.op_name().into(),
            operand: layout.id.operand_name().into(),
            dtype: layout.id.dtype.name().into(),
            source: if arch == PROBED_ARCH {
                "probed"
            } else {
                "model"
            }
            .into(),
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
    for id in LAYOUTS.iter().filter(|l| l.operand == Operand::Acc) {
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
