// Ring attention's math on one device: zigzag shards, each rank's steps by ring-schedule, partial results merged.
use std::sync::Arc;

use attn_merge::Merger;
use fixtures::{OutDtype, Shape};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::attention::{Attention, Config, Fp8, Lengths, OutBuf, Output};
use crate::error::{Error, Result};

/// The token range of zigzag half `half` (0: first, 1: second) of rank `rank` of `world`, in a sequence of `s`.
pub fn zigzag_range(s: usize, world: usize, rank: usize, half: usize) -> std::ops::Range<usize> {
    let c = ring_schedule::shard(world, rank)[half];
    let at = |c| ring_schedule::chunk_begin(s as u64, world, c) as usize;
    at(c)..at(c + 1)
}

/// The zigzag halves of a contiguous [B, heads, S, D] tensor `x` (elements of any type) for every rank: rank r's first
/// and second half, each [B, heads, L, D] contiguous.
pub fn zigzag_split<T: Copy>(x: &[T], dims: [usize; 4], world: usize) -> Vec<[Vec<T>; 2]> {
    let [b, h, s, d] = dims;
    let half = |rank, part| {
        let r = zigzag_range(s, world, rank, part);
        let mut out = Vec::with_capacity(b * h * r.len() * d);
        for bh in 0..b * h {
            out.extend_from_slice(&x[(bh * s + r.start) * d..(bh * s + r.end) * d]);
        }
        out
    };
    (0..world).map(|r| [half(r, 0), half(r, 1)]).collect()
}

/// The inverse of [`zigzag_split`]: every rank's halves, [B, heads, L, D] each (`d` = 1 for an LSE), back into one
/// [B, heads, S, D] tensor.
pub fn zigzag_join<T: Copy + Default>(halves: &[[Vec<T>; 2]], dims: [usize; 4]) -> Vec<T> {
    let [b, h, s, d] = dims;
    let world = halves.len();
    let mut out = vec![T::default(); b * h * s * d];
    for (rank, hv) in halves.iter().enumerate() {
        for (part, data) in hv.iter().enumerate() {
            let r = zigzag_range(s, world, rank, part);
            for bh in 0..b * h {
                let src = &data[bh * r.len() * d..(bh + 1) * r.len() * d];
                out[(bh * s + r.start) * d..(bh * s + r.end) * d].copy_from_slice(src);
            }
        }
    }
    out
}

/// One rank's E4M3 shard on the device: its zigzag halves' codes ([B, heads, L, D] each) and per-(batch, head)
/// scales, and the halves' lengths.
#[derive(Debug, Clone, Copy)]
pub struct Shard<'a> {
    /// The first and second half (chunks r and 2W − 1 − r).
    pub halves: [Fp8<'a>; 2],
    /// Their lengths in tokens.
    pub lens: [usize; 2],
}

/// A rank's result: per half, O (f32, [B, H, L, D]) and the LSE ([B, H, L]); over NCCL, each step's times too.
#[derive(Debug)]
pub struct RankOutput {
    /// O of each half.
    pub o: [CudaSlice<f32>; 2],
    /// The LSE of each half.
    pub lse: [CudaSlice<f32>; 2],
    /// Each step's times on this rank (device events), in step order: empty for the one-device ring.
    pub steps: Vec<StepTime>,
    /// Where the call's host time went (zero for the one-device ring).
    pub host: HostTimes,
}

/// A ring call's host time on a rank, ms, in its order: the ranks' input check (an all-reduce the host waits for:
/// every rank's arrival), the setup (buffers, the ops, the own shard's copy), queueing the steps (NCCL's calls and
/// every kernel launch), and the wait for the device to finish. A step's device time above its share of the work,
/// with queueing as long as the steps, says the host is what the device waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTimes {
    /// The input check, ms.
    pub check_ms: f64,
    /// Buffers, ops and the own shard's copy, ms.
    pub setup_ms: f64,
    /// Queueing every step, ms.
    pub queue_ms: f64,
    /// Waiting for the device, ms.
    pub drain_ms: f64,
}

