// The tma-ring model: the mbarrier parity rule, the ring's schedule under any interleaving, and each tile's bytes.
use anyhow::{Result, bail};
use frag_layout::{Desc, Swizzle};

/// An mbarrier as the hardware keeps it: the phase count and the arrivals still missing in the current phase.
#[derive(Debug, Clone)]
pub struct Mbarrier {
    count: u32,
    pending: u32,
    completed: u32,
}

impl Mbarrier {
    pub fn new(count: u32) -> Self {
        Mbarrier {
            count,
            pending: count,
            completed: 0,
        }
    }
    pub fn arrive(&mut self) {
        self.pending -= 1;
        if self.pending == 0 {
            self.completed += 1;
            self.pending = self.count;
        }
    }
    /// `mbarrier.try_wait.parity P`: true when the current (incomplete) phase's parity differs from P, i.e.
    /// the last phase of parity P has completed. The hardware keeps one phase bit, nothing more.
    pub fn try_wait(&self, parity: u32) -> bool {
        self.completed % 2 != parity
    }
}

pub fn stage(t: usize, stages: usize) -> usize {
    t % stages
}
pub fn phase(t: usize, stages: usize) -> u32 {
    ((t / stages) & 1) as u32
}

/// Where a consumer's `tma::Cursor` stands at tile t of a `stages`-deep ring: the stages of tiles t, t − 1 and t − 2
/// (before the first tiles: the stages the cursor starts with, STAGES − 1 and STAGES − 2, which name no tile) and t's
/// parity, as Ring's rule gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorAt {
    pub stage: usize,
    pub parity: u32,
    pub prev: usize,
    pub prev2: usize,
}

pub fn cursor_at(t: usize, stages: usize) -> CursorAt {
    let before = |k: usize| (t + stages * 2 - k) % stages;
    CursorAt {
        stage: stage(t, stages),
        parity: phase(t, stages),
        prev: before(1),
        prev2: before(2),
    }
}

/// Runs the ring's protocol (producer: acquire = wait empty with parity phase^1, then the tile lands on full;
/// each consumer: wait full with parity phase, read, release) under the interleaving `order` (who moves next,
/// 0 = producer, 1.. = consumers; a blocked actor's turn is skipped), and checks the ring's two promises: no
/// consumer passes wait_full(t) before tile t landed, and no tile lands in a stage some consumer has not
/// released.
pub fn check(stages: usize, consumers: usize, tiles: usize, order: &[usize]) -> Result<()> {
    let mut full: Vec<Mbarrier> = (0..stages).map(|_| Mbarrier::new(1)).collect();
    let mut empty: Vec<Mbarrier> = (0..stages)
        .map(|_| Mbarrier::new(consumers as u32))
        .collect();
    // What each stage holds, and which consumers still read it.
    let mut holds: Vec<Option<usize>> = vec![None; stages];
    let mut readers: Vec<Vec<bool>> = vec![vec![false; consumers]; stages];
    let mut next_load = 0usize;
    let mut next_read = vec![0usize; consumers];
    for &who in order
        .iter()
        .cycle()
        .take(order.len().max(1) * (tiles + 1) * (consumers + 1) * 4)
    {
        if who == 0 {
            let t = next_load;
            if t < tiles && empty[stage(t, stages)].try_wait(phase(t, stages) ^ 1) {
                let s = stage(t, stages);
                if readers[s].iter().any(|&r| r) {
                    bail!(
                        "tile {t} landed in stage {s} while a consumer still read tile {:?}",
                        holds[s]
                    );
                }
                holds[s] = Some(t);
                readers[s] = vec![true; consumers];
                full[s].arrive(); // expect_tx's arrival, then the bytes: one completed phase
                next_load += 1;
            }
        } else {
            let c = who - 1;
            let t = next_read[c];
            if t < tiles && full[stage(t, stages)].try_wait(phase(t, stages)) {
                let s = stage(t, stages);
                if holds[s] != Some(t) {
                    bail!(
                        "consumer {c} passed wait_full({t}) while stage {s} held {:?}",
                        holds[s]
                    );
                }
                readers[s][c] = false;
                empty[s].arrive();
                next_read[c] += 1;
            }
        }
    }
    if next_load != tiles || next_read.iter().any(|&n| n != tiles) {
        bail!("the ring stalled: {next_load} of {tiles} tiles loaded, consumers at {next_read:?}");
    }
    Ok(())
}

