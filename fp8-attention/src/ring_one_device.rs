// The one-device ring: every rank's (or one rank's) steps on one GPU, the arithmetic and the reference times the ring
// over NCCL is held to.
use std::sync::Arc;

use fixtures::Shape;
use lab::Gpu;
use lab::cudarc::driver::CudaStream;
use lab::cudarc::driver::sys::CUevent_flags;

use crate::error::{Error, Result};
use crate::ring::{HostTimes, RankOutput, RankSteps, Shard, SplitTail, StepTime, zigzag_range};

/// Ring attention's arithmetic for `world` ranks on one device, on `stream`: rank r's queries against every rank's
/// K/V shard in the ring's order (ring-schedule's launches over zigzag shards: the diagonal step one causal launch,
/// causal blocks off it whole halves), each launch by stage 7, the first into the rank's (O, LSE), each later one into
/// an f32 part merged into it by attn-merge as it lands. `shape` is the whole problem (B, H, Hkv, S, D; Sq = Sk = S);
/// `q[r]` and `kv[r]` (K and V) are rank r's shards. What crosses ranks in a real ring (the K/V shard a step sends on)
/// is read here in place.
pub fn ring_on_one_device(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    q: &[Shard],
    kv: &[(Shard, Shard)],
) -> Result<Vec<RankOutput>> {
    let fold = crate::stage_for(gpu).accumulating_kernel(shape.d);
    ring_on_one_device_as(gpu, stream, shape, q, kv, fold, SplitTail::default())
}

/// [`ring_on_one_device`] with later steps' full launches merging into the running result in their kernel, `fold`
/// (`Stage::accumulating_kernel`'s, the default; or a variant of it with the same parameters), or, with None, writing
/// an f32 part that attn-merge merges after (the same bits where no launch splits its tail: a test holds them equal),
/// and `split`'s steps splitting their tails.
pub fn ring_on_one_device_as(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    q: &[Shard],
    kv: &[(Shard, Shard)],
    fold: Option<lab::KernelSpec>,
    split: SplitTail,
) -> Result<Vec<RankOutput>> {
    let ranks: Vec<(usize, &Shard)> = q.iter().enumerate().collect();
    one_device(
        gpu,
        stream,
        shape,
        (q.len(), &ranks),
        kv,
        (fold, split),
        Steps::Untimed,
    )
}

/// [`ring_on_one_device`] with each step's launches between device events: every rank's [`RankOutput::steps`] holds
/// its steps' times (`transfer_ms` None, `step_ms` its attention's), the ring's own launches with no communication
/// beside them, which a ring over NCCL holds its steps to.
pub fn ring_on_one_device_timed(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    q: &[Shard],
    kv: &[(Shard, Shard)],
) -> Result<Vec<RankOutput>> {
    ring_on_one_device_beside(gpu, stream, shape, q, kv, Beside::Nothing)
}

/// What runs beside each timed step of the one-device ring that would have a transfer beside it over NCCL (every step
/// but the last): nothing, or a copy of the next step's K and V codes (the transfer's bytes) between two buffers of
/// the device, on a second stream started with the step — a transfer's memory traffic with no NCCL and no other GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beside {
    /// The ring's launches alone.
    Nothing,
    /// A device-to-device copy of the transfer's bytes.
    Copy,
}

/// [`ring_on_one_device_timed`] with `beside` running beside each step that has a transfer over NCCL.
pub fn ring_on_one_device_beside(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    q: &[Shard],
    kv: &[(Shard, Shard)],
    beside: Beside,
) -> Result<Vec<RankOutput>> {
    let ranks: Vec<(usize, &Shard)> = q.iter().enumerate().collect();
    timed(gpu, stream, shape, (q.len(), &ranks), kv, beside)
}

/// [`ring_on_one_device_beside`] for rank `rank` alone: its steps, on its query shard `q` and every rank's K/V shards
/// (`kv`, in rank order), timed as there; what the other ranks' steps would take is not run. `rank`'s output is the
/// one [`ring_on_one_device_beside`] gives it (its launches are the same), at 1/W of the work.
pub fn ring_rank_on_one_device_beside(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    rank: usize,
    q: &Shard,
    kv: &[(Shard, Shard)],
    beside: Beside,
) -> Result<RankOutput> {
    if rank >= kv.len() {
        return Err(Error::Unsupported(format!(
            "ring: rank {rank} of {} ranks (one K/V shard a rank)",
            kv.len()
        )));
    }
    let mut outs = timed(gpu, stream, shape, (kv.len(), &[(rank, q)]), kv, beside)?;
    Ok(outs.swap_remove(0))
}

