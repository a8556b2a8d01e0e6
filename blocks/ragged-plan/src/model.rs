// The ragged-plan model: a packed batch's boundaries checked by name, its units longest first, and each unit's rows.
//
// A packed batch holds B sequences of different lengths one after another: Q is [total_q, H, D] and K, V are
// [total_k, Hkv, D], with `cu_seqlens_q` and `cu_seqlens_k` (B + 1 entries each) giving where each sequence starts.
// The plan cuts every (sequence, head) into query tiles of `rows` rows and orders the units longest first, so that a
// persistent grid taking them from a counter ends with its shortest units and no SM idles on a short sequence.
use anyhow::{Result, ensure};

/// Why `cu` cannot be the boundaries of `batch` sequences packed into `total` tokens: the first thing wrong, named
/// (`name` is the argument, `cu_seqlens_q` or `cu_seqlens_k`).
pub fn validate_cu_seqlens(name: &str, cu: &[i32], batch: usize, total: usize) -> Result<()> {
    ensure!(
        cu.len() == batch + 1,
        "`{name}` has {} entries: {batch} sequences need B + 1 = {}",
        cu.len(),
        batch + 1
    );
    ensure!(cu[0] == 0, "`{name}` starts at {}, not 0", cu[0]);
    if let Some(i) = (0..batch).find(|&i| cu[i + 1] < cu[i]) {
        anyhow::bail!(
            "`{name}` decreases: [{}] = {} after [{i}] = {} (it must be non-decreasing)",
            i + 1,
            cu[i + 1],
            cu[i]
        );
    }
    ensure!(
        cu[batch] as i64 == total as i64,
        "`{name}` ends at {}, and the packed tensor holds {total} tokens",
        cu[batch]
    );
    Ok(())
}

/// One unit of a ragged batch's work: query rows `q0 .. q0 + rows` of sequence `seq`, head `head`, over its first
/// `key_tiles` key tiles (all its keys, or those a causal mask leaves visible to the unit's last row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaggedUnit {
    pub seq: u32,
    pub head: u32,
    pub q0: u32,
    pub rows: u32,
    pub key_tiles: u32,
}

/// The units of a packed batch with `heads` query heads, query tiles of `tile_rows` rows and key tiles of `bc` keys,
/// longest first (ties: sequence, head, query tile in order). Causal masks are bottom-right aligned per sequence:
/// row i of a sequence of Sq queries and Sk keys sees keys j ≤ i + Sk − Sq. A unit whose rows see no key still runs
/// one tile (its rows get O = 0, LSE = −inf); a sequence with no queries has no units.
pub fn ragged_plan(
    cu_q: &[i32],
    cu_k: &[i32],
    heads: usize,
    tile_rows: usize,
    bc: usize,
    causal: bool,
) -> Vec<RaggedUnit> {
    ragged_plan_windowed(cu_q, cu_k, heads, tile_rows, bc, causal, None, None)
}

/// [`ragged_plan`] under a sliding window (`left`, `right`: keys each side of the bottom-right diagonal, None
/// unbounded): each unit's key tiles are those of [`key_range`], from its window's first.
#[allow(clippy::too_many_arguments)]
pub fn ragged_plan_windowed(
    cu_q: &[i32],
    cu_k: &[i32],
    heads: usize,
    tile_rows: usize,
    bc: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
) -> Vec<RaggedUnit> {
    ragged_plan_packed(cu_q, cu_k, heads, tile_rows, bc, causal, left, right, 1)
}

