// Ring attention's math on one device: zigzag shards, each rank's steps by ring-schedule, partial results merged.
use std::sync::Arc;

use attn_merge::Merger;
use fixtures::{OutDtype, Shape};
use lab::Gpu;
use lab::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::attention::{Attention, Config, Fp8, OutBuf, Output};
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

/// A rank's result: per half, O (f32, [B, H, L, D]) and the LSE ([B, H, L]).
#[derive(Debug)]
pub struct RankOutput {
    /// O of each half.
    pub o: [CudaSlice<f32>; 2],
    /// The LSE of each half.
    pub lse: [CudaSlice<f32>; 2],
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
    let cfg = |causal| Config {
        causal,
        out_dtype: OutDtype::F32,
        softmax_scale: None,
    };
    let (mut full, mut diag) = (
        Attention::new(gpu, cfg(false))?,
        Attention::new(gpu, cfg(true))?,
    );
    let merger = Merger::default();
    let d = shape.d;
    let mut outs = Vec::with_capacity(world);
    for (rank, mine) in q.iter().enumerate() {
        let rows = |half: usize| shape.b * shape.h * mine.lens[half];
        let mut acc_o = Vec::with_capacity(2);
        let mut acc_l = Vec::with_capacity(2);
        for half in 0..2 {
            let n = rows(half).max(1);
            acc_o.push(
                stream
                    .alloc_zeros::<f32>(n * d)
                    .map_err(anyhow::Error::from)?,
            );
            acc_l.push(
                stream
                    .clone_htod(&vec![f32::NEG_INFINITY; n])
                    .map_err(anyhow::Error::from)?,
            );
        }
        for step in 0..world {
            let src = ring_schedule::source(world, rank, step);
            for blk in ring_schedule::blocks(world, rank, step, shape.causal) {
                for (qh, kh) in (0..2).flat_map(|a| (0..2).map(move |b| (a, b))) {
                    if blk.q & (1 << qh) == 0 || blk.kv & (1 << kh) == 0 {
                        continue;
                    }
                    let (lq, lk) = (mine.lens[qh], kv[src].0.lens[kh]);
                    if lq == 0 || lk == 0 {
                        continue;
                    }
                    let causal = blk.mask == ring_schedule::Mask::Causal;
                    let s = Shape {
                        hkv: shape.hkv,
                        causal,
                        ..Shape::cross(shape.b, shape.h, lq, lk, d)
                    };
                    let op = if causal { &mut diag } else { &mut full };
                    let mut part: Output = op.alloc_output(gpu, stream, &s)?;
                    op.forward_into(
                        gpu,
                        stream,
                        s,
                        mine.halves[qh],
                        kv[src].0.halves[kh],
                        kv[src].1.halves[kh],
                        &mut part,
                    )?;
                    let OutBuf::F32(po) = &part.o else {
                        unreachable!("the ring's ops write f32 O")
                    };
                    let (ao, _g0) = acc_o[qh].device_ptr_mut(stream);
                    let (al, _g1) = acc_l[qh].device_ptr_mut(stream);
                    let (bo, _g2) = po.device_ptr(stream);
                    let (bl, _g3) = part.lse.device_ptr(stream);
                    // SAFETY: the accumulator holds rows(qh) rows of O and LSE; the part's first rows(qh) rows are
                    // the block's result (Attention::output_rows ≥ B·H·Lq); separate allocations, alive until the
                    // stream has run the merge (the part is dropped after it is queued: freed in stream order).
                    unsafe { merger.accumulate(gpu, stream, ao, al, bo, bl, rows(qh), d)? };
                }
            }
        }
        let mut it_o = acc_o.into_iter();
        let mut it_l = acc_l.into_iter();
        let mut next = || -> (CudaSlice<f32>, CudaSlice<f32>) {
            (
                it_o.next().expect("two halves"),
                it_l.next().expect("two halves"),
            )
        };
        let ((o0, l0), (o1, l1)) = (next(), next());
        outs.push(RankOutput {
            o: [o0, o1],
            lse: [l0, l1],
        });
    }
    Ok(outs)
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
