// `sdpa trace`: a timeline of stage 7's consumer warps (clock64 at each turn's marks), and what it says of a unit.
use anyhow::{Context, Result, ensure};

use crate::{OnDevice, Stage};

/// Blocks whose consumer warps are traced, and marks kept a warp.
pub const TRACE_BLOCKS: usize = 4;
pub const TRACE_CAP: usize = 16384;

/// pingpong_attention.cuh's marks (`enum Mark`), in the low 4 bits of each stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Turn = 1,
    Issued = 2,
    Softmax = 3,
    SoftmaxEnd = 4,
    Unit = 5,
    EpilogueEnd = 6,
    /// A unit's last P·V committed (its last turn), before consumer 1 asks the producer for the next unit.
    LastCommit = 7,
    /// A unit's Q landed, its first key tile landed (both before its first grant), its last P·V retired (its
    /// epilogue's start).
    QReady = 8,
    TileReady = 9,
    OReady = 10,
}

impl Mark {
    fn from_bits(b: u64) -> Option<Mark> {
        Some(match b {
            1 => Mark::Turn,
            2 => Mark::Issued,
            3 => Mark::Softmax,
            4 => Mark::SoftmaxEnd,
            5 => Mark::Unit,
            6 => Mark::EpilogueEnd,
            7 => Mark::LastCommit,
            8 => Mark::QReady,
            9 => Mark::TileReady,
            10 => Mark::OReady,
            _ => return None,
        })
    }
}

/// Stage 7's source with the marks on: lane 0 of each consumer warp of the first TRACE_BLOCKS blocks writes
/// clock64 (its low 4 bits the mark) to `sdpa_trace`, TRACE_CAP stamps a warp. Made once a process: kernel
/// sources are `'static`.
fn prelude() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        format!(
            r#"#define SDPA_TRACE_MARKS
__device__ unsigned long long sdpa_trace[{blocks} * 8 * {cap}];
namespace sdpa {{
struct Marks {{
  unsigned long long* out = nullptr;
  int n = 0;
  __device__ Marks() {{
    if (blockIdx.x < {blocks} && threadIdx.x % 32 == 0)
      out = sdpa_trace + (blockIdx.x * 8 + (threadIdx.x - 128) / 32) * {cap};
  }}
  template <class M>
  __device__ void operator()(M m) {{
    if (out != nullptr && n < {cap}) out[n++] = ((unsigned long long)clock64() & ~15ull) | unsigned(m);
  }}
}};
}}  // namespace sdpa
#include "pingpong_attention.cuh""#,
            blocks = TRACE_BLOCKS,
            cap = TRACE_CAP
        )
    })
}

/// Stage 7 at head dimension `d` with its timeline marks on.
pub fn traced_kernel(d: usize) -> Result<lab::KernelSpec> {
    Stage::S7
        .kernel(d)
        .mutated_source("#include \"pingpong_attention.cuh\"", prelude())
}

/// One consumer warp's stamps: (cycle, mark), in order.
#[derive(Clone, Debug, Default)]
pub struct WarpLine {
    pub block: usize,
    pub warp: usize,
    pub marks: Vec<(u64, Mark)>,
}

/// Launches `d`'s problem once with the traced kernel (after `warmup` launches of it, whose stamps are cleared)
/// and reads the consumer warps' timelines back.
pub fn record(
    gpu: &lab::Gpu,
    d: &mut OnDevice,
    head_dim: usize,
    warmup: usize,
) -> Result<Vec<WarpLine>> {
    let spec = traced_kernel(head_dim)?;
    d.use_kernel(Some(spec));
    for _ in 0..warmup {
        d.launch(gpu, Stage::S7)?;
    }
    let k = gpu.load(&spec)?;
    let st = gpu.stream.clone();
    {
        let mut buf = k.module.get_global("sdpa_trace", &st)?;
        st.memset_zeros(&mut buf)?;
    }
    d.launch(gpu, Stage::S7)?;
    st.synchronize()?;
    let buf = k.module.get_global("sdpa_trace", &st)?;
    let bytes = st
        .clone_dtoh(&buf)
        .context("reading the trace buffer back")?;
    d.use_kernel(None);
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    ensure!(
        words.len() == TRACE_BLOCKS * 8 * TRACE_CAP,
        "trace buffer of {} words",
        words.len()
    );
    Ok(parse(&words))
}

