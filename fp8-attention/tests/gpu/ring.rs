// Ring attention: every rank's steps on one device against the f64 reference, and over NCCL on 2 and 4 GPUs.
use anyhow::{Result, ensure};
use fixtures::{Quantized, Raw, Shape, quantize_per_head};
use fp8_attention::{Beside, Fp8, OutDtype, Shard, SplitTail};
use lab::{Gpu, Suite};

use crate::lab_path;

/// A rank's shard of one tensor: its codes (both zigzag halves, each head's in turn), its scales (one per (batch,
/// head), shared by every rank here), and the halves' token counts.
fn shard<'a>(
    codes: &'a lab::cudarc::driver::CudaSlice<u8>,
    scales: &'a lab::cudarc::driver::CudaSlice<f32>,
    lens: [usize; 2],
) -> Shard<'a> {
    Shard {
        tensor: Fp8 { codes, scales },
        lens,
    }
}

/// Every rank's zigzag shards of `qz` (shape `s`, over `world` ranks) on a stream of `gpu`: codes a rank, scales shared.
struct Uploaded {
    st: std::sync::Arc<lab::cudarc::driver::CudaStream>,
    codes: [Vec<lab::cudarc::driver::CudaSlice<u8>>; 3],
    scales: [lab::cudarc::driver::CudaSlice<f32>; 3],
    s: Shape,
    world: usize,
}

impl Uploaded {
    fn new(gpu: &Gpu, qz: &Quantized, s: Shape, world: usize) -> Result<Uploaded> {
        use fp8_attention::zigzag_split;
        let st = gpu.ctx.new_stream()?;
        let (qd, kd) = ([s.b, s.h, s.sq, s.d], [s.b, s.hkv, s.sk, s.d]);
        let upload = |x: &[u8], dims| -> Result<Vec<_>> {
            Ok(zigzag_split(x, dims, world)
                .iter()
                .map(|x| st.clone_htod(if x.is_empty() { &[0u8][..] } else { &x[..] }))
                .collect::<Result<_, _>>()?)
        };
        let codes = [upload(&qz.q, qd)?, upload(&qz.k, kd)?, upload(&qz.v, kd)?];
        let scales = [
            st.clone_htod(&qz.q_scale)?,
            st.clone_htod(&qz.k_scale)?,
            st.clone_htod(&qz.v_scale)?,
        ];
        Ok(Uploaded {
            st,
            codes,
            scales,
            s,
            world,
        })
    }

    /// Rank r's halves' token counts.
    fn lens(&self, r: usize) -> [usize; 2] {
        [0, 1].map(|h| fp8_attention::zigzag_range(self.s.sq, self.world, r, h).len())
    }

    /// Every rank's query shard, and every rank's (K, V) shards.
    fn shards(&self) -> (Vec<Shard<'_>>, Vec<(Shard<'_>, Shard<'_>)>) {
        let one = |t: usize, r: usize| shard(&self.codes[t][r], &self.scales[t], self.lens(r));
        (
            (0..self.world).map(|r| one(0, r)).collect(),
            (0..self.world).map(|r| (one(1, r), one(2, r))).collect(),
        )
    }
}

/// `ring_on_one_device` over `world` virtual ranks on `qz` (shape `s`), its ranks' shards joined: O and LSE of the
/// whole.
fn ring_one_device_joined(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    world: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    ring_one_device_joined_as(gpu, qz, s, world, default_fold(s.d))
}

/// The accumulating kernel later ring steps merge in by default (`ring_on_one_device`'s).
fn default_fold(d: usize) -> Option<lab::KernelSpec> {
    composed::Stage::S7.accumulating_kernel(d)
}

/// As ring_one_device_joined, later steps merging in `fold` (None: an f32 part merged by attn-merge after).
fn ring_one_device_joined_as(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    world: usize,
    fold: Option<lab::KernelSpec>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    ring_one_device_split(gpu, qz, s, world, fold, SplitTail::default())
}

/// As ring_one_device_joined_as, `split`'s steps splitting their tails.
fn ring_one_device_split(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    world: usize,
    fold: Option<lab::KernelSpec>,
    split: SplitTail,
) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok(ring_one_device_run(gpu, qz, s, world, How::As(fold, split))?.0)
}

