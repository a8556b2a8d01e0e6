// The fp8-relayout model: what each relayout must produce, byte for byte, from the frag-layout tables and the codec.
use fp8_codec::{Format, Saturation, encode};
use frag_layout::{DType, Desc, LayoutId, Op, Operand, Swizzle};

/// The register A words `acc_to_a_e4m3` must give thread t for K-step s of a 64 × n f32 tile `p` (row-major):
/// byte b of register q is element 4q + b of frag::wgmma_a_k32, the E4M3 code of p·scale (computed in f32).
pub fn a_words(p: &[f32], n: usize, scale: f32) -> Vec<u32> {
    a_words_in(p, n, scale, KeyOrder::InOrder)
}

/// Which key a K position holds: in order, or `acc_to_a_e4m3_local`'s order (mirrors `p_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrder {
    InOrder,
    Local,
}

impl KeyOrder {
    pub fn key(self, k: u32) -> u32 {
        match self {
            KeyOrder::InOrder => k,
            KeyOrder::Local => {
                32 * (k / 32) + 16 * (k % 32 / 16) + 8 * (k % 4 / 2) + 2 * (k % 16 / 4) + k % 2
            }
        }
    }
}

/// As [`a_words`], A slot k holding key `order.key(k)` (`acc_to_a_e4m3_local` with `KeyOrder::Local`).
pub fn a_words_in(p: &[f32], n: usize, scale: f32, order: KeyOrder) -> Vec<u32> {
    let a = LayoutId {
        op: Op::Wgmma { n: 64, k: 32 },
        operand: Operand::A(None),
        dtype: DType::E4m3,
    };
    let steps = n / 32;
    let mut out = vec![0u32; 128 * steps * 4];
    for t in 0..128u32 {
        for s in 0..steps {
            for e in 0..16u32 {
                let (row, col) = a.coord(t, e);
                let v = p[row as usize * n + s * 32 + order.key(col) as usize] * scale;
                let code = encode(v, Saturation::SatFinite, Format::E4M3) as u32;
                out[(t as usize * steps + s) * 4 + (e / 4) as usize] |= code << (8 * (e % 4));
            }
        }
    }
    out
}

/// The bytes of the transposed tile as they sit in shared memory: dst[c][r] = src[r][c] (src row-major
/// [rows][cols]) in the canonical K-major `dst_sw` layout of `cols` rows and `rows` bytes of K. Bytes of the
/// tile that hold no element (a swizzle wider than K) keep `fill`.
pub fn transposed(src: &[u8], rows: usize, cols: usize, dst_sw: Swizzle, fill: u8) -> Vec<u8> {
    transposed_in(src, rows, cols, dst_sw, fill, KeyOrder::InOrder)
}

/// As [`transposed`], K position k holding source row `order.key(k)`: dst[c][k] = src[order.key(k)][c].
pub fn transposed_in(
    src: &[u8],
    rows: usize,
    cols: usize,
    dst_sw: Swizzle,
    fill: u8,
    order: KeyOrder,
) -> Vec<u8> {
    let bytes = Desc::tile_bytes(dst_sw, cols as u32, rows as u32) as usize;
    let mut out = vec![fill; bytes];
    for c in 0..cols {
        for r in 0..rows {
            let d = Desc::k_major(
                dst_sw,
                cols as u32,
                rows.next_multiple_of(32) as u32,
                (r / 32) as u32,
            );
            let key = order.key(r as u32) as usize;
            out[d.byte_of(c as u32, (r % 32) as u32) as usize] = src[key * cols + c];
        }
    }
    out
}

/// The 8×8-byte block (rb, cb) that block number `n` of a tile with `nc` block columns is (mirrors
/// `transpose_rb` / `transpose_cb`): thread `t` moves blocks t, t + THREADS, …
pub fn transpose_block(n: u32, nc: u32) -> (u32, u32) {
    (
        16 * (n / 16 / nc) + (n % 16 + n / 16 % nc) % 16,
        n % 16 % nc,
    )
}

/// Shared-memory bank conflicts of `Transpose` on a `rows` × `cols` source tile (K-major, `src` swizzle)
/// transposed into the `dst` swizzle, summed over every warp and each of its 8 loads and 8 stores: a 64-bit
/// access is served a half-warp at a time, and the extra wavefronts of a half-warp are the distinct 4-byte
/// words landing in its busiest bank, beyond the first.
pub fn transpose_conflicts(
    rows: u32,
    cols: u32,
    src: Swizzle,
    dst: Swizzle,
    order: KeyOrder,
) -> u32 {
    conflicts_with(rows, cols, src, dst, order, |n, nc| {
        let (rb, cb) = transpose_block(n, nc);
        (rb, cb, 0)
    })
}

