// The hadamard kernels: the library's row rotations and the test kernels, with their budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "hadamard.cuh",
    code: include_str!("../cuda/hadamard.cuh"),
}];

/// The library kernels of [`crate::Rotation::apply`].
pub const ROWS_SOURCE: Source = Source {
    file: "rotate_rows.cu",
    code: include_str!("../cuda/rotate_rows.cu"),
    headers: &[HEADERS],
};

pub const SOURCE: Source = Source {
    file: "test_hadamard.cu",
    code: include_str!("../cuda/test_hadamard.cu"),
    headers: &[HEADERS],
};

const fn k(name: &'static str, source: &'static Source) -> KernelSpec {
    // Eight floats a lane at most, a shuffle a stage: 64 registers is ample, nothing in shared memory.
    KernelSpec {
        block: "hadamard",
        name,
        source,
        budget: Budget::new(64, 0),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

/// `hadamard_rows_d{32,64,128,256}`, by D.
pub const ROWS: [KernelSpec; 4] = [
    k("hadamard_rows_d32", &ROWS_SOURCE),
    k("hadamard_rows_d64", &ROWS_SOURCE),
    k("hadamard_rows_d128", &ROWS_SOURCE),
    k("hadamard_rows_d256", &ROWS_SOURCE),
];

/// `fwht_twice_d{32,64,128,256}`, by D.
pub const TWICE: [KernelSpec; 4] = [
    k("fwht_twice_d32", &SOURCE),
    k("fwht_twice_d64", &SOURCE),
    k("fwht_twice_d128", &SOURCE),
    k("fwht_twice_d256", &SOURCE),
];

pub const KERNELS: &[KernelSpec] = &[
    ROWS[0], ROWS[1], ROWS[2], ROWS[3], TWICE[0], TWICE[1], TWICE[2], TWICE[3],
];

/// The kernel of `specs` for rows of `d` (one of [`crate::DIMS`]).
pub fn for_dim(specs: &[KernelSpec; 4], d: usize) -> anyhow::Result<KernelSpec> {
    crate::check_dim(d)?;
    Ok(specs[crate::DIMS.iter().position(|&x| x == d).expect("checked")])
}
