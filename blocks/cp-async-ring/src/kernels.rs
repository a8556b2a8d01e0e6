// The cp-async-ring test kernels, one per (stages, rows, columns, element size), with their shapes and budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

pub const HEADERS: &[Header] = &[Header {
    name: "cp_async_ring.cuh",
    code: include_str!("../cuda/cp_async_ring.cuh"),
}];

pub const SOURCE: Source = Source {
    file: "test_cp_async_ring.cu",
    code: include_str!("../cuda/test_cp_async_ring.cu"),
    headers: &[HEADERS],
};

/// A ring instantiation: `stages` tiles of `rows` × `cols` elements of `elem` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub stages: usize,
    pub rows: usize,
    pub cols: usize,
    pub elem: usize,
}

impl Shape {
    pub const fn new(stages: usize, rows: usize, cols: usize, elem: usize) -> Self {
        Shape {
            stages,
            rows,
            cols,
            elem,
        }
    }
    pub fn row_bytes(&self) -> usize {
        self.cols * self.elem
    }
    pub fn tile_bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }
    /// Dynamic shared memory of the test kernel: the stages.
    pub fn smem_bytes(&self) -> usize {
        self.stages * self.tile_bytes()
    }
    pub fn kernel(&self) -> String {
        format!(
            "ring_n{}_r{}_c{}_e{}",
            self.stages, self.rows, self.cols, self.elem
        )
    }
}

/// The instantiations tested: 2, 3 and 4 stages; 16 to 64 rows; D = 64 or 128 of fp8 or f16.
pub const SHAPES: &[Shape] = &[
    Shape::new(2, 16, 64, 1),
    Shape::new(2, 32, 128, 1),
    Shape::new(2, 64, 128, 2),
    Shape::new(3, 64, 64, 1),
    Shape::new(3, 32, 64, 2),
    Shape::new(3, 16, 128, 2),
    Shape::new(4, 16, 128, 2),
    Shape::new(4, 32, 64, 1),
];

const fn k(name: &'static str) -> KernelSpec {
    // The stages are dynamic shared memory, so the static budget is 0; 128 threads of address arithmetic.
    KernelSpec {
        block: "cp-async-ring",
        name,
        source: &SOURCE,
        budget: Budget::new(64, 0),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

pub const KERNELS: &[KernelSpec] = &[
    k("ring_n2_r16_c64_e1"),
    k("ring_n2_r32_c128_e1"),
    k("ring_n2_r64_c128_e2"),
    k("ring_n3_r64_c64_e1"),
    k("ring_n3_r32_c64_e2"),
    k("ring_n3_r16_c128_e2"),
    k("ring_n4_r16_c128_e2"),
    k("ring_n4_r32_c64_e1"),
];

/// The 2-stage ring of 64 rows × 128 bytes placing chunks as wgmma's 128-byte-swizzled tile.
pub const SWIZZLED: KernelSpec = k("ring_n2_r64_c128_e1_sw128");

pub fn kernel(shape: &Shape) -> KernelSpec {
    KernelSpec::find(KERNELS, &shape.kernel())
}
