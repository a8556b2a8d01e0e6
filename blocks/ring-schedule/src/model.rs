// The ring schedule on the host: zigzag shards, the shard each rank holds at each step, the blocks it computes.
use anyhow::{Result, ensure};

/// How a block masks: every key (`Full`), or the diagonal of one chunk against itself (`Causal`: key j seen from
/// query i when j ≤ i). The values are the header's `ring::Mask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mask {
    Full = 1,
    Causal = 2,
}

/// One block of a step: the rank's Q halves and the held shard's K/V halves (bit sets: 1 first, 2 second, 3 both),
/// and the mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub q: u8,
    pub kv: u8,
    pub mask: Mask,
}

/// The first token of chunk `c` of a sequence of `s` tokens over `world` ranks (2·world chunks, ⌊c·S / 2W⌋).
pub fn chunk_begin(s: u64, world: usize, c: usize) -> u64 {
    c as u64 * s / (2 * world as u64)
}

/// The chunks rank `rank` holds, first half then second: r and 2W − 1 − r (zigzag).
pub fn shard(world: usize, rank: usize) -> [usize; 2] {
    [rank, 2 * world - 1 - rank]
}

/// The rank whose K/V shard rank `rank` holds at step `step` (shards move to rank + 1 each step).
pub fn source(world: usize, rank: usize, step: usize) -> usize {
    (rank + world - step % world) % world
}

/// The blocks rank `rank` computes at step `step`, as `ring::blocks` computes them on the device.
pub fn blocks(world: usize, rank: usize, step: usize, causal: bool) -> Vec<Block> {
    let b = |q, kv, mask| Block { q, kv, mask };
    if !causal {
        return vec![b(3, 3, Mask::Full)];
    }
    let src = source(world, rank, step);
    if src == rank {
        vec![
            b(1, 1, Mask::Causal),
            b(2, 1, Mask::Full),
            b(2, 2, Mask::Causal),
        ]
    } else if src < rank {
        vec![b(3, 1, Mask::Full)]
    } else {
        vec![b(2, 3, Mask::Full)]
    }
}

/// Token range [begin, end) of chunk `c`.
fn chunk(s: u64, world: usize, c: usize) -> std::ops::Range<u64> {
    chunk_begin(s, world, c)..chunk_begin(s, world, c + 1)
}

/// Query×key pairs a rank computes at a step (its work), under `shard`'s sharding and `blocks`' schedule.
pub fn work(
    world: usize,
    rank: usize,
    step: usize,
    s: u64,
    causal: bool,
    shard: impl Fn(usize, usize) -> [usize; 2],
) -> u64 {
    let (mine, theirs) = (shard(world, rank), shard(world, source(world, rank, step)));
    let mut n = 0;
    for blk in blocks(world, rank, step, causal) {
        for (hq, &cq) in mine.iter().enumerate() {
            for (hk, &ck) in theirs.iter().enumerate() {
                if blk.q & (1 << hq) == 0 || blk.kv & (1 << hk) == 0 {
                    continue;
                }
                let (lq, lk) = (
                    chunk(s, world, cq).end - chunk(s, world, cq).start,
                    chunk(s, world, ck).end - chunk(s, world, ck).start,
                );
                n += match blk.mask {
                    Mask::Full => lq * lk,
                    Mask::Causal => lq * (lq + 1) / 2,
                };
            }
        }
    }
    n
}