/// One ring step's times on a rank, from device events: its attention on the shard in hand (every kernel of its
/// blocks and merges), the transfer of the next shard on the communicator's stream (None on the last step, which
/// sends nothing), and the step as the ring lives it (from its start to the next step's, which waits for both; the
/// last step's ends with its attention). Communication is hidden where `step_ms` is `attention_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// The step's attention, ms.
    pub attention_ms: f32,
    /// The next shard's transfer, ms.
    pub transfer_ms: Option<f32>,
    /// The whole step, ms.
    pub step_ms: f32,
}

/// Ring attention's arithmetic for `world` ranks on one device, on `stream`: rank r's queries against every rank's
/// K/V shard in the ring's order (ring-schedule: zigzag halves, the blocks each step computes, causal blocks on the
/// diagonal only), each block by stage 7 into an f32 part, each part merged into the rank's running (O, LSE) by
/// attn-merge as it lands. `shape` is the whole problem (B, H, Hkv, S, D; Sq = Sk = S); `q[r]` and `kv[r]` (K and V)
/// are rank r's shards. What crosses ranks in a real ring (the K/V shard a step sends on) is read here in place.
pub fn ring_on_one_device(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    q: &[Shard],
    kv: &[(Shard, Shard)],
) -> Result<Vec<RankOutput>> {
    let world = q.len();
    if world == 0 || kv.len() != world {
        return Err(Error::Unsupported(format!(
            "ring: {} query shards and {} K/V shards: one of each a rank, at least one rank",
            q.len(),
            kv.len()
        )));
    }
    if shape.sq != shape.sk {
        return Err(Error::Unsupported(format!(
            "ring: Sq = {} and Sk = {}: the ring shards one sequence (Sq = Sk)",
            shape.sq, shape.sk
        )));
    }
    for r in 0..world {
        for half in 0..2 {
            let want = zigzag_range(shape.sq, world, r, half).len();
            for (what, got) in [
                ("q", q[r].lens[half]),
                ("k", kv[r].0.lens[half]),
                ("v", kv[r].1.lens[half]),
            ] {
                if got != want {
                    return Err(Error::Unsupported(format!(
                        "ring: rank {r}'s {what} half {half} holds {got} tokens; its zigzag chunk of S = {} over {world} ranks has {want}",
                        shape.sq
                    )));
                }
            }
        }
    }
    let mut outs = Vec::with_capacity(world);
    for (rank, mine) in q.iter().enumerate() {
        let mut steps = RankSteps::new(gpu, stream, shape, mine.lens)?;
        steps.begin(stream)?;
        for step in 0..world {
            let (k, v) = &kv[ring_schedule::source(world, rank, step)];
            steps.step(
                gpu, stream, world, rank, step, mine, k.halves, v.halves, k.lens,
            )?;
        }
        outs.push(steps.finish(Vec::new(), HostTimes::default())?);
    }
    Ok(outs)
}

/// One rank's running result and the ops it computes it with: each Q half's f32 (O, LSE), started empty (O = 0,
/// LSE = −inf) by [`RankSteps::begin`] for each call, and a stage 7 op for full blocks and one for the causal
/// diagonal, both writing f32 parts. The ops (their kernels, schedule tables and tensor maps) and the LSE's −inf rows
/// are kept from call to call.
pub(crate) struct RankSteps {
    shape: Shape,
    q_lens: [usize; 2],
    full: Attention,
    diag: Attention,
    merger: Merger,
    /// Every block's f32 part (O and LSE: rows for the longer Q half and any split tail's parts), made at the first
    /// step, grown when a block needs more rows, and kept: each block writes it and its merge reads it in stream
    /// order before the next block overwrites it (a replaced part is freed in stream order, after those reads).
    part: Option<Output>,
    /// The running result of the call in progress (None between calls).
    o: Option<[CudaSlice<f32>; 2]>,
    lse: Option<[CudaSlice<f32>; 2]>,
    /// Each half's LSE rows at −inf, copied into a new call's LSE on the device (no host copy a call).
    lse_empty: [CudaSlice<f32>; 2],
}

