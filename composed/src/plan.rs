// Launch plans: the grid of a stage, stage 7's split tail and the sections of its causal schedule.
use anyhow::{Result, ensure};

use crate::stages::Stage;
use crate::tables::{MergeList, SplitPart, SplitTable};

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

/// The blocks of a persistent launch of `units` work units on `sms` SMs that leaves `free` SMs to other kernels
/// (a communication library's beside a ring step): at most `sms − free` (at least one), and, where the units are equal
/// (`equal`: not causal), the fewest that run them in as many waves as `sms − free` blocks would — at 4,096 units
/// on 132 SMs less one, 128 blocks run the 32 waves 131 would, and leave 4 SMs free.
pub fn blocks_leaving(units: usize, sms: usize, free: usize, equal: bool) -> usize {
    let most = sms.saturating_sub(free).max(1);
    if !equal || units == 0 {
        return most.min(units.max(1));
    }
    units.div_ceil(units.div_ceil(most))
}

/// Stage 7's split tail (`sdpa::SplitTable`, in the schedule's buffer): with G blocks sharing equal units, the
/// busiest block runs ⌈U / G⌉ of them where the average is U / G — at (4, 16, 4096, 128), 2048 units on 132 SMs, 16
/// against 15.5 (ncu: 1984 units cost what 2048 do, 1920 6.4% less; docs/decisions.md, "The last wave"). So the last R
/// units (R = U mod G, or U mod G + G where that is at most G / 2, so that no piece is under half a unit) are cut, as
/// one run of R · T key tiles, into G pieces of near-equal length; each block runs its G-strided whole units, then
/// its piece — or, in a *taken* plan ([`SplitPlan::taken`]), every block takes whole units and then pieces from the
/// counter, so that a block that starts late (its SM held by another kernel) takes fewer instead of holding up a dealt
/// share. A part of a unit writes its O and LSE, as a unit would, to a virtual unit past the real ones, and
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
    /// Key tiles a unit (a halved plan's of its kernel's tiles, `Stage::halved_bc`; only a split tail reads it).
    pub unit_tiles: usize,
    /// Each unit's rows in two blocks of 64, each block's keys halved between its consumers ([`SplitPlan::halved`]).
    pub halved: bool,
    /// The pieces are taken from the counter after the whole units, not dealt one a block.
    pub taken: bool,
}

