// The tma-ring test kernels: one per ring shape, with their budgets and the SASS each must contain.
use frag_layout::Swizzle;
use lab::{Arch, Budget, Header, KernelSpec, Source};

use crate::model::Shape;

pub const HEADERS: &[Header] = &[
    Header {
        name: "tma_ring.cuh",
        code: include_str!("../cuda/tma_ring.cuh"),
    },
    Header {
        name: "warp_roles.cuh",
        code: include_str!("../cuda/warp_roles.cuh"),
    },
];

pub const SOURCE: Source = Source {
    file: "test_tma_ring.cu",
    code: include_str!("../cuda/test_tma_ring.cu"),
    headers: &[frag_layout::WGMMA_HEADERS, wgmma::HEADERS, HEADERS],
};

const fn s(
    stages: usize,
    rows: usize,
    d_bytes: usize,
    swizzle: Swizzle,
    elem: usize,
    consumers: usize,
    setmaxnreg: bool,
) -> Shape {
    Shape {
        stages,
        rows,
        d_bytes,
        swizzle,
        elem,
        consumers,
        setmaxnreg,
    }
}

/// 2, 3 and 4 stages; every swizzle; fp8 and f16 rows of 64 to 256 bytes; one or two consumer warpgroups.
pub const SHAPES: &[Shape] = &[
    s(2, 64, 128, Swizzle::B128, 1, 2, true),
    s(3, 64, 64, Swizzle::B64, 1, 1, true),
    s(4, 64, 128, Swizzle::B32, 1, 2, true),
    s(2, 128, 128, Swizzle::B128, 2, 2, true),
    s(3, 64, 128, Swizzle::None, 1, 1, true),
    s(4, 32, 256, Swizzle::B128, 2, 2, true),
    s(2, 64, 128, Swizzle::B128, 1, 1, false),
];

const TMA_SASS: &[&str] = &["UTMALDG", "SYNCS"];

const fn k(name: &'static str, archs: &'static [Arch]) -> KernelSpec {
    // The producer drops to 40 registers and the consumers claim 232 (ptxas reports the largest).
    KernelSpec {
        block: "tma-ring",
        name,
        source: &SOURCE,
        budget: Budget::new(232, 64),
        archs,
        sass: TMA_SASS,
    }
}

pub const KERNELS: &[KernelSpec] = &[
    k("tma_n2_r64_d128_sw128_e1_c2", &[Arch::Sm90a]),
    k("tma_n3_r64_d64_sw64_e1_c1", &[Arch::Sm90a]),
    k("tma_n4_r64_d128_sw32_e1_c2", &[Arch::Sm90a]),
    k("tma_n2_r128_d128_sw128_e2_c2", &[Arch::Sm90a]),
    k("tma_n3_r64_d128_none_e1_c1", &[Arch::Sm90a]),
    k("tma_n4_r32_d256_sw128_e2_c2", &[Arch::Sm90a]),
    k("tma_plain_n2_r64_d128_sw128_e1_c1", &[Arch::Sm90]),
];

/// The register-claim test: consumers hold 176 live values under a 168-register entry cap.
pub const ROLES_CLAIM: KernelSpec = KernelSpec {
    block: "tma-ring",
    name: "roles_claim",
    source: &SOURCE,
    budget: Budget::new(232, 1024),
    archs: &[Arch::Sm90a],
    sass: &[],
};

/// tma::bulk_load through a 2-stage ring (no tensor map): `bulk_ring(in, bytes, tiles, out)`, 128 threads.
pub const BULK_RING: KernelSpec = KernelSpec {
    block: "tma-ring",
    name: "bulk_ring",
    source: &SOURCE,
    budget: Budget::new(128, 64),
    archs: &[Arch::Sm90],
    sass: &["UBLKCP"],
};

/// tma::bulk_load_multicast in a cluster of two CTAs sharing a 2-stage ring: `cluster_ring(in, bytes, tiles, out)`,
/// grid 2 (one cluster), 128 threads a CTA; `out` holds each CTA's copy of every tile.
pub const CLUSTER_RING: KernelSpec = KernelSpec {
    block: "tma-ring",
    name: "cluster_ring",
    source: &SOURCE,
    budget: Budget::new(128, 64),
    archs: &[Arch::Sm90a],
    sass: &["UBLKCP"],
};

/// tma::store_4d of one box (up to 8 KiB) from shared memory: `store_box(map, img, words, c0, c1, c2)`, 128
/// threads.
pub const STORE_BOX: KernelSpec = KernelSpec {
    block: "tma-ring",
    name: "store_box",
    source: &SOURCE,
    budget: Budget::new(128, 8192),
    archs: &[Arch::Sm90],
    sass: &["UTMASTG"],
};

/// tma::Cursor over 2-, 3- and 4-stage rings of bulk-copied tiles: `cursor_walk_nN(in, bytes, tiles, lag, out, prev,
/// log)`, 64 threads (a producer warp, a consumer warp), 1024 + N·bytes of dynamic shared memory.
pub const CURSOR_WALKS: &[KernelSpec] = &[cursor(2), cursor(3), cursor(4)];

const fn cursor(stages: usize) -> KernelSpec {
    KernelSpec {
        block: "tma-ring",
        name: match stages {
            2 => "cursor_walk_n2",
            3 => "cursor_walk_n3",
            _ => "cursor_walk_n4",
        },
        source: &SOURCE,
        budget: Budget::new(128, 64),
        archs: &[Arch::Sm90],
        sass: &["UBLKCP", "SYNCS"],
    }
}

/// A split ring (tma::SplitBarriers) of 2 and 3 stages walked in stage 7's pingpong order: `split_walk_nN(in, bytes,
/// tiles, out)`, 64 threads, 1024 + 2·N·bytes of dynamic shared memory.
pub const SPLIT_WALKS: &[KernelSpec] = &[split(2), split(3)];

const fn split(stages: usize) -> KernelSpec {
    KernelSpec {
        block: "tma-ring",
        name: match stages {
            2 => "split_walk_n2",
            _ => "split_walk_n3",
        },
        source: &SOURCE,
        budget: Budget::new(128, 128),
        archs: &[Arch::Sm90],
        sass: &["UBLKCP", "SYNCS"],
    }
}

pub fn kernel(shape: &Shape) -> KernelSpec {
    KernelSpec::find(KERNELS, &shape.kernel())
}
