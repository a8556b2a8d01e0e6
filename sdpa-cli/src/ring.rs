// `sdpa bench --ranks N`: ring attention over NCCL on N GPUs of this host, beside stage 7 on one GPU.
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use fixtures::{Raw, Shape, quantize_per_head};
use fp8_attention::{
    Beside, Fp8, HostTimes, RingRank, Shard, SplitTail, StepTime, ring_attention_rank, zigzag_range,
};
use lab::cudarc::driver::CudaSlice;
use lab::cudarc::driver::sys::CUevent_flags;

use crate::shape_text;

/// The shard of rank `r` (both zigzag halves, each head's in turn: [B, heads, L0 + L1, D]) generated on the host as a
/// small problem of its own (so that no rank builds the whole sequence), unit-normal values quantized per head.
fn host_shard(s: Shape, world: usize, r: usize) -> fixtures::Quantized {
    let l: usize = (0..2).map(|h| zigzag_range(s.sq, world, r, h).len()).sum();
    let shape = Shape {
        hkv: s.hkv,
        ..Shape::new(s.b, s.h, l.max(1), s.d)
    };
    quantize_per_head(&Raw::random(shape, 1000 + r as u64, 1.0))
}

/// One rank's timings: wall ms a call with a fresh state each call; on a kept one, each setting's ([`KEPT_RUNS`], then
/// [`CAPPED_RUNS`] with `--nccl-max-ctas`) median a round (rounds interleaved: [`KEPT_ROUNDS`]), its last call's step
/// times and step 0's idle; its last fresh call's step and host times; for the kept state as the library sets it (the
/// first run), each round's median step times and step 0's median idle over its calls; and its own steps' launches
/// alone on its own GPU, each step's median over the rounds ([`HeldShards::steps`]).
struct RankTimes {
    fresh_ms: Vec<f64>,
    kept: Vec<(Vec<f64>, Vec<f32>, f32)>,
    fresh_steps: Vec<StepTime>,
    host: HostTimes,
    kept_steps: Vec<(Vec<f32>, f32)>,
    /// The kept state's last call's transfers (as the library sets it; ms, none for the last step) and host times.
    kept_transfers: Vec<f32>,
    kept_host: HostTimes,
    alone: Vec<f32>,
}

/// Rounds over [`KEPT_RUNS`], each setting timed once a round in the same order: a setting's calls then sit at five
/// points of the run, so that none is read only at its start (cooler) or only late, and a setting's figure is the
/// median of its rounds (a run's rounds differ by up to 10% at four GPUs: the better of two read high).
const KEPT_ROUNDS: usize = 5;

/// One run on the kept state: its label, which steps split their tail, whether step 0 runs under the ranks' check,
/// the SMs a step with a transfer leaves to NCCL, whether later steps merge in their kernel, and which of the rank's
/// communicators it runs on (0: NCCL's width; 1: the one held to `--nccl-max-ctas` blocks).
struct Kept {
    label: &'static str,
    split: SplitTail,
    overlap: bool,
    free_sms: usize,
    fold: bool,
    comm: usize,
}

/// The runs on a second communicator held to `--nccl-max-ctas` blocks, after [`KEPT_RUNS`], in the same rounds.
const CAPPED_RUNS: [Kept; 2] = [
    Kept {
        label: "the same with NCCL held to --nccl-max-ctas blocks (A/B)",
        split: SplitTail::Last,
        overlap: false,
        free_sms: 0,
        fold: true,
        comm: 1,
    },
    Kept {
        label: "the same with NCCL held to --nccl-max-ctas blocks and a step beside a transfer leaving 1 SM to it (A/B)",
        split: SplitTail::Last,
        overlap: false,
        free_sms: 1,
        fold: true,
        comm: 1,
    },
];

