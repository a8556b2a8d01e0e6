// The frag-layout probe kernels: sources, entry points and resource budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "frag_layout.cuh",
    code: include_str!("../cuda/frag_layout.cuh"),
}];
const TEST_HEADERS: &[Header] = &[Header {
    name: "mma_probe.cuh",
    code: include_str!("../cuda/mma_probe.cuh"),
}];

pub const PROBES: Source = Source {
    file: "test_frag_layout.cu",
    code: include_str!("../cuda/test_frag_layout.cu"),
    headers: &[HEADERS, TEST_HEADERS],
};

pub const PROBES_FP8: Source = Source {
    file: "test_frag_layout_fp8.cu",
    code: include_str!("../cuda/test_frag_layout_fp8.cu"),
    headers: &[TEST_HEADERS],
};

const FP8_ARCHS: &[Arch] = &[Arch::Sm89, Arch::Sm90];

pub const WGMMA_HEADERS: &[Header] = &[Header {
    name: "wgmma_instr.cuh",
    code: include_str!("../cuda/wgmma_instr.cuh"),
}];

pub const PROBES_WGMMA: Source = Source {
    file: "test_frag_layout_wgmma.cu",
    code: include_str!("../cuda/test_frag_layout_wgmma.cu"),
    headers: &[WGMMA_HEADERS],
};

const fn wg(name: &'static str, sass: &'static [&'static str]) -> KernelSpec {
    // One warpgroup, up to 128 accumulator registers (N = 256); images are dynamic shared memory.
    KernelSpec {
        block: "frag-layout",
        name,
        source: &PROBES_WGMMA,
        budget: Budget::new(200, 0),
        archs: &[Arch::Sm90a],
        sass,
    }
}
const QGMMA: &[&str] = &["QGMMA"];
const HGMMA: &[&str] = &["HGMMA"];

/// The wgmma probe kernel for input type `dtype`, width `n`, A from registers (`rs`) or shared memory (`ss`).
pub fn wgmma_probe(dtype: crate::DType, n: u32, a_regs: bool) -> anyhow::Result<KernelSpec> {
    let name = format!(
        "probe_wgmma_{}_n{n}_{}",
        dtype.name(),
        if a_regs { "rs" } else { "ss" }
    );
    WGMMA_PROBES
        .iter()
        .find(|k| k.name == name)
        .copied()
        .ok_or_else(|| anyhow::anyhow!("no wgmma probe kernel `{name}`"))
}

pub const WGMMA_PROBES: &[KernelSpec] = &[
    wg("probe_wgmma_e4m3_n64_rs", QGMMA),
    wg("probe_wgmma_e4m3_n128_rs", QGMMA),
    wg("probe_wgmma_e4m3_n256_rs", QGMMA),
    wg("probe_wgmma_e4m3_n64_ss", QGMMA),
    wg("probe_wgmma_e5m2_n64_rs", QGMMA),
    wg("probe_wgmma_e5m2_n128_rs", QGMMA),
    wg("probe_wgmma_e5m2_n256_rs", QGMMA),
    wg("probe_wgmma_e5m2_n64_ss", QGMMA),
    wg("probe_wgmma_f16_n64_rs", HGMMA),
    wg("probe_wgmma_f16_n128_rs", HGMMA),
    wg("probe_wgmma_f16_n256_rs", HGMMA),
    wg("probe_wgmma_f16_n64_ss", HGMMA),
    wg("probe_wgmma_bf16_n64_rs", HGMMA),
    wg("probe_wgmma_bf16_n128_rs", HGMMA),
    wg("probe_wgmma_bf16_n256_rs", HGMMA),
    wg("probe_wgmma_bf16_n64_ss", HGMMA),
];

const fn k(name: &'static str, source: &'static Source, archs: &'static [Arch]) -> KernelSpec {
    // Probes are one warp doing one fragment: small, no shared memory of their own.
    KernelSpec {
        block: "frag-layout",
        name,
        source,
        budget: Budget::new(64, 0),
        archs,
        sass: &[],
    }
}

pub const PROBE_WMMA_ACC_F32: KernelSpec = k("probe_wmma_acc_f32", &PROBES, &Arch::REQUIRED);
pub const PROBE_WMMA_ACC_F16: KernelSpec = k("probe_wmma_acc_f16", &PROBES, &Arch::REQUIRED);
pub const PROBE_WMMA_A_ROW: KernelSpec = k("probe_wmma_a_row", &PROBES, &Arch::REQUIRED);
pub const PROBE_WMMA_A_COL: KernelSpec = k("probe_wmma_a_col", &PROBES, &Arch::REQUIRED);
pub const PROBE_WMMA_B_ROW: KernelSpec = k("probe_wmma_b_row", &PROBES, &Arch::REQUIRED);
pub const PROBE_WMMA_B_COL: KernelSpec = k("probe_wmma_b_col", &PROBES, &Arch::REQUIRED);
pub const PROBE_MMA_K16_F16: KernelSpec = k("probe_mma_m16n8k16_f16", &PROBES, &Arch::REQUIRED);
pub const PROBE_MMA_K16_BF16: KernelSpec = k("probe_mma_m16n8k16_bf16", &PROBES, &Arch::REQUIRED);
pub const PROBE_MMA_K32_E4M3: KernelSpec = k("probe_mma_m16n8k32_e4m3", &PROBES_FP8, FP8_ARCHS);
pub const PROBE_MMA_K32_E5M2: KernelSpec = k("probe_mma_m16n8k32_e5m2", &PROBES_FP8, FP8_ARCHS);
pub const HEADER_TABLE: KernelSpec = k("header_table", &PROBES, &Arch::REQUIRED);
pub const QUAD_ROWMAX: KernelSpec = k("quad_rowmax", &PROBES, &Arch::REQUIRED);

pub const KERNELS: &[KernelSpec] = &[
    PROBE_WMMA_ACC_F32,
    PROBE_WMMA_ACC_F16,
    PROBE_WMMA_A_ROW,
    PROBE_WMMA_A_COL,
    PROBE_WMMA_B_ROW,
    PROBE_WMMA_B_COL,
    PROBE_MMA_K16_F16,
    PROBE_MMA_K16_BF16,
    PROBE_MMA_K32_E4M3,
    PROBE_MMA_K32_E5M2,
    HEADER_TABLE,
    QUAD_ROWMAX,
];

/// The header's layout functions in the order `header_table` writes them.
pub const HEADER_FNS: &[(&str, u32)] = &[
    ("frag::wmma_a", 16),
    ("frag::wmma_b", 16),
    ("frag::wmma_acc", 8),
    ("frag::m16n8k16_a", 8),
    ("frag::m16n8k16_b", 4),
    ("frag::m16n8k32_a", 16),
    ("frag::m16n8k32_b", 8),
    ("frag::mma_c", 4),
];
