// The plan built on the device from boundaries already there: three launches, no host copy, capturable in a graph.
use std::sync::Arc;

use anyhow::{Result, ensure};
use lab::cudarc::driver::{CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::kernels::{HISTOGRAM, OFFSETS, SCATTER};
use crate::model::{Geometry, RaggedUnit};

/// The plan's three kernels; a mutant replaces them together.
#[derive(Debug, Clone, Copy)]
pub struct Planner {
    pub histogram: KernelSpec,
    pub offsets: KernelSpec,
    pub scatter: KernelSpec,
}

impl Default for Planner {
    fn default() -> Self {
        Planner {
            histogram: HISTOGRAM,
            offsets: OFFSETS,
            scatter: SCATTER,
        }
    }
}

/// A plan on the device: the table (the unit count, then a unit an int4) and the histogram's bins it was made with.
#[derive(Debug)]
pub struct DevicePlan {
    pub geometry: Geometry,
    pub table: CudaSlice<i32>,
    pub counts: CudaSlice<i32>,
}

/// Threads a block of the histogram and the scatter, and of the offsets' one block (a multiple of 32: its scan
/// shuffles whole warps).
const THREADS: u32 = 256;
const SCAN_THREADS: u32 = 1024;

impl Planner {
    /// The same kernels with one header edit (a mutation test).
    pub fn mutated(&self, header: &str, from: &str, to: &str) -> Result<Self> {
        Ok(Planner {
            histogram: self.histogram.mutated(header, from, to)?,
            offsets: self.offsets.mutated(header, from, to)?,
            scatter: self.scatter.mutated(header, from, to)?,
        })
    }

    /// Buffers sized for `g` (nothing launched): reuse them across calls of one geometry.
    pub fn alloc(&self, st: &Arc<CudaStream>, g: Geometry) -> Result<DevicePlan> {
        Ok(DevicePlan {
            geometry: g,
            table: st.alloc_zeros::<i32>(g.table_words())?,
            counts: st.alloc_zeros::<i32>(g.bins())?,
        })
    }

    /// Queues the plan of the batch whose boundaries are on the device at `cu_q`, `cu_k` (device addresses of B + 1
    /// i32 each, checked by the caller: `validate_cu_seqlens` on a host copy; the device trusts them), into `plan`
    /// (sized for this geometry by [`Planner::alloc`]).
    pub fn run(
        &self,
        gpu: &Gpu,
        st: &Arc<CudaStream>,
        cu_q: u64,
        cu_k: u64,
        plan: &mut DevicePlan,
    ) -> Result<()> {
        let g = plan.geometry;
        ensure!(
            cu_q != 0 && cu_k != 0,
            "the boundaries' device addresses are null"
        );
        ensure!(
            g.batch <= i32::MAX as usize
                && g.table_words() <= i32::MAX as usize
                && g.heads > 0
                && g.tile_rows > 0
                && g.bc > 0,
            "a plan of {g:?} does not fit the kernels' 32-bit counts"
        );
        st.memset_zeros(&mut plan.counts)?;
        let (heads, rows, bc, causal, bins) = (
            g.heads as i32,
            g.tile_rows as i32,
            g.bc as i32,
            i32::from(g.causal),
            g.bins() as i32,
        );
        // A window's sides (−1: unbounded).
        let side = |x: Option<usize>| x.map_or(-1, |n| n.min(i32::MAX as usize) as i32);
        let (left, right) = (side(g.left), side(g.right));
        ensure!(
            g.group >= 1 && g.total_q.saturating_mul(g.group) <= i32::MAX as usize,
            "{} tokens of {} packed heads: more than 2^31 − 1 rows",
            g.total_q,
            g.group
        );
        let group = g.group as i32;
        let per_seq = LaunchConfig {
            grid_dim: (g.batch.max(1) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hist, offs, scat) = (
            gpu.load(&self.histogram)?,
            gpu.load(&self.offsets)?,
            gpu.load(&self.scatter)?,
        );
        // SAFETY: each kernel's arguments as ragged_plan.cu declares them; cu_q and cu_k hold B + 1 entries (the caller's),
        // counts `bins` and the table `table_words` (alloc): room for every unit and key-tile count of the geometry,
        // which bounds any boundaries of its totals (Geometry's test); blocks ≥ B read cu[B] at most.
        unsafe {
            if g.batch > 0 {
                st.launch_builder(&hist.func)
                    .arg(&cu_q)
                    .arg(&cu_k)
                    .arg(&heads)
                    .arg(&rows)
                    .arg(&bc)
                    .arg(&causal)
                    .arg(&mut plan.counts)
                    .arg(&left)
                    .arg(&right)
                    .arg(&group)
                    .launch(per_seq)?;
            }
            st.launch_builder(&offs.func)
                .arg(&mut plan.counts)
                .arg(&bins)
                .arg(&mut plan.table)
                .launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (SCAN_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })?;
            if g.batch > 0 {
                st.launch_builder(&scat.func)
                    .arg(&cu_q)
                    .arg(&cu_k)
                    .arg(&heads)
                    .arg(&rows)
                    .arg(&bc)
                    .arg(&causal)
                    .arg(&mut plan.counts)
                    .arg(&mut plan.table)
                    .arg(&left)
                    .arg(&right)
                    .arg(&group)
                    .launch(per_seq)?;
            }
        }
        Ok(())
    }
}

impl DevicePlan {
    /// The table's units, copied to the host (waits for `st`); `rows` recomputed from the boundaries (the table
    /// does not hold it).
    pub fn units(&self, st: &Arc<CudaStream>, cu_q: &[i32]) -> Result<Vec<RaggedUnit>> {
        let words = st.clone_dtoh(&self.table)?;
        let n = words[0] as usize;
        ensure!(
            4 + 4 * n <= words.len(),
            "the table says {n} units and has room for {}",
            (words.len() - 4) / 4
        );
        Ok(words[4..4 + 4 * n]
            .chunks_exact(4)
            .map(|w| {
                let sq = (cu_q[w[0] as usize + 1] - cu_q[w[0] as usize]) as u32;
                RaggedUnit {
                    seq: w[0] as u32,
                    head: w[1] as u32,
                    q0: w[2] as u32,
                    rows: (sq * self.geometry.group as u32 - w[2] as u32)
                        .min(self.geometry.tile_rows as u32),
                    key_tiles: w[3] as u32,
                }
            })
            .collect())
    }
}