/// The buffer's stamps per warp (a zero word ends a warp's line).
pub fn parse(words: &[u64]) -> Vec<WarpLine> {
    words
        .chunks(TRACE_CAP)
        .enumerate()
        .map(|(i, w)| WarpLine {
            block: i / 8,
            warp: i % 8,
            marks: w
                .iter()
                .take_while(|&&x| x != 0)
                .filter_map(|&x| Mark::from_bits(x & 15).map(|m| (x & !15, m)))
                .collect(),
        })
        .filter(|l| !l.marks.is_empty())
        .collect()
}

/// Per turn of one warp: the cycle it got the turn, handed over, started and ended its softmax (turns with no
/// softmax, a unit's last, have none), and whether it began or ended a unit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Turn {
    pub granted: u64,
    pub issued: u64,
    /// A last turn's P·V committed (before the handover, which consumer 1 makes once it knows the next unit).
    pub committed: Option<u64>,
    /// A last turn's epilogue end.
    pub epilogue_end: Option<u64>,
    pub softmax: Option<(u64, u64)>,
    pub first: bool,
    pub last: bool,
    /// A first turn's unit start, Q's landing and its first key tile's, before the grant.
    pub unit: Option<u64>,
    pub q_ready: Option<u64>,
    pub tile_ready: Option<u64>,
    /// A last turn's last P·V retired (the epilogue's start).
    pub o_ready: Option<u64>,
}

