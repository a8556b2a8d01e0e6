// Split-KV for packed batches (split_kv.cu): when a batch's units cannot fill the SMs, each sequence's keys run as P chunks.
//
// A packed batch of B sequences becomes a virtual batch of B · P sequences, virtual sequence b · P + c being sequence
// b's queries (a copy: Q2) against chunk c of its keys ([`chunk`]), run by the packed kernel into f32 parts, then
// merged row by row (attn-merge). Under a causal mask each virtual sequence also carries its chunk's `past` keys (the
// sequence's keys after it), which put its causal diagonal where the whole sequence's is. The host picks P from the batch's sizes ([`split_parts`]); the device builds the
// virtual boundaries, scales, block table and Q2 (`split_kv_prep`), so nothing waits for the host.
use std::sync::Arc;

use anyhow::{Context, Result};
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::packed::{PagedKv, VarlenShape, VarlenTensors};
use crate::stages::KERNELS;
use fixtures::OutDtype;

/// Chunks a sequence's keys are cut into at most (the merge's parts).
pub const MAX_SPLIT: usize = 16;

/// Keys [start, end) of chunk `c` of `parts` of a sequence of `sk` keys, with key tiles of `bc` and chunks of a
/// multiple of `align` tiles (the device's `splitkv::chunk`); its `past` keys are sk − end.
pub fn chunk(sk: usize, c: usize, parts: usize, bc: usize, align: usize) -> (usize, usize) {
    let per = sk.div_ceil(bc).div_ceil(parts).div_ceil(align) * align;
    ((c * per * bc).min(sk), ((c + 1) * per * bc).min(sk))
}

/// The virtual batch's boundaries (B · P + 1 each) and each virtual sequence's `past` keys (B · P) for host
/// boundaries `cu_q`, `cu_k`: what `split_kv_prep` writes.
pub fn virtual_boundaries(
    cu_q: &[i32],
    cu_k: &[i32],
    parts: usize,
    bc: usize,
    align: usize,
) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let b = cu_q.len() - 1;
    let (mut q2, mut k2, mut past) = (vec![], vec![], vec![]);
    for i in 0..b {
        let (sq, sk) = (
            (cu_q[i + 1] - cu_q[i]) as usize,
            (cu_k[i + 1] - cu_k[i]) as usize,
        );
        for c in 0..parts {
            let (start, end) = chunk(sk, c, parts, bc, align);
            q2.push(parts as i32 * cu_q[i] + (c * sq) as i32);
            k2.push(cu_k[i] + start as i32);
            past.push((sk - end) as i32);
        }
    }
    q2.push(parts as i32 * cu_q[b]);
    k2.push(cu_k[b]);
    (q2, k2, past)
}

/// Chunks a sequence of the batch `s` is cut into on a device of `sms` SMs: 1 (no split) unless its units (each
/// sequence's (head, 128-row tile) pairs at the average length; `packed` heads, `group` rows a token) leave more than
/// half the SMs idle and each chunk keeps at least two key tiles of `bc`; then as many as fill the SMs, at most
/// [`MAX_SPLIT`]. Never under a sliding window (its units read their own key ranges).
pub fn split_parts(sms: usize, s: &VarlenShape, packed: bool, bc: usize) -> usize {
    if s.window.is_bounded() || s.batch == 0 || s.total_q == 0 {
        return 1;
    }
    let (heads, group) = if packed {
        (s.hkv, s.h / s.hkv)
    } else {
        (s.h, 1)
    };
    let rows = (s.total_q * group).div_ceil(s.batch);
    let units = s.batch * heads * rows.div_ceil(128);
    if 2 * units > sms {
        return 1;
    }
    let keys = s.total_k / s.batch;
    (sms / units).min(MAX_SPLIT).min(keys / (2 * bc)).max(1)
}

