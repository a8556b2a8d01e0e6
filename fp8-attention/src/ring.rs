// Ring attention's math on one device: zigzag shards, each rank's steps by ring-schedule, partial results merged.
use std::sync::Arc;

use attn_merge::{Merger, Rows};
use fixtures::{OutDtype, Shape};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use composed::{Strides, Tensors};

use crate::attention::{Attention, Config, Fp8, OutBuf, Output};
use crate::checks::Lengths;
use crate::error::{Error, Result};

/// The token range of zigzag half `half` (0: first, 1: second) of rank `rank` of `world`, in a sequence of `s`.
pub fn zigzag_range(s: usize, world: usize, rank: usize, half: usize) -> std::ops::Range<usize> {
    let c = ring_schedule::shard(world, rank)[half];
    let at = |c| ring_schedule::chunk_begin(s as u64, world, c) as usize;
    at(c)..at(c + 1)
}

/// Every rank's zigzag shard of a contiguous [B, heads, S, D] tensor `x` (elements of any type): rank r's
/// [B, heads, L0 + L1, D], each head's rows of its first half (chunk r) then of its second (chunk 2W − 1 − r).
pub fn zigzag_split<T: Copy>(x: &[T], dims: [usize; 4], world: usize) -> Vec<Vec<T>> {
    let [b, h, s, d] = dims;
    (0..world)
        .map(|rank| {
            let halves = [0, 1].map(|part| zigzag_range(s, world, rank, part));
            let mut out = Vec::with_capacity(b * h * (halves[0].len() + halves[1].len()) * d);
            for bh in 0..b * h {
                for r in &halves {
                    out.extend_from_slice(&x[(bh * s + r.start) * d..(bh * s + r.end) * d]);
                }
            }
            out
        })
        .collect()
}

/// The inverse of [`zigzag_split`]: every rank's shard, [B, heads, L0 + L1, D] each (`d` = 1 for an LSE), back into
/// one [B, heads, S, D] tensor.
pub fn zigzag_join<T: Copy + Default>(shards: &[Vec<T>], dims: [usize; 4]) -> Vec<T> {
    let [b, h, s, d] = dims;
    let world = shards.len();
    let mut out = vec![T::default(); b * h * s * d];
    for (rank, data) in shards.iter().enumerate() {
        let halves = [0, 1].map(|part| zigzag_range(s, world, rank, part));
        let l = halves[0].len() + halves[1].len();
        for bh in 0..b * h {
            let mut at = bh * l * d;
            for r in &halves {
                out[(bh * s + r.start) * d..(bh * s + r.end) * d]
                    .copy_from_slice(&data[at..at + r.len() * d]);
                at += r.len() * d;
            }
        }
    }
    out
}

/// One rank's E4M3 shard on the device: its codes, [B, heads, L0 + L1, D] with each head's first-half rows followed by
/// its second's ([`zigzag_split`]'s layout), one f32 scale per (batch, head) for the whole shard, and the halves'
/// lengths. A step's launch reads any run of whole halves as one view of it.
#[derive(Debug, Clone, Copy)]
pub struct Shard<'a> {
    /// The codes and scales.
    pub tensor: Fp8<'a>,
    /// The halves' lengths in tokens (chunks r and 2W − 1 − r).
    pub lens: [usize; 2],
}

/// A rank's result, in its shard's layout: O (f32, [B, H, L0 + L1, D]) and the LSE ([B, H, L0 + L1]), each in the
/// first B·H·(L0 + L1) rows of its buffer; over NCCL, each step's times too.
#[derive(Debug)]
pub struct RankOutput {
    /// O.
    pub o: CudaSlice<f32>,
    /// The LSE.
    pub lse: CudaSlice<f32>,
    /// Each step's times on this rank (device events), in step order: empty for the one-device ring but where
    /// [`ring_on_one_device_timed`](crate::ring_on_one_device_timed) runs it.
    pub steps: Vec<StepTime>,
    /// Where the call's host time went (zero for the one-device ring).
    pub host: HostTimes,
}

