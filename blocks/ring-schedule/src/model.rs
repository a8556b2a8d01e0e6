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

/// One kernel launch of a step, in a rank's shard coordinates (its halves concatenated: rows 0 … L0 − 1 the first
/// half, L0 … L0 + L1 − 1 the second): the rank's Q rows and the held shard's K/V rows (bit sets as [`Block`]'s:
/// 1 the first half, 2 the second, 3 both, which are contiguous rows), and whether the launch is causal in shard
/// coordinates (key row y seen from query row x when y ≤ x; only with both halves of both, Sq = Sk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub q: u8,
    pub kv: u8,
    pub causal: bool,
}

/// The launches of rank `rank`'s step `step`: each of [`blocks`] as one launch, except the diagonal step's three
/// causal blocks — (first, first) causal, (second, first) full, (second, second) causal — which are exactly a causal
/// mask over the shard's concatenated halves (the second half's chunk follows the first's in the sequence), so one
/// causal launch.
pub fn launches(world: usize, rank: usize, step: usize, causal: bool) -> Vec<Launch> {
    let blocks = blocks(world, rank, step, causal);
    if causal && source(world, rank, step) == rank {
        return vec![Launch {
            q: 3,
            kv: 3,
            causal: true,
        }];
    }
    blocks
        .iter()
        .map(|b| Launch {
            q: b.q,
            kv: b.kv,
            causal: b.mask == Mask::Causal,
        })
        .collect()
}

/// Checks that `launches` compute every visible (query, key) pair once over all ranks and steps, and nothing else, as
/// [`check_coverage`] does for the blocks: a launch's rows mapped from shard coordinates to the sequence through
/// zigzag's chunks; a causal launch masked in shard coordinates.
pub fn check_launch_coverage(
    world: usize,
    s: u64,
    causal: bool,
    launches: impl Fn(usize, usize, usize, bool) -> Vec<Launch>,
) -> Result<()> {
    let n = s as usize;
    let mut seen = vec![0u8; n * n];
    // A shard's rows in the sequence, in shard order, for the halves in `bits`, with their shard coordinates.
    let rows = |r: usize, bits: u8| -> Vec<(usize, u64)> {
        let [a, b] = shard(world, r);
        let (ca, cb) = (chunk(s, world, a), chunk(s, world, b));
        let l0 = (ca.end - ca.start) as usize;
        let mut v = Vec::new();
        if bits & 1 != 0 {
            v.extend(ca.clone().enumerate());
        }
        if bits & 2 != 0 {
            v.extend(cb.clone().enumerate().map(|(x, t)| (l0 + x, t)));
        }
        v
    };
    for rank in 0..world {
        for step in 0..world {
            let src = source(world, rank, step);
            for l in launches(world, rank, step, causal) {
                ensure!(
                    !l.causal || (l.q == 3 && l.kv == 3 && src == rank),
                    "rank {rank} step {step}: a causal launch of Q halves {} against K/V halves {} of rank {src}",
                    l.q,
                    l.kv
                );
                for &(x, i) in &rows(rank, l.q) {
                    for &(y, j) in &rows(src, l.kv) {
                        if !(l.causal && y > x) {
                            seen[i as usize * n + j as usize] += 1;
                        }
                    }
                }
            }
        }
    }
    each_visible_once(&seen, world, s, causal, " by the launches")
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
    each_visible_once(&seen, world, s, causal, "")
}

/// Checks `seen` (how many times each (query, key) pair of a sequence of `s` was computed, row-major) against the
/// mask: every visible pair once, no other; the first that is not named, with `by` (who computed it).
fn each_visible_once(seen: &[u8], world: usize, s: u64, causal: bool, by: &str) -> Result<()> {
    let n = s as usize;
    for i in 0..n {
        for j in 0..n {
            let (want, got) = (u8::from(!causal || j <= i), seen[i * n + j]);
            ensure!(
                got == want,
                "W = {world}, S = {s}{}: query {i} × key {j} computed {got} times{by}, visible {want}",
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
                // S < 2W leaves some chunks empty: checked all the same. The blocks, and the launches made of them.
                for causal in [false, true] {
                    check_coverage(world, s, causal, shard).unwrap();
                    check_launch_coverage(world, s, causal, launches).unwrap();
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
    fn mutant_diagonal_launch_unmasked_is_caught() {
        let open = |w, r, st, c| {
            launches(w, r, st, c)
                .into_iter()
                .map(|l| Launch { causal: false, ..l })
                .collect()
        };
        let e = check_launch_coverage(4, 64, true, open)
            .unwrap_err()
            .to_string();
        assert!(e.contains("computed"), "{e}");
        // The diagonal as two unmasked launches (first half against both, second against itself): pairs past the
        // diagonal computed.
        let first_only = |w, r, st, c| {
            let mut v = launches(w, r, st, c);
            if c && source(w, r, st) == r {
                v = vec![
                    Launch {
                        q: 1,
                        kv: 3,
                        causal: false,
                    },
                    Launch {
                        q: 2,
                        kv: 2,
                        causal: false,
                    },
                ];
            }
            v
        };
        assert!(check_launch_coverage(2, 16, true, first_only).is_err());
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
