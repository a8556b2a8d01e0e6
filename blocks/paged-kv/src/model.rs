// The paged-kv model: the pool and block table, their checks with named errors, and where each key sits.
use anyhow::{Result, bail, ensure};

/// A paged KV cache's pool: `num_pages` pages of `page_size` rows, each row `hkv` heads of `d` bytes (E4M3):
/// `[num_pages, page_size, Hkv, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub num_pages: usize,
    pub page_size: usize,
    pub hkv: usize,
    pub d: usize,
}

impl Pool {
    /// Bytes of the pool.
    pub fn bytes(&self) -> usize {
        self.num_pages * self.page_size * self.hkv * self.d
    }
}

/// Each sequence's pages in order (`pages[b · max_pages + p]`, entries past a sequence's last page unread) and its
/// length in keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockTable {
    pub max_pages: usize,
    pub pages: Vec<i32>,
    pub seq_lens: Vec<i32>,
}

impl BlockTable {
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }
}

/// `sdpa::paged::Table` without its pointer: what a kernel needs besides the table's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    pub max_pages: i32,
    pub page_shift: i32,
}

/// Why `t` cannot address `pool`: the first thing wrong, named (a page size the kernels do not take, a table of the
/// wrong length, a negative length, a sequence longer than its pages, an entry outside the pool). On success, the
/// kernel's view of the table.
pub fn validate(pool: &Pool, t: &BlockTable) -> Result<Table> {
    let ps = pool.page_size;
    ensure!(
        ps.is_power_of_two() && (16..=256).contains(&ps),
        "page size {ps}: the kernels take a power of two from 16 to 256"
    );
    ensure!(
        pool.d.is_multiple_of(16) && pool.d > 0 && pool.hkv > 0,
        "pool rows of {} heads × D = {}: D must be a positive multiple of 16",
        pool.hkv,
        pool.d
    );
    let b = t.batch();
    ensure!(
        t.pages.len() == b * t.max_pages,
        "the block table holds {} entries, and {b} sequences × {} pages need {}",
        t.pages.len(),
        t.max_pages,
        b * t.max_pages
    );
    ensure!(
        pool.num_pages <= i32::MAX as usize && t.max_pages <= i32::MAX as usize,
        "a pool of {} pages or a table of {} pages a sequence: more than 2^31 − 1",
        pool.num_pages,
        t.max_pages
    );
    for (s, &len) in t.seq_lens.iter().enumerate() {
        ensure!(len >= 0, "sequence {s} has length {len}");
        let len = len as usize;
        ensure!(
            len <= t.max_pages * ps,
            "sequence {s} has {len} keys, more than its {} pages of {ps} hold",
            t.max_pages
        );
        for p in 0..len.div_ceil(ps) {
            let e = t.pages[s * t.max_pages + p];
            if e < 0 || e as usize >= pool.num_pages {
                bail!(
                    "block_table[{s}][{p}] = {e} is outside the pool of {} pages (sequence {s} has {len} keys: pages 0..{} \
                     are read)",
                    pool.num_pages,
                    len.div_ceil(ps)
                );
            }
        }
    }
    Ok(Table {
        max_pages: t.max_pages as i32,
        page_shift: ps.trailing_zeros() as i32,
    })
}

/// The pool row of key `key` of sequence `b`: its page's first row plus the key's place in the page.
pub fn pool_row(pool: &Pool, t: &BlockTable, b: usize, key: usize) -> usize {
    let page = t.pages[b * t.max_pages + key / pool.page_size] as usize;
    page * pool.page_size + key % pool.page_size
}