/// Tiles a chunk is a multiple of: chunks start on a page of a paged cache (`page` rows; 1 for packed keys).
pub fn align_tiles(bc: usize, page: Option<usize>) -> usize {
    page.map_or(1, |p| {
        let g = gcd(bc, p);
        (bc / g * p) / bc
    })
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `split_kv_prep`, the virtual batch's tables and Q2.
pub fn prep_kernel() -> KernelSpec {
    KernelSpec::find(KERNELS, "split_kv_prep")
}

/// `split_kv_merge_dD`, the parts merged into O and the LSE.
pub fn merge_kernel(d: usize) -> KernelSpec {
    KernelSpec::find(KERNELS, &format!("split_kv_merge_d{d}"))
}

/// What a split launch keeps between calls: the virtual batch's buffers, grown as needed.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    cu_q2: Option<CudaSlice<i32>>,
    cu_k2: Option<CudaSlice<i32>>,
    past2: Option<CudaSlice<i32>>,
    qs2: Option<CudaSlice<f32>>,
    ks2: Option<CudaSlice<f32>>,
    vs2: Option<CudaSlice<f32>>,
    table: Option<CudaSlice<i32>>,
    q2: Option<CudaSlice<u8>>,
    o2: Option<CudaSlice<f32>>,
    lse2: Option<CudaSlice<f32>>,
    /// Kernel replacements (tests' mutants): prep and merge.
    pub(crate) kernels: [Option<KernelSpec>; 2],
}

/// The device address of `slot`, made to hold at least `n` elements (a new buffer, zeroed, if it held fewer).
fn slot_at<T: lab::cudarc::driver::DeviceRepr + lab::cudarc::driver::ValidAsZeroBits>(
    st: &Arc<CudaStream>,
    slot: &mut Option<CudaSlice<T>>,
    n: usize,
) -> Result<u64> {
    if slot.as_ref().is_none_or(|x| x.len() < n) {
        *slot = Some(st.alloc_zeros::<T>(n.max(1))?);
    }
    let x = slot.as_ref().expect("allocated above");
    Ok(x.device_ptr(st).0)
}

/// The first `n` elements of `slot` (empty when it holds none), read back to the host.
fn read<T: lab::cudarc::driver::DeviceRepr + Clone>(
    st: &Arc<CudaStream>,
    slot: &Option<CudaSlice<T>>,
    n: usize,
) -> Result<Vec<T>> {
    Ok(match slot {
        Some(x) => st.clone_dtoh(x)?[..n].to_vec(),
        None => vec![],
    })
}

