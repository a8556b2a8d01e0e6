// Packed (variable-length) batches through the Attention op: boundaries checked by name, stage 8's packed kernel.
use std::sync::Arc;

use composed::ragged::validate_cu_seqlens;
use composed::{PagedKv, VarlenShape, VarlenTensors};
use half::{bf16, f16};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::attention::{Attention, Fp8, OutBuf};
use crate::error::{Error, Result};
use fixtures::OutDtype;

/// A packed batch's sizes as a call gives them: H query heads, Hkv key/value heads, D, and the boundaries of its B
/// sequences in the packed tokens, on the host (B + 1 entries each, from 0 to the tokens in all).
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a> {
    /// Query heads.
    pub h: usize,
    /// Key/value heads (a divisor of `h`).
    pub hkv: usize,
    /// Head dimension.
    pub d: usize,
    /// Where each sequence's queries start, and the query tokens in all last.
    pub cu_seqlens_q: &'a [i32],
    /// Where each sequence's keys start, and the key tokens in all last.
    pub cu_seqlens_k: &'a [i32],
}

impl Packed<'_> {
    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }
    /// Query tokens in all.
    pub fn total_q(&self) -> usize {
        self.cu_seqlens_q.last().map_or(0, |&x| x.max(0) as usize)
    }
    /// Key tokens in all.
    pub fn total_k(&self) -> usize {
        self.cu_seqlens_k.last().map_or(0, |&x| x.max(0) as usize)
    }
}

/// A packed call's outputs on the device: O [total_q, H, D] in the op's dtype and the LSE [H, total_q] (f32).
#[derive(Debug)]
pub struct PackedOutput {
    /// O, [total_q, H, D].
    pub o: OutBuf,
    /// The LSE, [H, total_q].
    pub lse: CudaSlice<f32>,
}

/// Why a packed batch `b` with inputs of these element and scale counts cannot run: the first thing wrong, named
/// (its boundaries, a head ratio, a head dimension stage 8 lacks, a tensor too short, scales neither one per (sequence,
/// head) nor one for the batch); nothing is launched.
pub fn check_packed(b: &Packed, lens: [usize; 3], scales: [usize; 3]) -> Result<()> {
    let batch = b.batch();
    let boundary = |name: &'static str, cu: &[i32], total: usize| {
        validate_cu_seqlens(name, cu, batch, total).map_err(|e| Error::Layout {
            tensor: name,
            why: e.to_string(),
        })
    };
    if b.cu_seqlens_q.is_empty() {
        return Err(Error::Layout {
            tensor: "cu_seqlens_q",
            why: "it is empty: B sequences need B + 1 entries".into(),
        });
    }
    boundary("cu_seqlens_q", b.cu_seqlens_q, b.total_q())?;
    boundary("cu_seqlens_k", b.cu_seqlens_k, b.total_k())?;
    for (what, got) in [("H", b.h), ("Hkv", b.hkv)] {
        if got == 0 {
            return Err(Error::Empty { what, got });
        }
    }
    if !b.h.is_multiple_of(b.hkv) {
        return Err(Error::HeadRatio { h: b.h, hkv: b.hkv });
    }
    if !composed::Stage::S8.dims().contains(&b.d) {
        return Err(Error::Unsupported(format!(
            "head dimension D = {}: packed batches run on stage8, which takes D = {:?}",
            b.d,
            composed::Stage::S8.dims()
        )));
    }
    // Named as [B, heads, S, D] with the batch's tokens as one sequence (the element counts of [total, heads, D]).
    let dims = [
        [1, b.h, b.total_q(), b.d],
        [1, b.hkv, b.total_k(), b.d],
        [1, b.hkv, b.total_k(), b.d],
    ];
    for ((tensor, got), d) in ["q", "k", "v"].into_iter().zip(lens).zip(dims) {
        let want = d.iter().product();
        if got < want {
            return Err(Error::Length {
                tensor,
                got,
                want,
                dims: d,
            });
        }
    }
    for ((tensor, got), want) in ["q scales", "k scales", "v scales"]
        .into_iter()
        .zip(scales)
        .zip([batch * b.h, batch * b.hkv, batch * b.hkv])
    {
        // One scale for the batch (a per-tensor scale) or one per (sequence, head).
        if got != want && got != 1 {
            return Err(Error::Scales { tensor, got, want });
        }
    }
    Ok(())
}

/// A paged KV cache as a call gives it: the pool's geometry (pages of `page_size` rows, a power of two from 16 to 256)
/// and, on the host, the block table (`[B][max_pages]` page indices) and each sequence's length in keys.
#[derive(Debug, Clone, Copy)]
pub struct PagedCache<'a> {
    /// Pages in the pool.
    pub num_pages: usize,
    /// Rows a page.
    pub page_size: usize,
    /// Page indices a sequence (the table's row length).
    pub max_pages: usize,
    /// `[B][max_pages]` page indices; entries past a sequence's last page are not read.
    pub block_table: &'a [i32],
    /// Each sequence's length in keys.
    pub seq_lens: &'a [i32],
}