/// Which one-device ring runs: `ring_on_one_device_as` with later steps merging in this kernel (None: attn-merge) and
/// these steps splitting their tails, or `ring_on_one_device_beside` (the defaults, each step between events, with
/// this beside the steps that have a transfer over NCCL).
enum How {
    As(Option<lab::KernelSpec>, SplitTail),
    Timed(fp8_attention::Beside),
}

/// As ring_one_device_joined_as, run `how`; each rank's step times come back too (in rank order; empty untimed).
fn ring_one_device_run(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    world: usize,
    how: How,
) -> Result<JoinedWithSteps> {
    use fp8_attention::{ring_on_one_device_as, ring_on_one_device_beside, zigzag_join};
    let up = Uploaded::new(gpu, qz, s, world)?;
    let st = &up.st;
    let lens = |r: usize| up.lens(r);
    let (q, kv) = up.shards();
    let outs = match how {
        How::Timed(beside) => ring_on_one_device_beside(gpu, st, s, &q, &kv, beside)?,
        How::As(fold, split) => ring_on_one_device_as(gpu, st, s, &q, &kv, fold, split)?,
    };
    let steps = outs.iter().map(|o| o.steps.clone()).collect();
    let (mut o_shards, mut l_shards) = (vec![], vec![]);
    for (r, out) in outs.iter().enumerate() {
        let rows = s.heads() * lens(r).iter().sum::<usize>();
        o_shards.push(st.clone_dtoh(&out.o)?[..rows * s.d].to_vec());
        l_shards.push(st.clone_dtoh(&out.lse)?[..rows].to_vec());
    }
    let o = zigzag_join(&o_shards, [s.b, s.h, s.sq, s.d]);
    let lse = zigzag_join(&l_shards, [s.b, s.h, s.sq, 1]);
    Ok(((o, lse), steps))
}

/// The joined O and LSE, and each rank's step times.
type JoinedWithSteps = ((Vec<f32>, Vec<f32>), Vec<Vec<fp8_attention::StepTime>>);

/// Ring attention over `world` virtual ranks on one device (`ring_on_one_device`) on shape `s`, against the f64
/// reference of the whole problem, beside stage 7 on the whole problem (the lab's path): the ring's O must be as
/// close to the reference as the dense kernel's (its parts are stage 7's; the merge adds f32 ulps), rel-L2 within
/// 10% + 1e-3 of the dense one's, and its LSE within the dense LSE's max error + 1e-4.
fn check_ring(gpu: &Gpu, s: Shape, world: usize, same_bits: bool) -> Result<()> {
    use lab::numerics::{Tolerance, error_stats};
    let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
    // The ring as the library runs it, and, where later steps fold their merge into the kernel, with attn-merge's
    // merge after each part instead: each held to the reference.
    let mut runs = vec![("", ring_one_device_joined(gpu, &qz, s, world)?)];
    // Every step splitting its tail (steps before the last taking their pieces from the counter): the same bits where
    // no launch splits.
    let every = ring_one_device_split(gpu, &qz, s, world, default_fold(s.d), SplitTail::Every)?;
    ensure!(
        !same_bits || runs[0].1 == every,
        "ring W = {world} {s:?}: every step splitting its tail changed bits where none splits"
    );
    runs.push((" (every step splitting its tail)", every));
    if default_fold(s.d).is_some() {
        let unfolded = ring_one_device_joined_as(gpu, &qz, s, world, None)?;
        // The same bits where no launch of the unfolded ring splits its tail (a split part's own merge changes them).
        ensure!(
            !same_bits || runs[0].1 == unfolded,
            "ring W = {world} {s:?}: the folded merge differs from attn-merge's"
        );
        runs.push((" (parts merged by attn-merge)", unfolded));
    }
    let want = fixtures::reference(&qz);
    let dense = lab_path(gpu, &qz, OutDtype::F32)?;
    let tol = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    let dense_e = error_stats(&dense.o, &want.o, tol);
    let lse_err = |x: &[f32]| {
        x.iter()
            .zip(&want.lse)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max)
    };
    let dense_l = lse_err(&dense.lse);
    for (how, (o, lse)) in &runs {
        let ring_e = error_stats(o, &want.o, tol);
        let ring_l = lse_err(lse);
        eprintln!(
            "ring W = {world} {s:?}{how}: O vs f64 max_abs={:.3e} mean_abs={:.3e} rel_l2={:.3e} (dense stage 7: rel_l2={:.3e}); LSE max abs {ring_l:.3e} (dense {dense_l:.3e})",
            ring_e.max_abs, ring_e.mean_abs, ring_e.rel_l2, dense_e.rel_l2
        );
        ensure!(
            ring_e.nan == 0 && ring_e.inf == 0,
            "ring W = {world}{how}: NaN or Inf in O"
        );
        ensure!(
            ring_e.rel_l2 <= 1.1 * dense_e.rel_l2 + 1e-3,
            "ring W = {world}{how}: rel-L2 {:.3e} against the dense kernel's {:.3e}",
            ring_e.rel_l2,
            dense_e.rel_l2
        );
        ensure!(
            ring_l <= dense_l + 1e-4,
            "ring W = {world}{how}: LSE error {ring_l:.3e} against the dense kernel's {dense_l:.3e}"
        );
    }
    Ok(())
}

