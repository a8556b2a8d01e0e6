// The fp8-codec test kernels and their budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "fp8_codec.cuh",
    code: include_str!("../cuda/fp8_codec.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_fp8_codec.cu",
    code: include_str!("../cuda/test_fp8_codec.cu"),
    headers: &[HEADERS],
};

const fn k(name: &'static str, smem: u32) -> KernelSpec {
    KernelSpec {
        block: "fp8-codec",
        name,
        source: &SOURCE,
        budget: Budget::new(64, smem),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

pub const ENCODE_ALL: KernelSpec = k("encode_all", 0);
pub const DECODE_ALL: KernelSpec = k("decode_all", 0);
pub const HEAD_SCALES: KernelSpec = k("head_scales", 1024);
pub const QUANTIZE: KernelSpec = k("quantize_e4m3", 0);
pub const DEQUANTIZE: KernelSpec = k("dequantize_smem", 4096);
pub const KERNELS: &[KernelSpec] = &[ENCODE_ALL, DECODE_ALL, HEAD_SCALES, QUANTIZE, DEQUANTIZE];