/// One instantiation of the test kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub stages: usize,
    pub rows: usize,
    pub d_bytes: usize,
    pub swizzle: Swizzle,
    pub elem: usize,
    pub consumers: usize,
    /// Warp-specialised with setmaxnreg (sm_90a); the plain one needs sm_90 only.
    pub setmaxnreg: bool,
}

impl Shape {
    pub fn tile_bytes(&self) -> usize {
        self.rows * self.d_bytes
    }
    pub fn threads(&self) -> u32 {
        128 * (1 + self.consumers as u32)
    }
    pub fn smem_bytes(&self) -> usize {
        self.stages * self.tile_bytes() + 1024
    }
    pub fn kernel(&self) -> String {
        format!(
            "tma_{}n{}_r{}_d{}_{}_e{}_c{}",
            if self.setmaxnreg { "" } else { "plain_" },
            self.stages,
            self.rows,
            self.d_bytes,
            self.swizzle.name(),
            self.elem,
            self.consumers
        )
    }
    /// Where byte `kb` of row `row` of a tile sits in its stage: the canonical wgmma K-major tile.
    pub fn tile_byte(&self, row: usize, kb: usize) -> usize {
        Desc::tile_byte(
            self.swizzle,
            self.rows as u32,
            self.d_bytes as u32,
            row as u32,
            kb as u32,
        ) as usize
    }
}

/// The byte at (b, h, s, kb) of every test tensor: 1..=200, so neither a zero-filled byte nor the 0xCD poison.
pub fn source_byte(b: usize, h: usize, s: usize, kb: usize) -> u8 {
    ((b * 101 + h * 31 + s * 7 + kb * 13) % 200 + 1) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_fresh_barrier_counts_phase_minus_one_as_complete() {
        let mut b = Mbarrier::new(2);
        assert!(b.try_wait(1) && !b.try_wait(0));
        b.arrive();
        assert!(!b.try_wait(0));
        b.arrive();
        assert!(b.try_wait(0) && !b.try_wait(1));
    }

    #[test]
    fn wrong_parity_is_caught() {
        // A consumer that waits on phase^1 passes a fresh barrier at once: the model must say so.
        let stages = 2;
        let full = Mbarrier::new(1);
        assert!(
            full.try_wait(phase(0, stages) ^ 1),
            "this is the bug the ring avoids"
        );
    }

    #[test]
    fn every_tile_byte_is_in_the_stage_exactly_once() {
        for sw in Swizzle::ALL {
            let s = Shape {
                stages: 2,
                rows: 64,
                d_bytes: 128,
                swizzle: sw,
                elem: 1,
                consumers: 1,
                setmaxnreg: true,
            };
            let mut seen = vec![false; s.tile_bytes()];
            for r in 0..s.rows {
                for kb in 0..s.d_bytes {
                    let at = s.tile_byte(r, kb);
                    assert!(!seen[at], "{sw:?}: byte {at} twice");
                    seen[at] = true;
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_ring_keeps_its_promises_under_any_interleaving(
            stages in 2usize..5, consumers in 1usize..3, tiles in 1usize..20,
            order in proptest::collection::vec(0usize..3, 1..40),
        ) {
            let order: Vec<usize> = order.into_iter().map(|w| w % (consumers + 1)).collect();
            // Every actor must get turns, or the "stall" is the schedule's, not the ring's.
            let mut order = order;
            order.extend(0..=consumers);
            prop_assert!(check(stages, consumers, tiles, &order).is_ok(), "{:?}", check(stages, consumers, tiles, &order));
        }
    }

    #[test]
    fn the_cursor_walks_the_rings_rule_through_every_wrap() {
        for stages in 2..=4 {
            // A cursor advanced step by step, as tma::Cursor::advance does, against the rule at every tile.
            let (mut s0, mut s1, mut s2, mut par) = (0usize, stages - 1, stages - 2, 0u32);
            for t in 0..5 * stages {
                if t > 0 {
                    s2 = s1;
                    s1 = s0;
                    s0 += 1;
                    if s0 == stages {
                        s0 = 0;
                        par ^= 1;
                    }
                }
                let want = CursorAt {
                    stage: s0,
                    parity: par,
                    prev: s1,
                    prev2: s2,
                };
                assert_eq!(
                    cursor_at(t, stages),
                    want,
                    "tile {t} of a {stages}-stage ring"
                );
            }
        }
        // A cursor whose parity never flips disagrees with the rule at the first wrap.
        assert_eq!(cursor_at(2, 2).parity, 1);
    }
}