/// The kept state's runs: as the library sets it, then A/Bs.
const KEPT_RUNS: [Kept; 6] = [
    Kept {
        label: "on a state kept across calls (RingRank; later steps merge in their kernel, the last step's partial launches split their tail)",
        split: SplitTail::Last,
        overlap: false,
        free_sms: 0,
        fold: true,
        comm: 0,
    },
    Kept {
        label: "the same with later steps writing a part that attn-merge merges (A/B)",
        split: SplitTail::Last,
        overlap: false,
        free_sms: 0,
        fold: false,
        comm: 0,
    },
    Kept {
        label: "the same with a step beside a transfer leaving 1 SM to NCCL (A/B)",
        split: SplitTail::Last,
        overlap: false,
        free_sms: 1,
        fold: true,
        comm: 0,
    },
    Kept {
        label: "the same with no step splitting its tail (A/B)",
        split: SplitTail::Never,
        overlap: false,
        free_sms: 0,
        fold: true,
        comm: 0,
    },
    Kept {
        label: "the same with every step splitting its tail, those beside a transfer taking their pieces from the counter (A/B)",
        split: SplitTail::Every,
        overlap: false,
        free_sms: 0,
        fold: true,
        comm: 0,
    },
    Kept {
        label: "the same with step 0 queued under the ranks' input check (A/B)",
        split: SplitTail::Last,
        overlap: true,
        free_sms: 0,
        fold: true,
        comm: 0,
    },
];

/// What `--ranks` needs of its problem, checked before anything runs: a rank at least, and one sequence (Sq = Sk).
fn check_ring(s: Shape, world: usize) -> Result<()> {
    ensure!(world >= 1, "--ranks {world}: at least one rank");
    ensure!(
        s.sq == s.sk,
        "--ranks: the ring shards one sequence (Sq = Sk), not {}",
        shape_text(&s)
    );
    Ok(())
}