impl Scratch {
    /// Queues `split_kv_prep` for the batch `s` at `t` cut into `parts` chunks (key tiles of `bc`), and returns the
    /// virtual batch's shape and tensors (f32 O and LSE in the scratch, for `merge`) and the device address of its
    /// `past` keys (B · P i32: the packed kernel's `past`).
    pub(crate) fn prepare(
        &mut self,
        gpu: &Gpu,
        st: &Arc<CudaStream>,
        s: &VarlenShape,
        t: &VarlenTensors,
        parts: usize,
        bc: usize,
    ) -> Result<(VarlenShape, VarlenTensors, u64)> {
        let virt = s.batch * parts;
        let (h, hkv, d) = (s.h, s.hkv, s.d);
        let rows2 = parts * s.total_q;
        let (cq2, ck2) = (
            slot_at(st, &mut self.cu_q2, virt + 1)?,
            slot_at(st, &mut self.cu_k2, virt + 1)?,
        );
        let past2 = slot_at(st, &mut self.past2, virt)?;
        let (qs2, ks2, vs2) = (
            slot_at(st, &mut self.qs2, virt * h)?,
            slot_at(st, &mut self.ks2, virt * hkv)?,
            slot_at(st, &mut self.vs2, virt * hkv)?,
        );
        let q2_at = slot_at(st, &mut self.q2, rows2 * h * d)?;
        let (o2_at, lse2_at) = (
            slot_at(st, &mut self.o2, rows2 * h * d)?,
            slot_at(st, &mut self.lse2, rows2 * h)?,
        );
        let page = t.paged.map(|p| p.page_size);
        let table2 = match t.paged {
            Some(p) => slot_at(st, &mut self.table, virt * p.max_pages)?,
            None => 0,
        };
        let align = align_tiles(bc, page);
        let (table, max_pages, shift) = t.paged.map_or((0u64, 0i32, 0i32), |p| {
            (
                p.block_table,
                p.max_pages as i32,
                p.page_size.trailing_zeros() as i32,
            )
        });
        // Q's token and head strides in elements (bytes: E4M3).
        let [ss, sh, _] = t.strides.map_or([h * d, d, 0], |x| x.q);
        let spec = self.kernels[0].unwrap_or_else(prep_kernel);
        let k = gpu.load(&spec)?;
        // Threads for the boundaries (one a virtual sequence), and grid-stride over the scales, the table's entries and
        // Q2's pieces.
        let pieces = (rows2 * h * d / 16)
            .max(virt * t.paged.map_or(0, |p| p.max_pages))
            .max(virt * (h + 2 * hkv));
        let blocks = (virt + 1)
            .div_ceil(256)
            .max(pieces.div_ceil(256).min(4 * gpu.sms))
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (batch, parts_i, bc_i, align_i) =
            (s.batch as i32, parts as i32, bc as i32, align as i32);
        let (heads_i, hkv_i, d_i, tq) = (h as i32, hkv as i32, d as i32, s.total_q as i32);
        let (ss, sh, one_scale) = (ss as i64, sh as i64, t.one_scale.bits());
        let mut b = st.launch_builder(&k.func);
        b.arg(&t.cu_q)
            .arg(&t.cu_k)
            .arg(&batch)
            .arg(&parts_i)
            .arg(&bc_i)
            .arg(&align_i)
            .arg(&heads_i)
            .arg(&hkv_i)
            .arg(&t.q_scale)
            .arg(&t.k_scale)
            .arg(&t.v_scale)
            .arg(&one_scale)
            .arg(&table)
            .arg(&max_pages)
            .arg(&shift)
            .arg(&t.q)
            .arg(&ss)
            .arg(&sh)
            .arg(&d_i)
            .arg(&tq)
            .arg(&cq2)
            .arg(&ck2)
            .arg(&past2)
            .arg(&qs2)
            .arg(&ks2)
            .arg(&vs2)
            .arg(&table2)
            .arg(&q2_at);
        // SAFETY: split_kv_prep's parameters in order; the batch's boundaries, scales, table and Q are the caller's
        // (valid, on this stream); every output holds the virtual batch's sizes (allocated above, kept by self).
        unsafe { b.launch(cfg) }.with_context(|| format!("launching {}", spec.name))?;
        let s2 = VarlenShape {
            batch: virt,
            total_q: rows2,
            ..*s
        };
        let t2 = VarlenTensors {
            q: q2_at,
            q_scale: qs2,
            k_scale: ks2,
            v_scale: vs2,
            o: o2_at,
            lse: lse2_at,
            cu_q: cq2,
            cu_k: ck2,
            strides: t.strides.map(|x| crate::strides::Strides {
                q: [h * d, d, rows2 * h * d],
                ..x
            }),
            paged: t.paged.map(|p| PagedKv {
                block_table: table2,
                max_pages: p.max_pages,
                ..p
            }),
            // The virtual batch's scales are copies, one per virtual (sequence, head), whatever the batch's were.
            one_scale: crate::packed::OneScale::default(),
            ..*t
        };
        Ok((s2, t2, past2))
    }

