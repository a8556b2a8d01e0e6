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
/// `store_pairs(x, n, out16, outbf, out32)`: fp8::store2 of n pairs into each output type.
pub const STORE_PAIRS: KernelSpec = k("store_pairs", 0);
/// The library kernels of [`crate::TensorQuantizer`]: whole tensors quantized on the device.
pub const TENSOR_SOURCE: Source = Source {
    file: "quantize_tensor.cu",
    code: include_str!("../cuda/quantize_tensor.cu"),
    headers: &[HEADERS],
};

const fn t(name: &'static str) -> KernelSpec {
    KernelSpec {
        source: &TENSOR_SOURCE,
        ..k(name, 0)
    }
}

pub const TENSOR_AMAX: KernelSpec = t("fp8_tensor_amax");
pub const TENSOR_SCALES: KernelSpec = t("fp8_tensor_scales");
pub const TENSOR_QUANTIZE: KernelSpec = t("fp8_tensor_quantize");
/// The library kernels of [`crate::ViewQuantizer`], by input type (f32, f16, bf16): step 1 (amax).
pub const VIEW_AMAX: [KernelSpec; 3] = [
    t("fp8_view_amax_f32"),
    t("fp8_view_amax_f16"),
    t("fp8_view_amax_bf16"),
];
/// Step 2 of [`crate::ViewQuantizer`] (codes and scales), by input type (f32, f16, bf16).
pub const VIEW_QUANTIZE: [KernelSpec; 3] = [
    t("fp8_view_quantize_f32"),
    t("fp8_view_quantize_f16"),
    t("fp8_view_quantize_bf16"),
];
pub const KERNELS: &[KernelSpec] = &[
    ENCODE_ALL,
    DECODE_ALL,
    HEAD_SCALES,
    QUANTIZE,
    DEQUANTIZE,
    STORE_PAIRS,
    TENSOR_AMAX,
    TENSOR_SCALES,
    TENSOR_QUANTIZE,
    VIEW_AMAX[0],
    VIEW_AMAX[1],
    VIEW_AMAX[2],
    VIEW_QUANTIZE[0],
    VIEW_QUANTIZE[1],
    VIEW_QUANTIZE[2],
];
