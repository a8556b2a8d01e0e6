// The fp8-relayout test kernels: each relayout alone, and P.V end to end through wgmma; sources and budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "fp8_relayout.cuh",
    code: include_str!("../cuda/fp8_relayout.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_fp8_relayout.cu",
    code: include_str!("../cuda/test_fp8_relayout.cu"),
    headers: &[
        frag_layout::HEADERS,
        frag_layout::WGMMA_HEADERS,
        wgmma::HEADERS,
        fp8_codec::HEADERS,
        HEADERS,
    ],
};

/// TransposeLean's test kernels, apart (test_transpose_lean.cu says why).
pub const LEAN_SOURCE: Source = Source {
    file: "test_transpose_lean.cu",
    code: include_str!("../cuda/test_transpose_lean.cu"),
    headers: SOURCE.headers,
};

/// TransposeLdsm's test kernels.
pub const LDSM_SOURCE: Source = Source {
    file: "test_transpose_ldsm.cu",
    code: include_str!("../cuda/test_transpose_ldsm.cu"),
    headers: SOURCE.headers,
};

const fn k(name: &'static str, sass: &'static [&'static str]) -> KernelSpec {
    k_in(&SOURCE, name, sass)
}

const fn k_in(
    source: &'static Source,
    name: &'static str,
    sass: &'static [&'static str],
) -> KernelSpec {
    KernelSpec {
        block: "fp8-relayout",
        name,
        source,
        budget: Budget::new(168, 0),
        archs: &[Arch::Sm90a],
        sass,
    }
}

pub const ACC_TO_A: [(u32, KernelSpec); 3] = [
    (64, k("acc_to_a_n64", &["SHFL", "PRMT"])),
    (128, k("acc_to_a_n128", &["SHFL", "PRMT"])),
    (256, k("acc_to_a_n256", &["SHFL", "PRMT"])),
];

/// acc_to_a_e4m3_local for N = 128: no shuffles (its SASS has none: tested), keys in p_key order.
pub const ACC_TO_A_LOCAL: (u32, KernelSpec) = (128, k("acc_to_a_local_n128", &["F2FP"]));

/// (rows, cols, source swizzle, destination swizzle, kernel).
pub const TRANSPOSES: [(
    u32,
    u32,
    frag_layout::Swizzle,
    frag_layout::Swizzle,
    KernelSpec,
); 5] = {
    use frag_layout::Swizzle::*;
    const P: &[&str] = &["PRMT"];
    [
        (128, 64, B64, B128, k("transpose_r128_c64_B64_B128", P)),
        (128, 128, B128, B128, k("transpose_r128_c128_B128_B128", P)),
        (256, 128, B128, B128, k("transpose_r256_c128_B128_B128", P)),
        (128, 64, None, B64, k("transpose_r128_c64_None_B64", P)),
        (128, 128, B32, None, k("transpose_r128_c128_B32_None", P)),
    ]
};

/// Transpose with V's keys in acc_to_a_e4m3_local's order (stage 5's V tile).
pub const TRANSPOSE_LOCAL: (
    u32,
    u32,
    frag_layout::Swizzle,
    frag_layout::Swizzle,
    KernelSpec,
) = (
    128,
    128,
    frag_layout::Swizzle::B128,
    frag_layout::Swizzle::B128,
    k("transpose_local_r128_c128_B128_B128", &["PRMT"]),
);

/// TransposeLean by 96 threads, keys in p_key order: the V transposes of stage 7's tiles (224 keys at D = 128,
/// 128 at D = 64), and a 128-key D = 128 tile (its 128-byte destination takes the rotated plan too).
pub const TRANSPOSES_LEAN: [(
    u32,
    u32,
    frag_layout::Swizzle,
    frag_layout::Swizzle,
    KernelSpec,
); 3] = {
    use frag_layout::Swizzle::*;
    const P: &[&str] = &["PRMT"];
    [
        (
            224,
            128,
            B128,
            B32,
            k_in(&LEAN_SOURCE, "transpose_lean_r224_c128_B128_B32", P),
        ),
        (
            128,
            64,
            B64,
            B128,
            k_in(&LEAN_SOURCE, "transpose_lean_r128_c64_B64_B128", P),
        ),
        (
            128,
            128,
            B128,
            B128,
            k_in(&LEAN_SOURCE, "transpose_lean_r128_c128_B128_B128", P),
        ),
    ]
};