/// [`ragged_plan_windowed`] with `group` query heads packed into a unit's rows (pack-gqa; 1: none): a unit is one
/// (sequence, K/V head, tile of `tile_rows` packed rows), packed row r being query head r % group of token r / group,
/// so a sequence of Sq tokens has Sq · group rows and `heads` counts K/V heads. `q0` and `rows` are packed rows; a
/// unit's key tiles are those of its tokens, from its first row's to its last row's ([`packed_key_tiles`]).
#[allow(clippy::too_many_arguments)]
pub fn ragged_plan_packed(
    cu_q: &[i32],
    cu_k: &[i32],
    heads: usize,
    tile_rows: usize,
    bc: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
    group: usize,
) -> Vec<RaggedUnit> {
    assert!(group >= 1, "a group of {group} heads");
    let mut units = Vec::new();
    for seq in 0..cu_q.len().saturating_sub(1) {
        let sq = (cu_q[seq + 1] - cu_q[seq]).max(0) as usize;
        let sk = (cu_k[seq + 1] - cu_k[seq]).max(0) as usize;
        let all = sq * group;
        for head in 0..heads {
            for q0 in (0..all).step_by(tile_rows) {
                let rows = tile_rows.min(all - q0);
                units.push(RaggedUnit {
                    seq: seq as u32,
                    head: head as u32,
                    q0: q0 as u32,
                    rows: rows as u32,
                    key_tiles: packed_key_tiles(sq, sk, q0, rows, bc, causal, left, right, group)
                        as u32,
                });
            }
        }
    }
    // Longest first; the sort is stable, so equal units keep sequence, head, tile order.
    units.sort_by_key(|u| std::cmp::Reverse(u.key_tiles));
    units
}

/// Key tiles of `bc` keys the unit at query row `q0` (`rows` rows) of a sequence of `sq` queries and `sk` keys reads:
/// all of them, or under a causal mask (bottom-right) those up to its last row's last visible key; at least one
/// (mirrors `ragged::key_tiles`).
pub fn key_tiles(sq: usize, sk: usize, q0: usize, rows: usize, bc: usize, causal: bool) -> usize {
    let visible = if causal {
        (q0 + rows + sk).saturating_sub(sq).min(sk)
    } else {
        sk
    };
    visible.div_ceil(bc).max(1)
}

/// The key tiles of `bc` keys a unit reads under a sliding window (mirrors `ragged::key_range`): (its first tile,
/// its tiles from there). Row i of a sequence of `sq` queries and `sk` keys sees keys i + Sk − Sq − left ≤ j ≤
/// i + Sk − Sq + right (None: that side unbounded; causal masking makes the right side 0). The unit's first tile is
/// its first row's first visible key's; its last, its last row's last visible key's; at least one tile.
#[allow(clippy::too_many_arguments)]
pub fn key_range(
    sq: usize,
    sk: usize,
    q0: usize,
    rows: usize,
    bc: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
) -> (usize, usize) {
    let first_key = left.map_or(0, |l| (q0 + sk).saturating_sub(sq + l));
    let right = if causal { Some(0) } else { right };
    let end = right.map_or(sk, |r| (q0 + rows + sk + r).saturating_sub(sq).min(sk));
    let first = first_key / bc;
    (first, end.div_ceil(bc).saturating_sub(first).max(1))
}

/// Key tiles of the unit at packed row `q0` (`rows` rows, `group` heads a token) of a sequence of `sq` tokens and
/// `sk` keys: [`key_range`]'s count over its tokens q0 / group ..= (q0 + rows − 1) / group (mirrors
/// `ragged::unit_key_tiles`). With `group` 1, the unit's own rows.
#[allow(clippy::too_many_arguments)]
pub fn packed_key_tiles(
    sq: usize,
    sk: usize,
    q0: usize,
    rows: usize,
    bc: usize,
    causal: bool,
    left: Option<usize>,
    right: Option<usize>,
    group: usize,
) -> usize {
    let t0 = q0 / group;
    let tokens = (q0 + rows - 1) / group - t0 + 1;
    key_range(sq, sk, t0, tokens, bc, causal, left, right).1
}

/// What the device plan needs sized before it runs, from sizes the host knows without reading the boundaries: at
/// most heads · (⌈total_q · group / tile_rows⌉ + B) units (each sequence adds at most one partial tile) and key-tile
/// counts up to ⌈total_k / bc⌉ (at least 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub batch: usize,
    pub heads: usize,
    pub tile_rows: usize,
    pub bc: usize,
    pub causal: bool,
    /// A sliding window's sides (None: unbounded; both None: no window).
    pub left: Option<usize>,
    pub right: Option<usize>,
    pub total_q: usize,
    pub total_k: usize,
    /// Query heads packed a token (1: none; then `heads` counts K/V heads): [`ragged_plan_packed`].
    pub group: usize,
}

impl Geometry {
    /// Units the table has room for.
    pub fn max_units(&self) -> usize {
        self.heads * ((self.total_q * self.group).div_ceil(self.tile_rows) + self.batch)
    }
    /// Key-tile counts 0 ..= ⌈total_k / bc⌉ (0 unused), the histogram's bins.
    pub fn bins(&self) -> usize {
        self.total_k.div_ceil(self.bc).max(1) + 1
    }
    /// i32 words of the table: a 4-word head (the unit count first), then 4 a unit.
    pub fn table_words(&self) -> usize {
        4 + 4 * self.max_units()
    }
}