    /// Queues `split_kv_merge_dD`: the parts the virtual batch wrote merged into `t`'s O (in `out`) and LSE.
    pub(crate) fn merge(
        &self,
        gpu: &Gpu,
        st: &Arc<CudaStream>,
        s: &VarlenShape,
        t: &VarlenTensors,
        parts: usize,
        out: OutDtype,
    ) -> Result<()> {
        let (Some(o2), Some(lse2)) = (&self.o2, &self.lse2) else {
            anyhow::bail!("split-KV merge before its parts");
        };
        let spec = self.kernels[1].unwrap_or_else(|| merge_kernel(s.d));
        let k = gpu.load(&spec)?;
        let threads = s.total_q * s.h * (s.d / 8);
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(128).max(1) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let addr = |p: (u64, lab::cudarc::driver::SyncOnDrop<'_>)| p.0;
        let (o2_at, l2_at) = (addr(o2.device_ptr(st)), addr(lse2.device_ptr(st)));
        let (dt, batch, parts_i, tq, heads) = (
            crate::tables::out_dtype_code(out),
            s.batch as i32,
            parts as i32,
            s.total_q as i32,
            s.h as i32,
        );
        let mut b = st.launch_builder(&k.func);
        b.arg(&o2_at)
            .arg(&l2_at)
            .arg(&t.o)
            .arg(&t.lse)
            .arg(&dt)
            .arg(&t.cu_q)
            .arg(&batch)
            .arg(&parts_i)
            .arg(&tq)
            .arg(&heads);
        // SAFETY: split_kv_merge_dD's parameters in order; the parts were written on this stream before, O and the LSE
        // are the caller's ([total_q, H, D] in `out`, [H, total_q]).
        unsafe { b.launch(cfg) }.with_context(|| format!("launching {}", spec.name))?;
        Ok(())
    }
}

/// The virtual batch `split_kv_prep` makes, read back to the host: boundaries (B · P + 1 each), past keys (B · P), Q
/// scales (B · P · H),
/// K scales (B · P · Hkv), Q2 ([P · total_q, H, D] codes) and, for a paged cache, the block table ([B · P][max_pages]).
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualBatch {
    pub cu_q: Vec<i32>,
    pub cu_k: Vec<i32>,
    pub past: Vec<i32>,
    pub q_scale: Vec<f32>,
    pub k_scale: Vec<f32>,
    pub q: Vec<u8>,
    pub table: Vec<i32>,
}

/// Runs `split_kv_prep` alone for the batch `s` at `t` in `parts` chunks (key tiles of `bc`) and reads back what it
/// made: for tests against [`virtual_boundaries`] and the host's copies.
pub fn virtual_batch(
    gpu: &Gpu,
    st: &Arc<CudaStream>,
    s: &VarlenShape,
    t: &VarlenTensors,
    parts: usize,
    bc: usize,
) -> Result<VirtualBatch> {
    let mut sc = Scratch::default();
    sc.prepare(gpu, st, s, t, parts, bc)?;
    let virt = s.batch * parts;
    let table_len = t.paged.map_or(0, |p| virt * p.max_pages);
    Ok(VirtualBatch {
        cu_q: read(st, &sc.cu_q2, virt + 1)?,
        cu_k: read(st, &sc.cu_k2, virt + 1)?,
        past: read(st, &sc.past2, virt)?,
        q_scale: read(st, &sc.qs2, virt * s.h)?,
        k_scale: read(st, &sc.ks2, virt * s.hkv)?,
        q: read(st, &sc.q2, parts * s.total_q * s.h * s.d)?,
        table: read(st, &sc.table, table_len)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_each_sequence_once_in_order() {
        for sk in [0, 1, 191, 192, 193, 5000, 131072] {
            for parts in 1..=MAX_SPLIT {
                for align in [1, 2, 4] {
                    let mut next = 0;
                    for c in 0..parts {
                        let (a, b) = chunk(sk, c, parts, 192, align);
                        assert_eq!(a, next, "sk {sk} parts {parts} chunk {c}");
                        assert!(b >= a && b <= sk);
                        assert!(
                            a == sk || a % (192 * align) == 0,
                            "a chunk starts on a page"
                        );
                        next = b;
                    }
                    assert_eq!(next, sk);
                }
            }
        }
        assert_eq!(chunk(1000, 1, 8, 128, 1), (128, 256));
        assert_eq!(chunk(1000, 7, 8, 128, 1), (896, 1000));
    }

    #[test]
    fn virtual_boundaries_are_prefix_sums_of_the_chunks() {
        let (cu_q, cu_k) = ([0, 1, 1, 5], [0, 5000, 5300, 5301]);
        let (q2, k2, past) = virtual_boundaries(&cu_q, &cu_k, 4, 128, 1);
        assert_eq!(q2, vec![0, 1, 2, 3, 4, 4, 4, 4, 4, 8, 12, 16, 20]);
        // Sequence 0: 40 tiles, 10 a chunk; sequence 1: 3 tiles, 1 a chunk (its last empty); sequence 2 (4 queries,
        // one key): the key in chunk 0, three empty chunks.
        assert_eq!(
            k2,
            vec![
                0, 1280, 2560, 3840, 5000, 5128, 5256, 5300, 5300, 5301, 5301, 5301, 5301
            ]
        );
        // Each chunk's keys after it: what moves its causal diagonal to the sequence's.
        assert_eq!(past, vec![3720, 2440, 1160, 0, 172, 44, 0, 0, 0, 0, 0, 0]);
    }

    /// Row i of a causal sequence sees keys j ≤ i + Sk − Sq; in chunk [start, end) with `past` keys after it the
    /// packed kernel shows row i the chunk's keys j' ≤ i + (end − start) + past − Sq. The two agree for every row,
    /// chunk and split: each key is seen in exactly one chunk, by the rows that see it in the whole sequence.
    #[test]
    fn past_keys_keep_each_rows_causal_keys() {
        for (sq, sk) in [
            (4, 9000),
            (16, 5765),
            (16, 5),
            (3, 2),
            (1, 131072),
            (7, 577),
        ] {
            for parts in [2, 5, 15, 16] {
                let (_, k2, past) = virtual_boundaries(&[0, sq], &[0, sk], parts, 192, 1);
                for i in 0..sq as i64 {
                    let mut seen = 0i64;
                    for c in 0..parts {
                        let (start, end) = (k2[c] as i64, k2[c + 1] as i64);
                        let len = end - start;
                        // The chunk's keys the kernel shows row i: j' ≤ i + len + past − sq, within the chunk.
                        let shown = (i + len + past[c] as i64 - sq as i64 + 1).clamp(0, len);
                        // Those it sees in the whole sequence: keys start ..= i + sk − sq.
                        let want = (i + sk as i64 - sq as i64 + 1 - start).clamp(0, len);
                        assert_eq!(
                            shown, want,
                            "sq {sq} sk {sk} parts {parts} row {i} chunk {c}"
                        );
                        seen += shown;
                    }
                    assert_eq!(seen, (i + sk as i64 - sq as i64 + 1).clamp(0, sk as i64));
                }
            }
        }
    }

    #[test]
    fn parts_fill_the_sms_only_where_units_leave_them_idle() {
        let s = |batch, total_q, total_k| VarlenShape {
            batch,
            h: 32,
            hkv: 8,
            d: 128,
            total_q,
            total_k,
            causal: true,
            window: fixtures::Window::NONE,
        };
        // One decode token over 131,072 keys, heads packed: 8 units → 16 chunks.
        assert_eq!(split_parts(132, &s(1, 1, 131072), true, 192), 16);
        // 64 sequences: 512 units, no split.
        assert_eq!(split_parts(132, &s(64, 64, 64 * 8192), true, 192), 1);
        // Unpacked: 32 units → 4 chunks.
        assert_eq!(split_parts(132, &s(1, 1, 131072), false, 192), 4);
        // Short keys: chunks of at least two tiles.
        assert_eq!(split_parts(132, &s(1, 1, 1000), true, 192), 2);
        assert_eq!(split_parts(132, &s(1, 1, 300), true, 192), 1);
        assert_eq!(align_tiles(192, Some(64)), 1);
        assert_eq!(align_tiles(192, Some(256)), 4);
        assert_eq!(align_tiles(128, Some(256)), 2);
        assert_eq!(align_tiles(128, None), 1);
    }
}
