// The wgmma test kernels: one warpgroup GEMM per (input pairing, N, A source), their sources and budgets.
use frag_layout::DType;
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "wgmma.cuh",
    code: include_str!("../cuda/wgmma.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_wgmma.cu",
    code: include_str!("../cuda/test_wgmma.cu"),
    headers: &[frag_layout::HEADERS, frag_layout::WGMMA_HEADERS, HEADERS],
};

/// Bytes of K each test GEMM runs over: four K-steps, so every panel and start offset of every swizzle is crossed.
pub const K_BYTES: usize = 128;

/// The input types of one instruction: every FP8 pairing, and f16 / bf16 with themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pairing {
    pub a: DType,
    pub b: DType,
}

pub const PAIRINGS: [Pairing; 6] = [
    Pairing {
        a: DType::E4m3,
        b: DType::E4m3,
    },
    Pairing {
        a: DType::E4m3,
        b: DType::E5m2,
    },
    Pairing {
        a: DType::E5m2,
        b: DType::E4m3,
    },
    Pairing {
        a: DType::E5m2,
        b: DType::E5m2,
    },
    Pairing {
        a: DType::F16,
        b: DType::F16,
    },
    Pairing {
        a: DType::Bf16,
        b: DType::Bf16,
    },
];

pub const NS: [u32; 3] = [64, 128, 256];

impl Pairing {
    pub fn elem_bytes(&self) -> usize {
        match self.a {
            DType::F16 | DType::Bf16 => 2,
            _ => 1,
        }
    }
    pub fn is_fp8(&self) -> bool {
        self.elem_bytes() == 1
    }
    /// The test kernel: `gemm_e4m3_e5m2_n128_rs`.
    pub fn kernel_name(&self, n: u32, a_regs: bool) -> String {
        format!(
            "gemm_{}_{}_n{n}_{}",
            self.a.name(),
            self.b.name(),
            if a_regs { "rs" } else { "ss" }
        )
    }
    pub fn kernel(&self, n: u32, a_regs: bool) -> KernelSpec {
        KernelSpec::find(KERNELS, &self.kernel_name(n, a_regs))
    }
}

const QGMMA: &[&str] = &["QGMMA"];
const HGMMA: &[&str] = &["HGMMA"];

const fn k(name: &'static str, sass: &'static [&'static str]) -> KernelSpec {
    // N = 256 keeps 128 f32 accumulators per thread; the tiles are dynamic shared memory.
    KernelSpec {
        block: "wgmma",
        name,
        source: &SOURCE,
        budget: Budget::new(232, 0),
        archs: &[Arch::Sm90a],
        sass,
    }
}

macro_rules! gemms {
    ($($ta:literal $tb:literal $sass:ident),*) => {
        pub const KERNELS: &[KernelSpec] = &[$(
            k(concat!("gemm_", $ta, "_", $tb, "_n64_ss"), $sass),
            k(concat!("gemm_", $ta, "_", $tb, "_n64_rs"), $sass),
            k(concat!("gemm_", $ta, "_", $tb, "_n128_ss"), $sass),
            k(concat!("gemm_", $ta, "_", $tb, "_n128_rs"), $sass),
            k(concat!("gemm_", $ta, "_", $tb, "_n256_ss"), $sass),
            k(concat!("gemm_", $ta, "_", $tb, "_n256_rs"), $sass),
        )*];
    };
}
/// The FP8 N = 128 GEMM with A from registers through `mma_rs_first`: its first `steps` K-steps only.
pub const FIRST_STEPS: KernelSpec = k("first_steps_e4m3_e4m3_n128", QGMMA);
/// Two GEMMs through one B tile, a wait between them: the missing-wait mutant's target.
pub const REUSE: KernelSpec = k("reuse_e4m3_e4m3_n128", QGMMA);

gemms!("e4m3" "e4m3" QGMMA, "e4m3" "e5m2" QGMMA, "e5m2" "e4m3" QGMMA, "e5m2" "e5m2" QGMMA, "f16" "f16" HGMMA, "bf16" "bf16" HGMMA);
