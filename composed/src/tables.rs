// Host→device tables as typed `#[repr(C)]` structs, each mirrored field for field by a struct in a header.
//
// `Params` is `sdpa::Params` (sdpa_common.cuh), the argument every stage kernel takes; `SplitHead`, `SplitPart` and
// `MergeList` are the pieces of stage 7's split-tail table (`sdpa::SplitTable`, pingpong_schedule.cuh) that sits in
// the schedule's buffer at `Params::sched`. `LAYOUTS` lists every field's offset as Rust lays it out; the GPU test
// `tables::layouts_match_the_headers` compares it with the offsets a kernel (`cuda/layouts.cu`) writes, so a field
// added, dropped or moved on one side only fails before any stage reads a wrong value.
use fixtures::OutDtype;
use lab::cudarc::driver::DeviceRepr;
use lab::{Arch, Budget, KernelSpec, Source};

/// `sdpa::Params`: E4M3 Q, K, V in [B, H, S, D] with per-(b, h) scales; O in `o_dtype`, LSE in f32; the launch's
/// geometry and schedule. Pointers are device addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Params {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub v_scale: u64,
    pub o: u64,
    pub lse: u64,
    pub sq: i32,
    pub sk: i32,
    pub softmax_scale: f32,
    /// `sdpa::OutDtype` ([`out_dtype_code`]).
    pub o_dtype: i32,
    pub causal: i32,
    /// Query heads per K/V head.
    pub group: i32,
    /// Query rows a block (or a work unit of stage 7).
    pub q_rows: i32,
    /// Query tiles of `q_rows` a head.
    pub q_tiles: i32,
    /// Work units of a persistent grid: heads · q_tiles.
    pub work: i32,
    /// Heads a section of causal stage 7's schedule.
    pub section: i32,
    /// Vᵀ as tile images (stage 7 at D = 128), or 0.
    pub vt_tiles: u64,
    /// Stage 7's schedule buffer: a [`SplitHead`], then the rest of the [`SplitTable`].
    pub sched: u64,
}
// SAFETY: plain integers and a float, laid out as sdpa::Params (checked against the header by the layouts test).
unsafe impl DeviceRepr for Params {}

/// The value of `sdpa::OutDtype` for `d`.
pub fn out_dtype_code(d: OutDtype) -> i32 {
    match d {
        OutDtype::F16 => 0,
        OutDtype::Bf16 => 1,
        OutDtype::F32 => 2,
    }
}

/// `sdpa::SplitHead`: the start of stage 7's schedule buffer. `counter` and `done` are the persistent grid's unit
/// counter and count of blocks done with it (zero before a launch; the last block done zeroes them again);
/// `split` is the first unit of the split tail, `pieces` how many pieces it is cut into (0: no split);
/// `parts_at` and `merged_at` are the word offsets of the parts and merge lists in the buffer; `taken` is 1 where the
/// persistent blocks take the pieces from the counter after the whole units, which they take from it too (0: each
/// block is dealt its whole units and then piece `blockIdx.x`). The pieces' first parts (`pieces + 1` words) follow
/// the head.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitHead {
    pub counter: i32,
    pub done: i32,
    pub split: i32,
    pub pieces: i32,
    pub parts_at: i32,
    pub merged_at: i32,
    pub taken: i32,
    pub reserved: i32,
}

/// `sdpa::SplitPart` (read as an int4): key tiles `k0 .. k0 + tiles` of `unit`, written to virtual unit `dst`;
/// `tiles` and `dst` −1 for a whole unit written to its own rows.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitPart {
    pub unit: i32,
    pub k0: i32,
    pub tiles: i32,
    pub dst: i32,
}

impl SplitPart {
    pub fn whole(unit: i32) -> SplitPart {
        SplitPart {
            unit,
            k0: 0,
            tiles: -1,
            dst: -1,
        }
    }
}

/// Parts a split unit may be cut into at most (`sdpa::kMaxParts`).
pub const MAX_PARTS: usize = 4;

/// `sdpa::MergeList`: a split unit's parts (0: the unit ran whole, nothing to merge) and their virtual units.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeList {
    pub parts: i32,
    pub dst: [i32; 7],
}

impl MergeList {
    /// Adds a part's virtual unit.
    pub fn push(&mut self, v: i32) {
        let n = self.parts as usize;
        assert!(n < self.dst.len(), "a unit split into more than 7 parts");
        self.dst[n] = v;
        self.parts += 1;
    }
    /// A unit in one part ran whole: nothing to merge.
    pub fn keep_if_split(&mut self) {
        if self.parts < 2 {
            *self = MergeList::default();
        }
    }
    /// The parts' virtual units.
    pub fn dsts(&self) -> &[i32] {
        &self.dst[..self.parts as usize]
    }
}

/// Stage 7's split-tail table, as typed parts; [`SplitTable::words`] lays it out as the device reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitTable {
    pub head: SplitHead,
    /// Piece q's parts are `parts[first[q] .. first[q + 1]]`.
    pub first: Vec<i32>,
    pub parts: Vec<SplitPart>,
    /// Per split unit, in unit order.
    pub merged: Vec<MergeList>,
}

const WORDS_OF_HEAD: usize = size_of::<SplitHead>() / 4;

impl SplitTable {
    /// The table of a plan's pieces, parts and merge lists; the head's offsets computed (parts 16-byte aligned).
    /// `taken`: the pieces are taken from the counter, not dealt.
    pub fn new(
        split: i32,
        pieces: i32,
        taken: bool,
        first: Vec<i32>,
        parts: Vec<SplitPart>,
        merged: Vec<MergeList>,
    ) -> SplitTable {
        let parts_at = (WORDS_OF_HEAD + first.len()).next_multiple_of(4);
        let merged_at = parts_at + 4 * parts.len();
        SplitTable {
            head: SplitHead {
                split,
                pieces,
                taken: i32::from(taken),
                parts_at: parts_at as i32,
                merged_at: merged_at as i32,
                ..SplitHead::default()
            },
            first,
            parts,
            merged,
        }
    }