impl RankSteps {
    /// A rank whose Q halves hold `q_lens` tokens, of the whole problem `shape`, its accumulators on `stream`.
    pub(crate) fn new(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        shape: Shape,
        q_lens: [usize; 2],
    ) -> Result<Self> {
        let cfg = |causal| Config {
            causal,
            out_dtype: OutDtype::F32,
            softmax_scale: None,
            window: fixtures::Window::NONE,
        };
        let rows = |half: usize| (shape.b * shape.h * q_lens[half]).max(1);
        let drv = |e| Error::Device(anyhow::Error::from(e));
        let lse = |h| {
            stream
                .clone_htod(&vec![f32::NEG_INFINITY; rows(h)])
                .map_err(drv)
        };
        // NCCL's kernels share the GPU with a step's attention: each block takes its units from the counter (no
        // split tail dealt ahead), so a block whose SM NCCL holds for a while takes fewer, not delays the step.
        let op = |causal| -> Result<Attention> {
            let mut op = Attention::with_stage(gpu, cfg(causal), crate::stage_for(gpu))?;
            op.set_split_tail(false);
            Ok(op)
        };
        Ok(RankSteps {
            shape,
            q_lens,
            full: op(false)?,
            diag: op(true)?,
            merger: Merger::default(),
            part: None,
            o: None,
            lse: None,
            lse_empty: [lse(0)?, lse(1)?],
        })
    }

    /// Both ops' split tail (`Attention::set_split_tail`).
    pub(crate) fn set_split_tail(&mut self, on: bool) {
        self.full.set_split_tail(on);
        self.diag.set_split_tail(on);
    }

    /// Starts a call's running result on `stream`: O = 0 and LSE = −inf, new buffers (the last call's went out with
    /// its [`RankOutput`]), made on the device.
    pub(crate) fn begin(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let drv = |e| Error::Device(anyhow::Error::from(e));
        let o = |h: usize| {
            stream
                .alloc_zeros::<f32>(self.lse_empty[h].len() * self.shape.d)
                .map_err(drv)
        };
        let lse = |h: usize| -> Result<CudaSlice<f32>> {
            // SAFETY: every element is written by the copy below, in stream order, before anything reads it.
            let mut x = unsafe { stream.alloc::<f32>(self.lse_empty[h].len()) }.map_err(drv)?;
            stream
                .memcpy_dtod(&self.lse_empty[h], &mut x)
                .map_err(drv)?;
            Ok(x)
        };
        self.o = Some([o(0)?, o(1)?]);
        self.lse = Some([lse(0)?, lse(1)?]);
        Ok(())
    }