/// A ring call's host time on a rank, ms: the ranks' input check (an all-reduce the host waits for: every rank's
/// arrival), the setup (buffers, the own shard's copy, and under `RingRank::set_overlap_check` step 0's attention,
/// queued before the check's wait), queueing the steps (NCCL's calls and every kernel launch), and the wait for the
/// device to finish. A step's
/// device time above its share of the work, with queueing as long as the steps, says the host is what the device
/// waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTimes {
    /// The input check, ms.
    pub check_ms: f64,
    /// Buffers and the own shard's copy (and step 0's attention, overlapped with the check), ms.
    pub setup_ms: f64,
    /// Queueing every step's transfer and attention (step 0's already queued where it overlaps the check), ms.
    pub queue_ms: f64,
    /// Waiting for the device, ms.
    pub drain_ms: f64,
}

/// One ring step's times on a rank, from device events: its attention on the shard in hand (every kernel of its
/// blocks and merges), the transfer of the next shard on the communicator's stream (None on the last step, which
/// sends nothing), and the step as the ring lives it (from its start to the next step's, which waits for both; the
/// last step's ends with its attention). Communication is hidden where `step_ms` is `attention_ms`. `idle_ms` is the
/// part of `attention_ms` before its first launch was queued: where the device had caught up with the host (step 0),
/// its wait while the host queued the step's transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// The step's attention, ms.
    pub attention_ms: f32,
    /// Of the attention's time, the device's wait for the host to queue its first launch, ms.
    pub idle_ms: f32,
    /// The next shard's transfer, ms.
    pub transfer_ms: Option<f32>,
    /// The whole step, ms.
    pub step_ms: f32,
}

/// Which ring steps' launches split the last, partial wave of their units by key tiles among the blocks
/// (`Attention::set_split_tail`). A step with a transfer in flight shares the GPU with NCCL's kernels, and a block
/// that starts late would hold up a share dealt to it ahead: such a step's pieces are taken from the counter after the
/// whole units (`Attention::set_split_taken`); the last step sends nothing, and its pieces are dealt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitTail {
    /// No step: every unit whole, taken from the counter.
    Never,
    /// The last step only (the default).
    #[default]
    Last,
    /// Every step.
    Every,
}

/// A ring step's op on `stage`: O in f32 (a running result, or a part to merge into it), causal or not.
fn step_op(gpu: &Gpu, stage: composed::Stage, causal: bool) -> Result<Attention> {
    let cfg = Config {
        causal,
        out_dtype: OutDtype::F32,
        softmax_scale: None,
        window: fixtures::Window::NONE,
    };
    Attention::with_stage(gpu, cfg, stage)
}

/// The op for later steps' full launches: stage 7 writing f32 by `spec`, an accumulating kernel (its split tail's
/// merge kernel, from the same source, merges each split unit's running rows with its parts).
fn folding_op(gpu: &Gpu, stage: composed::Stage, spec: lab::KernelSpec) -> Result<Attention> {
    let mut a = step_op(gpu, stage, false)?;
    a.set_kernel(Some(spec));
    Ok(a)
}

/// Rows `bits` (ring-schedule's halves: 1 the first, 2 the second, 3 both) of a shard of halves `lens`: the first row
/// and the count.
fn rows_of(bits: u8, lens: [usize; 2]) -> (usize, usize) {
    match bits {
        1 => (0, lens[0]),
        2 => (lens[0], lens[1]),
        _ => (0, lens[0] + lens[1]),
    }
}

/// One rank's running result and the ops it computes it with: the f32 (O, LSE) of its shard's rows, written by the
/// first step's launch ([`RankSteps::begin`] makes it for each call), and a stage 7 op for full launches and one for
/// the causal diagonal, both writing f32. The ops (their kernels, schedule tables and tensor maps) are kept from call
/// to call.
pub(crate) struct RankSteps {
    shape: Shape,
    world: usize,
    q_lens: [usize; 2],
    split: SplitTail,
    /// SMs a step with a transfer leaves to NCCL's kernels.
    free_sms: usize,
    full: Attention,
    diag: Attention,
    /// Full launches of later steps that cover every Q row, merged into the running result by the kernel itself
    /// (`Stage::accumulating_kernel`; None at head dimensions without one), and whether to use it.
    folding: Option<Attention>,
    fold: bool,
    merger: Merger,
    /// Every later launch's f32 part (O and LSE: rows for the rank's shard and any split tail's parts), made at the
    /// first such launch, grown when one needs more rows, and kept: each launch writes it and its merge reads it in
    /// stream order before the next launch overwrites it (a replaced part is freed in stream order, after those
    /// reads).
    part: Option<Output>,
    /// The running result of the call in progress (None between calls).
    acc: Option<Output>,
}