/// How the one-device ring runs its steps: untimed, or each between device events, with a copy of each transfer's
/// bytes on the stream it holds beside the step, if any.
#[derive(Clone, Copy)]
enum Steps<'a> {
    Untimed,
    Timed(Option<&'a Arc<CudaStream>>),
}

/// `ranks`' steps (of `world` ranks: `q_count` query shards given) with each step between events and `beside` beside
/// the steps that have a transfer over NCCL, later full launches merging in the default accumulating kernel.
fn timed(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    ranks: (usize, &[(usize, &Shard)]),
    kv: &[(Shard, Shard)],
    beside: Beside,
) -> Result<Vec<RankOutput>> {
    let fold = crate::stage_for(gpu).accumulating_kernel(shape.d);
    let side = match beside {
        Beside::Nothing => None,
        Beside::Copy => Some(
            stream
                .fork()
                .map_err(|e| Error::Device(anyhow::Error::from(e)))?,
        ),
    };
    one_device(
        gpu,
        stream,
        shape,
        ranks,
        kv,
        (fold, SplitTail::default()),
        Steps::Timed(side.as_ref()),
    )
}

/// Whether `ranks`' query shards and all `world` ranks' K/V shards (`kv`) fit `shape`'s zigzag split over `world`
/// ranks: a named error before any launch where a count, a half's length or a buffer is wrong.
fn check_shards(
    shape: Shape,
    world: usize,
    ranks: &[(usize, &Shard)],
    kv: &[(Shard, Shard)],
) -> Result<()> {
    if world == 0 || kv.len() != world {
        return Err(Error::Unsupported(format!(
            "ring: {world} query shards and {} K/V shards: one of each a rank, at least one rank",
            kv.len()
        )));
    }
    if shape.sq != shape.sk {
        return Err(Error::Unsupported(format!(
            "ring: Sq = {} and Sk = {}: the ring shards one sequence (Sq = Sk)",
            shape.sq, shape.sk
        )));
    }
    let want = |r: usize| [0, 1].map(|half| zigzag_range(shape.sq, world, r, half).len());
    let wrong = |r: usize, what: &str, got: [usize; 2]| {
        Error::Unsupported(format!(
            "ring: rank {r}'s {what} halves hold {got:?} tokens; its zigzag chunks of S = {} over {world} ranks have \
             {:?}",
            shape.sq,
            want(r)
        ))
    };
    let short = |r: usize, why: String| Error::Unsupported(format!("ring: rank {r}: {why}"));
    for &(r, q) in ranks {
        if q.lens != want(r) {
            return Err(wrong(r, "q", q.lens));
        }
        if let Some(why) = short_tensor(shape, q.lens, "q", q, shape.h) {
            return Err(short(r, why));
        }
    }
    for (r, (k, v)) in kv.iter().enumerate() {
        for (what, t) in [("k", k), ("v", v)] {
            if t.lens != want(r) {
                return Err(wrong(r, what, t.lens));
            }
            if let Some(why) = short_tensor(shape, t.lens, what, t, shape.hkv) {
                return Err(short(r, why));
            }
        }
    }
    Ok(())
}

