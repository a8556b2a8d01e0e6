// A packed (variable-length) batch as a launch takes it: its sizes, its tensors' device addresses, a paged cache.
use crate::strides::Strides;

/// A packed batch's sizes: B sequences, H query heads and Hkv key/value heads of D, `total_q` query and `total_k` key
/// tokens in all; causal masks and sliding windows bottom-right aligned per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarlenShape {
    pub batch: usize,
    pub h: usize,
    pub hkv: usize,
    pub d: usize,
    pub total_q: usize,
    pub total_k: usize,
    pub causal: bool,
    /// A sliding window (`Window::NONE`: none), per sequence.
    pub window: fixtures::Window,
}

/// Device addresses of a packed batch: E4M3 Q [total_q, H, D], K and V [total_k, Hkv, D] (packed, or at `strides`);
/// f32 scales per (sequence, head) ([B, H] and [B, Hkv]; one value for the batch where `one_scale` says so); O
/// [total_q, H, D] in the launch's dtype and the LSE [H, total_q] (f32); the boundaries `cu_q`, `cu_k` (B + 1 i32
/// each). Borrowed: the caller keeps them alive until the launch has run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VarlenTensors {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub q_scale: u64,
    pub k_scale: u64,
    pub v_scale: u64,
    pub o: u64,
    pub lse: u64,
    pub cu_q: u64,
    pub cu_k: u64,
    /// Element strides of Q's, K's and V's token, head and (unused: one batch) batch dimensions; None: packed
    /// [total, heads, D]. Quantized codes in [1, H, total, D] are (D, total·D, ·).
    pub strides: Option<Strides>,
    /// K and V as a paged cache's pool instead of packed: `k` and `v` are then pools [num_pages, page_size, Hkv, D],
    /// and `cu_k` the prefix sums of the sequences' lengths in keys.
    pub paged: Option<PagedKv>,
    /// Which scales are one value for every (sequence, head) (a per-tensor scale, read at its one element).
    pub one_scale: OneScale,
}

/// Which of a packed batch's Q, K and V scales are one value for the whole batch instead of one per (sequence, head):
/// the kernels read such a scale's single element for every head (`RaggedArgs::one_scale`'s bits, ragged_units.cuh),
/// so a per-tensor scale needs no expanded copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OneScale {
    pub q: bool,
    pub k: bool,
    pub v: bool,
}

impl OneScale {
    /// Every scale one value.
    pub const ALL: OneScale = OneScale {
        q: true,
        k: true,
        v: true,
    };

    /// The device's bitmask (`sdpa::OneScale`: kOneQ = 1, kOneK = 2, kOneV = 4).
    pub fn bits(self) -> i32 {
        i32::from(self.q) | i32::from(self.k) << 1 | i32::from(self.v) << 2
    }
}

/// A paged KV cache as a launch reads it: the block table's device address ([B][max_pages] i32 page indices, checked by
/// the caller with `paged_kv::validate`: every entry a sequence's length reaches is in the pool), pages of
/// `page_size` rows (a power of two, 16 to 256), `num_pages` of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagedKv {
    pub block_table: u64,
    pub max_pages: usize,
    pub page_size: usize,
    pub num_pages: usize,
}

#[cfg(test)]
mod tests {
    use super::OneScale;

    /// The bits mirror ragged_units.cuh's `OneScale` (kOneQ = 1, kOneK = 2, kOneV = 4).
    #[test]
    fn one_scale_bits_mirror_the_header() {
        let header = include_str!("../cuda/ragged_units.cuh");
        assert!(header.contains("enum OneScale : int { kOneQ = 1, kOneK = 2, kOneV = 4 };"));
        let one = |q, k, v| OneScale { q, k, v }.bits();
        assert_eq!(
            [
                one(true, false, false),
                one(false, true, false),
                one(false, false, true)
            ],
            [1, 2, 4]
        );
        assert_eq!(OneScale::ALL.bits(), 7);
        assert_eq!(OneScale::default().bits(), 0);
    }
}