impl RankSteps {
    /// A rank of `world` whose Q halves hold `q_lens` tokens, of the whole problem `shape`.
    pub(crate) fn new(gpu: &Gpu, world: usize, shape: Shape, q_lens: [usize; 2]) -> Result<Self> {
        // NCCL's kernels share the GPU with a step's attention: a step with a transfer takes its units (and any split
        // tail's pieces) from the counter, so a block whose SM NCCL holds for a while takes fewer, not delays the step
        // (`SplitTail`, set per step).
        let stage = crate::stage_for(gpu);
        let op = |causal| step_op(gpu, stage, causal);
        let folding = stage
            .accumulating_kernel(shape.d)
            .map(|spec| folding_op(gpu, stage, spec))
            .transpose()?;
        Ok(RankSteps {
            shape,
            world,
            q_lens,
            split: SplitTail::default(),
            free_sms: 0,
            full: op(false)?,
            diag: op(true)?,
            folding,
            fold: true,
            merger: Merger::default(),
            part: None,
            acc: None,
        })
    }

    /// Which steps split their tails.
    pub(crate) fn set_split_tail(&mut self, split: SplitTail) {
        self.split = split;
    }

    /// Whether later steps' full launches merge into the running result in their kernel (on by default, where the
    /// head dimension has the kernel) or write an f32 part that attn-merge merges after.
    pub(crate) fn set_fold_merge(&mut self, on: bool) {
        self.fold = on;
    }

    /// Later steps' full launches merge in `spec` (a variant of the accumulating kernel), or, with None, write a part
    /// that attn-merge merges.
    pub(crate) fn set_folding(&mut self, gpu: &Gpu, spec: Option<lab::KernelSpec>) -> Result<()> {
        let stage = crate::stage_for(gpu);
        self.fold = spec.is_some();
        self.folding = spec.map(|k| folding_op(gpu, stage, k)).transpose()?;
        Ok(())
    }

    /// SMs each step with a transfer leaves to NCCL's kernels (0 by default: none).
    pub(crate) fn set_free_sms(&mut self, free: usize) {
        self.free_sms = free;
    }

    /// Both ops' split tail and free SMs as `self.split` and `self.free_sms` set them for step `step` (every step
    /// but the last sends the next shard beside its attention).
    fn configure(&mut self, step: usize) {
        let last = step + 1 == self.world;
        let on = match self.split {
            SplitTail::Never => false,
            SplitTail::Last => last,
            SplitTail::Every => true,
        };
        let free = if last { 0 } else { self.free_sms };
        for op in [
            Some(&mut self.full),
            Some(&mut self.diag),
            self.folding.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            op.set_split_tail(on);
            op.set_split_taken(!last);
            op.set_free_sms(free);
        }
    }

    /// The rank's whole shard against a whole shard: the first step's problem (the diagonal), B·H heads of L0 + L1
    /// rows and keys.
    fn whole(&self) -> Shape {
        let (s, l) = (self.shape, self.q_lens[0] + self.q_lens[1]);
        Shape {
            hkv: s.hkv,
            causal: s.causal,
            ..Shape::cross(s.b, s.h, l, l, s.d)
        }
    }

    /// Starts a call's running result on `stream`: new buffers (the last call's went out with its [`RankOutput`]),
    /// not initialised — the first step writes every row. A rank with no rows gets one row of O = 0, LSE = −inf.
    pub(crate) fn begin(&mut self, gpu: &Gpu, stream: &Arc<CudaStream>) -> Result<()> {
        // Step 0's launch writes the result, and later steps' folded launches merge into it; past the shard's rows it
        // holds the split-tail parts of any of them that splits (each step's configuration, as `configure` sets it).
        let whole = self.whole();
        let mut rows = 0;
        for step in (0..self.world).rev() {
            self.configure(step);
            let (op, s) = match (step, &self.folding) {
                (0, _) if whole.causal => (&self.diag, whole),
                (0, _) => (&self.full, whole),
                (_, Some(f)) if self.fold => (
                    f,
                    Shape {
                        causal: false,
                        ..whole
                    },
                ),
                _ => continue,
            };
            rows = rows.max(op.output_rows(gpu, &s)?);
        }
        // The loop ends configured for step 0.
        let op = if whole.causal { &self.diag } else { &self.full };
        self.acc = Some(if whole.sq == 0 {
            let drv = |e| Error::Device(anyhow::Error::from(e));
            Output {
                shape: whole,
                o: OutBuf::F32(stream.alloc_zeros::<f32>(whole.d).map_err(drv)?),
                lse: stream.clone_htod(&[f32::NEG_INFINITY]).map_err(drv)?,
            }
        } else {
            op.alloc_rows(stream, &whole, rows)?
        });
        Ok(())
    }

