// Packed grouped-query rows on the host: row r's (query head, token), and the keys a row sees under causal and windows.

/// Row `r` of a packed tile: (query head within the group, query token) = (r mod group, r / group).
pub fn row(r: usize, group: usize) -> (usize, usize) {
    (r % group, r / group)
}

/// The packed row of (head within the group, token): the inverse of [`row`].
pub fn row_of(head: usize, token: usize, group: usize) -> usize {
    token * group + head
}

/// What a row may see: causal (bottom-right), and a sliding window of `left` keys before its position and `right`
/// after (None: unbounded on that side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Visibility {
    pub causal: bool,
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl Visibility {
    /// Whether query token `token` of `sq` (at key position Sk − Sq + token) sees key `j` of `sk`: the definition,
    /// key by key.
    pub fn sees(&self, token: usize, sq: usize, sk: usize, j: usize) -> bool {
        let i = sk as i64 - sq as i64 + token as i64;
        let j = j as i64;
        (!self.causal || j <= i)
            && self.left.is_none_or(|l| j >= i - l as i64)
            && self.right.is_none_or(|r| j <= i + r as i64)
    }

    /// The keys [lo, hi) query token `token` sees, as `pack::keys` computes them (lo = hi: none).
    pub fn keys(&self, token: usize, sq: usize, sk: usize) -> (usize, usize) {
        let i = sk as i64 - sq as i64 + token as i64;
        let mut hi = sk as i64;
        let mut lo = 0i64;
        if self.causal {
            hi = hi.min(i + 1);
        }
        if let Some(r) = self.right {
            hi = hi.min(i + r as i64 + 1);
        }
        if let Some(l) = self.left {
            lo = lo.max(i - l as i64);
        }
        let hi = hi.max(0);
        (lo.min(hi) as usize, hi as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_head_and_token_is_one_row() {
        for group in [1, 2, 4, 7, 8] {
            for sq in [1, 3, 16] {
                let mut seen = vec![false; group * sq];
                for r in 0..group * sq {
                    let (h, t) = row(r, group);
                    assert!(h < group && t < sq);
                    assert_eq!(row_of(h, t, group), r);
                    assert!(!std::mem::replace(&mut seen[h * sq + t], true));
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_key_range_is_the_definition(
            sq in 1usize..20, extra in 0usize..300, token_at in 0usize..20, causal: bool,
            left in proptest::option::of(0usize..40), right in proptest::option::of(0usize..40),
        ) {
            let (sk, token) = (sq + extra, token_at % sq);
            let v = Visibility { causal, left, right };
            let (lo, hi) = v.keys(token, sq, sk);
            prop_assert!(lo <= hi && hi <= sk);
            for j in 0..sk {
                prop_assert_eq!(v.sees(token, sq, sk, j), (lo..hi).contains(&j), "key {}", j);
            }
        }

        #[test]
        fn more_queries_than_keys_leave_rows_without_keys(sq in 2usize..20, sk in 1usize..20) {
            // Causal with Sq > Sk: the first Sq − Sk tokens see nothing (lo = hi), the rest at least one key.
            let v = Visibility { causal: true, ..Default::default() };
            for t in 0..sq {
                let (lo, hi) = v.keys(t, sq, sk);
                prop_assert_eq!(lo == hi, t + sk < sq);
            }
        }
    }
}