/// The block (rb, cb) that block number `n` of `TransposeLean` is, and the rotation of its channels (mirrors
/// `lean_rb` / `lean_cb` / `lean_rot`). With 16 block columns (128 channels) a half-warp takes every block
/// column of one 32-key panel's 4 block rows, each lane a rotation (lane % 4) of the order it stores its 4-channel
/// groups in, so that its 64-bit stores land in 16 different banks of a 32-byte-swizzled Vᵀ; with 8 (64
/// channels) it is `transpose_block`'s diagonal with no rotation.
pub fn lean_block(n: u32, nc: u32) -> (u32, u32, u32) {
    if nc == 16 {
        let (h, l) = (n / 16, n % 16);
        (4 * (h / 4) + (l / 4 + h) % 4, l, l % 4)
    } else {
        let (rb, cb) = transpose_block(n, nc);
        (rb, cb, 0)
    }
}

/// As [`transpose_conflicts`], for `TransposeLean`'s blocks and rotations ([`lean_block`]).
pub fn lean_conflicts(rows: u32, cols: u32, src: Swizzle, dst: Swizzle, order: KeyOrder) -> u32 {
    conflicts_with(rows, cols, src, dst, order, lean_block)
}

fn conflicts_with(
    rows: u32,
    cols: u32,
    src: Swizzle,
    dst: Swizzle,
    order: KeyOrder,
    block: impl Fn(u32, u32) -> (u32, u32, u32),
) -> u32 {
    let byte = |sw: Swizzle, tile_rows: u32, k_bytes: u32, r: u32, b: u32| {
        Desc::tile_byte(sw, tile_rows, k_bytes.next_multiple_of(32), r, b)
    };
    let extra = |addrs: Vec<u32>| -> u32 {
        let mut per_bank: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>> =
            Default::default();
        for a in addrs {
            for w in [a / 4, a / 4 + 1] {
                per_bank.entry(w % 32).or_default().insert(w);
            }
        }
        per_bank
            .values()
            .map(|w| w.len() as u32 - 1)
            .max()
            .unwrap_or(0)
    };
    let nc = cols / 8;
    let blocks = rows / 8 * nc;
    let mut total = 0;
    for half in 0..blocks.div_ceil(16) {
        let ns = (16 * half..(16 * half + 16).min(blocks)).map(|n| block(n, nc));
        let ns: Vec<(u32, u32, u32)> = ns.collect();
        for i in 0..8 {
            total += extra(
                ns.iter()
                    .map(|&(rb, cb, _)| byte(src, rows, cols, order.key(8 * rb + i), 8 * cb))
                    .collect(),
            );
            // Store i of a block: its 4-channel group i / 4, channel (i + rot) % 4 of the group.
            total += extra(
                ns.iter()
                    .map(|&(rb, cb, rot)| {
                        byte(dst, cols, rows, 8 * cb + i / 4 * 4 + (i + rot) % 4, 8 * rb)
                    })
                    .collect(),
            );
        }
    }
    total
}

