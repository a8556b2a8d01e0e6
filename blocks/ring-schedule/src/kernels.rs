// The ring-schedule test kernel (the schedule for many (world, rank, step) at once) and its budget.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "ring_schedule.cuh",
    code: include_str!("../cuda/ring_schedule.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_ring_schedule.cu",
    code: include_str!("../cuda/test_ring_schedule.cu"),
    headers: &[HEADERS],
};

/// `ring_schedule(world, rank, step, causal, s, n, out, begins)`: thread i writes its case's source rank, block
/// count and three (q, kv, mask) triples and a zero to out[12·i …], and the chunk starts to begins[17·i …].
pub const SCHEDULE: KernelSpec = KernelSpec {
    block: "ring-schedule",
    name: "ring_schedule",
    source: &SOURCE,
    // Integer arithmetic only; no shared memory.
    budget: Budget::new(40, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};

pub const KERNELS: &[KernelSpec] = &[SCHEDULE];
