// Ring attention over NCCL: one rank a GPU, K/V shards sent on around the ring while the shard in hand is attended.
use std::sync::Arc;
use std::time::{Duration, Instant};

use fixtures::Shape;
use lab::Gpu;
use lab::cudarc::driver::sys::CUevent_flags;
use lab::cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use lab::cudarc::nccl::Id;

use crate::attention::Fp8;
use crate::error::{Error, Result};
use crate::ring::{HostTimes, RankOutput, RankSteps, Shard, SplitTail, StepTime, zigzag_range};
use crate::ring_comm::{RingComm, group, nccl};

/// A step's events: its attention's start and end on the rank's stream, its transfer's on the communicator's.
/// A step's device events: its start, its first launch's queueing (none where step 0 was queued before the verdict),
/// its attention's end, and its transfer's start and end (none on the last step).
type StepMarks = (
    CudaEvent,
    Option<CudaEvent>,
    CudaEvent,
    Option<(CudaEvent, CudaEvent)>,
);

/// A K/V shard as it travels: K's and V's codes (sized for the longest shard of any rank; a shard fills the first
/// elements) and their per-(batch, K/V head) scales.
struct Travel {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    ks: CudaSlice<f32>,
    vs: CudaSlice<f32>,
}

impl Travel {
    /// K and V as the attention reads them.
    fn tensors(&self) -> (Fp8<'_>, Fp8<'_>) {
        (
            Fp8 {
                codes: &self.k,
                scales: &self.ks,
            },
            Fp8 {
                codes: &self.v,
                scales: &self.vs,
            },
        )
    }
}

fn drv(e: lab::cudarc::driver::DriverError) -> Error {
    Error::Device(anyhow::Error::from(e))
}