/// The one-device ring, `ranks`' steps (each a rank and its query shard, of `q_count` given) run as `how` says, over
/// every rank's K/V shards `kv`, once `check_shards` passes.
fn one_device(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: Shape,
    (q_count, ranks): (usize, &[(usize, &Shard)]),
    kv: &[(Shard, Shard)],
    (fold, split): (Option<lab::KernelSpec>, SplitTail),
    how: Steps,
) -> Result<Vec<RankOutput>> {
    check_shards(shape, q_count, ranks, kv)?;
    let (timed, side) = match how {
        Steps::Untimed => (false, None),
        Steps::Timed(side) => (true, side),
    };
    let world = kv.len();
    let drv = |e| Error::Device(anyhow::Error::from(e));
    // A shard's K (or V) codes, [B, K/V heads, L0 + L1, D] bytes; the copy's destination holds the largest.
    let bytes = |sh: &Shard| shape.b * shape.hkv * (sh.lens[0] + sh.lens[1]) * shape.d;
    let most = kv.iter().map(|(k, _)| bytes(k)).max().unwrap_or(0);
    let mut scratch = match side {
        Some(st) => Some([
            st.alloc_zeros::<u8>(most).map_err(drv)?,
            st.alloc_zeros::<u8>(most).map_err(drv)?,
        ]),
        None => None,
    };
    let mut outs = Vec::with_capacity(ranks.len());
    for &(rank, mine) in ranks {
        let mut steps = RankSteps::new(gpu, world, shape, mine.lens)?;
        steps.set_folding(gpu, fold)?;
        steps.set_split_tail(split);
        steps.begin(gpu, stream)?;
        let mark = || {
            stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv)
        };
        let mut marks = Vec::with_capacity(if timed { world + 1 } else { 0 });
        for step in 0..world {
            if timed {
                marks.push(mark()?);
            }
            if let (Some(st), Some([dk, dv]), true) = (side, scratch.as_mut(), step + 1 < world) {
                let (nk, nv) = &kv[ring_schedule::source(world, rank, step + 1)];
                st.wait(marks.last().expect("a timed step's start"))
                    .map_err(drv)?;
                let n = bytes(nk);
                st.memcpy_dtod(&nk.tensor.codes.slice(0..n), &mut dk.slice_mut(0..n))
                    .map_err(drv)?;
                st.memcpy_dtod(&nv.tensor.codes.slice(0..n), &mut dv.slice_mut(0..n))
                    .map_err(drv)?;
            }
            let (k, v) = &kv[ring_schedule::source(world, rank, step)];
            steps.step(
                gpu,
                stream,
                (world, rank, step),
                mine,
                (k.tensor, v.tensor),
                k.lens,
            )?;
            if let (Some(st), true) = (side, step + 1 < world) {
                // The next step waits for the copy, as a ring step waits for its transfer.
                stream.join(st).map_err(drv)?;
            }
        }
        let mut times = Vec::with_capacity(world);
        if timed {
            marks.push(mark()?);
            for w in marks.windows(2) {
                let ms = w[0].elapsed_ms(&w[1]).map_err(drv)?;
                times.push(StepTime {
                    attention_ms: ms,
                    idle_ms: 0.0,
                    transfer_ms: None,
                    step_ms: ms,
                });
            }
        }
        outs.push(steps.finish(times, HostTimes::default())?);
    }
    Ok(outs)
}

/// Why a rank's shards `q`, `k`, `v` (halves of `lens` tokens, of the whole problem `shape`) cannot be read: a codes
/// buffer shorter than its shard or a scales buffer shorter than its heads, named; None when they can.
pub(crate) fn short_buffer(
    shape: Shape,
    lens: [usize; 2],
    q: &Shard,
    k: &Shard,
    v: &Shard,
) -> Option<String> {
    [("q", q, shape.h), ("k", k, shape.hkv), ("v", v, shape.hkv)]
        .into_iter()
        .find_map(|(what, t, heads)| short_tensor(shape, lens, what, t, heads))
}

/// Why shard `t` (`what`: q, k or v; `heads` of them, halves of `lens` tokens) cannot be read: its codes shorter than
/// [B, heads, L0 + L1, D] or its scales shorter than B·heads, named; None when it can.
fn short_tensor(
    shape: Shape,
    lens: [usize; 2],
    what: &str,
    t: &Shard,
    heads: usize,
) -> Option<String> {
    let l = lens[0] + lens[1];
    let (codes, scales) = (shape.b * heads * l * shape.d, shape.b * heads);
    if t.tensor.codes.len() < codes {
        Some(format!(
            "its {what} codes hold {} bytes; its shard [B, heads, L0 + L1, D] = [{}, {heads}, {l}, {}] needs {codes}",
            t.tensor.codes.len(),
            shape.b,
            shape.d
        ))
    } else if t.tensor.scales.len() < scales {
        Some(format!(
            "its {what} scales hold {}; one per (batch, head) is {scales}",
            t.tensor.scales.len()
        ))
    } else {
        None
    }
}