/// Times `iters` ring calls on `world` GPUs (after one warm-up), rank 0's wall clock a call (each call ends with its
/// rank's stream synchronised: the ranks run in lockstep), each call with its own state (`ring_attention_rank`) and
/// then on a state kept across calls (`RingRank`), and prints both beside stage 7 on the whole problem on GPU 0, then
/// rank 0's last fresh-state call step by step (attention, transfer, the step against its attention) and its host
/// time.
pub fn bench_ranks(s: Shape, world: usize, iters: usize, max_ctas: Option<usize>) -> Result<()> {
    check_ring(s, world)?;
    let have = lab::device_count();
    ensure!(
        have >= world,
        "--ranks {world}: this host has {have} GPU(s); ring attention runs one rank a GPU"
    );
    let one_before = stage7_ms(lab::Gpu::device(0)?, s, fixtures::OutDtype::Bf16)?;
    // The kept state's settings: on NCCL's width, then (with --nccl-max-ctas) on a communicator held to that many
    // blocks, in the same rounds.
    let settings: Vec<&Kept> = KEPT_RUNS
        .iter()
        .chain(max_ctas.map_or(&[][..], |_| &CAPPED_RUNS[..]))
        .collect();
    let caps: Vec<Option<usize>> = std::iter::once(None).chain(max_ctas.map(Some)).collect();
    let times =
        fp8_attention::on_ranks_with_comms(world, &caps, |r, gpu, comms| -> Result<RankTimes> {
            let comm = &comms[0];
            let st = comm.stream();
            let h = host_shard(s, world, r);
            let lens = [0, 1].map(|i| zigzag_range(s.sq, world, r, i).len());
            let codes: Vec<CudaSlice<u8>> = [&h.q, &h.k, &h.v]
                .iter()
                .map(|x| st.clone_htod(x.as_slice()))
                .collect::<Result<_, _>>()?;
            let scales: Vec<CudaSlice<f32>> = [&h.q_scale, &h.k_scale, &h.v_scale]
                .iter()
                .map(|x| st.clone_htod(x.as_slice()))
                .collect::<Result<_, _>>()?;
            let shard = |t: usize| Shard {
                tensor: Fp8 {
                    codes: &codes[t],
                    scales: &scales[t],
                },
                lens,
            };
            let limit = std::time::Duration::from_secs(300);
            // Each call with its own state (ring_attention_rank); its last call's step and host times.
            let (out, (steps, host)) = timed_calls(iters, || {
                let out = ring_attention_rank(gpu, comm, s, shard(0), shard(1), shard(2), limit)?;
                Ok((out.steps, out.host))
            })?;
            // The same calls on a state kept across them (RingRank: buffers and ops made once), in each of KEPT_RUNS'
            // settings.
            let mut kept = RingRank::new(gpu, comm, s)?;
            let mut runs: Vec<(Vec<f64>, Vec<f32>, f32)> =
                vec![(vec![], vec![], 0.0); settings.len()];
            let mut kept_steps = vec![];
            let mut kept_transfers = vec![];
            let mut kept_host = HostTimes::default();
            // This rank's steps' own launches with no transfer beside them, on its own GPU, once a round after the kept
            // settings (every GPU running its rank's, in the rounds' heat: a step is held to launches run in the same
            // conditions as it); every rank's shards are held, and only this rank's steps run.
            let held = HeldShards::upload(gpu, s, world)?;
            let mut alone_rounds = Vec::with_capacity(KEPT_ROUNDS);
            for _ in 0..KEPT_ROUNDS {
                for (i, (k, run)) in settings.iter().zip(runs.iter_mut()).enumerate() {
                    kept.set_split_tail(k.split);
                    kept.set_overlap_check(k.overlap);
                    kept.set_free_sms(k.free_sms);
                    kept.set_fold_merge(k.fold);
                    let mut every = vec![];
                    let (ms, (last, host)) = timed_calls(iters, || {
                        let out =
                            kept.run(gpu, &comms[k.comm], shard(0), shard(1), shard(2), limit)?;
                        every.push(out.steps.clone());
                        Ok((out.steps, out.host))
                    })?;
                    run.0.push(lab::numerics::median(ms));
                    run.1 = last.iter().map(|t| t.step_ms).collect();
                    run.2 = last.first().map_or(0.0, |t| t.idle_ms);
                    if i == 0 {
                        kept_steps.push(round_steps(&every[1..]));
                        kept_transfers = last.iter().filter_map(|t| t.transfer_ms).collect();
                        kept_host = host;
                    }
                }
                alone_rounds.push(held.rank_steps(gpu, s, r, Beside::Nothing)?);
            }
            let alone = step_medians(&alone_rounds);
            Ok(RankTimes {
                fresh_ms: out,
                kept: runs,
                fresh_steps: steps,
                host,
                kept_steps,
                kept_transfers,
                kept_host,
                alone,
            })
        })?;
    let times: Vec<RankTimes> = times
        .into_iter()
        .enumerate()
        .map(|(r, t)| t.with_context(|| format!("rank {r}")))
        .collect::<Result<_>>()?;
    let (kept0, steps0, host0) = (&times[0].kept, &times[0].fresh_steps, times[0].host);
    // Each setting's median round (the rounds' medians printed beside it).
    let kept_ms: Vec<f64> = kept0
        .iter()
        .map(|k| lab::numerics::median(k.0.clone()))
        .collect();
    let ring_ms = lab::numerics::median(times[0].fresh_ms.clone());
    // One GPU: stage 7 on the whole problem (every kernel of a launch), as the library runs it; timed before the ring's
    // rounds (`one_before`) and after them, and their mean.
    let gpu = lab::Gpu::device(0)?;
    let one_after = stage7_ms(gpu, s, fixtures::OutDtype::Bf16)?;
    let one_ms = (one_before + one_after) / 2.0;
    // A step's work alone: stage 7 on one rank's shard against one shard of keys (B, H, S / W, S / W), not causal;
    // a causal step (the diagonal, or two of the four half-blocks) is half of it.
    let shard = Shape {
        hkv: s.hkv,
        ..Shape::new(s.b, s.h, s.sq.div_ceil(world), s.d)
    };
    let half = if s.causal { 0.5 } else { 1.0 };
    let step_work_ms = stage7_ms(gpu, shard, fixtures::OutDtype::Bf16)? * half;
    // The same writing f32 O, as the ring's steps do (a step's excess over it is the ring's: views, the merge).
    let step_f32_ms = stage7_ms(gpu, shard, fixtures::OutDtype::F32)? * half;
    // Shape::flops counts half the pairs under the causal mask.
    let flops = s.flops();
    println!(
        "ring over NCCL ({}), {world} GPU(s), {}: {ring_ms:.3} ms a call (rank 0, median of {iters}; {:.1} TFLOP/s in all); \
         stage 7 on one GPU: {:.3} ms ({:.1} TFLOP/s; {one_before:.3} ms before the ring's calls, {one_after:.3} after): \
         {:.2}× one GPU",
        max_ctas.map_or("its kernels as wide as NCCL picks".into(), |n| format!(
            "its kernels as wide as NCCL picks; the last settings on a second communicator held to {n} blocks"
        )),
        shape_text(&s),
        flops / (ring_ms * 1e-3) / 1e12,
        one_ms,
        flops / (one_ms * 1e-3) / 1e12,
        one_ms / ring_ms
    );
    for ((k, ms), (rounds, steps, idle)) in settings.iter().zip(&kept_ms).zip(kept0) {
        println!(
            "  {}: {ms:.3} ms a call ({:.1} TFLOP/s): {:.2}× one GPU (the median of {KEPT_ROUNDS} interleaved rounds' \
             medians, {} ms; rank 0's steps in its last call {} ms, step 0's device waiting for the host {idle:.3} ms)",
            k.label,
            flops / (ms * 1e-3) / 1e12,
            one_ms / ms,
            joined(rounds.iter().copied(), ""),
            joined(steps.iter().map(|&v| f64::from(v)), "")
        );
    }
    // Each rank's device time in its last fresh call's steps (its attention, the transfers under it): a rank whose
    // steps take longer holds up the others at the next call's input check.
    println!(
        "  each rank's steps (its last fresh call, device events): {} ms",
        joined(
            times.iter().map(|t| t
                .fresh_steps
                .iter()
                .map(|st| f64::from(st.step_ms))
                .sum::<f64>()),
            ""
        )
    );
    // Communication hidden: each step's time against its attention's (rank 0, the last call; device events).
    for (i, st) in steps0.iter().enumerate() {
        println!(
            "  step {i}: attention {:.3} ms (the device waiting for the host {:.3} ms of it), transfer {}, step {:.3} ms \
             ({:.3}× its attention)",
            st.attention_ms,
            st.idle_ms,
            st.transfer_ms
                .map_or("none".into(), |t| format!("{t:.3} ms")),
            st.step_ms,
            st.step_ms / st.attention_ms.max(f32::MIN_POSITIVE)
        );
    }
    if let Some(worst) = steps0
        .iter()
        .map(|st| st.step_ms / st.attention_ms.max(f32::MIN_POSITIVE))
        .max_by(f32::total_cmp)
    {
        println!(
            "  the slowest step against its attention: {worst:.3}× (communication hidden at 1.00×)"
        );
    }
    if let Some(slowest) = steps0
        .iter()
        .map(|st| f64::from(st.step_ms))
        .max_by(f64::total_cmp)
    {
        println!(
            "  a step's work alone (stage 7 on {}{}): {step_work_ms:.3} ms; the slowest step {:.3}× it (issue 35: ≤ 1.05×)",
            shape_text(&shard),
            if s.causal {
                ", halved for a causal step"
            } else {
                ""
            },
            slowest / step_work_ms
        );
        println!(
            "  the same writing f32 O: {step_f32_ms:.3} ms; the slowest step {:.3}× it",
            slowest / step_f32_ms
        );
    }
    // Each rank's steps, on the kept state (as the library runs calls: each step's median over the rounds, each round's
    // the median of its calls) and on a fresh one, against the ring's own launches of those steps with nothing beside
    // them, on the rank's own GPU.
    let list = |x: &[f32], unit: &str| joined(x.iter().map(|&v| f64::from(v)), unit);
    let (mut worst_kept, mut worst_fresh, mut worst_sum) = (0.0f32, 0.0f32, 0.0f32);
    for (r, t) in times.iter().enumerate() {
        let ratios = |ms: &[f32]| -> Vec<f32> {
            ms.iter()
                .zip(&t.alone)
                .map(|(st, a)| st / a.max(f32::MIN_POSITIVE))
                .collect()
        };
        let (kept_ms, kept_idle) = over_rounds(&t.kept_steps);
        let fresh_ms: Vec<f32> = t.fresh_steps.iter().map(|st| st.step_ms).collect();
        let fresh_idle = t.fresh_steps.first().map_or(0.0, |st| st.idle_ms);
        let (kept, fresh) = (ratios(&kept_ms), ratios(&fresh_ms));
        worst_kept = kept.iter().copied().fold(worst_kept, f32::max);
        worst_fresh = fresh.iter().copied().fold(worst_fresh, f32::max);
        let sum = |x: &[f32]| x.iter().sum::<f32>();
        worst_sum = worst_sum.max(sum(&kept_ms) / sum(&t.alone).max(f32::MIN_POSITIVE));
        println!(
            "  rank {r} (GPU {r}): its steps' own launches alone (each step's median over {KEPT_ROUNDS} rounds of \
             {ALONE_CALLS} calls' medians, timed in the rounds after the kept settings, every GPU running its rank's) {} \
             ms; kept state's steps, each the median over {KEPT_ROUNDS} rounds of its calls' medians, {} ms \
             ({}; step 0's device waiting for the host {:.3} ms; the last call's transfers {} ms); fresh state's last \
             call {} ms ({}; {:.3} ms)",
            list(&t.alone, ""),
            list(&kept_ms, ""),
            list(&kept, "×"),
            kept_idle,
            list(&t.kept_transfers, ""),
            list(&fresh_ms, ""),
            list(&fresh, "×"),
            fresh_idle,
        );
    }
    println!(
        "  the slowest step of any rank against its own launches alone: {worst_kept:.3}× on the kept state, \
         {worst_fresh:.3}× on a fresh one (issue 35: ≤ 1.05×); the slowest rank's kept steps in all against its \
         launches alone in all {worst_sum:.3}×; the kept call over {world} steps against a step's work alone (stage 7 \
         on one shard) {:.3}×",
        kept_ms[0] / world as f64 / step_work_ms
    );
    let h = times[0].kept_host;
    println!(
        "  host, rank 0's last kept call (as the library sets it): input check {:.3} ms, setup {:.3} ms, queueing the \
         steps {:.3} ms, waiting for the device {:.3} ms",
        h.check_ms, h.setup_ms, h.queue_ms, h.drain_ms
    );
    let h = host0;
    println!(
        "  host, rank 0's last fresh call: input check {:.3} ms, setup {:.3} ms, queueing the steps {:.3} ms, waiting for \
         the device {:.3} ms",
        h.check_ms, h.setup_ms, h.queue_ms, h.drain_ms
    );
    Ok(())
}