/// Waits for everything queued on `st` so far, or fails by name once `deadline` has passed (a peer that stopped
/// leaves this rank's transfers, and the work behind them, waiting for ever).
fn wait(st: &Arc<CudaStream>, deadline: Instant, rank: usize, what: &str) -> Result<()> {
    let done = st.record_event(None).map_err(drv)?;
    loop {
        if done.try_is_complete().map_err(drv)? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Ring(format!(
                "rank {rank}: {what} did not finish in time (a peer stopped or failed, or the link is down); drop \
                 the communicator on every rank (its drop aborts it)"
            )));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// This rank's part of ring attention over `comm` (rank `comm.rank()` of `comm.world_size()`, on `gpu`, whose
/// stream the communicator was made with): its zigzag shards `q`, `k`, `v` of the whole problem `shape` (Sq = Sk =
/// S over every rank). At each step the K/V shard in hand goes on to rank + 1 and the next comes from rank − 1 on the
/// communicator's stream, while this rank attends the one in hand on a stream of its own (ring-schedule's launches,
/// stage 7 on views of the shards' halves, each after the first into an f32 part merged into the running (O, LSE) by
/// attn-merge); a step's transfer waits for the
/// step before's reads of the buffer it fills, and a step's attention for the transfer that filled its buffer.
/// Every rank must call this with the same `shape`. Before anything is sent the ranks tell each other whether their
/// inputs are right (an all-reduce of one flag): where one rank's are not, every rank returns an error naming that
/// rank, and nothing is sent. Where a peer stops later (it died, or its device failed), this rank's wait for the ring
/// ends after `timeout` with [`Error::Ring`], whether it waits on the device or inside NCCL on the host (connecting
/// to the peer: [`RingComm::watched`] aborts the communicator at the deadline); every rank then makes a new one.
/// One call's state is made and dropped here: a caller that runs the ring again on the same shape keeps a
/// [`RingRank`].
pub fn ring_attention_rank(
    gpu: &Gpu,
    comm: &RingComm,
    shape: Shape,
    q: Shard,
    k: Shard,
    v: Shard,
    timeout: Duration,
) -> Result<RankOutput> {
    RingRank::new(gpu, comm, shape)?.run(gpu, comm, q, k, v, timeout)
}

/// One rank's ring state for calls on one communicator and shape ([`ring_attention_rank`]'s, kept): its stream, the two
/// travel buffers, and the ops with their kernels, schedule tables and tensor maps; each call makes only its result's
/// buffers.
pub struct RingRank {
    shape: Shape,
    world: usize,
    rank: usize,
    st: Arc<CudaStream>,
    bufs: [Travel; 2],
    steps: RankSteps,
    /// Queue step 0's attention before waiting for the ranks' verdict (`set_overlap_check`).
    overlap_check: bool,
}

impl std::fmt::Debug for RingRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingRank")
            .field("shape", &self.shape)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

impl RingRank {
    /// The state of `comm`'s rank for calls on `shape` (the whole problem; Sq = Sk); nothing is sent.
    pub fn new(gpu: &Gpu, comm: &RingComm, shape: Shape) -> Result<RingRank> {
        let (world, rank) = (comm.world_size(), comm.rank());
        let lens = |r: usize| [0, 1].map(|h| zigzag_range(shape.sq, world, r, h).len());
        let st = gpu.ctx.new_stream().map_err(drv)?;
        let per_tok = shape.b * shape.hkv * shape.d;
        let longest = (0..world)
            .map(|r| lens(r).iter().sum::<usize>())
            .max()
            .unwrap_or(1)
            .max(1);
        let heads_kv = (shape.b * shape.hkv).max(1);
        let alloc = || -> Result<Travel> {
            let codes = || st.alloc_zeros::<u8>(longest * per_tok.max(1)).map_err(drv);
            let scales = || st.alloc_zeros::<f32>(heads_kv).map_err(drv);
            Ok(Travel {
                k: codes()?,
                v: codes()?,
                ks: scales()?,
                vs: scales()?,
            })
        };
        let bufs = [alloc()?, alloc()?];
        let steps = RankSteps::new(gpu, world, shape, lens(rank))?;
        Ok(RingRank {
            shape,
            world,
            rank,
            st,
            bufs,
            steps,
            overlap_check: false,
        })
    }

    /// Which steps' launches split their last, partial wave among the blocks ([`SplitTail`]; by default the last
    /// step's, the one with no transfer beside it, dealt ahead; with `Every`, steps beside a transfer take their pieces
    /// from the counter). The others are A/Bs.
    pub fn set_split_tail(&mut self, split: SplitTail) {
        self.steps.set_split_tail(split);
    }

    /// Each step with a transfer leaves `free` SMs to NCCL's kernels (0, the default: its attention takes every SM);
    /// its launch of equal units then takes the fewest blocks that run them in the waves of the others
    /// ([`composed::blocks_leaving`]). Measured level on two GPUs (docs/decisions.md), kept as an A/B.
    pub fn set_free_sms(&mut self, free: usize) {
        self.steps.set_free_sms(free);
    }

    /// With `on` (the default), later steps' full launches merge into the running result in their kernel (the
    /// accumulating stage 7, at D = 64 and 128); without, they write an f32 part that attn-merge merges after (A/B).
    pub fn set_fold_merge(&mut self, on: bool) {
        self.steps.set_fold_merge(on);
    }

    /// With `on`, step 0's attention (the own shard, which needs no peer) is queued before the host waits for the
    /// ranks' verdict on their inputs, so that the wait runs under it; step 0's transfer is posted after the verdict,
    /// beside it on the SMs it leaves free ([`RingRank::set_free_sms`]). Off by default: the verdict first, then
    /// step 0's transfer and attention (the A/B in `sdpa bench --ranks`, docs/decisions.md).
    pub fn set_overlap_check(&mut self, on: bool) {
        self.overlap_check = on;
    }

    /// One call ([`ring_attention_rank`]'s, on this state): every rank of `comm` calls it with its shards.
    pub fn run(
        &mut self,
        gpu: &Gpu,
        comm: &RingComm,
        q: Shard,
        k: Shard,
        v: Shard,
        timeout: Duration,
    ) -> Result<RankOutput> {
        let deadline = Instant::now() + timeout;
        comm.watched(deadline, "the ring", || {
            self.work(gpu, comm, q, k, v, deadline)
        })
    }

    /// [`RingRank::run`]'s work, under its watchdog.
    fn work(
        &mut self,
        gpu: &Gpu,
        comm: &RingComm,
        q: Shard,
        k: Shard,
        v: Shard,
        deadline: Instant,
    ) -> Result<RankOutput> {
        let shape = self.shape;
        let (world, rank) = (self.world, self.rank);
        let t0 = Instant::now();
        let since = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let lens = |r: usize| [0, 1].map(|h| zigzag_range(shape.sq, world, r, h).len());
        let mut mine = None;
        if (comm.world_size(), comm.rank()) != (world, rank) {
            mine = Some(format!(
                "its state was made for rank {rank} of {world}, and the communicator is rank {} of {}",
                comm.rank(),
                comm.world_size()
            ));
        }
        if mine.is_none() && shape.sq != shape.sk {
            mine = Some(format!(
                "Sq = {} and Sk = {}: the ring shards one sequence",
                shape.sq, shape.sk
            ));
        }
        for (what, got) in [("q", q.lens), ("k", k.lens), ("v", v.lens)] {
            if mine.is_none() && got != lens(rank) {
                mine = Some(format!(
                    "its {what} halves hold {got:?} tokens; its zigzag chunks of S = {} over {world} ranks have {:?}",
                    shape.sq,
                    lens(rank)
                ));
            }
        }
        if mine.is_none() {
            mine = crate::ring_one_device::short_buffer(shape, lens(rank), &q, &k, &v);
        }
        let comm_stream: Arc<CudaStream> = comm.stream();
        let st = self.st.clone();
        // Every rank's verdict on its inputs: the largest failing rank + 1 (0: all fine), by an all-reduce (max).
        let flag = comm_stream
            .clone_htod(&[if mine.is_some() { rank as i32 + 1 } else { 0 }])
            .map_err(drv)?;
        let mut worst = comm_stream.alloc_zeros::<i32>(1).map_err(drv)?;
        comm.all_reduce_max(&flag, &mut worst)?;
        if let Some(why) = mine {
            wait(&comm_stream, deadline, rank, "the ranks' input checks")?;
            return Err(Error::Ring(format!("rank {rank} of {world}: {why}")));
        }
        let t1 = Instant::now();
        let per_tok = shape.b * shape.hkv * shape.d;
        let heads_kv = shape.b * shape.hkv;
        // The last call's reads of the travel buffers are done (its drain waited for both streams).
        let bufs = &mut self.bufs;
        // Step 0's shard is this rank's own, copied into the first travel buffer; its attention (which needs nothing
        // from a peer) is queued before the host waits for the verdict, so that the wait runs under it.
        let n = (k.lens[0] + k.lens[1]) * per_tok;
        if n > 0 {
            st.memcpy_dtod(&k.tensor.codes.slice(0..n), &mut bufs[0].k.slice_mut(0..n))
                .map_err(drv)?;
            st.memcpy_dtod(&v.tensor.codes.slice(0..n), &mut bufs[0].v.slice_mut(0..n))
                .map_err(drv)?;
        }
        st.memcpy_dtod(&k.tensor.scales.slice(0..heads_kv), &mut bufs[0].ks)
            .map_err(drv)?;
        st.memcpy_dtod(&v.tensor.scales.slice(0..heads_kv), &mut bufs[0].vs)
            .map_err(drv)?;
        let copied = st.record_event(None).map_err(drv)?;
        // Each step's events: attention start and end on `st`, transfer start and end on the communicator's stream.
        let timed = |s: &Arc<CudaStream>| {
            s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv)
        };
        let steps = &mut self.steps;
        steps.begin(gpu, &st)?;
        // The verdict: every rank's inputs right, or this rank's error naming the one that refused (after the device
        // is done with the caller's shard).
        let verdict = || -> Result<()> {
            wait(&comm_stream, deadline, rank, "the ranks' input checks")?;
            let worst = comm_stream.clone_dtoh(&worst).map_err(drv)?[0];
            if worst > 0 {
                wait(&st, deadline, rank, "step 0's attention")?;
                return Err(Error::Ring(format!(
                    "rank {rank} of {world}: rank {} refused its inputs (its own error says why); nothing was sent",
                    worst - 1
                )));
            }
            Ok(())
        };
        // Step 0's attention queued before the verdict (`set_overlap_check`): its start and end marks.
        let mut first = if self.overlap_check {
            let a0 = timed(&st)?;
            steps.step(
                gpu,
                &st,
                (world, rank, 0),
                &q,
                bufs[0].tensors(),
                lens(rank),
            )?;
            Some((a0, timed(&st)?))
        } else {
            None
        };
        let setup_ms = since(t1);
        verdict()?;
        let check_ms = since(t0) - setup_ms;
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        let mut marks: Vec<StepMarks> = Vec::with_capacity(world);
        let t2 = Instant::now();
        for step in 0..world {
            let (lo, hi) = bufs.split_at_mut(1);
            let (cur, nxt) = if step % 2 == 0 {
                (&mut lo[0], &mut hi[0])
            } else {
                (&mut hi[0], &mut lo[0])
            };
            // The transfer that filled this step's buffer has landed; the step before's reads of the other buffer are
            // done before this step's transfer fills it. Step 0's attention is queued already: its transfer waits
            // only for the own shard's copy.
            if step == 0 {
                comm_stream.wait(&copied).map_err(drv)?;
            } else {
                st.join(&comm_stream).map_err(drv)?;
                comm_stream.join(&st).map_err(drv)?;
            }
            // Step 0's attention, where it was queued before the verdict, has its marks; a step's starts here.
            let queued = first.take();
            let start = match queued {
                Some(_) => None,
                None => Some(timed(&st)?),
            };
            let mut transfer = None;
            let src = ring_schedule::source(world, rank, step);
            if step + 1 < world {
                let c0 = timed(&comm_stream)?;
                let (send_lens, recv_lens) = (
                    lens(src),
                    lens(ring_schedule::source(world, rank, step + 1)),
                );
                group(|| {
                    let (ns, nr) = (
                        send_lens.iter().sum::<usize>() * per_tok,
                        recv_lens.iter().sum::<usize>() * per_tok,
                    );
                    for (c, n) in [(&cur.k, &mut nxt.k), (&cur.v, &mut nxt.v)] {
                        if ns > 0 {
                            comm.send(&c.slice(0..ns), next)?;
                        }
                        if nr > 0 {
                            comm.recv(&mut n.slice_mut(0..nr), prev)?;
                        }
                    }
                    for (c, n) in [(&cur.ks, &mut nxt.ks), (&cur.vs, &mut nxt.vs)] {
                        comm.send(&c.slice(..), next)?;
                        comm.recv(&mut n.slice_mut(..), prev)?;
                    }
                    Ok(())
                })?;
                transfer = Some((c0, timed(&comm_stream)?));
            }
            if let Some((a0, a1)) = queued {
                marks.push((a0, None, a1, transfer));
            } else if let Some(a0) = start {
                let l0 = timed(&st)?;
                // The travel buffers are sized for the longest shard: the step reads the first elements.
                steps.step(gpu, &st, (world, rank, step), &q, cur.tensors(), lens(src))?;
                marks.push((a0, Some(l0), timed(&st)?, transfer));
            }
        }
        let queue_ms = since(t2);
        let t3 = Instant::now();
        wait(&comm_stream, deadline, rank, "the ring's transfers")?;
        wait(&st, deadline, rank, "the ring's attention")?;
        let host = HostTimes {
            check_ms,
            setup_ms,
            queue_ms,
            drain_ms: since(t3),
        };
        let ms = |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map_err(drv);
        let mut times = Vec::with_capacity(world);
        for (i, (a0, l0, a1, transfer)) in marks.iter().enumerate() {
            let step_end = marks.get(i + 1).map_or(a1, |next| &next.0);
            times.push(StepTime {
                attention_ms: ms(a0, a1)?,
                idle_ms: l0.as_ref().map_or(Ok(0.0), |l0| ms(a0, l0))?,
                transfer_ms: transfer.as_ref().map(|(c0, c1)| ms(c0, c1)).transpose()?,
                step_ms: ms(a0, step_end)?,
            });
        }
        steps.finish(times, host)
    }
}

