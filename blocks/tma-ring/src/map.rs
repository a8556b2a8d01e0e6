// The host side of TMA: a 4-D tiled tensor map built with cuTensorMapEncodeTiled, each constraint checked first, by name.
use anyhow::{Result, bail, ensure};
use frag_layout::Swizzle;
use lab::cudarc::driver::DeviceRepr;
use lab::cudarc::driver::sys;

/// A `CUtensorMap`, passed to a kernel by value as `const __grid_constant__ tma::Map`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct TensorMap(pub sys::CUtensorMap);

// SAFETY: a plain 128-byte value that the kernel reads as its own 64-byte-aligned `tma::Map`.
unsafe impl DeviceRepr for TensorMap {}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap(..)")
    }
}

/// The element type of a map: only its size matters to a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    U8,
    U16,
}

impl Elem {
    pub fn bytes(self) -> u64 {
        match self {
            Elem::U8 => 1,
            Elem::U16 => 2,
        }
    }
}

/// What a 4-D tiled map describes: dims innermost first (elements), strides of dims 1..3 in bytes, the box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSpec {
    pub elem: Elem,
    pub dims: [u64; 4],
    pub strides: [u64; 3],
    pub boxes: [u32; 4],
    pub swizzle: Swizzle,
}

impl MapSpec {
    /// The lab's K/V map over a [B, H, S, D] (`bshd = false`) or [B, S, H, D] tensor of sizes `[b, h, s, d]`:
    /// dims (D, S, H, B), a box of one swizzle panel × `rows` rows of one head.
    pub fn heads(
        elem: Elem,
        [b, h, s, d]: [u64; 4],
        bshd: bool,
        rows: u32,
        sw: Swizzle,
    ) -> MapSpec {
        let row = d * elem.bytes();
        let strides = if bshd {
            [h * row, row, s * h * row]
        } else {
            [row, s * row, h * s * row]
        };
        MapSpec {
            elem,
            dims: [d, s, h, b],
            strides,
            boxes: [(sw.row_bytes() as u64 / elem.bytes()) as u32, rows, 1, 1],
            swizzle: sw,
        }
    }

    /// A map over a tensor of sizes `[b, h, s, d]` at any element strides `[s, h, b]` of its S, H and B dimensions (D
    /// contiguous): dims (D, S, H, B), a box of one swizzle panel × `rows` rows of one head. [`MapSpec::heads`] is
    /// its two common layouts.
    pub fn strided(
        elem: Elem,
        [b, h, s, d]: [u64; 4],
        [ss, sh, sb]: [u64; 3],
        rows: u32,
        sw: Swizzle,
    ) -> MapSpec {
        let e = elem.bytes();
        MapSpec {
            elem,
            dims: [d, s, h, b],
            strides: [ss * e, sh * e, sb * e],
            boxes: [(sw.row_bytes() as u64 / e) as u32, rows, 1, 1],
            swizzle: sw,
        }
    }

    /// Every rule cuTensorMapEncodeTiled enforces that the lab relies on, each failing by name.
    pub fn check(&self, address: u64) -> Result<()> {
        ensure!(
            address.is_multiple_of(16),
            "tensor map: the global address {address:#x} is not 16-byte aligned"
        );
        for (i, &d) in self.dims.iter().enumerate() {
            ensure!(
                (1..=1u64 << 32).contains(&d),
                "tensor map: dim {i} = {d} is outside 1..=2^32"
            );
        }
        for (i, &s) in self.strides.iter().enumerate() {
            ensure!(
                s.is_multiple_of(16) && s < 1 << 40,
                "tensor map: the stride of dim {} = {s} bytes is not a multiple of 16 below 2^40",
                i + 1
            );
        }
        for (i, &b) in self.boxes.iter().enumerate() {
            ensure!(
                (1..=256).contains(&b),
                "tensor map: box dim {i} = {b} is outside 1..=256"
            );
        }
        let inner = self.boxes[0] as u64 * self.elem.bytes();
        ensure!(
            inner.is_multiple_of(16),
            "tensor map: the box's inner extent is {inner} bytes, not a multiple of 16"
        );
        if self.swizzle != Swizzle::None {
            ensure!(
                inner <= self.swizzle.row_bytes() as u64,
                "tensor map: the box's inner extent ({inner} bytes) is wider than the {} swizzle",
                self.swizzle.name()
            );
        }
        Ok(())
    }

    /// The map for a tensor at device address `address`.
    pub fn encode(&self, address: u64) -> Result<TensorMap> {
        self.check(address)?;
        let dtype = match self.elem {
            Elem::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            Elem::U16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        };
        let swizzle = match self.swizzle {
            Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let elem_strides = [1u32; 4];
        // SAFETY: CUtensorMap is plain data; the driver writes all of it.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: every array holds `rank` (4) entries (strides 3), and the map outlives the call.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                4,
                address as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxes.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                // NONE fills out-of-bounds elements with zeros: how a sequence's tail tile becomes zeros.
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            bail!("cuTensorMapEncodeTiled refused {self:?} at {address:#x}: {r:?}");
        }
        Ok(TensorMap(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_follow_the_tensor_layout() {
        let m = MapSpec::heads(Elem::U8, [2, 3, 100, 128], false, 64, Swizzle::B128);
        assert_eq!(m.strides, [128, 100 * 128, 3 * 100 * 128]);
        assert_eq!(m.boxes, [128, 64, 1, 1]);
        let m = MapSpec::heads(Elem::U16, [2, 3, 100, 64], true, 64, Swizzle::B64);
        assert_eq!(m.strides, [3 * 128, 128, 100 * 3 * 128]);
        assert_eq!(m.boxes, [32, 64, 1, 1]);
        m.check(0x1000).unwrap();
        // The general form gives the same maps, and any other layout: heads of a fused [B, S, 3, H, D] projection.
        assert_eq!(
            MapSpec::strided(
                Elem::U16,
                [2, 3, 100, 64],
                [3 * 64, 64, 100 * 3 * 64],
                64,
                Swizzle::B64
            ),
            m
        );
        let fused = MapSpec::strided(
            Elem::U8,
            [2, 3, 100, 128],
            [9 * 128, 128, 100 * 9 * 128],
            64,
            Swizzle::B128,
        );
        assert_eq!(fused.strides, [9 * 128, 128, 100 * 9 * 128]);
        fused.check(0x1000).unwrap();
    }

    #[test]
    fn each_broken_rule_is_named() {
        let m = MapSpec::heads(Elem::U8, [1, 1, 64, 128], false, 64, Swizzle::B128);
        assert!(format!("{}", m.check(0x1008).unwrap_err()).contains("not 16-byte aligned"));
        let bad = MapSpec {
            boxes: [128, 300, 1, 1],
            ..m
        };
        assert!(format!("{}", bad.check(0).unwrap_err()).contains("box dim 1 = 300"));
        let bad = MapSpec {
            strides: [100, 6400, 6400],
            ..m
        };
        assert!(format!("{}", bad.check(0).unwrap_err()).contains("stride of dim 1 = 100"));
        let bad = MapSpec {
            swizzle: Swizzle::B64,
            ..m
        };
        assert!(format!("{}", bad.check(0).unwrap_err()).contains("wider than the sw64 swizzle"));
    }
}
