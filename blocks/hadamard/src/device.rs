// Rotation on the device: rows of a tensor in place, through the library kernels (cuda/rotate_rows.cu).
use anyhow::{Context, Result, ensure};
use lab::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use lab::{Gpu, KernelSpec};

use crate::kernels::{ROWS, for_dim};
use crate::model::{Rotation, norm};

impl Rotation {
    /// Rotates (or, `inverse`, rotates back) every row of `x`, a whole allocation of rows of D, in place on the
    /// device: bit for bit what [`Rotation::rows`] does on the host.
    pub fn apply(&self, gpu: &Gpu, x: &mut CudaSlice<f32>, inverse: bool) -> Result<()> {
        self.apply_with(gpu, &for_dim(&ROWS, self.d)?, x, inverse)
    }

    /// As [`Rotation::apply`] through `spec` (a mutant of the library kernel, in tests).
    pub fn apply_with(
        &self,
        gpu: &Gpu,
        spec: &KernelSpec,
        x: &mut CudaSlice<f32>,
        inverse: bool,
    ) -> Result<()> {
        ensure!(
            x.len().is_multiple_of(self.d),
            "rotating rows of {}: {} elements are not whole rows",
            self.d,
            x.len()
        );
        let st = &gpu.stream;
        let rows = (x.len() / self.d) as i64;
        if rows == 0 {
            return Ok(());
        }
        let signs = match &self.signs {
            Some(s) => Some(st.clone_htod(s)?),
            None => None,
        };
        let k = gpu.load(spec)?;
        // Eight rows a block (a warp each), grid-stride beyond a million blocks.
        let cfg = LaunchConfig {
            grid_dim: ((rows as u64).div_ceil(8).min(1 << 20) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (norm, inv) = (norm(self.d), i32::from(inverse));
        let null: u64 = 0;
        let mut b = st.launch_builder(&k.func);
        b.arg(x).arg(&rows);
        match &signs {
            Some(s) => b.arg(s),
            None => b.arg(&null),
        };
        b.arg(&norm).arg(&inv);
        // SAFETY: hadamard_rows_dD(float* x[rows·D], long long rows, const float* signs[D] or null, float norm,
        // int inverse); x is a whole allocation (aligned for float4), one warp a row, grid-stride.
        unsafe { b.launch(cfg) }.with_context(|| format!("launching {}", spec.name))?;
        Ok(())
    }
}