/// Where a unit's rows are in the packed tensors (mirrors `ragged::Coord`): its first query row and valid rows, its
/// sequence's first key row, and the sequence's query and key counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coord {
    pub q_row0: usize,
    pub rows: usize,
    pub k_row0: usize,
    pub sq: usize,
    pub sk: usize,
}

/// Unit `u`'s coordinates in a batch of boundaries `cu_q`, `cu_k` and query tiles of `tile_rows`.
pub fn coord(cu_q: &[i32], cu_k: &[i32], u: &RaggedUnit, tile_rows: usize) -> Coord {
    coord_packed(cu_q, cu_k, u, tile_rows, 1)
}

/// [`coord`] in a plan of `group` packed heads (mirrors `ragged::coord_packed`): `q_row0` is the token of the unit's
/// first row, `rows` its valid packed rows.
pub fn coord_packed(
    cu_q: &[i32],
    cu_k: &[i32],
    u: &RaggedUnit,
    tile_rows: usize,
    group: usize,
) -> Coord {
    let s = u.seq as usize;
    let (q, k) = (cu_q[s] as usize, cu_k[s] as usize);
    let (sq, sk) = (cu_q[s + 1] as usize - q, cu_k[s + 1] as usize - k);
    Coord {
        q_row0: q + u.q0 as usize / group,
        rows: tile_rows.min(sq * group - u.q0 as usize),
        k_row0: k,
        sq,
        sk,
    }
}