    /// Step `step` of rank `rank` of `world` (`at`): ring-schedule's launches of the rank's shard `q` against the
    /// K/V shard in hand (`kv`, halves of `held` tokens; its codes may be longer: the first elements are read), each
    /// by stage 7 on views of whole halves; step 0's (the rank's own shard, every Q row) into the running result,
    /// later ones into an f32 part merged into it on `stream`.
    pub(crate) fn step(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        (world, rank, step): (usize, usize, usize),
        q: &Shard,
        (k, v): (Fp8, Fp8),
        held: [usize; 2],
    ) -> Result<()> {
        let (shape, d) = (self.shape, self.shape.d);
        let (lq_all, lk_all) = (self.q_lens[0] + self.q_lens[1], held[0] + held[1]);
        for (what, got, want) in [
            ("q", q.tensor.codes.len(), shape.b * shape.h * lq_all * d),
            ("k", k.codes.len(), shape.b * shape.hkv * lk_all * d),
            ("v", v.codes.len(), shape.b * shape.hkv * lk_all * d),
        ] {
            if got < want {
                let (heads, rows) = if what == "q" {
                    (shape.h, lq_all)
                } else {
                    (shape.hkv, lk_all)
                };
                return Err(Error::Length {
                    tensor: what,
                    got,
                    want,
                    dims: [shape.b, heads, rows, d],
                });
            }
        }
        for (tensor, got, want) in [
            ("q scales", q.tensor.scales.len(), shape.b * shape.h),
            ("k scales", k.scales.len(), shape.b * shape.hkv),
            ("v scales", v.scales.len(), shape.b * shape.hkv),
        ] {
            if got < want {
                return Err(Error::Scales { tensor, got, want });
            }
        }
        self.configure(step);
        for l in ring_schedule::launches(world, rank, step, shape.causal) {
            let ((q0, lq), (k0, lk)) = (rows_of(l.q, self.q_lens), rows_of(l.kv, held));
            if lq == 0 || lk == 0 {
                continue;
            }
            let s = Shape {
                hkv: shape.hkv,
                causal: l.causal,
                ..Shape::cross(shape.b, shape.h, lq, lk, d)
            };
            // A later step's full launch over every Q row merges into the running result in its own epilogue.
            let folded = step > 0
                && self.fold
                && self.folding.is_some()
                && !l.causal
                && (q0, lq) == (0, lq_all);
            let op = match self.folding.as_mut() {
                Some(a) if folded => a,
                _ if l.causal => &mut self.diag,
                _ => &mut self.full,
            };
            // The views' lengths were checked above against the whole shards they lie in.
            let (s, scale, stage) = op.checked(gpu, s, &Lengths::of(&s), None)?;
            let mut guards = Vec::with_capacity(6);
            let mut at = |(ptr, g)| {
                guards.push(g);
                ptr
            };
            let (qa, ka, va) = (
                at(q.tensor.codes.device_ptr(stream)) + (q0 * d) as u64,
                at(k.codes.device_ptr(stream)) + (k0 * d) as u64,
                at(v.codes.device_ptr(stream)) + (k0 * d) as u64,
            );
            let kv_strides = [d, lk_all * d, shape.hkv * lk_all * d];
            let t = Tensors {
                q: qa,
                k: ka,
                v: va,
                q_scale: at(q.tensor.scales.device_ptr(stream)),
                k_scale: at(k.scales.device_ptr(stream)),
                v_scale: at(v.scales.device_ptr(stream)),
                o: 0,
                lse: 0,
                strides: Some(Strides {
                    q: [d, lq_all * d, shape.h * lq_all * d],
                    k: kv_strides,
                    v: kv_strides,
                }),
            };
            let Some(acc) = self.acc.as_mut() else {
                return Err(Error::Ring(
                    "a ring step outside a call (RankSteps::begin first)".into(),
                ));
            };
            if folded {
                op.launch_views(gpu, stream, s, scale, stage, t, acc)?;
                continue;
            }
            if step == 0 {
                // The rank's own shard: every Q row (ring-schedule's diagonal or full launch), straight into the
                // running result.
                if (q0, lq) != (0, lq_all) {
                    return Err(Error::Ring(format!(
                        "ring step 0 of rank {rank}: a launch of Q rows {q0}..{} of {lq_all}; step 0 covers them all",
                        q0 + lq
                    )));
                }
                op.launch_views(gpu, stream, s, scale, stage, t, acc)?;
                continue;
            }
            let need = op.output_rows(gpu, &s)?;
            let part = match &mut self.part {
                Some(p) if p.lse.len() >= need => p,
                _ => self.part.insert(op.alloc_output(gpu, stream, &s)?),
            };
            op.launch_views(gpu, stream, s, scale, stage, t, part)?;
            let (OutBuf::F32(po), OutBuf::F32(ao)) = (&part.o, &mut acc.o) else {
                unreachable!("the ring's ops write f32 O")
            };
            let (ao, _g0) = ao.device_ptr_mut(stream);
            let (al, _g1) = acc.lse.device_ptr_mut(stream);
            let (bo, _g2) = po.device_ptr(stream);
            let (bl, _g3) = part.lse.device_ptr(stream);
            // Each head's lq part rows into its rows q0 … of the shard's lq_all.
            let rows = Rows {
                n: shape.b * shape.h * lq,
                per: lq,
                stride: lq_all,
                off: q0,
            };
            // SAFETY: the part's first B·H·lq rows are the launch's result (output_rows ≥ B·H·lq); the accumulator
            // holds B·H·lq_all rows (rows.acc_rows() ≤ that); separate allocations, the part kept by RankSteps and
            // rewritten only by a later launch on this stream, after this merge.
            unsafe {
                self.merger
                    .accumulate_rows(gpu, stream, (ao, al), (bo, bl), rows, d)?
            };
        }
        Ok(())
    }

