// The hello kernel's spec and CPU model: the smallest kernel that exercises the whole loop.
use crate::{Arch, Budget, KernelSpec, Source};

pub const SOURCE: Source = Source {
    file: "hello.cu",
    code: include_str!("../cuda/hello.cu"),
    headers: &[crate::HEADERS],
};

pub const THREADS: u32 = 256;

pub const KERNELS: &[KernelSpec] = &[KernelSpec {
    block: "lab",
    name: "hello_axpy",
    source: &SOURCE,
    budget: Budget::new(32, 1024),
    archs: &Arch::REQUIRED,
    sass: &[],
}];

/// The model, in f64: y[i] = a·x[i] + y[i]. (The kernel computes element i in thread i^1, through shared memory.)
pub fn axpy(a: f32, x: &[f32], y: &[f32]) -> Vec<f64> {
    x.iter()
        .zip(y)
        .map(|(&x, &y)| a as f64 * x as f64 + y as f64)
        .collect()
}