/// A paged batch's checks that read no codes: a length for each sequence `b` bounds, and the table against the pool
/// (paged-kv's `validate`: the page size, the table's length, a sequence longer than its pages, an entry outside the
/// pool). Returns the keys' boundaries, the lengths' prefix sums.
pub(crate) fn check_paged_batch(b: &Packed, cache: &PagedCache) -> Result<Vec<i32>> {
    let batch = b.batch();
    let pool = paged_kv::Pool {
        num_pages: cache.num_pages,
        page_size: cache.page_size,
        hkv: b.hkv,
        d: b.d,
    };
    let table = paged_kv::BlockTable {
        max_pages: cache.max_pages,
        pages: cache.block_table.to_vec(),
        seq_lens: cache.seq_lens.to_vec(),
    };
    let layout = |why: String| Error::Layout {
        tensor: "block_table",
        why,
    };
    if cache.seq_lens.len() != batch {
        return Err(layout(format!(
            "{} sequence lengths for the {batch} sequences cu_seqlens_q bounds",
            cache.seq_lens.len()
        )));
    }
    paged_kv::validate(&pool, &table).map_err(|e| layout(format!("{e:#}")))?;
    // The keys' boundaries: the prefix sums of the lengths (what the plan and the masks read).
    let mut cu_k = vec![0i32];
    for &l in cache.seq_lens {
        cu_k.push(cu_k.last().copied().unwrap_or(0).saturating_add(l));
    }
    Ok(cu_k)
}

/// A paged call's codes and scales against its batch `b` (its keys' boundaries set) and pools: Q's length and every
/// scale count (`check_packed`), and K's and V's pools of `num_pages` pages of `page_size` rows.
pub(crate) fn check_paged_codes(
    b: &Packed,
    num_pages: usize,
    page_size: usize,
    q: &Fp8,
    k: &Fp8,
    v: &Fp8,
) -> Result<()> {
    let pool_len = paged_kv::Pool {
        num_pages,
        page_size,
        hkv: b.hkv,
        d: b.d,
    }
    .bytes();
    // K and V are pools, checked below: their lengths pass here.
    check_packed(
        b,
        [q.codes.len(), usize::MAX, usize::MAX],
        [q.scales.len(), k.scales.len(), v.scales.len()],
    )?;
    for (tensor, got) in [("k", k.codes.len()), ("v", v.codes.len())] {
        if got < pool_len {
            return Err(Error::Length {
                tensor,
                got,
                want: pool_len,
                dims: [num_pages, page_size, b.hkv, b.d],
            });
        }
    }
    Ok(())
}

impl Attention {
    /// Attention of a packed batch's queries (`q`: [total_q, H, D], sequence i's rows from `cu_seqlens_q[i]`; `b`'s
    /// cu_seqlens_k is not read) over a paged FP8 KV cache (`k`, `v`: pools [num_pages, page_size, Hkv, D]; `cache`:
    /// the block table and lengths, checked by name here — a page size the kernels lack, a table of the wrong length, a
    /// sequence longer than its pages, an entry outside the pool — then copied to the device on `stream`). The new
    /// tokens are each sequence's last (causal bottom-right). Stage 8's packed kernel with its paged loads.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_paged(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        b: &Packed,
        cache: &PagedCache,
        q: Fp8,
        k: Fp8,
        v: Fp8,
    ) -> Result<PackedOutput> {
        let cu_k = check_paged_batch(b, cache)?;
        let packed = Packed {
            cu_seqlens_k: &cu_k,
            ..*b
        };
        check_paged_codes(&packed, cache.num_pages, cache.page_size, &q, &k, &v)?;
        let drv = |e: lab::cudarc::driver::DriverError| Error::Device(anyhow::Error::from(e));
        let dt = stream.clone_htod(cache.block_table).map_err(drv)?;
        let paged = PagedKv {
            block_table: dt.device_ptr(stream).0,
            max_pages: cache.max_pages,
            page_size: cache.page_size,
            num_pages: cache.num_pages,
        };
        self.packed_launch(gpu, stream, &packed, q, k, v, Some(paged), None)
    }

    /// Attention over a packed batch: Q [total_q, H, D], K and V [total_k, Hkv, D] (E4M3 codes, scales one per
    /// (sequence, head) or one for the batch), sequence i's rows from `b.cu_seqlens_q[i]` and `b.cu_seqlens_k[i]`;
    /// causal (the op's) bottom-right per sequence. Runs stage 8's packed kernel on sm_90 (the units planned on the
    /// device from the boundaries, which are checked here and copied to the device on `stream`), into new outputs on
    /// `stream`.
    pub fn forward_varlen(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        b: &Packed,
        q: Fp8,
        k: Fp8,
        v: Fp8,
    ) -> Result<PackedOutput> {
        check_packed(
            b,
            [q.codes.len(), k.codes.len(), v.codes.len()],
            [q.scales.len(), k.scales.len(), v.scales.len()],
        )?;
        self.packed_launch(gpu, stream, b, q, k, v, None, None)
    }

    /// The packed kernel on checked inputs (K and V packed, or `paged`'s pools; `strides`: the codes' (token, head,
    /// ·) element strides, None for packed [total, heads, D]), into new outputs on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn packed_launch(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        b: &Packed,
        q: Fp8,
        k: Fp8,
        v: Fp8,
        paged: Option<PagedKv>,
        strides: Option<composed::Strides>,
    ) -> Result<PackedOutput> {
        let drv = |e: lab::cudarc::driver::DriverError| Error::Device(anyhow::Error::from(e));
        let cu_q = stream.clone_htod(b.cu_seqlens_q).map_err(drv)?;
        let cu_k = stream.clone_htod(b.cu_seqlens_k).map_err(drv)?;
        let cfg = self.config();
        let (cq, _g1) = cu_q.device_ptr(stream);
        let (ck, _g2) = cu_k.device_ptr(stream);
        let call = PackedCall {
            b,
            q,
            k,
            v,
            paged,
            strides,
            cu: [cq, ck],
        };
        launch_packed(gpu, stream, &cfg, &mut self.varlen, &call)
    }
}