/// Every sequence's keys as a dense `[B, Hkv, max_len, D]` tensor from `cache` (the pool's bytes), zeros at and
/// past each sequence's length: what `gather_paged` writes.
pub fn gather(pool: &Pool, t: &BlockTable, cache: &[u8], max_len: usize) -> Vec<u8> {
    let d = pool.d;
    let mut out = vec![0u8; t.batch() * pool.hkv * max_len * d];
    for b in 0..t.batch() {
        for h in 0..pool.hkv {
            for key in 0..(t.seq_lens[b] as usize).min(max_len) {
                let src = (pool_row(pool, t, b, key) * pool.hkv + h) * d;
                let dst = ((b * pool.hkv + h) * max_len + key) * d;
                out[dst..dst + d].copy_from_slice(&cache[src..src + d]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pool(ps: usize) -> Pool {
        Pool {
            num_pages: 10,
            page_size: ps,
            hkv: 2,
            d: 64,
        }
    }

    #[test]
    fn every_bad_table_is_named() {
        let t = BlockTable {
            max_pages: 3,
            pages: vec![4, 1, -1, 0, 2, 9],
            seq_lens: vec![20, 40],
        };
        assert_eq!(
            validate(&pool(16), &t).unwrap(),
            Table {
                max_pages: 3,
                page_shift: 4
            }
        );
        let e = |p: &Pool, t: &BlockTable| validate(p, t).unwrap_err().to_string();
        assert!(e(&pool(24), &t).contains("page size 24"));
        assert!(e(&pool(512), &t).contains("page size 512"));
        let short = BlockTable {
            pages: vec![4, 1, -1, 0, 2],
            ..t.clone()
        };
        assert!(
            e(&pool(16), &short).contains("holds 5 entries"),
            "{}",
            e(&pool(16), &short)
        );
        let long = BlockTable {
            seq_lens: vec![20, 49],
            ..t.clone()
        };
        assert!(
            e(&pool(16), &long).contains("sequence 1 has 49 keys, more than its 3 pages of 16")
        );
        let outside = BlockTable {
            pages: vec![4, 1, -1, 0, 2, 10],
            ..t.clone()
        };
        assert!(
            e(&pool(16), &outside)
                .contains("block_table[1][2] = 10 is outside the pool of 10 pages")
        );
        let unset = BlockTable {
            seq_lens: vec![33, 40],
            ..t.clone()
        };
        assert!(e(&pool(16), &unset).contains("block_table[0][2] = -1"));
        let negative = BlockTable {
            seq_lens: vec![-1, 40],
            ..t
        };
        assert!(e(&pool(16), &negative).contains("sequence 0 has length -1"));
    }

    #[test]
    fn an_identity_table_gathers_the_pool_as_it_is() {
        // One sequence whose pages are the pool's in order: the gather is the pool itself, head by head.
        let p = Pool {
            num_pages: 4,
            page_size: 16,
            hkv: 1,
            d: 16,
        };
        let t = BlockTable {
            max_pages: 4,
            pages: vec![0, 1, 2, 3],
            seq_lens: vec![64],
        };
        let cache: Vec<u8> = (0..p.bytes()).map(|i| (i % 251) as u8).collect();
        assert_eq!(gather(&p, &t, &cache, 64), cache);
    }

    proptest! {
        /// Keys of one sequence land in distinct pool rows, in the page its table names, at the key's place in it.
        #[test]
        fn keys_land_in_their_page(shift in 4u32..9, len in 1usize..600, seed in 0u64..1000) {
            let ps = 1usize << shift;
            let pages = len.div_ceil(ps);
            let p = Pool { num_pages: pages + 3, page_size: ps, hkv: 1, d: 16 };
            // A shuffled choice of distinct pages.
            let mut ids: Vec<i32> = (0..p.num_pages as i32).collect();
            let mut x = seed;
            for i in (1..ids.len()).rev() {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ids.swap(i, (x >> 33) as usize % (i + 1));
            }
            let t = BlockTable { max_pages: pages, pages: ids[..pages].to_vec(), seq_lens: vec![len as i32] };
            prop_assert!(validate(&p, &t).is_ok());
            let mut seen = std::collections::HashSet::new();
            for key in 0..len {
                let row = pool_row(&p, &t, 0, key);
                prop_assert_eq!(row / ps, t.pages[key / ps] as usize);
                prop_assert_eq!(row % ps, key % ps);
                prop_assert!(seen.insert(row));
            }
        }
    }
}