/// Runs `f` once a rank on GPUs 0 … `world` − 1 of this host, a thread each, each rank with its device and its
/// communicator (made on a new stream of that device, as [`ring_attention_rank`] takes it, by
/// [`RingComm::from_rank`]): every rank's result in rank order, a panic as that rank's error. Fails before any thread
/// starts if NCCL cannot be loaded.
pub fn on_ranks<T: Send>(
    world: usize,
    f: impl Fn(usize, &'static Gpu, &RingComm) -> anyhow::Result<T> + Sync,
) -> Result<Vec<anyhow::Result<T>>> {
    on_ranks_with(world, None, f)
}

/// [`on_ranks`] with the communicators' NCCL kernels held to `max_ctas` blocks, or (None) as many as NCCL picks
/// ([`RingComm::from_rank_with`]).
pub fn on_ranks_with<T: Send>(
    world: usize,
    max_ctas: Option<usize>,
    f: impl Fn(usize, &'static Gpu, &RingComm) -> anyhow::Result<T> + Sync,
) -> Result<Vec<anyhow::Result<T>>> {
    on_ranks_with_comms(world, &[max_ctas], |r, gpu, comms| f(r, gpu, &comms[0]))
}

/// [`on_ranks`] with one communicator a rank for each of `caps` (each on its own new stream, its NCCL kernels held to
/// that many blocks or, with None, as wide as NCCL picks), made in that order on every rank: settings of NCCL that a
/// measurement sets side by side in one run.
pub fn on_ranks_with_comms<T: Send>(
    world: usize,
    caps: &[Option<usize>],
    f: impl Fn(usize, &'static Gpu, &[RingComm]) -> anyhow::Result<T> + Sync,
) -> Result<Vec<anyhow::Result<T>>> {
    let ids = caps
        .iter()
        .map(|_| Id::new().map_err(nccl("ncclGetUniqueId (is libnccl.so.2 installed?)")))
        .collect::<Result<Vec<_>>>()?;
    let (f, ids) = (&f, &ids);
    Ok(std::thread::scope(|sc| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                sc.spawn(move || -> anyhow::Result<T> {
                    let gpu = Gpu::device(r)?;
                    let comms = caps
                        .iter()
                        .zip(ids)
                        .map(|(&cap, id)| {
                            RingComm::from_rank_with(gpu.ctx.new_stream()?, r, world, id, cap)
                                .map_err(|e| anyhow::anyhow!("rank {r}'s communicator: {e:#}"))
                        })
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    f(r, gpu, &comms)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a rank panicked")))
            })
            .collect()
    }))
}