/// A rank's O and LSE (its shard's rows), on the host.
type RankRows = (Vec<f32>, Vec<f32>);

/// Ring attention over NCCL on `world` GPUs (one thread and communicator a rank, `ring_attention_rank`) on shape `s`:
/// the whole problem's O and LSE, joined from every rank's shard, must equal ring_on_one_device's on device 0 bit
/// for bit (the same kernels and merges in the same order, on GPUs of one model), which check_ring holds against the
/// f64 reference.
fn check_ring_nccl(gpus: &[&'static Gpu], s: Shape) -> Result<()> {
    use fp8_attention::zigzag_join;
    let world = gpus.len();
    let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
    let results = ring_nccl_run(gpus, &qz, None);
    let (mut o_s, mut l_s) = (vec![], vec![]);
    for (r, res) in results.into_iter().enumerate() {
        let (o, l) = res.map_err(|e| e.context(format!("rank {r}")))?;
        o_s.push(o);
        l_s.push(l);
    }
    let o = zigzag_join(&o_s, [s.b, s.h, s.sq, s.d]);
    let lse = zigzag_join(&l_s, [s.b, s.h, s.sq, 1]);
    let (one_o, one_l) = ring_one_device_joined(gpus[0], &qz, s, world)?;
    ensure!(
        o.iter()
            .zip(&one_o)
            .all(|(a, b)| a.to_bits() == b.to_bits())
            && lse
                .iter()
                .zip(&one_l)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
        "ring over NCCL on {world} GPUs differs from the same ring on one device"
    );
    eprintln!(
        "ring over NCCL, {world} GPUs, {s:?}: O and LSE bit-identical to the ring on one device"
    );
    Ok(())
}

/// Every rank of a ring over NCCL on `gpus` on `qz` (its shape's whole sequence), one thread and communicator a rank;
/// rank `bad`, if any, claims a second half one token short. Each rank's O and LSE, or its error.
fn ring_nccl_run(
    gpus: &[&'static Gpu],
    qz: &Quantized,
    bad: Option<usize>,
) -> Vec<Result<RankRows>> {
    use fp8_attention::{RingRank, on_ranks, ring_attention_rank, zigzag_range, zigzag_split};
    let world = gpus.len();
    let s = qz.shape;
    let (qd, kd) = ([s.b, s.h, s.sq, s.d], [s.b, s.hkv, s.sk, s.d]);
    let (qs, ks, vs) = (
        zigzag_split(&qz.q, qd, world),
        zigzag_split(&qz.k, kd, world),
        zigzag_split(&qz.v, kd, world),
    );
    let lens = move |r: usize| [0, 1].map(|h| zigzag_range(s.sq, world, r, h).len());
    let run = on_ranks(world, |r, gpu, comm| -> Result<RankRows> {
        let st = comm.stream();
        let up = |x: &Vec<u8>| st.clone_htod(if x.is_empty() { &[0u8][..] } else { &x[..] });
        let (dq, dk, dv) = (up(&qs[r])?, up(&ks[r])?, up(&vs[r])?);
        let (sq, sk, sv) = (
            st.clone_htod(&qz.q_scale)?,
            st.clone_htod(&qz.k_scale)?,
            st.clone_htod(&qz.v_scale)?,
        );
        let l = lens(r);
        let claimed = if bad == Some(r) {
            [l[0], l[1].saturating_sub(1)]
        } else {
            l
        };
        let shards = || {
            (
                shard(&dq, &sq, claimed),
                shard(&dk, &sk, l),
                shard(&dv, &sv, l),
            )
        };
        let limit = std::time::Duration::from_secs(60);
        let (q1, k1, v1) = shards();
        let out = ring_attention_rank(gpu, comm, s, q1, k1, v1, limit);
        if bad.is_some() {
            // The same refusal on a state that queues step 0 under the ranks' check: the same error on every rank.
            let mut overlapped = RingRank::new(gpu, comm, s)?;
            overlapped.set_overlap_check(true);
            let (q2, k2, v2) = shards();
            let again = overlapped.run(gpu, comm, q2, k2, v2, limit);
            let text = |r: &fp8_attention::Result<fp8_attention::RankOutput>| {
                r.as_ref().err().map(|e| e.to_string())
            };
            ensure!(
                text(&out).is_some() && text(&out) == text(&again),
                "rank {r}: refusals differ with step 0 under the check: {:?} / {:?}",
                text(&out),
                text(&again)
            );
        }
        let out = out?;
        // The same call three times on a kept state (RingRank: its buffers and ops reused), the second with step 0
        // queued under the ranks' input check, the third with 4 SMs left to NCCL (fewer blocks): each gives the
        // one-call bits.
        let mut kept = RingRank::new(gpu, comm, s)?;
        for call in 0..3 {
            kept.set_overlap_check(call == 1);
            kept.set_free_sms(if call == 2 { 4 } else { 0 });
            let (q2, k2, v2) = shards();
            let again = kept.run(gpu, comm, q2, k2, v2, limit)?;
            ensure!(
                st.clone_dtoh(&again.o)? == st.clone_dtoh(&out.o)?
                    && st.clone_dtoh(&again.lse)? == st.clone_dtoh(&out.lse)?,
                "rank {r}: call {call} on a kept RingRank differs from ring_attention_rank"
            );
        }
        // A time for every step: attention and step positive, a transfer on every step but the last.
        ensure!(
            out.steps.len() == world,
            "rank {r}: {} step times for {world} steps",
            out.steps.len()
        );
        for (i, t) in out.steps.iter().enumerate() {
            ensure!(
                t.attention_ms > 0.0
                    && (0.0..t.attention_ms).contains(&t.idle_ms)
                    && t.step_ms >= t.attention_ms
                    && t.transfer_ms.is_some() == (i + 1 < world),
                "rank {r}, step {i}: {t:?}"
            );
        }
        let rows = s.heads() * (l[0] + l[1]);
        Ok((
            st.clone_dtoh(&out.o)?[..rows * s.d].to_vec(),
            st.clone_dtoh(&out.lse)?[..rows].to_vec(),
        ))
    });
    match run {
        Ok(results) => results,
        Err(e) => vec![Err(e.into())],
    }
}

/// O of the two-rank one-device ring on `qz` with later steps merging in `mutant`, against the same ring merging in
/// `good` (None: attn-merge after an f32 part).
fn mutant_distance(
    gpu: &Gpu,
    qz: &Quantized,
    s: Shape,
    good: Option<lab::KernelSpec>,
    mutant: lab::KernelSpec,
) -> Result<lab::numerics::ErrorStats> {
    let good = ring_one_device_joined_as(gpu, qz, s, 2, good)?;
    let bad = ring_one_device_joined_as(gpu, qz, s, 2, Some(mutant))?;
    let exact = lab::numerics::Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };
    Ok(lab::numerics::error_stats(&bad.0, &good.0, exact))
}

/// The ring tests.
pub fn add(t: &mut Suite) {
    t.gpu(
        "ring::on_one_device::a_short_shard_is_refused_by_name",
        |gpu| {
            // A rank whose K codes are one byte short of its shard: a named error before any launch or copy, from the
            // plain, the timed and the copy-beside ring alike.
            let (s, world) = (Shape::new(1, 2, 256, 64), 2);
            let st = gpu.ctx.new_stream()?;
            let lens =
                |r: usize| [0, 1].map(|h| fp8_attention::zigzag_range(s.sq, world, r, h).len());
            let need = |r: usize| s.b * s.h * lens(r).iter().sum::<usize>() * s.d;
            let full: Vec<_> = (0..world)
                .map(|r| st.alloc_zeros::<u8>(need(r)))
                .collect::<Result<_, _>>()?;
            let short = st.alloc_zeros::<u8>(need(1) - 1)?;
            let scales = st.clone_htod(&vec![1.0f32; s.b * s.h])?;
            let q: Vec<Shard> = (0..world)
                .map(|r| shard(&full[r], &scales, lens(r)))
                .collect();
            let kv: Vec<(Shard, Shard)> = (0..world)
                .map(|r| {
                    let k = if r == 1 { &short } else { &full[r] };
                    (
                        shard(k, &scales, lens(r)),
                        shard(&full[r], &scales, lens(r)),
                    )
                })
                .collect();
            for beside in [None, Some(Beside::Nothing), Some(Beside::Copy)] {
                let err = match beside {
                    None => fp8_attention::ring_on_one_device(gpu, &st, s, &q, &kv),
                    Some(b) => fp8_attention::ring_on_one_device_beside(gpu, &st, s, &q, &kv, b),
                }
                .map(|_| ())
                .expect_err("a short K shard ran");
                let text = format!("{err:#}");
                ensure!(
                    text.contains("rank 1") && text.contains("its k codes hold"),
                    "{beside:?}: {text}"
                );
            }
            Ok(())
        },
    );
    t.gpu("ring::on_one_device::timed_steps_same_bits", |gpu| {
        // The timed one-device ring (what `sdpa bench --ranks` holds a ring's steps to) computes what the untimed one
        // does, and times each rank's every step.
        let s = Shape::new(1, 4, 1000, 128);
        let qz = quantize_per_head(&Raw::random(s, 92, 1.0));
        let world = 3;
        let (plain, none) = ring_one_device_run(
            gpu,
            &qz,
            s,
            world,
            How::As(default_fold(s.d), SplitTail::default()),
        )?;
        let (timed, steps) = ring_one_device_run(gpu, &qz, s, world, How::Timed(Beside::Nothing))?;
        // A copy of each transfer's bytes beside the steps reads the shards and writes only its own buffers.
        let (copied, beside) = ring_one_device_run(gpu, &qz, s, world, How::Timed(Beside::Copy))?;
        ensure!(
            none.iter().all(Vec::is_empty),
            "the untimed ring returned step times"
        );
        ensure!(
            plain == timed,
            "the timed ring's O or LSE differ from the untimed one's"
        );
        ensure!(
            plain == copied,
            "the timed ring's O or LSE beside a copy of each transfer's bytes differ from the untimed one's"
        );
        ensure!(
            beside.iter().flatten().all(|t| t.attention_ms > 0.0),
            "the ring beside a copy returned a step time of 0"
        );
        ensure!(
            steps.len() == world,
            "{} ranks' step times for {world} ranks",
            steps.len()
        );
        for (r, st) in steps.iter().enumerate() {
            ensure!(
                st.len() == world,
                "rank {r}: {} step times for {world} steps",
                st.len()
            );
            for (i, t) in st.iter().enumerate() {
                ensure!(
                    t.attention_ms > 0.0
                        && t.idle_ms == 0.0
                        && t.step_ms == t.attention_ms
                        && t.transfer_ms.is_none(),
                    "rank {r}, step {i}: {t:?}"
                );
            }
        }
        eprintln!(
            "timed one-device ring, W = {world}: rank 0's steps {:?}",
            steps[0]
        );
        Ok(())
    });
    t.gpu("ring::on_one_device::one_rank_alone_same_bits", |gpu| {
        // One rank's steps run alone (what `sdpa bench --ranks` times each rank's steps by) give that rank what the
        // whole one-device ring gives it, bit for bit, and one step time a step; a rank past the ring is refused by name.
        use fp8_attention::{ring_on_one_device_beside, ring_rank_on_one_device_beside};
        let s = Shape::new(1, 4, 1000, 128).with_causal(true);
        let qz = quantize_per_head(&Raw::random(s, 93, 1.0));
        let world = 3;
        let up = Uploaded::new(gpu, &qz, s, world)?;
        let st = &up.st;
        let lens = |r: usize| up.lens(r);
        let (q, kv) = up.shards();
        let all = ring_on_one_device_beside(gpu, st, s, &q, &kv, Beside::Nothing)?;
        for r in 0..world {
            let one = ring_rank_on_one_device_beside(gpu, st, s, r, &q[r], &kv, Beside::Nothing)?;
            let rows = s.heads() * lens(r).iter().sum::<usize>();
            let got = (st.clone_dtoh(&one.o)?, st.clone_dtoh(&one.lse)?);
            let want = (st.clone_dtoh(&all[r].o)?, st.clone_dtoh(&all[r].lse)?);
            ensure!(
                got.0[..rows * s.d] == want.0[..rows * s.d] && got.1[..rows] == want.1[..rows],
                "rank {r} alone: O or LSE differ from the whole ring's rank {r}"
            );
            ensure!(
                one.steps.len() == world && one.steps.iter().all(|t| t.attention_ms > 0.0),
                "rank {r} alone: step times {:?} for {world} steps",
                one.steps
            );
        }
        // A rank's query shard given as another's is refused (its halves' lengths differ at S = 1000 over 3 ranks).
        let err = ring_rank_on_one_device_beside(gpu, st, s, 0, &q[2], &kv, Beside::Nothing)
            .expect_err("rank 0 ran on rank 2's query shard");
        ensure!(format!("{err:#}").contains("rank 0's q halves"), "{err:#}");
        let err = ring_rank_on_one_device_beside(gpu, st, s, world, &q[0], &kv, Beside::Nothing)
            .expect_err("a rank past the ring ran");
        ensure!(format!("{err:#}").contains("rank 3 of 3 ranks"), "{err:#}");
        Ok(())
    });
    t.gpu(
        "ring::on_one_device::folded_merge_mutant_is_caught",
        |gpu| {
            // The accumulating kernel with the running result's LSE and the part's swapped in the merge's weights (each
            // gets the other's): its ring must differ from attn-merge's merge, bit for bit and by far.
            let s = Shape::new(1, 4, 1000, 128);
            let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
            let spec =
                anyhow::Context::context(default_fold(s.d), "no accumulating kernel at D = 128")?;
            let mutant = spec.mutated(
                "pingpong_epilogue.cuh",
                "const float l[2] = {lrun[h], lse[h]};",
                "const float l[2] = {lse[h], lrun[h]};",
            )?;
            let e = mutant_distance(gpu, &qz, s, None, mutant)?;
            ensure!(
                e.rel_l2 > 1e-2,
                "the swapped weights' ring is within rel-L2 {:.3e} of the merge's",
                e.rel_l2
            );
            eprintln!(
                "mutant `swapped merge weights` caught: rel-L2 {:.3e} from attn-merge's merge",
                e.rel_l2
            );
            Ok(())
        },
    );
    for (name, shape, worlds) in [
        (
            "1x4x1000x128",
            Shape::new(1, 4, 1000, 128),
            &[2usize, 3, 4][..],
        ),
        (
            "1x4x1000x128_causal",
            Shape::new(1, 4, 1000, 128).with_causal(true),
            &[2, 3, 4][..],
        ),
        (
            "2x8q2kv_777x64_causal",
            Shape::new(2, 8, 777, 64)
                .with_kv_heads(2)
                .expect("8 / 2")
                .with_causal(true),
            &[2, 4][..],
        ),
        (
            "1x2x5x64_causal_empty_chunks",
            Shape::new(1, 2, 5, 64).with_causal(true),
            &[4][..],
        ),
        // 43 heads × 8 query tiles a half = 344 units a full block: more than two waves on 114 to 170 SMs and not a
        // whole number of them, so stage 7 splits the tail and a block's part needs rows past its real ones.
        (
            "1x43x4096x64_split_tail",
            Shape::new(1, 43, 4096, 64),
            &[2][..],
        ),
        (
            "1x43x4096x64_causal_split_tail",
            Shape::new(1, 43, 4096, 64).with_causal(true),
            &[2][..],
        ),
        // D = 128 (consume_unit's epilogue, not the chain's): 43 heads × 8 query tiles, 5 key tiles a step.
        (
            "1x43x2048x128_split_tail",
            Shape::new(1, 43, 2048, 128),
            &[2][..],
        ),
        // 137 heads × 2 query tiles = 274 units a step on 132 SMs: 142 units in the tail, pieces longer than a unit,
        // so some pieces hold a whole unit (accumulated in the kernel) beside a part.
        (
            "1x137x512x128_split_tail_whole_parts",
            Shape::new(1, 137, 512, 128),
            &[2][..],
        ),
    ] {
        t.gpu(&format!("ring::on_one_device::{name}"), move |gpu| {
            if name.contains("split_tail") {
                // A step's launch at W = 2 (a rank's shard against a shard) must split its tail on this GPU: the last
                // step's does (SplitTail::Last, the default), its parts merged in the kernel's own merge.
                let block = Shape::new(shape.b, shape.h, shape.sq / 2, shape.d);
                let plan = composed::SplitPlan::of(composed::Stage::S7, &block, 128, gpu.sms);
                ensure!(
                    plan.pieces > 0,
                    "{name}: a block of {block:?} does not split its tail on {} SMs ({plan:?})",
                    gpu.sms
                );
            }
            for &w in worlds {
                check_ring(gpu, shape, w, !name.contains("split_tail"))?;
            }
            Ok(())
        });
    }
    t.gpu(
        "ring::on_one_device::split_tail_merge_without_running_rows_is_caught",
        |gpu| {
            // The last step's folded launch splits its tail (W = 2, 344 units on 132 SMs); with stage 7's own merge
            // kernel in the accumulating source (the parts merged, the running rows of the step before dropped) the
            // ring must differ from the accumulating merge's by far.
            let s = Shape::new(1, 43, 2048, 128);
            let qz = quantize_per_head(&Raw::random(s, 91, 1.0));
            let spec =
                anyhow::Context::context(default_fold(s.d), "no accumulating kernel at D = 128")?;
            let mutant = spec.mutated_source("SDPA_MERGE_ACC_KERNEL(128)", "SDPA_MERGE_KERNEL(128)")?;
            let e = mutant_distance(gpu, &qz, s, Some(spec), mutant)?;
            ensure!(
                e.rel_l2 > 1e-2,
                "the merge without the running rows is within rel-L2 {:.3e} of the accumulating merge",
                e.rel_l2
            );
            eprintln!(
                "mutant `split tail merged without the running rows` caught: rel-L2 {:.3e}",
                e.rel_l2
            );
            Ok(())
        },
    );
    for (world, name, shape) in [
        (
            2,
            "1x4x1000x128_causal",
            Shape::new(1, 4, 1000, 128).with_causal(true),
        ),
        (
            2,
            "2x8q2kv_777x64",
            Shape::new(2, 8, 777, 64).with_kv_heads(2).expect("8 / 2"),
        ),
        (
            4,
            "1x4x1001x128_causal",
            Shape::new(1, 4, 1001, 128).with_causal(true),
        ),
    ] {
        t.gpus(
            world,
            &format!("ring::nccl::{world}_gpus::{name}"),
            move |gpus| check_ring_nccl(gpus, shape),
        );
    }
    t.gpus(
        2,
        "ring::nccl::2_gpus::a_rank_refusing_its_inputs_ends_every_rank",
        |gpus| {
            // Rank 1 claims its second half one token short: it fails by name, and rank 0 learns it from the ranks' check
            // before anything is sent, with an error naming rank 1; neither waits out its timeout.
            let s = Shape::new(1, 2, 300, 64).with_causal(true);
            let qz = quantize_per_head(&Raw::random(s, 5, 1.0));
            let t0 = std::time::Instant::now();
            let res = ring_nccl_run(gpus, &qz, Some(1));
            let e: Vec<String> = res
                .into_iter()
                .map(|r| r.err().map(|e| format!("{e:#}")).unwrap_or_default())
                .collect();
            ensure!(
                e[1].contains("rank 1 of 2") && e[1].contains("q halves hold"),
                "rank 1: {}",
                e[1]
            );
            ensure!(
                e[0].contains("rank 1 refused its inputs"),
                "rank 0: {}",
                e[0]
            );
            ensure!(
                t0.elapsed().as_secs() < 30,
                "the ranks took {:?} to fail",
                t0.elapsed()
            );
            eprintln!(
                "a rank refusing its inputs: rank 0 `{}`; rank 1 `{}`",
                e[0], e[1]
            );
            Ok(())
        },
    );
    t.gpus(
        2,
        "ring::nccl::2_gpus::a_peer_that_stops_ends_the_other_rank_by_its_timeout",
        |_gpus| {
            // Rank 1 joins the ranks' input check (one all-reduce of a zero flag, as ring_attention_rank does) and then
            // stops, as a peer that died would: rank 0 passes the check, posts its first send and receive, and must come
            // back with Error::Ring naming the stall within its timeout (3 s here), not hang. Its first send blocks on
            // the host, inside ncclGroupEnd, connecting to the peer (seen on two H100s, 2026-11-27: the test hung
            // there): the watchdog of RingComm::watched aborts the communicator at the deadline, which ends that call.
            use fp8_attention::{on_ranks, ring_attention_rank, zigzag_range, zigzag_split};
            let s = Shape::new(1, 2, 512, 64);
            let qz = quantize_per_head(&Raw::random(s, 7, 1.0));
            let dims = [s.b, s.h, s.sq, s.d];
            let (qs, ks, vs) = (
                zigzag_split(&qz.q, dims, 2),
                zigzag_split(&qz.k, dims, 2),
                zigzag_split(&qz.v, dims, 2),
            );
            let t0 = std::time::Instant::now();
            let res = on_ranks(2, |r, gpu, comm| -> Result<String> {
                let st = comm.stream();
                if r == 1 {
                    let flag = st.clone_htod(&[0i32])?;
                    let mut worst = st.alloc_zeros::<i32>(1)?;
                    comm.all_reduce_max(&flag, &mut worst)
                        .map_err(|e| anyhow::anyhow!("rank 1's check: {e:#}"))?;
                    st.synchronize()?;
                    return Ok("stopped".into());
                }
                let up = |x: &Vec<u8>| st.clone_htod(&x[..]);
                let (dq, dk, dv) = (up(&qs[0])?, up(&ks[0])?, up(&vs[0])?);
                let (sq, sk, sv) = (
                    st.clone_htod(&qz.q_scale)?,
                    st.clone_htod(&qz.k_scale)?,
                    st.clone_htod(&qz.v_scale)?,
                );
                let l = [0, 1].map(|h| zigzag_range(s.sq, 2, 0, h).len());
                let out = ring_attention_rank(
                    gpu,
                    comm,
                    s,
                    shard(&dq, &sq, l),
                    shard(&dk, &sk, l),
                    shard(&dv, &sv, l),
                    std::time::Duration::from_secs(3),
                );
                Ok(format!(
                    "{:#}",
                    out.err()
                        .map(anyhow::Error::from)
                        .unwrap_or_else(|| anyhow::anyhow!("no error"))
                ))
            })?;
            let e0 = res.into_iter().next().expect("rank 0")?;
            ensure!(
                e0.contains("rank 0") && e0.contains("did not finish in time"),
                "rank 0: {e0}"
            );
            ensure!(
                t0.elapsed().as_secs() < 30,
                "rank 0 took {:?} to give up",
                t0.elapsed()
            );
            eprintln!("a peer that stops: rank 0 `{e0}` after {:?}", t0.elapsed());
            Ok(())
        },
    );
}
