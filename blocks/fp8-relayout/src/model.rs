// The fp8-relayout model: what each relayout must produce, byte for byte, from the frag-layout tables and the codec.
use fp8_codec::{Format, Saturation, encode};
use frag_layout::{DType, Desc, LayoutId, Op, Operand, Swizzle};

/// The register A words `acc_to_a_e4m3` must give thread t for K-step s of a 64 × n f32 tile `p` (row-major):
/// byte b of register q is element 4q + b of frag::wgmma_a_k32, the E4M3 code of p·scale (computed in f32).
pub fn a_words(p: &[f32], n: usize, scale: f32) -> Vec<u32> {
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
                let v = p[row as usize * n + s * 32 + col as usize] * scale;
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
            out[d.byte_of(c as u32, (r % 32) as u32) as usize] = src[r * cols + c];
        }
    }
    out
}

/// The block `transpose_tile`'s lane `l` moves in task `k` (mirrors `transpose_rb` / `transpose_cb`).
pub fn transpose_block(l: u32, k: u32) -> (u32, u32) {
    (l, ((l >> 1) ^ (k % 16)) + 16 * (k / 16))
}

/// Shared-memory bank conflicts of one warp's transpose task: for each of its 4 loads and 4 stores, the
/// extra wavefronts (distinct 4-byte words landing in one bank, beyond the first). `rows` × `cols` is the
/// source tile (K-major, `src` swizzle), transposed into the `dst` swizzle.
pub fn transpose_conflicts(rows: u32, cols: u32, src: Swizzle, dst: Swizzle, k: u32) -> u32 {
    let byte = |sw: Swizzle, tile_rows: u32, k_bytes: u32, r: u32, b: u32| {
        Desc::k_major(sw, tile_rows, k_bytes.next_multiple_of(32), b / 32).byte_of(r, b % 32)
    };
    let extra = |addrs: Vec<u32>| -> u32 {
        let mut per_bank: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>> =
            Default::default();
        for a in addrs {
            per_bank.entry((a / 4) % 32).or_default().insert(a / 4);
        }
        per_bank
            .values()
            .map(|w| w.len() as u32 - 1)
            .max()
            .unwrap_or(0)
    };
    let mut total = 0;
    for i in 0..4 {
        total += extra(
            (0..32)
                .map(|l| {
                    let (rb, cb) = transpose_block(l, k);
                    byte(src, rows, cols, 4 * rb + i, 4 * cb)
                })
                .collect(),
        );
        total += extra(
            (0..32)
                .map(|l| {
                    let (rb, cb) = transpose_block(l, k);
                    byte(dst, cols, rows, 4 * cb + i, 4 * rb)
                })
                .collect(),
        );
    }
    total
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
    fn tasks_cover_every_block_once() {
        for cols in [64u32, 128] {
            let mut seen = std::collections::BTreeSet::new();
            for k in 0..cols / 64 * 16 {
                for l in 0..32 {
                    assert!(
                        seen.insert(transpose_block(l, k)),
                        "cols {cols}: block twice"
                    );
                }
            }
            assert_eq!(seen.len() as u32, 32 * cols / 4);
        }
    }

    #[test]
    fn stage5_transposes_are_free_of_bank_conflicts() {
        // V of D = 128 (128-byte swizzle) into Vᵀ of 128 keys (128-byte swizzle): no conflict at all.
        for k in 0..32 {
            assert_eq!(
                transpose_conflicts(128, 128, Swizzle::B128, Swizzle::B128, k),
                0,
                "task {k}"
            );
        }
        // The first mapping (one block per thread, consecutive threads along a row) had 16-way store conflicts.
        let d64: u32 = (0..16)
            .map(|k| transpose_conflicts(128, 64, Swizzle::B64, Swizzle::B128, k))
            .sum();
        eprintln!("D = 64 (64-byte swizzle source): {d64} extra wavefronts over 16 tasks");
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