impl SplitPlan {
    /// The plan of a launch of `stage` on `s` with blocks of `rows` query rows and a grid of `blocks` (`grid`'s x):
    /// none but for stage 7, which is persistent.
    /// `blocks` is the most blocks the launch may take (one an SM, or the count asked), not capped at the units.
    pub fn of(stage: Stage, s: &fixtures::Shape, rows: usize, blocks: usize) -> SplitPlan {
        let units = s.heads() * s.sq.div_ceil(rows);
        if stage.persistent() {
            let tiles = s.sk.div_ceil(stage.bc(s.d));
            // A window's units read their own key ranges: no split tail (as causal ones).
            let ordered = s.causal || s.window.is_bounded();
            // A halved kernel's tiles are its own (`Stage::halved_bc`: 128 keys at D = 64 where Sk is 2 or 4 of them).
            let halved_tiles = s.sk.div_ceil(stage.halved_bc(s.d, s.sk));
            let halved = (stage.halves() && !ordered)
                .then(|| SplitPlan::halved(units, blocks, halved_tiles, stage.ring_stages(s.d)))
                .flatten();
            halved.unwrap_or_else(|| SplitPlan::new(units, blocks, tiles, ordered, s.sq / rows))
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
            halved: false,
            taken: false,
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
            halved: false,
            taken: false,
        }
    }
    /// Halved units: where the units would hold at most half the `blocks` (the mission shape, (1, 8, 512, 64): 32
    /// units on 132 SMs), each unit's 128 rows go to two blocks of 64, and in each block consumer 0 takes the first
    /// half of the unit's key tiles and consumer 1 the second, on the same rows; consumer 0 merges the two (O, LSE)
    /// pairs through shared memory (`sdpa::merge_halves`). A unit's time is its chain of turns, one a key tile a
    /// consumer: halved, T / 2. Only where T is even and every tile has its own ring stage (`stages`: no stage is
    /// reused, so neither consumer waits for the other's releases).
    pub fn halved(
        units: usize,
        blocks: usize,
        unit_tiles: usize,
        stages: usize,
    ) -> Option<SplitPlan> {
        (units > 0 && 2 * units <= blocks && unit_tiles.is_multiple_of(2) && unit_tiles <= stages)
            .then_some(SplitPlan {
                units,
                split: units,
                pieces: 0,
                unit_tiles,
                halved: true,
                taken: false,
            })
    }
    /// The launch's blocks: two a unit for a halved plan, else `grid` (the persistent grid's).
    pub fn blocks(&self, grid: usize) -> usize {
        if self.halved { 2 * self.units } else { grid }
    }
    /// This plan's units all whole, every one taken from the counter (no split tail).
    pub fn unsplit(self) -> SplitPlan {
        SplitPlan {
            split: self.units,
            pieces: 0,
            halved: false,
            taken: false,
            ..self
        }
    }
    /// This plan with its pieces, where it has any, taken from the counter after the whole units (which are taken
    /// from it too) instead of dealt: the same parts, virtual units and merge lists, so the same bits.
    pub fn taken(self) -> SplitPlan {
        SplitPlan {
            taken: self.pieces > 0,
            ..self
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
    /// The table `sdpa::SplitTable` reads at `sdpa::Params::sched` (`SplitTable`): the pieces' first parts, the parts
    /// in piece order as (unit, k0, key tiles or −1, virtual unit or −1), per split unit its parts' virtual units.
    /// `q_tiles` query tiles a head, `q_full` of them full.
    pub fn table(&self, q_tiles: usize, q_full: usize) -> SplitTable {
        let i = |x: usize| x as i32;
        let mut first = vec![];
        let mut parts: Vec<SplitPart> = vec![];
        let mut merged = vec![MergeList::default(); self.units - self.split];
        for q in 0..self.pieces {
            first.push(i(parts.len()));
            for (u, k0, k1) in self.parts(q) {
                if k1 - k0 == self.unit_tiles {
                    parts.push(SplitPart::whole(i(u)));
                    continue;
                }
                let u0 = (u - self.split) * self.unit_tiles;
                let k = 2 * q + usize::from(self.bound(q) < u0);
                let v = self.units.next_multiple_of(q_tiles) + (k / q_full) * q_tiles + k % q_full;
                parts.push(SplitPart {
                    unit: i(u),
                    k0: i(k0),
                    tiles: i(k1 - k0),
                    dst: i(v),
                });
                merged[u - self.split].push(i(v));
            }
        }
        first.push(i(parts.len()));
        for m in &mut merged {
            m.keep_if_split();
        }
        SplitTable::new(
            i(self.split),
            i(self.pieces),
            self.taken,
            first,
            parts,
            merged,
        )
    }
}

/// K and V bytes a schedule section of causal stage 7 may hold (`sdpa::unit_coord`): a third of the H100's 50 MB L2,
/// so that the section's K and V stay there beside the section before's, whose last units are still running. 4 to
/// 16 MiB measured level there, 32 MiB 6.5% slower (docs/decisions.md, "Units from a counter").
pub const SECTION_KV_BYTES: usize = 16 << 20;

/// Query heads a section of causal stage 7's schedule (`sdpa::unit_coord`: longest units first within a section):
/// as many whole K/V groups as keep their K and V within `SECTION_KV_BYTES`, at least one group, at most every head.
pub fn schedule_section(s: &fixtures::Shape) -> usize {
    let kv_head = 2 * s.sk * s.d;
    let groups = (SECTION_KV_BYTES / kv_head.max(1)).max(1);
    (groups * s.group()).min(s.heads())
}

#[cfg(test)]
mod tests {
    use super::{SplitPlan, blocks_leaving};
    use crate::stages::Stage;

    #[test]
    fn blocks_leaving_keep_the_waves_of_the_rest() {
        // The ring's steps at (1, 16, 131072, 128): 4 GPUs, 4,096 units; 2 GPUs, 8,192.
        assert_eq!(blocks_leaving(4096, 132, 1, true), 128);
        assert_eq!(blocks_leaving(8192, 132, 1, true), 131);
        assert_eq!(blocks_leaving(8192, 132, 2, true), 128);
        // Causal units differ in length: no wave count, every SM but the free ones.
        assert_eq!(blocks_leaving(4096, 132, 1, false), 131);
        // Fewer units than SMs: one block a unit; nothing free asked: one block an SM where the units fill them.
        assert_eq!(blocks_leaving(40, 132, 4, true), 40);
        assert_eq!(blocks_leaving(40, 132, 4, false), 40);
        assert_eq!(blocks_leaving(264, 132, 0, true), 132);
        // Never no block, even with every SM asked free.
        assert_eq!(blocks_leaving(100, 4, 9, true), 1);
        for units in 1..2000 {
            for free in 0..8 {
                let most = 132 - free;
                let b = blocks_leaving(units, 132, free, true);
                assert!(
                    b <= most && b >= 1,
                    "{units} units, {free} free: {b} blocks"
                );
                assert_eq!(
                    units.div_ceil(b),
                    units.div_ceil(most),
                    "{units} units, {free} free: {b} blocks"
                );
                assert!(
                    b == 1 || units.div_ceil(b - 1) > units.div_ceil(most),
                    "{units}, {free}: {b} not the fewest"
                );
            }
        }
    }

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
                    assert_eq!(
                        (t.head.split, t.head.pieces),
                        (p.split as i32, p.pieces as i32)
                    );
                    let mut seen = std::collections::HashSet::new();
                    for q in 0..p.pieces {
                        let (a, b) = (t.first[q] as usize, t.first[q + 1] as usize);
                        let want = p.parts(q);
                        assert_eq!(b - a, want.len(), "{p:?}");
                        for (e, &(u, k0, k1)) in t.parts[a..b].iter().zip(&want) {
                            assert_eq!(e.unit as usize, u);
                            if e.dst >= 0 {
                                assert!(seen.insert(e.dst) && (e.dst as usize) >= units, "{p:?}");
                                assert!(((e.dst as usize) % q_tiles) < q_full);
                                assert_eq!((e.k0 as usize, e.tiles as usize), (k0, k1 - k0));
                            } else {
                                assert_eq!((k0, k1), (0, tiles));
                            }
                        }
                    }
                    for (r, m) in t.merged.iter().enumerate() {
                        assert!(
                            m.parts == 0 || (2..=4).contains(&m.parts),
                            "{p:?}: unit {r} merges {m:?}"
                        );
                        assert!(m.dsts().iter().all(|v| seen.contains(v)));
                    }
                    assert_eq!(t.merged.len(), tail);
                    assert_eq!(
                        seen.len(),
                        t.merged.iter().map(|m| m.parts as usize).sum::<usize>()
                    );
                    // The words the device reads: the head's offsets point at the parts and the merge lists.
                    let w = t.words();
                    let (pa, ma) = (t.head.parts_at as usize, t.head.merged_at as usize);
                    assert_eq!(pa % 4, 0, "parts are read as int4");
                    assert_eq!(
                        &w[pa..pa + 4],
                        &[
                            t.parts[0].unit,
                            t.parts[0].k0,
                            t.parts[0].tiles,
                            t.parts[0].dst
                        ]
                    );
                    assert_eq!(w.len(), ma + 8 * tail);
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
    fn halved_plans_take_two_blocks_a_unit_where_the_tiles_fit_the_ring() {
        let mut halved = 0;
        for units in 1..=80 {
            for blocks in 1..=140 {
                for tiles in 1..=6 {
                    for stages in [3, 4] {
                        let want = 2 * units <= blocks && tiles % 2 == 0 && tiles <= stages;
                        let p = SplitPlan::halved(units, blocks, tiles, stages);
                        assert_eq!(
                            p.is_some(),
                            want,
                            "{units} units, {blocks} blocks, {tiles} tiles, {stages} stages"
                        );
                        let Some(p) = p else { continue };
                        halved += 1;
                        // No split tail beside it: no table, no merge kernel, no virtual heads.
                        assert_eq!((p.split, p.pieces, p.virtual_heads(4)), (units, 0, 0));
                        assert_eq!(p.blocks(units.min(blocks)), 2 * units);
                        assert!(!p.unsplit().halved);
                    }
                }
            }
        }
        assert!(halved > 1_000, "{halved} plans halved");
        // Stage 8 halves the mission shape at the default grid; stage 7, causal units, windows and 6 tiles do not.
        let mission = fixtures::Shape::new(1, 8, 512, 64);
        assert!(SplitPlan::of(Stage::S8, &mission, 128, 132).halved);
        assert_eq!(SplitPlan::of(Stage::S8, &mission, 128, 132).blocks(32), 64);
        assert!(!SplitPlan::of(Stage::S7, &mission, 128, 132).halved);
        assert!(!SplitPlan::of(Stage::S8, &mission.with_causal(true), 128, 132).halved);
        assert!(!SplitPlan::of(Stage::S8, &fixtures::Shape::new(1, 8, 768, 64), 128, 132).halved);
        assert_eq!(
            SplitPlan::of(Stage::S8, &mission, 128, 32),
            SplitPlan::new(32, 32, 2, false, 4)
        );
    }

    /// The producer's walk over a taken plan (pingpong_attention.cuh), one step: a block's next item after `w` (below
    /// `split` a whole unit, else `split` + a part's index in the table) with `end` its piece's end (0: none in hand),
    /// and the grid's counter.
    fn taken_next(
        p: &SplitPlan,
        first: &[i32],
        grid: usize,
        (w, end): (usize, usize),
        counter: &mut usize,
    ) -> (usize, usize) {
        if w >= p.split && w + 1 < end {
            return (w + 1, end);
        }
        let c = grid + *counter;
        *counter += 1;
        let q = c.checked_sub(p.split).filter(|&q| q < p.pieces);
        let w = if c < p.split {
            c
        } else {
            p.split + first[q.unwrap_or(p.pieces)] as usize
        };
        (w, q.map_or(0, |q| p.split + first[q + 1] as usize))
    }

    proptest::proptest! {
        /// Blocks walking a taken plan in any interleaving, some of them starting only after every other block has
        /// ended (late, as beside NCCL's kernels): every whole unit and every part is produced once.
        #[test]
        fn a_taken_walk_runs_every_item_once(
            units in 2usize..400,
            blocks in 1usize..40,
            tiles in 2usize..12,
            order in proptest::collection::vec(0usize..1000, 1..4000),
            late in 0usize..4,
        ) {
            let p = SplitPlan::new(units, blocks, tiles, false, 4).taken();
            proptest::prop_assume!(p.pieces > 0);
            proptest::prop_assert!(p.taken);
            let t = p.table(5, 4);
            let mut counter = 0;
            // Each block: its item in hand (its first unit: blockIdx.x) and whether it walks yet.
            let mut at: Vec<(usize, usize)> = (0..blocks).map(|b| (b, 0)).collect();
            let alive = |(w, end): (usize, usize)| w < p.split || w < end;
            let mut ran = vec![0u32; p.split + t.parts.len()];
            let mut picks = order.iter().cycle();
            let early = blocks - late.min(blocks - 1);
            loop {
                let walking: Vec<usize> = (0..blocks)
                    .filter(|&b| alive(at[b]) && (b < early || (0..early).all(|e| !alive(at[e]))))
                    .collect();
                let Some(&pick) = picks.next() else { break };
                if walking.is_empty() {
                    break;
                }
                let b = walking[pick % walking.len()];
                ran[at[b].0] += 1;
                at[b] = taken_next(&p, &t.first, blocks, at[b], &mut counter);
            }
            proptest::prop_assert!(ran.iter().all(|&n| n == 1), "{:?}: items run {:?}", p, ran);
        }
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
}