/// A checked packed call: its sizes and boundaries (`b`, on the host), its codes, the paged pools' table or the
/// codes' strides, and the boundaries' copies on the device (`cu`: cu_seqlens_q, cu_seqlens_k).
pub(crate) struct PackedCall<'a, 'b> {
    pub b: &'a Packed<'b>,
    pub q: Fp8<'a>,
    pub k: Fp8<'a>,
    pub v: Fp8<'a>,
    pub paged: Option<PagedKv>,
    pub strides: Option<composed::Strides>,
    pub cu: [u64; 2],
}

/// Stage 8's packed kernel for `c` through the launcher `vl`, with the op's configuration `cfg`, into new outputs on
/// `stream`.
pub(crate) fn launch_packed(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    cfg: &crate::Config,
    vl: &mut composed::Varlen,
    c: &PackedCall,
) -> Result<PackedOutput> {
    if !matches!(gpu.arch, lab::Arch::Sm90 | lab::Arch::Sm90a) {
        return Err(Error::Unsupported(format!(
            "packed batches run on stage8, which needs an sm_90 GPU; {} is {}",
            gpu.name, gpu.arch
        )));
    }
    let b = c.b;
    let drv = |e: lab::cudarc::driver::DriverError| Error::Device(anyhow::Error::from(e));
    let (tq, n) = (b.total_q(), b.total_q() * b.h * b.d);
    // SAFETY: every element a caller reads is written by the launch below (each sequence's rows), queued after it
    // on `stream`; rows of no sequence do not exist (total_q counts the sequences' rows only).
    let mut o = unsafe {
        match cfg.out_dtype {
            OutDtype::F16 => OutBuf::F16(stream.alloc::<f16>(n.max(1)).map_err(drv)?),
            OutDtype::Bf16 => OutBuf::Bf16(stream.alloc::<bf16>(n.max(1)).map_err(drv)?),
            OutDtype::F32 => OutBuf::F32(stream.alloc::<f32>(n.max(1)).map_err(drv)?),
        }
    };
    let mut lse = unsafe { stream.alloc::<f32>((b.h * tq).max(1)).map_err(drv)? };
    let mut guards: Vec<SyncOnDrop> = Vec::with_capacity(8);
    let mut at = |(ptr, g)| {
        guards.push(g);
        ptr
    };
    let t = VarlenTensors {
        q: at(c.q.codes.device_ptr(stream)),
        k: at(c.k.codes.device_ptr(stream)),
        v: at(c.v.codes.device_ptr(stream)),
        q_scale: at(c.q.scales.device_ptr(stream)),
        k_scale: at(c.k.scales.device_ptr(stream)),
        v_scale: at(c.v.scales.device_ptr(stream)),
        o: at(o.device_ptr_mut(stream)),
        lse: at(lse.device_ptr_mut(stream)),
        cu_q: c.cu[0],
        cu_k: c.cu[1],
        strides: c.strides,
        paged: c.paged,
        // A scale of one element is the batch's (check_packed let no other count through but one per head).
        one_scale: composed::OneScale {
            q: c.q.scales.len() == 1,
            k: c.k.scales.len() == 1,
            v: c.v.scales.len() == 1,
        },
    };
    let shape = VarlenShape {
        batch: b.batch(),
        h: b.h,
        hkv: b.hkv,
        d: b.d,
        total_q: tq,
        total_k: b.total_k(),
        causal: cfg.causal,
        window: cfg.window,
    };
    let scale = cfg.softmax_scale.unwrap_or(1.0 / (b.d as f32).sqrt());
    vl.launch(gpu, stream, &shape, scale, cfg.out_dtype, &t)?;
    drop(guards);
    Ok(PackedOutput { o, lse })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paged_batch_is_checked_before_its_codes() {
        let cq = [0, 1, 3];
        let b = Packed {
            h: 8,
            hkv: 2,
            d: 128,
            cu_seqlens_q: &cq,
            cu_seqlens_k: &[],
        };
        let (table, lens) = ([4, 1, 0, 2, 3, -1], [130, 100]);
        let cache = PagedCache {
            num_pages: 5,
            page_size: 64,
            max_pages: 3,
            block_table: &table,
            seq_lens: &lens,
        };
        assert_eq!(check_paged_batch(&b, &cache).unwrap(), vec![0, 130, 230]);
        let e = |c: &PagedCache| check_paged_batch(&b, c).unwrap_err().to_string();
        let m = e(&PagedCache {
            seq_lens: &lens[..1],
            ..cache
        });
        assert!(m.contains("1 sequence lengths for the 2 sequences"), "{m}");
        let outside = [4, 1, 5, 2, 3, -1];
        let m = e(&PagedCache {
            block_table: &outside,
            ..cache
        });
        assert!(
            m.contains("block_table[0][2]") && m.contains("outside the pool"),
            "{m}"
        );
        let long = [130, 200];
        let m = e(&PagedCache {
            seq_lens: &long,
            ..cache
        });
        assert!(
            m.contains("sequence 1 has 200 keys, more than its 3 pages of 64 hold"),
            "{m}"
        );
    }

    #[test]
    fn every_bad_packed_input_is_named() {
        let (cq, ck) = ([0, 100, 100, 350], [0, 300, 310, 900]);
        let b = Packed {
            h: 8,
            hkv: 2,
            d: 128,
            cu_seqlens_q: &cq,
            cu_seqlens_k: &ck,
        };
        let lens = [350 * 8 * 128, 900 * 2 * 128, 900 * 2 * 128];
        let scales = [3 * 8, 3 * 2, 3 * 2];
        assert!(check_packed(&b, lens, scales).is_ok());
        let e = |b: &Packed, l: [usize; 3], s: [usize; 3]| {
            check_packed(b, l, s).unwrap_err().to_string()
        };
        let bad_q = [0, 100, 90, 350];
        let m = e(
            &Packed {
                cu_seqlens_q: &bad_q,
                ..b
            },
            lens,
            scales,
        );
        assert!(
            m.contains("`cu_seqlens_q`") && m.contains("decreases"),
            "{m}"
        );
        let short_k = [0, 300, 310];
        let m = e(
            &Packed {
                cu_seqlens_k: &short_k,
                ..b
            },
            lens,
            scales,
        );
        assert!(m.contains("`cu_seqlens_k` has 3 entries"), "{m}");
        let m = e(&Packed { hkv: 3, ..b }, lens, scales);
        assert!(m.contains("H = 8") && m.contains("Hkv = 3"), "{m}");
        let m = e(&Packed { d: 256, ..b }, lens, scales);
        assert!(m.contains("D = 256") && m.contains("stage8"), "{m}");
        let m = e(&b, [lens[0], lens[1] - 1, lens[2]], scales);
        assert!(
            m.contains("`k` holds 230399 elements") && m.contains("needs 230400"),
            "{m}"
        );
        // One scale for the batch (a per-tensor scale) is taken for any of the three; other counts are named.
        assert!(check_packed(&b, lens, [1, 1, 1]).is_ok());
        assert!(check_packed(&b, lens, [24, 1, 6]).is_ok());
        let m = e(&b, lens, [2, 6, 6]);
        assert!(
            m.contains("`q scales` holds 2 scales") && m.contains("needs 24"),
            "{m}"
        );
        let m = e(&b, lens, [24, 6, 2]);
        assert!(
            m.contains("`v scales` holds 2 scales") && m.contains("needs 6"),
            "{m}"
        );
        let empty: [i32; 0] = [];
        let m = e(
            &Packed {
                cu_seqlens_q: &empty,
                ..b
            },
            lens,
            scales,
        );
        assert!(m.contains("`cu_seqlens_q`: it is empty"), "{m}");
    }
}
