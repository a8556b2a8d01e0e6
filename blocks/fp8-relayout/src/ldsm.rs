// The model of TransposeLdsm: V's tile to Vᵀ in p_key order by ldmatrix.trans, byte permutes and stmatrix, emulated.
//
// A warp moves one *unit* at a time: 16 keys × 32 channels (512 bytes). `ldmatrix.x4.trans` reads four 8 × 8
// matrices of 16-bit elements (a row is 16 bytes of one key: channel pairs), lane 8m + i giving the address of row i
// of matrix m, and hands lane 4c + w, for each matrix j, the word (row 2w, column c) | (row 2w + 1, column c) << 16:
// bytes V[k][2c], V[k][2c + 1], V[k + 1][2c], V[k + 1][2c + 1] with k = 2w. Matrices 0 and 1 are keys 0–7 and 8–15
// of channels 0–15, 2 and 3 the same keys of channels 16–31. Two byte permutes of words 0 and 1 give channel 2c's
// four keys 2w, 2w + 1, 8 + 2w, 9 + 2w (the even bytes) and channel 2c + 1's (the odd bytes): exactly the keys
// that A slots 4w .. 4w + 3 hold in p_key order. `stmatrix.x4` then writes lane 4r + w's word j as bytes 4w .. 4w + 3
// of row r of matrix j, row i of matrix m at the address lane 8m + i gives. Lanes with r ≥ 4 put the odd channel
// in the even matrix: matrix 2h + p's row r is channel 16h + 2r + (p ^ r / 4), so that the 8 rows of one matrix sit
// in 8 different bank groups of a Vᵀ whose rows are 32 or 128 bytes (the stores are conflict-free).
use crate::model::KeyOrder;
use frag_layout::{Desc, Swizzle};

/// A tile's geometry: `rows` keys of `cols` channels (bytes), V in the canonical K-major layout of `src` (rows of
/// `cols` bytes, beyond the swizzle width in further panels, as TMA boxes lay them), Vᵀ in that of `dst` (`cols`
/// rows of `rows` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LdsmTile {
    pub rows: u32,
    pub cols: u32,
    pub src: Swizzle,
    pub dst: Swizzle,
}

/// The byte-permute selectors of lane `lane`'s words 2h and 2h + 1 (mirrors `TransposeLdsm::run`): the even bytes
/// (0x6420) then the odd (0x7531), swapped for lanes of rows 4–7 (lane / 4 ≥ 4).
pub fn ldsm_selectors(lane: u32) -> [u32; 2] {
    if lane / 16 == 0 {
        [0x6420, 0x7531]
    } else {
        [0x7531, 0x6420]
    }
}

/// CUDA's `__byte_perm(x, y, s)`: byte i of the result is byte (s >> 4i) & 7 of y:x.
pub fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let b = (y as u64) << 32 | x as u64;
    (0..4).fold(0, |acc, i| {
        let sel = (s >> (4 * i)) & 7;
        acc | (((b >> (8 * sel)) & 0xFF) as u32) << (8 * i)
    })
}

impl LdsmTile {
    /// Units in the tile: (rows / 16) key blocks × (cols / 32) channel blocks.
    pub fn units(&self) -> u32 {
        self.rows / 16 * (self.cols / 32)
    }

    /// Unit u's key block and channel block (mirrors `TransposeLdsm::unit`): channel blocks fastest.
    pub fn unit(&self, u: u32) -> (u32, u32) {
        (u / (self.cols / 32), u % (self.cols / 32))
    }

    /// Where lane `lane`'s ldmatrix row starts in V's tile for unit (kb, db): key 16kb + 8(m % 2) + i, channels
    /// 32db + 16(m / 2) .. + 15 (m = lane / 8, i = lane % 8).
    pub fn src_byte(&self, lane: u32, kb: u32, db: u32) -> u32 {
        let (m, i) = (lane / 8, lane % 8);
        let key = 16 * kb + 8 * (m % 2) + i;
        Desc::tile_byte(
            self.src,
            self.rows,
            self.cols.next_multiple_of(32),
            key,
            32 * db + 16 * (m / 2),
        )
    }

    /// The channel that row i of stmatrix's matrix m holds: 16(m / 2) + 2i + (m % 2 ^ i / 4) of the unit's 32.
    pub fn channel(m: u32, i: u32) -> u32 {
        16 * (m / 2) + 2 * i + ((m % 2) ^ (i / 4))
    }

