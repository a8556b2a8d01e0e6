// The wgmma CPU model: the exact product of integer-valued tiles, their bytes, and the header's static checks.
use std::fmt::Write as _;

use anyhow::Result;
use frag_layout::probe::exact_bits;
use frag_layout::{DType, Desc, Swizzle};

/// D[m][n] = Σ_k A[m][k]·B[n][k] in f64: A is [m][k], B is [n][k], both row-major.
pub fn gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut d = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            d[i * n + j] = (0..k)
                .map(|kk| a[i * k + kk] as f64 * b[j * k + kk] as f64)
                .sum();
        }
    }
    d
}

/// The bytes of `vals` in `dtype`, little-endian, which must hold each value exactly.
pub fn to_bytes(vals: &[f32], dtype: DType) -> Result<Vec<u8>> {
    let eb = if matches!(dtype, DType::F16 | DType::Bf16) {
        2
    } else {
        1
    };
    let mut out = Vec::with_capacity(vals.len() * eb);
    for &v in vals {
        let bits = exact_bits(v, dtype)?;
        out.extend_from_slice(&bits.to_le_bytes()[..eb]);
    }
    Ok(out)
}

/// The largest |value| whose products summed over `k` stay exact in f32 and that every input type holds.
pub fn value_range(dtype: DType) -> i32 {
    match dtype {
        DType::F16 | DType::Bf16 => 4,
        _ => 3,
    }
}

/// Bytes a tile of `rows` rows and `k_bytes` bytes of K spans from a 1024-aligned base, rounded up to 1024: 227 KiB
/// (the most shared memory a block has on sm_90) less this is the last base at which the tile still fits.
fn tile_span(sw: Swizzle, rows: u32, k_bytes: u32) -> u32 {
    Desc::tile_bytes(sw, rows, k_bytes).div_ceil(1024) * 1024
}

/// CUDA source that static_asserts `wgmma.cuh`'s tile functions against frag_layout's model
/// (`Desc::k_major`, `byte_of`, `encode`, `tile_bytes`): compiling it proves the header and the model agree.
pub fn header_checks() -> String {
    let mut s = String::from(
        "// Generated from frag_layout::Desc by wgmma::header_checks().\n#include \"wgmma.cuh\"\nusing namespace wgmma;\n",
    );
    let name = |sw: Swizzle| match sw {
        Swizzle::None => "Swizzle::None",
        Swizzle::B32 => "Swizzle::B32",
        Swizzle::B64 => "Swizzle::B64",
        Swizzle::B128 => "Swizzle::B128",
    };
    for sw in Swizzle::ALL {
        let _ = writeln!(
            s,
            "static_assert(int({}) == {}, \"the lab numbers swizzles as CUtensorMapSwizzle\");",
            name(sw),
            sw.tma_code()
        );
        for rows in [64u32, 128, 256] {
            for k_bytes in [32u32, 64, 128, 256] {
                let _ = writeln!(
                    s,
                    "static_assert(tile_bytes({}, {rows}, {k_bytes}) == {}u, \"tile bytes\");",
                    name(sw),
                    Desc::tile_bytes(sw, rows, k_bytes)
                );
                for step in 0..k_bytes / 32 {
                    let d = Desc::k_major(sw, rows, k_bytes, step);
                    let _ = writeln!(
                        s,
                        "static_assert(k_major({n}, {rows}, {step}).start == {}u && k_major({n}, {rows}, {step}).lbo == {}u && k_major({n}, {rows}, {step}).sbo == {}u, \"{n} rows {rows} step {step}\");",
                        d.start,
                        d.lbo,
                        d.sbo,
                        n = name(sw)
                    );
                    let _ = writeln!(
                        s,
                        "static_assert(encode(k_major({n}, {rows}, {step}), 0x2400u) == {}ull, \"{n} rows {rows} step {step}: encoding\");",
                        d.encode(0x2400),
                        n = name(sw)
                    );
                    // mma_ss / mma_rs add step_offset to step 0's descriptor: equal to the model's own
                    // encoding of the step at every 1024-aligned tile base up to the end of shared memory.
                    for base in [
                        0u32,
                        0x2400,
                        0x1_0000,
                        227 * 1024 - tile_span(sw, rows, k_bytes),
                    ] {
                        let _ = writeln!(
                            s,
                            "static_assert(encode(k_major({n}, {rows}, 0), {base}u) + step_offset({n}, {rows}, {step}) == {}ull, \"{n} rows {rows} step {step}: step descriptor at base {base}\");",
                            d.encode(base),
                            n = name(sw)
                        );
                    }
                    for row in [0u32, 1, 7, 8, 9, 63, rows - 1] {
                        for kb in [0u32, 4, 15, 16, 17, 31] {
                            let _ = writeln!(
                                s,
                                "static_assert(tile_byte({n}, {rows}, {row}, {kb}) == {}u, \"{n} rows {rows}: byte of ({row}, {kb})\");",
                                d.byte_of(row, kb),
                                kb = step * 32 + kb,
                                n = name(sw)
                            );
                        }
                    }
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_is_a_b_transposed() {
        // A = [[1, 2]], B = [[3, 4], [5, 6]]: D = [[11, 17]].
        assert_eq!(
            gemm(&[1.0, 2.0], &[3.0, 4.0, 5.0, 6.0], 1, 2, 2),
            vec![11.0, 17.0]
        );
    }

    #[test]
    fn integer_products_over_128_bytes_of_k_are_exact_in_f32() {
        for dtype in [DType::E4m3, DType::E5m2, DType::F16, DType::Bf16] {
            let r = value_range(dtype) as f64;
            let k = if matches!(dtype, DType::F16 | DType::Bf16) {
                64.0
            } else {
                128.0
            };
            assert!(r * r * k < (1 << 24) as f64);
            for v in -value_range(dtype)..=value_range(dtype) {
                exact_bits(v as f32, dtype).unwrap();
            }
        }
    }

    #[test]
    fn bytes_are_little_endian() {
        assert_eq!(to_bytes(&[1.0], DType::F16).unwrap(), vec![0x00, 0x3C]);
        assert_eq!(
            to_bytes(&[1.0, -2.0], DType::E4m3).unwrap(),
            vec![0x38, 0xC0]
        );
    }
}