/// A warp's marks as turns; None if they are not in the order the kernel makes them.
pub fn turns(line: &WarpLine) -> Option<Vec<Turn>> {
    let mut out: Vec<Turn> = Vec::new();
    // A unit's marks before its first grant: its start, Q's landing, its first key tile's.
    let mut ahead = Turn::default();
    let mut it = line.marks.iter().peekable();
    while let Some(&(t, m)) = it.next() {
        match m {
            Mark::Unit => ahead.unit = Some(t),
            Mark::QReady => ahead.q_ready = Some(t),
            Mark::TileReady => ahead.tile_ready = Some(t),
            Mark::Turn => {
                let a = std::mem::take(&mut ahead);
                out.push(Turn {
                    granted: t,
                    first: a.unit.is_some(),
                    ..a
                })
            }
            Mark::OReady => out.last_mut()?.o_ready = Some(t),
            Mark::Issued => out.last_mut()?.issued = t,
            Mark::Softmax => {
                let &(e, m2) = it.next()?;
                if m2 != Mark::SoftmaxEnd {
                    return None;
                }
                out.last_mut()?.softmax = Some((t, e));
            }
            Mark::SoftmaxEnd => return None,
            Mark::EpilogueEnd => {
                let x = out.last_mut()?;
                x.last = true;
                x.epilogue_end = Some(t);
            }
            Mark::LastCommit => out.last_mut()?.committed = Some(t),
        }
    }
    Some(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What the timeline says, in cycles (medians over the traced warps): a middle turn's period and its parts, the
/// units' cost beyond their key tiles, and how far apart the two consumers' turns are.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub warps: usize,
    pub units: usize,
    /// Grant to grant of consecutive turns inside a unit.
    pub period: f64,
    /// Softmax end to the next turn's grant (waiting for the other consumer's handover).
    pub wait_turn: f64,
    /// Grant to handover (the GEMM issue).
    pub issue: f64,
    /// Handover to softmax start (waiting for Q·Kᵀ).
    pub wait_qk: f64,
    pub softmax: f64,
    /// A unit's first grant to the next unit's first grant, less its key tiles × period.
    pub unit_extra: f64,
    /// Of that: the last turn's grant to the next unit's first grant (last P·V, epilogue, next Q·Kᵀ turn).
    pub boundary: f64,
    /// Consumer 1's grant after consumer 0's, over the period (0.5: evenly interleaved).
    pub phase: f64,
    /// Per consumer (0, 1), in a unit's last turn: grant to the last P·V's commit, commit to handover (consumer
    /// 1 first learns whether the block has a next unit), handover to the epilogue's end (P·V's wait, epilogue).
    pub last_commit: [f64; 2],
    pub last_ask: [f64; 2],
    pub last_epilogue: [f64; 2],
    /// Per consumer, a unit boundary's parts in order (`BOUNDARY_PARTS`): from the last turn's handover to the next
    /// unit's first grant.
    pub boundary_parts: [[f64; 6]; 2],
}

/// The parts of a unit boundary, as `Summary::boundary_parts` holds them.
pub const BOUNDARY_PARTS: [&str; 6] = [
    "handover to O ready (the last P·V's wait)",
    "O ready to epilogue end",
    "epilogue end to the next unit",
    "unit start to Q ready",
    "Q ready to first tile ready",
    "tile ready to grant",
];

/// A boundary's parts (BOUNDARY_PARTS) between last turn `a` and the next unit's first turn `b`; None if a mark is
/// missing or out of order.
fn boundary_parts(a: &Turn, b: &Turn) -> Option<[u64; 6]> {
    let at = [
        a.issued,
        a.o_ready?,
        a.epilogue_end?,
        b.unit?,
        b.q_ready?,
        b.tile_ready?,
        b.granted,
    ];
    let mut out = [0; 6];
    for i in 0..6 {
        out[i] = at[i + 1].checked_sub(at[i])?;
    }
    Some(out)
}

pub fn summarize(lines: &[WarpLine]) -> Result<Summary> {
    let mut s = Summary::default();
    let (mut period, mut wait_turn, mut issue, mut wait_qk, mut softmax) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut unit_extra, mut boundary, mut phase) = (vec![], vec![], vec![]);
    let mut per_warp = Vec::new();
    for l in lines {
        let t = turns(l)
            .with_context(|| format!("block {} warp {}: marks out of order", l.block, l.warp))?;
        s.warps += 1;
        for w in t.windows(2) {
            let (a, b) = (w[0], w[1]);
            if !a.last && !b.first {
                period.push((b.granted - a.granted) as f64);
                if let Some((_, e)) = a.softmax {
                    wait_turn.push(b.granted.saturating_sub(e) as f64);
                }
            }
        }
        for x in &t {
            issue.push(x.issued.saturating_sub(x.granted) as f64);
            if let Some((b, e)) = x.softmax {
                wait_qk.push(b.saturating_sub(x.issued) as f64);
                softmax.push((e - b) as f64);
            }
        }
        per_warp.push((l.block, l.warp, t));
    }
    s.period = median(period);
    s.wait_turn = median(wait_turn);
    s.issue = median(issue);
    s.wait_qk = median(wait_qk);
    s.softmax = median(softmax);
    for (_, _, t) in &per_warp {
        let firsts: Vec<usize> = (0..t.len()).filter(|&i| t[i].first).collect();
        for w in firsts.windows(2) {
            let (a, b) = (w[0], w[1]);
            s.units += 1;
            // A unit of T key tiles has T + 1 turns.
            let tiles = (b - a - 1) as f64;
            unit_extra.push((t[b].granted - t[a].granted) as f64 - tiles * s.period);
            boundary.push((t[b].granted - t[b - 1].granted) as f64);
        }
    }
    s.unit_extra = median(unit_extra);
    s.boundary = median(boundary);
    for (block, warp, t0) in per_warp.iter().filter(|(_, w, _)| *w < 4) {
        let Some((_, _, t1)) = per_warp
            .iter()
            .find(|(b, w, _)| b == block && *w == warp + 4)
        else {
            continue;
        };
        let g0: Vec<u64> = t0.iter().map(|x| x.granted).collect();
        for x in t1.iter().filter(|x| !x.first && !x.last) {
            let i = g0.partition_point(|&g| g <= x.granted);
            if i > 0 && i < g0.len() {
                phase.push((x.granted - g0[i - 1]) as f64 / (g0[i] - g0[i - 1]) as f64);
            }
        }
    }
    s.phase = median(phase);
    for c in 0..2 {
        let last: Vec<Turn> = per_warp
            .iter()
            .filter(|(_, w, _)| (*w >= 4) == (c == 1))
            .flat_map(|(_, _, t)| t.iter().copied().filter(|x| x.last))
            .collect();
        let part = |f: &dyn Fn(&Turn) -> Option<u64>| {
            median(last.iter().filter_map(f).map(|v| v as f64).collect())
        };
        s.last_commit[c] = part(&|x| x.committed.map(|m| m.saturating_sub(x.granted)));
        s.last_ask[c] = part(&|x| x.committed.map(|m| x.issued.saturating_sub(m)));
        s.last_epilogue[c] = part(&|x| x.epilogue_end.map(|e| e.saturating_sub(x.issued)));
        let parts: Vec<[u64; 6]> = per_warp
            .iter()
            .filter(|(_, w, _)| (*w >= 4) == (c == 1))
            .flat_map(|(_, _, t)| {
                t.windows(2)
                    .filter(|w| w[0].last && w[1].first)
                    .filter_map(|w| boundary_parts(&w[0], &w[1]))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (i, v) in s.boundary_parts[c].iter_mut().enumerate() {
            *v = median(parts.iter().map(|p| p[i] as f64).collect());
        }
    }
    Ok(s)
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} consumer warps, {} unit boundaries (cycles, medians)",
            self.warps, self.units
        )?;
        writeln!(f, "| a turn inside a unit | cycles |")?;
        writeln!(f, "|---|---|")?;
        writeln!(f, "| grant to grant (period) | {:.0} |", self.period)?;
        writeln!(f, "| grant to handover (GEMM issue) | {:.0} |", self.issue)?;
        writeln!(
            f,
            "| handover to softmax start (Q·Kᵀ wait) | {:.0} |",
            self.wait_qk
        )?;
        writeln!(f, "| softmax | {:.0} |", self.softmax)?;
        writeln!(
            f,
            "| softmax end to the next grant | {:.0} |",
            self.wait_turn
        )?;
        writeln!(
            f,
            "| a unit beyond its key tiles × period | {:.0} |",
            self.unit_extra
        )?;
        writeln!(
            f,
            "| last turn's grant to the next unit's first | {:.0} |",
            self.boundary
        )?;
        writeln!(
            f,
            "| consumer 1's grant after consumer 0's (of a period) | {:.2} |",
            self.phase
        )?;
        for c in 0..2 {
            writeln!(
                f,
                "| consumer {c}'s last turn: grant to P·V commit / commit to handover / handover to epilogue end | {:.0} / {:.0} / {:.0} |",
                self.last_commit[c], self.last_ask[c], self.last_epilogue[c]
            )?;
        }
        for c in 0..2 {
            let parts: Vec<String> = self.boundary_parts[c]
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect();
            writeln!(
                f,
                "| consumer {c}'s unit boundary, handover to the next grant: {} | {} |",
                BOUNDARY_PARTS.join(" / "),
                parts.join(" / ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(marks: &[(u64, Mark)]) -> WarpLine {
        WarpLine {
            block: 0,
            warp: 0,
            marks: marks.to_vec(),
        }
    }

    #[test]
    fn marks_match_the_kernels_enum() {
        // pingpong_attention.cuh's `enum Mark` and this one are the two ends of one format.
        let code = crate::HEADERS
            .iter()
            .find(|h| h.name == "pingpong_attention.cuh")
            .expect("the header")
            .code;
        let all = [
            ("kMarkTurn", Mark::Turn),
            ("kMarkIssued", Mark::Issued),
            ("kMarkSoftmax", Mark::Softmax),
            ("kMarkSoftmaxEnd", Mark::SoftmaxEnd),
            ("kMarkUnit", Mark::Unit),
            ("kMarkEpilogueEnd", Mark::EpilogueEnd),
            ("kMarkLastCommit", Mark::LastCommit),
            ("kMarkQReady", Mark::QReady),
            ("kMarkTileReady", Mark::TileReady),
            ("kMarkOReady", Mark::OReady),
        ];
        for (name, m) in all {
            let want = format!("{name} = {},", m as u64);
            assert!(
                code.contains(&want),
                "pingpong_attention.cuh lacks `{want}`"
            );
            assert_eq!(Mark::from_bits(m as u64), Some(m));
        }
        assert_eq!(
            code.matches("  kMark").count(),
            all.len(),
            "a mark this side does not know"
        );
    }

    #[test]
    fn turns_follow_the_kernels_marks() {
        use Mark::*;
        // A unit of two key tiles: three turns (first, middle, last), then the epilogue.
        let l = line(&[
            (0, Unit),
            (16, Turn),
            (32, Issued),
            (48, Softmax),
            (64, SoftmaxEnd),
            (96, Turn),
            (112, Issued),
            (128, Softmax),
            (160, SoftmaxEnd),
            (192, Turn),
            (208, Issued),
            (224, EpilogueEnd),
        ]);
        let t = turns(&l).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t[0].first && !t[0].last && t[2].last && !t[1].first);
        assert_eq!(t[1].softmax, Some((128, 160)));
        assert_eq!(t[2].softmax, None);
        // A softmax end with no start is refused.
        assert!(turns(&line(&[(0, Unit), (16, Turn), (32, SoftmaxEnd)])).is_none());
    }

    #[test]
    fn parse_reads_stamps_and_stops_at_zero() {
        let mut words = vec![0u64; TRACE_BLOCKS * 8 * TRACE_CAP];
        words[0] = (100 << 4) | 5;
        words[1] = (200 << 4) | 1;
        words[TRACE_CAP] = (300 << 4) | 1; // warp 1
        let l = parse(&words);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].marks, vec![(1600, Mark::Unit), (3200, Mark::Turn)]);
        assert_eq!((l[1].block, l[1].warp), (0, 1));
    }

    #[test]
    fn summary_of_two_interleaved_consumers() {
        use Mark::*;
        // Consumer 0 (warp 0) and 1 (warp 4) of block 0, period 1000, consumer 1 half a period behind; units of
        // three key tiles (four turns), the boundary 1500 instead of 1000.
        let unit = |t0: u64| -> Vec<(u64, Mark)> {
            let mut v = vec![(t0, Unit), (t0 + 4, QReady), (t0 + 8, TileReady)];
            for k in 0..4u64 {
                let g = t0 + 16 + 1000 * k;
                v.push((g, Turn));
                v.push((g + 100, Issued));
                if k < 3 {
                    v.push((g + 300, Softmax));
                    v.push((g + 900, SoftmaxEnd));
                }
            }
            v.push((t0 + 3150, OReady));
            v.push((t0 + 3200, EpilogueEnd));
            v
        };
        let mk = |off: u64, warp: usize| WarpLine {
            block: 0,
            warp,
            marks: [unit(off), unit(off + 4500)].concat(),
        };
        let s = summarize(&[mk(0, 0), mk(500, 4)]).unwrap();
        assert_eq!(s.period, 1000.0);
        assert_eq!(s.softmax, 600.0);
        assert_eq!(s.wait_qk, 200.0);
        assert_eq!(s.wait_turn, 100.0);
        assert_eq!(s.units, 2);
        assert_eq!(s.boundary, 1500.0);
        assert_eq!(s.unit_extra, 1500.0);
        assert!((s.phase - 0.5).abs() < 1e-9, "{}", s.phase);
        // Handover 3116, O ready 3150, epilogue end 3200, next unit 4500, Q 4504, tile 4508, grant 4516.
        for c in 0..2 {
            assert_eq!(s.boundary_parts[c], [34.0, 50.0, 1300.0, 4.0, 4.0, 8.0]);
        }
    }
}