    /// Where lane `lane`'s stmatrix row starts in Vᵀ for unit (kb, db): row 32db + channel(m, i), K positions
    /// 16kb .. 16kb + 15.
    pub fn dst_byte(&self, lane: u32, kb: u32, db: u32) -> u32 {
        let (m, i) = (lane / 8, lane % 8);
        Desc::tile_byte(
            self.dst,
            self.cols,
            self.rows.next_multiple_of(32),
            32 * db + Self::channel(m, i),
            16 * kb,
        )
    }

    /// V's tile image (`src` layout) of a row-major [rows][cols] byte matrix.
    pub fn src_image(&self, v: &[u8]) -> Vec<u8> {
        let k = self.cols.next_multiple_of(32);
        let mut img = vec![0u8; Desc::tile_bytes(self.src, self.rows, k) as usize];
        for r in 0..self.rows {
            for c in 0..self.cols {
                img[Desc::tile_byte(self.src, self.rows, k, r, c) as usize] =
                    v[(r * self.cols + c) as usize];
            }
        }
        img
    }

    /// Vᵀ's image as `TransposeLdsm` leaves it, emulated instruction by instruction from V's image: every unit's
    /// ldmatrix.x4.trans, four byte permutes a lane and stmatrix.x4. Bytes no unit writes keep `fill`.
    pub fn emulate(&self, src: &[u8], fill: u8) -> Vec<u8> {
        let k = self.rows.next_multiple_of(32);
        let mut dst = vec![fill; Desc::tile_bytes(self.dst, self.cols, k) as usize];
        let half = |img: &[u8], at: usize| u16::from_le_bytes([img[at], img[at + 1]]) as u32;
        for u in 0..self.units() {
            let (kb, db) = self.unit(u);
            // ldmatrix.x4.trans: lane 4c + w's word j = (row 2w, col c) | (row 2w + 1, col c) << 16 of matrix j.
            let rows: Vec<u32> = (0..32).map(|l| self.src_byte(l, kb, db)).collect();
            let regs: Vec<[u32; 4]> = (0..32u32)
                .map(|lane| {
                    let (c, w) = (lane / 4, lane % 4);
                    std::array::from_fn(|j| {
                        let r0 = rows[(8 * j as u32 + 2 * w) as usize] as usize;
                        let r1 = rows[(8 * j as u32 + 2 * w + 1) as usize] as usize;
                        half(src, r0 + 2 * c as usize) | half(src, r1 + 2 * c as usize) << 16
                    })
                })
                .collect();
            let out: Vec<[u32; 4]> = (0..32u32)
                .map(|lane| {
                    let [s0, s1] = ldsm_selectors(lane);
                    let r = regs[lane as usize];
                    [
                        byte_perm(r[0], r[1], s0),
                        byte_perm(r[0], r[1], s1),
                        byte_perm(r[2], r[3], s0),
                        byte_perm(r[2], r[3], s1),
                    ]
                })
                .collect();
            // stmatrix.x4: lane 4r + w's word j to bytes 4w .. 4w + 3 of row r of matrix j (address from lane 8j + r).
            for lane in 0..32u32 {
                let (r, w) = (lane / 4, lane % 4);
                for j in 0..4u32 {
                    let at = self.dst_byte(8 * j + r, kb, db) as usize + 4 * w as usize;
                    dst[at..at + 4].copy_from_slice(&out[lane as usize][j as usize].to_le_bytes());
                }
            }
        }
        dst
    }

    /// Extra shared-memory wavefronts of a whole tile's transposes: an ldmatrix or stmatrix phase is one 8 × 16-byte
    /// matrix (the 8 row addresses of lanes 8m .. 8m + 7); its extra wavefronts are the distinct 16-byte chunks in
    /// its busiest bank group of 128 bytes, beyond the first. (loads, stores).
    pub fn conflicts(&self) -> (u32, u32) {
        let extra = |addrs: Vec<u32>| -> u32 {
            let mut per_group: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>> =
                Default::default();
            for a in addrs {
                per_group.entry(a / 16 % 8).or_default().insert(a / 16);
            }
            per_group
                .values()
                .map(|s| s.len() as u32 - 1)
                .max()
                .unwrap_or(0)
        };
        let (mut loads, mut stores) = (0, 0);
        for u in 0..self.units() {
            let (kb, db) = self.unit(u);
            for m in 0..4 {
                loads += extra((0..8).map(|i| self.src_byte(8 * m + i, kb, db)).collect());
                stores += extra((0..8).map(|i| self.dst_byte(8 * m + i, kb, db)).collect());
            }
        }
        (loads, stores)
    }
}