/// Whether `table` (units as the device plan wrote them: `rows` is not in the table and is ignored) is the plan of
/// `model` up to the order of units of equal key tiles: the same units, key tiles never growing along the table.
/// Err names the first difference.
pub fn same_plan(table: &[RaggedUnit], model: &[RaggedUnit]) -> anyhow::Result<()> {
    anyhow::ensure!(
        table.len() == model.len(),
        "{} units, and the plan has {}",
        table.len(),
        model.len()
    );
    if let Some(i) = (1..table.len()).find(|&i| table[i].key_tiles > table[i - 1].key_tiles) {
        anyhow::bail!(
            "unit {i} reads {} key tiles after one of {}: not longest first",
            table[i].key_tiles,
            table[i - 1].key_tiles
        );
    }
    let key = |u: &RaggedUnit| (std::cmp::Reverse(u.key_tiles), u.seq, u.head, u.q0);
    let mut a: Vec<_> = table.iter().map(key).collect();
    let mut b: Vec<_> = model.iter().map(key).collect();
    a.sort();
    b.sort();
    if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
        anyhow::bail!(
            "units differ: the table has {:?} where the plan has {:?}",
            a[i],
            b[i]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_boundary_is_named() {
        assert!(validate_cu_seqlens("cu_seqlens_q", &[0, 3, 3, 10], 3, 10).is_ok());
        let e = |cu: &[i32], b, t| {
            validate_cu_seqlens("cu_seqlens_k", cu, b, t)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[0, 3, 10], 3, 10).contains("has 3 entries: 3 sequences need B + 1 = 4"));
        assert!(e(&[1, 3, 10], 2, 10).contains("`cu_seqlens_k` starts at 1, not 0"));
        assert!(e(&[0, 5, 4, 10], 3, 10).contains("decreases: [2] = 4 after [1] = 5"));
        assert!(e(&[0, 3, 9], 2, 10).contains("ends at 9, and the packed tensor holds 10 tokens"));
    }

    /// Every (sequence, head, query row) is in exactly one unit, each unit's key tiles are the keys its last row
    /// sees (at least one tile), and the units come longest first.
    #[test]
    fn the_plan_covers_every_row_once_longest_first() {
        let lens_q = [0usize, 1, 128, 129, 700, 5000];
        let lens_k = [5usize, 300, 128, 2000, 700, 5000];
        let cu = |l: &[usize]| {
            let mut c = vec![0i32];
            for &x in l {
                c.push(c.last().unwrap() + x as i32);
            }
            c
        };
        let (cq, ck) = (cu(&lens_q), cu(&lens_k));
        for causal in [false, true] {
            let plan = ragged_plan(&cq, &ck, 3, 128, 224, causal);
            assert!(plan.windows(2).all(|w| w[0].key_tiles >= w[1].key_tiles));
            let mut seen = std::collections::HashSet::new();
            for u in &plan {
                let (sq, sk) = (lens_q[u.seq as usize], lens_k[u.seq as usize]);
                let last = (u.q0 + u.rows) as usize - 1;
                let visible = if causal {
                    (last + 1 + sk).saturating_sub(sq).min(sk)
                } else {
                    sk
                };
                assert_eq!(u.key_tiles as usize, visible.div_ceil(224).max(1), "{u:?}");
                for r in u.q0..u.q0 + u.rows {
                    assert!(seen.insert((u.seq, u.head, r)), "{u:?}: row {r} twice");
                }
            }
            let rows: usize = lens_q.iter().sum::<usize>() * 3;
            assert_eq!(seen.len(), rows);
        }
        // A sequence of no queries has no units; one query over no keys still runs a tile.
        let plan = ragged_plan(&[0, 0, 1], &[0, 4, 4], 1, 128, 128, true);
        assert_eq!(
            plan,
            vec![RaggedUnit {
                seq: 1,
                head: 0,
                q0: 0,
                rows: 1,
                key_tiles: 1
            }]
        );
    }

    #[test]
    fn the_geometry_bounds_every_plan() {
        // The table and the histogram are sized before the boundaries are read: no plan may outgrow them.
        let lens = [
            (0usize, 5usize),
            (1, 300),
            (128, 128),
            (129, 2000),
            (700, 700),
            (5000, 5000),
            (3, 0),
        ];
        let mut cq = vec![0i32];
        let mut ck = vec![0i32];
        for &(q, k) in &lens {
            cq.push(cq.last().unwrap() + q as i32);
            ck.push(ck.last().unwrap() + k as i32);
        }
        for (tile_rows, bc, causal, heads) in [
            (128, 224, false, 3),
            (128, 128, true, 1),
            (64, 128, true, 5),
        ] {
            let g = Geometry {
                batch: lens.len(),
                heads,
                tile_rows,
                bc,
                causal,
                left: None,
                right: None,
                total_q: *cq.last().unwrap() as usize,
                total_k: *ck.last().unwrap() as usize,
                group: 1,
            };
            let plan = ragged_plan(&cq, &ck, heads, tile_rows, bc, causal);
            assert!(
                plan.len() <= g.max_units(),
                "{} units > {}",
                plan.len(),
                g.max_units()
            );
            assert!(plan.iter().all(|u| (u.key_tiles as usize) < g.bins()));
            for u in &plan {
                let c = coord(&cq, &ck, u, tile_rows);
                assert_eq!(c.rows, u.rows as usize);
                assert_eq!(c.q_row0, cq[u.seq as usize] as usize + u.q0 as usize);
            }
        }
    }

    #[test]
    fn a_packed_plan_covers_every_packed_row_once_with_its_tokens_keys() {
        let (cq, ck) = ([0i32, 1, 17, 17, 300], [0i32, 900, 2000, 2100, 2400]);
        for (group, causal, left) in [
            (1, true, None),
            (4, true, None),
            (8, false, None),
            (4, true, Some(100)),
        ] {
            let plan = ragged_plan_packed(&cq, &ck, 2, 128, 64, causal, left, None, group);
            if group == 1 {
                assert_eq!(
                    plan,
                    ragged_plan_windowed(&cq, &ck, 2, 128, 64, causal, left, None)
                );
            }
            for seq in 0..4 {
                let (sq, sk) = (
                    (cq[seq + 1] - cq[seq]) as usize,
                    (ck[seq + 1] - ck[seq]) as usize,
                );
                for head in 0..2u32 {
                    let mut rows: Vec<usize> = plan
                        .iter()
                        .filter(|u| u.seq as usize == seq && u.head == head)
                        .flat_map(|u| u.q0 as usize..(u.q0 + u.rows) as usize)
                        .collect();
                    rows.sort();
                    assert_eq!(
                        rows,
                        (0..sq * group).collect::<Vec<_>>(),
                        "seq {seq} head {head}"
                    );
                }
                for u in plan.iter().filter(|u| u.seq as usize == seq) {
                    // The unit's tiles are its tokens' (key_range over them), as the kernel masks them.
                    let (t0, t1) = (u.q0 as usize / group, (u.q0 + u.rows - 1) as usize / group);
                    let want = key_range(sq, sk, t0, t1 - t0 + 1, 64, causal, left, None).1;
                    assert_eq!(u.key_tiles as usize, want);
                    let c = coord_packed(&cq, &ck, u, 128, group);
                    assert_eq!(c.q_row0, cq[seq] as usize + t0);
                    assert_eq!(c.rows, u.rows as usize);
                }
            }
            let g = Geometry {
                batch: 4,
                heads: 2,
                tile_rows: 128,
                bc: 64,
                causal,
                left,
                right: None,
                total_q: 300,
                total_k: 2400,
                group,
            };
            assert!(plan.len() <= g.max_units());
        }
    }

    #[test]
    fn same_plan_tells_a_reordering_from_a_wrong_plan() {
        let plan = ragged_plan(&[0, 300, 310], &[0, 900, 1000], 2, 128, 128, true);
        let mut shuffled = plan.clone();
        // Equal key tiles may come in any order.
        let n = shuffled
            .iter()
            .filter(|u| u.key_tiles == shuffled[0].key_tiles)
            .count();
        shuffled[..n].reverse();
        assert!(same_plan(&shuffled, &plan).is_ok());
        let mut ascending = plan.clone();
        ascending.reverse();
        assert!(
            same_plan(&ascending, &plan)
                .unwrap_err()
                .to_string()
                .contains("not longest first")
        );
        let mut wrong = plan.clone();
        wrong[0].head += 1;
        assert!(
            same_plan(&wrong, &plan)
                .unwrap_err()
                .to_string()
                .contains("units differ")
        );
        assert!(
            same_plan(&plan[1..], &plan)
                .unwrap_err()
                .to_string()
                .contains("units, and the plan has")
        );
    }

    proptest::proptest! {
        /// The range formula against the key-by-key definition: a unit's tiles cover its rows' last visible key.
        #[test]
        fn key_range_covers_every_rows_window_and_no_more(sq in 1usize..400, sk in 0usize..600, q0f in 0.0f64..1.0,
                                                          bc in 1usize..200, causal: bool,
                                                          left in proptest::option::of(0usize..500),
                                                          right in proptest::option::of(0usize..500)) {
            let q0 = ((sq - 1) as f64 * q0f) as usize;
            let rows = 128.min(sq - q0);
            let (first, tiles) = key_range(sq, sk, q0, rows, bc, causal, left, right);
            // Every key some row of the unit sees is inside the tiles; the first tile holds the first row's first key.
            let sees = |i: usize, j: usize| {
                let d = (i + sk) as i64 - sq as i64;
                let lo = left.map_or(i64::MIN, |l| d - l as i64);
                let hi = if causal { d } else { right.map_or(i64::MAX, |r| d + r as i64) };
                (lo..=hi).contains(&(j as i64))
            };
            let seen: Vec<usize> = (0..sk).filter(|&j| (q0..q0 + rows).any(|i| sees(i, j))).collect();
            proptest::prop_assert!(tiles >= 1);
            if let (Some(&a), Some(&b)) = (seen.first(), seen.last()) {
                proptest::prop_assert_eq!(first, a / bc);
                proptest::prop_assert_eq!(first + tiles - 1, b / bc);
            }
            // No window: key_tiles's count from tile 0.
            if left.is_none() && right.is_none() {
                proptest::prop_assert_eq!((first, tiles), (0, key_tiles(sq, sk, q0, rows, bc, causal)));
            }
        }

        #[test]
        fn key_tiles_cover_the_last_rows_keys(sq in 1usize..600, sk in 0usize..900, q0f in 0.0f64..1.0, bc in 1usize..300) {
            let q0 = ((sq - 1) as f64 * q0f) as usize;
            let rows = (sq - q0).min(128);
            let last_row = q0 + rows - 1;
            let visible = (0..sk).filter(|&j| j + sq <= last_row + sk).count();
            proptest::prop_assert_eq!(key_tiles(sq, sk, q0, rows, bc, true), visible.div_ceil(bc).max(1));
            proptest::prop_assert_eq!(key_tiles(sq, sk, q0, rows, bc, false), sk.div_ceil(bc).max(1));
        }
    }
}
