// Variable-length (packed) batches: their sequence boundaries checked by name, and the plan of their ragged work.
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
    let mut units = Vec::new();
    for seq in 0..cu_q.len().saturating_sub(1) {
        let sq = (cu_q[seq + 1] - cu_q[seq]).max(0) as usize;
        let sk = (cu_k[seq + 1] - cu_k[seq]).max(0) as usize;
        for head in 0..heads {
            for q0 in (0..sq).step_by(tile_rows) {
                let rows = tile_rows.min(sq - q0);
                let visible = if causal {
                    (q0 + rows + sk).saturating_sub(sq).min(sk)
                } else {
                    sk
                };
                units.push(RaggedUnit {
                    seq: seq as u32,
                    head: head as u32,
                    q0: q0 as u32,
                    rows: rows as u32,
                    key_tiles: visible.div_ceil(bc).max(1) as u32,
                });
            }
        }
    }
    // Longest first; the sort is stable, so equal units keep sequence, head, tile order.
    units.sort_by_key(|u| std::cmp::Reverse(u.key_tiles));
    units
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
}