/// What `TransposeLdsm` must leave: Vᵀ with K position k holding key p_key(k), `fill` where the tile has no element.
pub fn ldsm_expected(tile: &LdsmTile, v: &[u8], fill: u8) -> Vec<u8> {
    crate::model::transposed_in(
        v,
        tile.rows as usize,
        tile.cols as usize,
        tile.dst,
        fill,
        KeyOrder::Local,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TILES: [LdsmTile; 7] = [
        // 224 keys of D = 128 (Vᵀ in 32-byte panels); 128-key tiles at D = 64, 256 and 128; 32 keys of D = 128 (the
        // smallest tile); stage 8's tiles: D = 64 (256 keys, 128-byte Vᵀ panels) and D = 128 (192 keys, 64-byte
        // panels).
        LdsmTile {
            rows: 224,
            cols: 128,
            src: Swizzle::B128,
            dst: Swizzle::B32,
        },
        LdsmTile {
            rows: 128,
            cols: 64,
            src: Swizzle::B64,
            dst: Swizzle::B128,
        },
        LdsmTile {
            rows: 128,
            cols: 256,
            src: Swizzle::B128,
            dst: Swizzle::B128,
        },
        LdsmTile {
            rows: 128,
            cols: 128,
            src: Swizzle::B128,
            dst: Swizzle::B128,
        },
        LdsmTile {
            rows: 32,
            cols: 128,
            src: Swizzle::B128,
            dst: Swizzle::B32,
        },
        LdsmTile {
            rows: 256,
            cols: 64,
            src: Swizzle::B64,
            dst: Swizzle::B128,
        },
        LdsmTile {
            rows: 192,
            cols: 128,
            src: Swizzle::B128,
            dst: Swizzle::B64,
        },
    ];

    fn v(t: &LdsmTile, seed: u32) -> Vec<u8> {
        (0..t.rows * t.cols)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
            .collect()
    }

    #[test]
    fn byte_perm_is_cudas() {
        assert_eq!(byte_perm(0x33221100, 0x77665544, 0x6420), 0x66442200);
        assert_eq!(byte_perm(0x33221100, 0x77665544, 0x7531), 0x77553311);
        assert_eq!(byte_perm(0x33221100, 0x77665544, 0x3210), 0x33221100);
    }

    #[test]
    fn emulated_instructions_give_the_transpose_in_p_key_order() {
        for t in TILES {
            for seed in 0..3 {
                let v = v(&t, seed);
                let got = t.emulate(&t.src_image(&v), 0xCD);
                let want = ldsm_expected(&t, &v, 0xCD);
                let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                assert_eq!(bad, 0, "{t:?} seed {seed}: {bad} bytes differ");
            }
        }
    }

    #[test]
    fn in_order_keys_would_differ() {
        // The instructions give p_key order, not key order: the model tells the two apart.
        let t = TILES[3];
        let v = v(&t, 1);
        let got = t.emulate(&t.src_image(&v), 0);
        let in_order = crate::model::transposed(&v, 128, 128, t.dst, 0);
        assert_ne!(got, in_order);
    }

    #[test]
    fn units_write_every_byte_once() {
        for t in TILES {
            let mut seen = std::collections::BTreeSet::new();
            for u in 0..t.units() {
                let (kb, db) = t.unit(u);
                for lane in 0..32 {
                    let at = t.dst_byte(lane, kb, db);
                    for b in 0..16 {
                        assert!(seen.insert(at + b), "{t:?}: byte {} twice", at + b);
                    }
                }
            }
            assert_eq!(seen.len() as u32, t.rows * t.cols, "{t:?}");
        }
    }

    #[test]
    fn no_bank_conflicts() {
        // Loads: 8 keys of one 16-byte channel chunk, which every swizzle of V (rows of 64 or 128 bytes) spreads
        // over 8 bank groups. Stores: 8 channels 2i + (p ^ i / 4) apart, in 8 bank groups of Vᵀ.
        for t in TILES {
            assert_eq!(t.conflicts(), (0, 0), "{t:?}");
        }
        // The plain assignment (even channels in the even matrix on every lane) stores 2-way.
        let t = TILES[0];
        let plain = |m: u32, i: u32| 16 * (m / 2) + 2 * i + m % 2;
        let mut extra = 0;
        for u in 0..t.units() {
            let (kb, db) = t.unit(u);
            for m in 0..4 {
                let mut groups = std::collections::BTreeMap::<u32, u32>::new();
                for i in 0..8 {
                    let at = Desc::tile_byte(
                        t.dst,
                        t.cols,
                        224u32.next_multiple_of(32),
                        32 * db + plain(m, i),
                        16 * kb,
                    );
                    *groups.entry(at / 16 % 8).or_default() += 1;
                }
                extra += groups.values().max().unwrap() - 1;
            }
        }
        assert!(
            extra >= t.units() * 4,
            "the plain stores: {extra} extra wavefronts"
        );
    }
}