/// The 8 KiB shared-memory image `stage_panel<T, n, panel>` must write for a 64 × n f32 tile `x` (row-major):
/// columns 64·panel .. 64·panel + 63 times the row's factor (`scale[h]` for rows 16w + 8h .. 16w + 8h + 7, the
/// accumulator's row halves) as 16-bit words (`to16`: bf16 or f16 bits), in the canonical wgmma tile of 64 rows ×
/// 128 bytes with the 128-byte swizzle (the image a TMA box with that swizzle holds).
pub fn staged_panel(
    x: &[f32],
    n: usize,
    panel: usize,
    scale: [f32; 2],
    to16: impl Fn(f32) -> u16,
) -> Vec<u8> {
    let mut out = vec![0u8; 64 * 128];
    for r in 0..64 {
        for c in 0..64 {
            let v = to16(x[r * n + 64 * panel + c] * scale[r % 16 / 8]).to_le_bytes();
            for (b, byte) in v.into_iter().enumerate() {
                let kb = 2 * c + b;
                let at = Desc::tile_byte(Swizzle::B128, 64, 128, r as u32, kb as u32);
                out[at as usize] = byte;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_words_put_row_g_keys_4q_in_register_0() {
        // p[r][c] = c (exact in E4M3 up to 16, then the codec rounds; only the first keys are looked at).
        let n = 32;
        let p: Vec<f32> = (0..64 * n).map(|i| (i % n) as f32 / 4.0).collect();
        let w = a_words(&p, n, 1.0);
        // Thread 1 (q = 1): register 0 holds keys 4..7 of row 0.
        let want: Vec<u8> = (4..8)
            .map(|c| encode(c as f32 / 4.0, Saturation::SatFinite, Format::E4M3))
            .collect();
        assert_eq!(w[4].to_le_bytes().to_vec(), want);
    }

    #[test]
    fn local_key_order_permutes_each_step() {
        let keys: std::collections::BTreeSet<u32> =
            (0..64).map(|k| KeyOrder::Local.key(k)).collect();
        assert_eq!(keys, (0..64).collect());
        // Thread q = 1 of a quad keeps its accumulator pairs 2, 3 / 10, 11 in slots 4..7.
        let slots: Vec<u32> = (4..8).map(|k| KeyOrder::Local.key(k)).collect();
        assert_eq!(slots, [2, 3, 10, 11]);
        assert!((32..64).all(|k| KeyOrder::Local.key(k) / 32 == 1));
    }

    #[test]
    fn blocks_cover_the_tile_once() {
        for (rows, cols) in [(128u32, 64u32), (128, 128), (256, 128)] {
            let nc = cols / 8;
            let mut seen = std::collections::BTreeSet::new();
            for n in 0..rows / 8 * nc {
                let (rb, cb) = transpose_block(n, nc);
                assert!(rb < rows / 8 && cb < nc, "{rows}x{cols}: block {n} outside");
                assert!(seen.insert((rb, cb)), "{rows}x{cols}: block twice");
            }
        }
    }

    #[test]
    fn stage5_transposes_bank_conflicts() {
        // V of D = 128 (128-byte swizzle) into Vᵀ of 128 keys (128-byte swizzle): none at all.
        // Also with V's keys in acc_to_a_e4m3_local's order: a load's rows then differ in r % 8 by the block
        // row's parity, which the 128-byte swizzle's XOR absorbs (each lane class keeps 8 distinct chunks).
        for order in [KeyOrder::InOrder, KeyOrder::Local] {
            assert_eq!(
                transpose_conflicts(128, 128, Swizzle::B128, Swizzle::B128, order),
                0,
                "{order:?}"
            );
        }
        // D = 64: the 64-byte-swizzled source puts two rows in one 128-byte line; the loads are 2-way (one extra
        // wavefront per half-warp and load: 8 half-warps x 8 loads), the stores free.
        assert_eq!(
            transpose_conflicts(128, 64, Swizzle::B64, Swizzle::B128, KeyOrder::InOrder),
            64
        );
        eprintln!(
            "D = 64, local key order: {} extra wavefronts",
            transpose_conflicts(128, 64, Swizzle::B64, Swizzle::B128, KeyOrder::Local)
        );
        // Consecutive threads along one block row (the obvious mapping): every store of a half-warp in one bank
        // pair, 15 extra wavefronts each (16 half-warps x 8 stores x 15).
        let naive = |n: u32, nc: u32| (n / nc, n % nc, 0);
        assert_eq!(
            conflicts_with(
                128,
                128,
                Swizzle::B128,
                Swizzle::B128,
                KeyOrder::InOrder,
                naive
            ),
            16 * 8 * 15
        );
    }

    #[test]
    fn lean_blocks_cover_the_tile_once() {
        for (rows, cols) in [(128u32, 64u32), (224, 128), (128, 128), (256, 128)] {
            let nc = cols / 8;
            let mut seen = std::collections::BTreeSet::new();
            for n in 0..rows / 8 * nc {
                let (rb, cb, rot) = lean_block(n, nc);
                assert!(
                    rb < rows / 8 && cb < nc && rot < 4,
                    "{rows}x{cols}: block {n} outside"
                );
                assert!(seen.insert((rb, cb)), "{rows}x{cols}: block twice");
            }
        }
    }

    #[test]
    fn lean_transposes_bank_conflicts() {
        // D = 128: 224 keys of V (128-byte swizzle) into Vᵀ's seven 32-byte-swizzled panels, keys in p_key
        // order: none. Without the rotation, every store of a half-warp shares 4 banks (3 extra wavefronts each).
        assert_eq!(
            lean_conflicts(224, 128, Swizzle::B128, Swizzle::B32, KeyOrder::Local),
            0
        );
        let unrotated = |n: u32, nc: u32| {
            let (rb, cb, _) = lean_block(n, nc);
            (rb, cb, 0)
        };
        let plain = conflicts_with(
            224,
            128,
            Swizzle::B128,
            Swizzle::B32,
            KeyOrder::Local,
            unrotated,
        );
        eprintln!("D = 128 without the rotation: {plain} extra wavefronts");
        assert!(plain >= 28 * 8 * 3, "{plain}");
        // D = 64: 128 keys (64-byte swizzle) into a 128-byte-swizzled Vᵀ, stage 5's plan.
        assert_eq!(
            lean_conflicts(128, 64, Swizzle::B64, Swizzle::B128, KeyOrder::Local),
            transpose_conflicts(128, 64, Swizzle::B64, Swizzle::B128, KeyOrder::Local)
        );
    }

    #[test]
    fn transposed_tile_holds_every_byte_once() {
        let (rows, cols) = (64, 128);
        let src: Vec<u8> = (0..rows * cols).map(|i| (i % 251) as u8 + 1).collect();
        for sw in Swizzle::ALL {
            let t = transposed(&src, rows, cols, sw, 0);
            let mut a: Vec<u8> = t.iter().copied().filter(|&b| b != 0).collect();
            let mut b = src.clone();
            a.sort();
            b.sort();
            assert_eq!(a, b, "{sw:?}");
        }
    }
}
