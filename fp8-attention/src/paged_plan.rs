// PagedPlan: a paged batch checked and copied to the device once, its device plan kept, run once a layer.
use std::sync::Arc;

use composed::{PagedKv, Varlen};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::attention::{Attention, Fp8};
use crate::error::{Error, Result};
use crate::varlen::{
    Packed, PackedCall, PackedOutput, PagedCache, check_paged_batch, check_paged_codes,
    launch_packed,
};

/// A batch over a paged FP8 KV cache, planned for repeated runs ([`Attention::plan_paged`]): a decode step attends
/// the same batch — block table, lengths, new tokens — in every layer, over each layer's cache. Its boundaries, table
/// and lengths are checked on the host and copied to the device once; its launcher keeps the device plan its first
/// run makes (composed's `Varlen::keep_plan`), so a run ([`Attention::run_paged`]) queues the attention alone (with
/// split-KV, its prep and merge too). Runs on the stream that planned it (its buffers are that stream's).
pub struct PagedPlan {
    h: usize,
    hkv: usize,
    d: usize,
    cu_seqlens_q: Vec<i32>,
    cu_seqlens_k: Vec<i32>,
    cu: [CudaSlice<i32>; 2],
    table: CudaSlice<i32>,
    num_pages: usize,
    page_size: usize,
    max_pages: usize,
    varlen: Varlen,
}

impl std::fmt::Debug for PagedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedPlan")
            .field("h", &self.h)
            .field("hkv", &self.hkv)
            .field("d", &self.d)
            .field("batch", &self.cu_seqlens_q.len().saturating_sub(1))
            .field("page_size", &self.page_size)
            .field("max_pages", &self.max_pages)
            .field("num_pages", &self.num_pages)
            .field("plans_made", &self.varlen.plans_made())
            .finish()
    }
}

impl PagedPlan {
    /// Device plans its runs have queued: one for the batch (its first run's).
    pub fn plans_made(&self) -> usize {
        self.varlen.plans_made()
    }

    /// Chunks a sequence's keys were cut into at the last run (1: no split).
    pub fn last_split(&self) -> usize {
        self.varlen.last_split()
    }
}

impl Attention {
    /// Plans the batch `b` (`b`'s cu_seqlens_k is not read) over the paged cache `cache` for repeated runs: the checks
    /// of [`Attention::forward_paged`] that read no codes, named the same, then the boundaries and the table copied to
    /// the device on `stream`. Packing and split-KV as the op's ([`Attention::set_pack_heads`],
    /// [`Attention::set_split_kv`]) at this call.
    pub fn plan_paged(
        &self,
        stream: &Arc<CudaStream>,
        b: &Packed,
        cache: &PagedCache,
    ) -> Result<PagedPlan> {
        let cu_k = check_paged_batch(b, cache)?;
        crate::varlen::check_packed(
            &Packed {
                cu_seqlens_k: &cu_k,
                ..*b
            },
            [usize::MAX; 3],
            [b.batch() * b.h, b.batch() * b.hkv, b.batch() * b.hkv],
        )?;
        let drv = |e: lab::cudarc::driver::DriverError| Error::Device(anyhow::Error::from(e));
        let mut varlen = Varlen::new();
        varlen.pack_heads(self.varlen.heads_packed());
        varlen.split_kv(self.varlen.splits_kv());
        varlen.keep_plan(true);
        Ok(PagedPlan {
            h: b.h,
            hkv: b.hkv,
            d: b.d,
            cu: [
                stream.clone_htod(b.cu_seqlens_q).map_err(drv)?,
                stream.clone_htod(&cu_k).map_err(drv)?,
            ],
            cu_seqlens_q: b.cu_seqlens_q.to_vec(),
            cu_seqlens_k: cu_k,
            table: stream.clone_htod(cache.block_table).map_err(drv)?,
            num_pages: cache.num_pages,
            page_size: cache.page_size,
            max_pages: cache.max_pages,
            varlen,
        })
    }

    /// One run of `plan` over one layer's pools `k`, `v` ([num_pages, page_size, Hkv, D] E4M3, the plan's
    /// geometry) with queries `q` ([total_q, H, D]): [`Attention::forward_paged`]'s result bit for bit, with the op's
    /// configuration (causal, O's dtype, softmax scale), into new outputs on `stream`. The codes' lengths and scale
    /// counts are checked by name first.
    pub fn run_paged(
        &self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        plan: &mut PagedPlan,
        q: Fp8,
        k: Fp8,
        v: Fp8,
    ) -> Result<PackedOutput> {
        let (cq, _g1) = plan.cu[0].device_ptr(stream);
        let (ck, _g2) = plan.cu[1].device_ptr(stream);
        let (table, _g3) = plan.table.device_ptr(stream);
        let paged = PagedKv {
            block_table: table,
            max_pages: plan.max_pages,
            page_size: plan.page_size,
            num_pages: plan.num_pages,
        };
        let b = Packed {
            h: plan.h,
            hkv: plan.hkv,
            d: plan.d,
            cu_seqlens_q: &plan.cu_seqlens_q,
            cu_seqlens_k: &plan.cu_seqlens_k,
        };
        check_paged_codes(&b, plan.num_pages, plan.page_size, &q, &k, &v)?;
        let call = PackedCall {
            b: &b,
            q,
            k,
            v,
            paged: Some(paged),
            strides: None,
            cu: [cq, ck],
        };
        launch_packed(gpu, stream, &self.config(), &mut plan.varlen, &call)
    }
}