    /// The buffer's words: the head, the first parts, padding to the parts, the parts, the merge lists.
    pub fn words(&self) -> Vec<i32> {
        let h = &self.head;
        let mut w = vec![
            h.counter,
            h.done,
            h.split,
            h.pieces,
            h.parts_at,
            h.merged_at,
            h.taken,
            h.reserved,
        ];
        debug_assert_eq!(w.len(), WORDS_OF_HEAD);
        w.extend(&self.first);
        w.resize(h.parts_at as usize, 0);
        for p in &self.parts {
            w.extend([p.unit, p.k0, p.tiles, p.dst]);
        }
        for m in &self.merged {
            w.push(m.parts);
            w.extend(m.dst);
        }
        w
    }
}

/// A table's layout as Rust has it: its name, its size, and each field's name and offset, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub table: &'static str,
    pub size: usize,
    pub fields: Vec<(&'static str, usize)>,
}

macro_rules! layout {
    ($t:ident, $name:literal, [$($f:ident),* $(,)?]) => {
        Layout {
            table: $name,
            size: size_of::<$t>(),
            fields: vec![$((stringify!($f), std::mem::offset_of!($t, $f))),*],
        }
    };
}

/// Every host→device table, in the order `cuda/layouts.cu` writes them: per table its size, then each field's
/// offset.
pub fn layouts() -> Vec<Layout> {
    vec![
        layout!(
            Params,
            "sdpa::Params",
            [
                q,
                k,
                v,
                q_scale,
                k_scale,
                v_scale,
                o,
                lse,
                sq,
                sk,
                softmax_scale,
                o_dtype,
                causal,
                group,
                q_rows,
                q_tiles,
                work,
                section,
                vt_tiles,
                sched,
            ]
        ),
        layout!(
            SplitHead,
            "sdpa::SplitHead",
            [
                counter, done, split, pieces, parts_at, merged_at, taken, reserved
            ]
        ),
        layout!(SplitPart, "sdpa::SplitPart", [unit, k0, tiles, dst]),
        layout!(MergeList, "sdpa::MergeList", [parts, dst]),
    ]
}

/// `sdpa_layouts(int* out)`: one thread writes [`layouts`]' sizes and offsets as the headers have them.
pub const LAYOUTS: KernelSpec = KernelSpec {
    block: "composed",
    name: "sdpa_layouts",
    source: &Source {
        file: "layouts.cu",
        code: include_str!("../cuda/layouts.cu"),
        headers: crate::stages::BLOCK_HEADERS,
    },
    budget: Budget::new(32, 0),
    archs: &[Arch::Sm90a],
    sass: &[],
};

/// The words `sdpa_layouts` writes if the headers agree with Rust: per table its size, then its fields' offsets.
pub fn expected_layout_words() -> Vec<i32> {
    layouts()
        .iter()
        .flat_map(|l| std::iter::once(l.size).chain(l.fields.iter().map(|f| f.1)))
        .map(|x| x as i32)
        .collect()
}

/// Where the device's words differ from Rust's layouts, by table and field (empty: they agree).
pub fn layout_differences(device: &[i32]) -> Vec<String> {
    let mut out = vec![];
    let mut i = 0;
    for l in layouts() {
        let names = std::iter::once("sizeof").chain(l.fields.iter().map(|f| f.0));
        let want = std::iter::once(l.size).chain(l.fields.iter().map(|f| f.1));
        for (name, want) in names.zip(want) {
            match device.get(i) {
                Some(&d) if d as usize == want => {}
                got => out.push(format!(
                    "{}.{name}: Rust {want}, the header {got:?}",
                    l.table
                )),
            }
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_is_the_size_the_header_declares() {
        // 8 pointers, 10 four-byte fields, 2 pointers: no padding anywhere.
        assert_eq!(size_of::<Params>(), 8 * 8 + 10 * 4 + 2 * 8);
        assert_eq!(size_of::<SplitHead>(), 32);
        assert_eq!(size_of::<SplitPart>(), 16);
        assert_eq!(size_of::<MergeList>(), 32);
    }

    #[test]
    fn layouts_list_every_field_in_order() {
        for l in layouts() {
            let offsets: Vec<usize> = l.fields.iter().map(|f| f.1).collect();
            assert!(offsets.is_sorted(), "{}: fields out of order", l.table);
            assert_eq!(offsets[0], 0, "{}", l.table);
            assert!(*offsets.last().unwrap() < l.size, "{}", l.table);
        }
    }

    #[test]
    fn words_put_each_part_where_the_head_says() {
        let mut m = MergeList::default();
        m.push(40);
        m.push(41);
        let t = SplitTable::new(
            3,
            2,
            true,
            vec![0, 1, 2],
            vec![
                SplitPart {
                    unit: 3,
                    k0: 0,
                    tiles: 2,
                    dst: 40,
                },
                SplitPart {
                    unit: 3,
                    k0: 2,
                    tiles: 2,
                    dst: 41,
                },
            ],
            vec![m],
        );
        let w = t.words();
        assert_eq!(&w[..8], &[0, 0, 3, 2, 12, 20, 1, 0]);
        assert_eq!(&w[8..11], &[0, 1, 2]);
        assert_eq!(&w[12..16], &[3, 0, 2, 40]);
        assert_eq!(&w[20..23], &[2, 40, 41]);
        assert_eq!(w.len(), 28);
    }
}
