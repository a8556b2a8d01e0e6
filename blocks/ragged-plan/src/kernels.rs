// The ragged-plan kernels: the plan's three library kernels and the decode test kernel; sources and budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "ragged_plan.cuh",
    code: include_str!("../cuda/ragged_plan.cuh"),
}];

/// The library kernels (`Planner`): histogram, offsets, scatter.
pub const SOURCE: Source = Source {
    file: "ragged_plan.cu",
    code: include_str!("../cuda/ragged_plan.cu"),
    headers: &[HEADERS],
};

/// The test kernel: a table's units decoded as an attention kernel would.
pub const TEST_SOURCE: Source = Source {
    file: "test_ragged_plan.cu",
    code: include_str!("../cuda/test_ragged_plan.cu"),
    headers: &[HEADERS],
};

const fn k(
    name: &'static str,
    source: &'static Source,
    sass: &'static [&'static str],
) -> KernelSpec {
    KernelSpec {
        block: "ragged-plan",
        name,
        source,
        // Integer arithmetic and atomics; the offsets' scan uses 128 bytes of static shared memory.
        budget: Budget::new(40, 128),
        archs: &Arch::REQUIRED,
        sass,
    }
}

pub const HISTOGRAM: KernelSpec = k("ragged_histogram", &SOURCE, &[]);
pub const OFFSETS: KernelSpec = k("ragged_offsets", &SOURCE, &["SHFL"]);
pub const SCATTER: KernelSpec = k("ragged_scatter", &SOURCE, &["ATOMG"]);
pub const DECODE: KernelSpec = k("ragged_decode", &TEST_SOURCE, &[]);

pub const KERNELS: &[KernelSpec] = &[HISTOGRAM, OFFSETS, SCATTER, DECODE];
