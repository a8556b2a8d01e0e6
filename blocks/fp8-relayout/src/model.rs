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