/// TransposeLdsm: (tile, warps, kernel), stage 8's V tiles and two more (ldsm.rs's `TILES`); the SASS must hold the
/// transposing matrix load and the matrix store.
pub const TRANSPOSES_LDSM: [(crate::LdsmTile, u32, KernelSpec); 7] = {
    use crate::LdsmTile as T;
    use frag_layout::Swizzle::*;
    const M: &[&str] = &["LDSM", "STSM", "PRMT"];
    const fn t(rows: u32, cols: u32, src: frag_layout::Swizzle, dst: frag_layout::Swizzle) -> T {
        T {
            rows,
            cols,
            src,
            dst,
        }
    }
    [
        (
            t(224, 128, B128, B32),
            4,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r224_c128_B128_B32_w4", M),
        ),
        (
            t(128, 64, B64, B128),
            4,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r128_c64_B64_B128_w4", M),
        ),
        (
            t(128, 256, B128, B128),
            4,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r128_c256_B128_B128_w4", M),
        ),
        (
            t(128, 128, B128, B128),
            4,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r128_c128_B128_B128_w4", M),
        ),
        (
            t(32, 128, B128, B32),
            3,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r32_c128_B128_B32_w3", M),
        ),
        (
            t(256, 64, B64, B128),
            4,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r256_c64_B64_B128_w4", M),
        ),
        (
            t(192, 128, B128, B64),
            3,
            k_in(&LDSM_SOURCE, "transpose_ldsm_r192_c128_B128_B64_w3", M),
        ),
    ]
};

pub const STORE_BF16: KernelSpec = k("store_n128_bf16", &[]);
pub const STORE_F16: KernelSpec = k("store_n64_f16", &[]);
pub const STORE_F32: KernelSpec = k("store_n64_f32", &[]);
/// store_rows_at with GroupedRows (packed grouped-query heads: row r at token r / group, head r % group), f16.
pub const STORE_GROUPED_F16: KernelSpec = k("store_grouped_n64_f16", &[]);
/// (n, panel, kernel): relayout::stage_panel's shared-memory image of panel `panel` of a 64 × n accumulator.
pub const STAGE_PANEL: [(usize, usize, KernelSpec); 2] = [
    (128, 1, staged("stage_n128_p1_bf16")),
    (64, 0, staged("stage_n64_p0_f16")),
];
/// A stage_panel test kernel: its 8 KiB panel is static shared memory.
const fn staged(name: &'static str) -> KernelSpec {
    KernelSpec {
        budget: Budget::new(168, 8192),
        ..k(name, &["STS"])
    }
}
/// (keys, d, kernel): O = P·V through every relayout and the FP8 wgmma, in order and in the local key order.
pub const PV: [(usize, usize, KernelSpec); 4] = [
    (128, 64, k("pv_k128_d64_f16", &["QGMMA"])),
    (128, 128, k("pv_k128_d128_bf16", &["QGMMA"])),
    (128, 64, k("pv_local_k128_d64_f16", &["QGMMA"])),
    (128, 128, k("pv_local_k128_d128_bf16", &["QGMMA"])),
];

pub fn all() -> Vec<KernelSpec> {
    let mut v: Vec<KernelSpec> = ACC_TO_A.iter().map(|x| x.1).collect();
    v.push(ACC_TO_A_LOCAL.1);
    v.extend(TRANSPOSES.iter().map(|x| x.4));
    v.push(TRANSPOSE_LOCAL.4);
    v.extend(TRANSPOSES_LEAN.iter().map(|x| x.4));
    v.extend(TRANSPOSES_LDSM.iter().map(|x| x.2));
    v.extend([STORE_BF16, STORE_F16, STORE_F32, STORE_GROUPED_F16]);
    v.extend(STAGE_PANEL.iter().map(|x| x.2));
    v.extend(PV.iter().map(|x| x.2));
    v
}