    /// The rank's result.
    pub(crate) fn finish(&mut self, steps: Vec<StepTime>, host: HostTimes) -> Result<RankOutput> {
        let Some(acc) = self.acc.take() else {
            return Err(Error::Ring(
                "a ring call finished twice (RankSteps::begin first)".into(),
            ));
        };
        let OutBuf::F32(o) = acc.o else {
            unreachable!("the ring's ops write f32 O")
        };
        Ok(RankOutput {
            o,
            lse: acc.lse,
            steps,
            host,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_join_is_the_tensor() {
        for (world, s) in [(1, 5), (2, 7), (3, 100), (4, 3)] {
            let dims = [2, 3, s, 4];
            let x: Vec<u32> = (0..dims.iter().product::<usize>() as u32).collect();
            let shards = zigzag_split(&x, dims, world);
            for (r, data) in shards.iter().enumerate() {
                let [a, b] = [0, 1].map(|part| zigzag_range(s, world, r, part));
                assert_eq!(data.len(), 2 * 3 * (a.len() + b.len()) * 4);
                // Head 1's rows: the first half's tokens, then the second's.
                let l = a.len() + b.len();
                let head1: Vec<u32> = a.chain(b).map(|t| x[(s + t) * 4]).collect();
                let got: Vec<u32> = (0..l).map(|i| data[(l + i) * 4]).collect();
                assert_eq!(got, head1, "W = {world}, S = {s}, rank {r}");
            }
            assert_eq!(zigzag_join(&shards, dims), x, "W = {world}, S = {s}");
        }
    }

    #[test]
    fn halves_tile_the_sequence() {
        for world in 1..=8 {
            let s = 1000 + world;
            let mut seen = vec![0; s];
            for r in 0..world {
                for half in 0..2 {
                    zigzag_range(s, world, r, half).for_each(|t| seen[t] += 1);
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "W = {world}");
        }
    }
}