/// `values` to three decimals, each followed by `unit`, joined by " / ".
fn joined(values: impl IntoIterator<Item = f64>, unit: &str) -> String {
    values
        .into_iter()
        .map(|v| format!("{v:.3}{unit}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Calls of the ring on one device whose median step times [`HeldShards::steps`] reports (after one warm-up call).
const ALONE_CALLS: usize = 3;

/// Every rank's shards of the bench's problem on one device, uploaded once ([`HeldShards::steps`] runs them).
struct HeldShards {
    st: std::sync::Arc<lab::cudarc::driver::CudaStream>,
    held: Vec<HeldShard>,
}

/// One rank's Q, K and V codes, their scales, and its halves' lengths, on the device.
type HeldShard = ([CudaSlice<u8>; 3], [CudaSlice<f32>; 3], [usize; 2]);

impl HeldShards {
    /// Every rank's shards of `s` over `world` ranks (the bench's, [`host_shard`]) on `gpu`'s stream.
    fn upload(gpu: &'static lab::Gpu, s: Shape, world: usize) -> Result<HeldShards> {
        let st = gpu.stream.clone();
        let mut held = Vec::with_capacity(world);
        for r in 0..world {
            let h = host_shard(s, world, r);
            let up = |x: &[u8]| st.clone_htod(x);
            let ups = |x: &[f32]| st.clone_htod(x);
            held.push((
                [up(&h.q)?, up(&h.k)?, up(&h.v)?],
                [ups(&h.q_scale)?, ups(&h.k_scale)?, ups(&h.v_scale)?],
                [0, 1].map(|i| zigzag_range(s.sq, world, r, i).len()),
            ));
        }
        Ok(HeldShards { st, held })
    }

    /// Rank r's shard of tensor t (0: Q, 1: K, 2: V).
    fn shard(&self, r: usize, t: usize) -> Shard<'_> {
        let (codes, scales, lens) = &self.held[r];
        Shard {
            tensor: Fp8 {
                codes: &codes[t],
                scales: &scales[t],
            },
            lens: *lens,
        }
    }

    /// Every rank's step times in ms (the median of [`ALONE_CALLS`] calls, step by step, after one warm-up call) when
    /// the ring's launches run on one device with no transfer beside them (`ring_on_one_device_beside` on `gpu`,
    /// every rank's shard there): the same kernels, views, f32 O and merges as a ring step's; with `beside`'s copy of
    /// each transfer's bytes beside the steps that have one.
    fn steps(&self, gpu: &'static lab::Gpu, s: Shape, beside: Beside) -> Result<Vec<Vec<f32>>> {
        let shard = |r: usize, t: usize| self.shard(r, t);
        let world = self.held.len();
        let q: Vec<Shard> = (0..world).map(|r| shard(r, 0)).collect();
        let kv: Vec<(Shard, Shard)> = (0..world).map(|r| (shard(r, 1), shard(r, 2))).collect();
        let mut calls: Vec<Vec<Vec<StepTime>>> = vec![vec![]; world];
        for i in 0..=ALONE_CALLS {
            let outs = fp8_attention::ring_on_one_device_beside(gpu, &self.st, s, &q, &kv, beside)?;
            if i > 0 {
                for (c, out) in calls.iter_mut().zip(outs) {
                    c.push(out.steps);
                }
            }
        }
        Ok(calls.iter().map(|c| round_steps(c).0).collect())
    }

    /// Rank `rank`'s step times alone, as [`HeldShards::steps`] gives them for it, with none of the other ranks'
    /// steps run (`ring_rank_on_one_device_beside`: its query shard over every rank's K/V shards).
    fn rank_steps(
        &self,
        gpu: &'static lab::Gpu,
        s: Shape,
        rank: usize,
        beside: Beside,
    ) -> Result<Vec<f32>> {
        let shard = |r: usize, t: usize| self.shard(r, t);
        let kv: Vec<(Shard, Shard)> = (0..self.held.len())
            .map(|r| (shard(r, 1), shard(r, 2)))
            .collect();
        let mut calls = Vec::with_capacity(ALONE_CALLS);
        for i in 0..=ALONE_CALLS {
            let out = fp8_attention::ring_rank_on_one_device_beside(
                gpu,
                &self.st,
                s,
                rank,
                &shard(rank, 0),
                &kv,
                beside,
            )?;
            if i > 0 {
                calls.push(out.steps);
            }
        }
        Ok(round_steps(&calls).0)
    }
}

/// Rounds of `sdpa bench --ranks N --one-device`, each the ring's launches alone and then beside a copy.
const ONE_DEVICE_ROUNDS: usize = 2;

/// `sdpa bench --ranks N --one-device`: the ring's launches for N ranks, every rank's steps on GPU 0 with nothing
/// beside them, against stage 7 on the whole problem there: how far the ring's kernels alone stand from one GPU's
/// 1/N share, with no transfer, no NCCL and no other GPU (an A/B of the ring's kernels needs one GPU). Then each step
/// against itself beside a device-to-device copy of its transfer's bytes (`Beside::Copy`), in alternating rounds: what
/// a transfer's memory traffic alone costs a step.
pub fn bench_one_device(s: Shape, world: usize) -> Result<()> {
    check_ring(s, world)?;
    let gpu = lab::Gpu::device(0)?;
    let one_ms = stage7_ms(gpu, s, fixtures::OutDtype::Bf16)?;
    let held = HeldShards::upload(gpu, s, world)?;
    let mut rounds = Vec::with_capacity(ONE_DEVICE_ROUNDS);
    for _ in 0..ONE_DEVICE_ROUNDS {
        let alone = held.steps(gpu, s, Beside::Nothing)?;
        let copy = held.steps(gpu, s, Beside::Copy)?;
        rounds.push((alone, copy));
    }
    let all = &rounds[0].0;
    let sums: Vec<f64> = all
        .iter()
        .map(|st| st.iter().map(|&v| f64::from(v)).sum())
        .collect();
    let slowest = sums.iter().copied().fold(0.0, f64::max);
    let share = one_ms / world as f64;
    println!(
        "ring launches of {world} rank(s) on one GPU, {}: stage 7 on the whole problem {one_ms:.3} ms, 1/{world} of it \
         {share:.3} ms; the slowest rank's steps {slowest:.3} ms, {:.3}× that share",
        shape_text(&s),
        slowest / share
    );
    for (r, (st, sum)) in all.iter().zip(&sums).enumerate() {
        println!(
            "  rank {r}: steps {} ms (median of {ALONE_CALLS} calls each), {sum:.3} ms in all",
            joined(st.iter().map(|&v| f64::from(v)), "")
        );
    }
    for (i, (alone, copy)) in rounds.iter().enumerate() {
        println!(
            "round {i}: each step beside a copy of its transfer's bytes ÷ the step alone (the last step has none)"
        );
        for (r, (a, c)) in alone.iter().zip(copy).enumerate() {
            let ratio = a.iter().zip(c).map(|(&a, &c)| f64::from(c) / f64::from(a));
            println!(
                "  rank {r}: alone {} ms, beside a copy {} ms: {}",
                joined(a.iter().map(|&v| f64::from(v)), ""),
                joined(c.iter().map(|&v| f64::from(v)), ""),
                joined(ratio, "×")
            );
        }
    }
    Ok(())
}

/// Stage 7's time in ms on `s` writing O in `out` (unit-normal inputs quantized per head, on `gpu`, Vᵀ made once):
/// past 10^14 FLOP a launch (0.1 s and more) the median of 5 launches each between CUDA events after one warm-up, not
/// graph replays of 20 launches (at S = 1M, H = 8: minutes); else the graph replays' median.
fn stage7_ms(gpu: &'static lab::Gpu, s: Shape, out: fixtures::OutDtype) -> Result<f64> {
    let qz = quantize_per_head(&Raw::random(s, 7, 1.0));
    let mut p = fp8_attention::Problem::upload(gpu, &qz, out)?;
    if s.flops() <= 1e14 {
        return Ok(p.time(gpu, composed::Stage::S7, 2, 10)?.p50_us / 1e3);
    }
    p.launch(gpu, composed::Stage::S7)?;
    let mut ms = vec![];
    for _ in 0..5 {
        gpu.stream.synchronize()?;
        let e0 = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        p.launch(gpu, composed::Stage::S7)?;
        let e1 = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        gpu.stream.synchronize()?;
        ms.push(f64::from(e0.elapsed_ms(&e1)?));
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[2])
}

/// Each step's median over `rounds` (each a round's step medians and step 0's idle, as [`round_steps`] gives them),
/// and step 0's median idle over them.
fn over_rounds(rounds: &[(Vec<f32>, f32)]) -> (Vec<f32>, f32) {
    let steps: Vec<Vec<f32>> = rounds.iter().map(|r| r.0.clone()).collect();
    let idle = if rounds.is_empty() {
        0.0
    } else {
        lab::numerics::median(rounds.iter().map(|r| f64::from(r.1)).collect()) as f32
    };
    (step_medians(&steps), idle)
}

/// Each step's median over `rounds` (each a round's step times; as many steps as the shortest round has).
fn step_medians(rounds: &[Vec<f32>]) -> Vec<f32> {
    let steps = rounds.iter().map(Vec::len).min().unwrap_or(0);
    (0..steps)
        .map(|i| lab::numerics::median(rounds.iter().map(|r| f64::from(r[i])).collect()) as f32)
        .collect()
}

/// Each step's median time over `calls` (each a call's steps), and step 0's median idle (a kept round's calls, or
/// [`HeldShards::steps`]'s).
fn round_steps(calls: &[Vec<StepTime>]) -> (Vec<f32>, f32) {
    let med = |f: &dyn Fn(&[StepTime]) -> Option<f32>| -> Option<f32> {
        let v: Vec<f64> = calls.iter().filter_map(|c| f(c)).map(f64::from).collect();
        (!v.is_empty()).then(|| lab::numerics::median(v) as f32)
    };
    let steps = calls.first().map_or(0, Vec::len);
    (
        (0..steps)
            .filter_map(|i| med(&|c| c.get(i).map(|t| t.step_ms)))
            .collect(),
        med(&|c| c.first().map(|t| t.idle_ms)).unwrap_or(0.0),
    )
}

/// `iters` calls of `call` after one warm-up: each one's wall ms, and the last call's output.
fn timed_calls<T>(
    iters: usize,
    mut call: impl FnMut() -> fp8_attention::Result<T>,
) -> Result<(Vec<f64>, T)> {
    let mut ms = vec![];
    let mut last = call()?;
    for _ in 0..iters {
        let t0 = Instant::now();
        last = call()?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok((ms, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(ms: f32, idle: f32) -> StepTime {
        StepTime {
            attention_ms: ms,
            idle_ms: idle,
            transfer_ms: None,
            step_ms: ms,
        }
    }

    #[test]
    fn the_kept_steps_are_each_steps_median_over_the_rounds() {
        // Three rounds of two steps: each step's median on its own, and step 0's idle's.
        let rounds = vec![
            (vec![9.0, 4.0], 0.3),
            (vec![7.0, 6.0], 0.1),
            (vec![8.0, 5.0], 0.2),
        ];
        assert_eq!(over_rounds(&rounds), (vec![8.0, 5.0], 0.2));
        assert_eq!(over_rounds(&[]), (vec![], 0.0));
    }

    #[test]
    fn a_rounds_steps_are_each_steps_median_over_its_calls() {
        // Three calls of two steps: each step's median is taken on its own (not the median call's steps).
        let calls = vec![
            vec![step(9.0, 0.1), step(5.0, 0.0)],
            vec![step(7.0, 0.3), step(6.0, 0.0)],
            vec![step(8.0, 0.2), step(4.0, 0.0)],
        ];
        assert_eq!(round_steps(&calls), (vec![8.0, 5.0], 0.2));
        assert_eq!(round_steps(&[]), (vec![], 0.0));
    }
}