    /// Step `step` of rank `rank` of `world`: ring-schedule's blocks of its Q halves `q` against the K/V shard in hand
    /// (halves `k`, `v` of `held` tokens; their codes may be longer: the first elements are read), each block by
    /// stage 7 into an f32 part merged into the running result on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn step(
        &mut self,
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        world: usize,
        rank: usize,
        step: usize,
        q: &Shard,
        k: [Fp8; 2],
        v: [Fp8; 2],
        held: [usize; 2],
    ) -> Result<()> {
        let (shape, d) = (self.shape, self.shape.d);
        for blk in ring_schedule::blocks(world, rank, step, shape.causal) {
            for (qh, kh) in (0..2).flat_map(|a| (0..2).map(move |b| (a, b))) {
                if blk.q & (1 << qh) == 0 || blk.kv & (1 << kh) == 0 {
                    continue;
                }
                let (lq, lk) = (self.q_lens[qh], held[kh]);
                if lq == 0 || lk == 0 {
                    continue;
                }
                let causal = blk.mask == ring_schedule::Mask::Causal;
                let s = Shape {
                    hkv: shape.hkv,
                    causal,
                    ..Shape::cross(shape.b, shape.h, lq, lk, d)
                };
                let need = Lengths::of(&s);
                for (tensor, got, want) in [
                    ("q", q.halves[qh].codes.len(), need.q),
                    ("k", k[kh].codes.len(), need.k),
                    ("v", v[kh].codes.len(), need.v),
                ] {
                    if got < want {
                        let heads = if tensor == "q" { s.h } else { s.hkv };
                        let rows = if tensor == "q" { lq } else { lk };
                        return Err(Error::Length {
                            tensor,
                            got,
                            want,
                            dims: [s.b, heads, rows, d],
                        });
                    }
                }
                for (tensor, got, want) in [
                    ("q scales", q.halves[qh].scales.len(), need.q_scales),
                    ("k scales", k[kh].scales.len(), need.k_scales),
                    ("v scales", v[kh].scales.len(), need.v_scales),
                ] {
                    if got < want {
                        return Err(Error::Scales { tensor, got, want });
                    }
                }
                let op = if causal {
                    &mut self.diag
                } else {
                    &mut self.full
                };
                let (s, scale, stage) = op.checked(gpu, s, &need, None)?;
                // The kept part grows to the most rows any block has needed: the longer Q half, and the split
                // tail's virtual units past the real rows, which depend on the op (never for causal) and on Sk.
                let longest = Shape {
                    sq: self.q_lens[0].max(self.q_lens[1]),
                    ..s
                };
                let (rows_longest, rows_now) =
                    (op.output_rows(gpu, &longest)?, op.output_rows(gpu, &s)?);
                let part = match &mut self.part {
                    Some(p) if p.lse.len() >= rows_longest.max(rows_now) => p,
                    _ => {
                        let of = if rows_longest >= rows_now {
                            &longest
                        } else {
                            &s
                        };
                        self.part.insert(op.alloc_output(gpu, stream, of)?)
                    }
                };
                op.launch_into(
                    gpu,
                    stream,
                    s,
                    scale,
                    stage,
                    q.halves[qh],
                    k[kh],
                    v[kh],
                    None,
                    part,
                )?;
                let OutBuf::F32(po) = &part.o else {
                    unreachable!("the ring's ops write f32 O")
                };
                let (Some(acc_o), Some(acc_l)) = (self.o.as_mut(), self.lse.as_mut()) else {
                    return Err(Error::Ring(
                        "a ring step outside a call (RankSteps::begin first)".into(),
                    ));
                };
                let (ao, _g0) = acc_o[qh].device_ptr_mut(stream);
                let (al, _g1) = acc_l[qh].device_ptr_mut(stream);
                let (bo, _g2) = po.device_ptr(stream);
                let (bl, _g3) = part.lse.device_ptr(stream);
                // SAFETY: the accumulator holds B·H·Lq rows of O and LSE; the part's first B·H·Lq rows are the
                // block's result (Attention::output_rows ≥ B·H·Lq); separate allocations, the part kept by RankSteps
                // and rewritten only by a later launch on this stream, after this merge.
                unsafe {
                    self.merger.accumulate(
                        gpu,
                        stream,
                        ao,
                        al,
                        bo,
                        bl,
                        shape.b * shape.h * lq,
                        d,
                    )?
                };
            }
        }
        Ok(())
    }

    /// The rank's result.
    pub(crate) fn finish(&mut self, steps: Vec<StepTime>, host: HostTimes) -> Result<RankOutput> {
        let (Some(o), Some(lse)) = (self.o.take(), self.lse.take()) else {
            return Err(Error::Ring(
                "a ring call finished twice (RankSteps::begin first)".into(),
            ));
        };
        Ok(RankOutput {
            o,
            lse,
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
            let halves = zigzag_split(&x, dims, world);
            for (r, hv) in halves.iter().enumerate() {
                for (part, data) in hv.iter().enumerate() {
                    assert_eq!(
                        data.len(),
                        2 * 3 * zigzag_range(s, world, r, part).len() * 4
                    );
                }
            }
            assert_eq!(zigzag_join(&halves, dims), x, "W = {world}, S = {s}");
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