/// Checks that the schedule computes every visible (query, key) pair of the sequence exactly once over all ranks
/// and steps (visible: every pair, or j ≤ i under the causal mask) and nothing else, under `shard`'s sharding: the
/// first pair that is missed, doubled, or computed though masked, named.
pub fn check_coverage(
    world: usize,
    s: u64,
    causal: bool,
    shard: impl Fn(usize, usize) -> [usize; 2],
) -> Result<()> {
    let n = s as usize;
    let mut seen = vec![0u8; n * n];
    for rank in 0..world {
        let mine = shard(world, rank);
        for step in 0..world {
            let theirs = shard(world, source(world, rank, step));
            for blk in blocks(world, rank, step, causal) {
                for (hq, &cq) in mine.iter().enumerate() {
                    for (hk, &ck) in theirs.iter().enumerate() {
                        if blk.q & (1 << hq) == 0 || blk.kv & (1 << hk) == 0 {
                            continue;
                        }
                        if blk.mask == Mask::Causal {
                            ensure!(
                                cq == ck,
                                "rank {rank} step {step}: a causal block of Q chunk {cq} against K/V chunk {ck}"
                            );
                        }
                        let (rq, rk) = (chunk(s, world, cq), chunk(s, world, ck));
                        for i in rq.clone() {
                            for j in rk.clone() {
                                let local = (i - rq.start, j - rk.start);
                                if blk.mask == Mask::Causal && local.1 > local.0 {
                                    continue;
                                }
                                seen[i as usize * n + j as usize] += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    for i in 0..n {
        for j in 0..n {
            let want = u8::from(!causal || j <= i);
            let got = seen[i * n + j];
            ensure!(
                got == want,
                "W = {world}, S = {s}{}: query {i} × key {j} computed {got} times, visible {want}",
                if causal { ", causal" } else { "" }
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_visible_pair_once_for_every_world() {
        for world in [1, 2, 3, 4, 8] {
            for s in [1, 2, 7, 16, 33, 100] {
                // S < 2W leaves some chunks empty: checked all the same.
                for causal in [false, true] {
                    check_coverage(world, s, causal, shard).unwrap();
                }
            }
        }
    }

    #[test]
    fn causal_work_is_balanced_across_ranks() {
        // Zigzag's point: under the mask every rank does the same work at every step but the first, within a chunk's
        // rounding; the whole run's work differs by under 1% across ranks at S = 131072 over 4 and 8 ranks.
        for world in [2, 4, 8] {
            let s = 131072u64;
            let per_rank: Vec<u64> = (0..world)
                .map(|r| {
                    (0..world)
                        .map(|st| work(world, r, st, s, true, shard))
                        .sum()
                })
                .collect();
            let (lo, hi) = (
                per_rank.iter().min().unwrap(),
                per_rank.iter().max().unwrap(),
            );
            assert!(
                (*hi as f64) / (*lo as f64) < 1.01,
                "W = {world}: {per_rank:?}"
            );
            for step in 1..world {
                let w: Vec<u64> = (0..world)
                    .map(|r| work(world, r, step, s, true, shard))
                    .collect();
                let c = (s / (2 * world as u64)).pow(2);
                assert!(
                    w.iter().all(|&x| x.abs_diff(2 * c) <= 2 * c / 1000 + 4),
                    "step {step}: {w:?}"
                );
            }
        }
    }

    #[test]
    fn mutant_zigzag_halves_swapped_is_caught() {
        let swapped = |w: usize, r: usize| [2 * w - 1 - r, r];
        let e = check_coverage(4, 64, true, swapped)
            .unwrap_err()
            .to_string();
        assert!(e.contains("computed"), "{e}");
    }

    #[test]
    fn mutant_contiguous_shards_are_caught() {
        // Plain (not zigzag) sharding: rank r holds chunks 2r and 2r + 1; the schedule's blocks are zigzag's.
        let plain = |_: usize, r: usize| [2 * r, 2 * r + 1];
        assert!(check_coverage(4, 64, true, plain).is_err());
    }

    proptest! {
        #[test]
        fn chunks_tile_the_sequence(world in 1usize..9, s in 0u64..5000) {
            prop_assert_eq!(chunk_begin(s, world, 0), 0);
            prop_assert_eq!(chunk_begin(s, world, 2 * world), s);
            for c in 0..2 * world {
                let len = chunk_begin(s, world, c + 1) - chunk_begin(s, world, c);
                prop_assert!(len == s / (2 * world as u64) || len == s / (2 * world as u64) + 1);
            }
        }
    }
}
