// Programmatic dependent launch: every kernel launched so holds the wait; stage 8 behind a late writer of Q waits for it.
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::{Arch, Budget, KernelSpec, Source};

use crate::prelude::*;

/// A kernel that lets its dependents launch at once, spins for `spin` clock cycles, then copies `n` bytes: a
/// predecessor still writing when a programmatic launch after it starts.
const LATE_COPY: Source = Source {
    file: "late_copy.cu",
    code: r#"
extern "C" __global__ void late_copy(const unsigned char* src, unsigned char* dst, long long n, long long spin) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += gridDim.x * (long long)blockDim.x)
    dst[i] = src[i];
}
"#,
    headers: &[],
};
const LATE: KernelSpec = KernelSpec {
    block: "composed",
    name: "late_copy",
    source: &LATE_COPY,
    budget: Budget::new(32, 0),
    archs: &[Arch::Sm90],
    sass: &[],
};

/// The wait, as pingpong_attention.cuh writes it; the mutant drops it.
const WAIT: &str = r#"asm volatile("griddepcontrol.wait;" ::: "memory");"#;

/// Whether `spec` runs pingpong_attention.cuh's `pingpong_attention`, whose body holds the wait: its source includes
/// that header, and the wait is in the function's body there.
fn waits(spec: &KernelSpec) -> bool {
    const HEADER: &str = "pingpong_attention.cuh";
    let Some(h) = spec
        .source
        .headers
        .iter()
        .flat_map(|set| set.iter())
        .find(|h| h.name == HEADER)
    else {
        return false;
    };
    let body = h
        .code
        .split_once("__device__ void pingpong_attention(")
        .and_then(|(_, rest)| rest.split_once("\n}\n"))
        .map_or("", |(body, _)| body);
    spec.source.code.contains(&format!("#include \"{HEADER}\"")) && body.contains(WAIT)
}

pub fn add(t: &mut Suite) {
    t.model("programmatic::every_programmatic_kernel_waits", || {
        // Every kernel launched as a programmatic dependent launch — the programmatic stages' kernels, windowed or
        // not, and the packed batches' — has the wait that makes it safe (pingpong_attention.cuh's).
        let mut specs = vec![];
        for stage in Stage::ALL.into_iter().filter(|s| s.programmatic()) {
            for &d in stage.dims() {
                specs.push(stage.kernel(d));
                if stage.windows() {
                    let window = fixtures::Window {
                        left: Some(8),
                        right: None,
                    };
                    specs.push(stage.kernel_for(&Shape::new(1, 1, 64, d).with_window(window)));
                }
            }
        }
        for &d in Stage::S8.dims() {
            specs.push(composed::varlen_kernel(d));
            specs.push(composed::varlen_pack_kernel(d));
        }
        for &d in Stage::S8.dims() {
            specs.push(lab::KernelSpec::find(
                composed::KERNELS,
                &format!("stage8w_varlen_d{d}"),
            ));
        }
        ensure!(
            specs.len() >= 12,
            "{} programmatic kernels found",
            specs.len()
        );
        // The check tells a kernel without the wait apart: stage 6 runs tma_attention.cuh's loop.
        ensure!(!waits(&Stage::S6.kernel(128)), "stage 6 reads as waiting");
        for spec in specs {
            ensure!(
                waits(&spec),
                "{} is launched programmatically without `{WAIT}`",
                spec.name
            );
        }
        Ok(())
    });
    t.model("programmatic::mutant_applies", || {
        Stage::S8
            .kernel(64)
            .mutated("pingpong_attention.cuh", WAIT, "")?;
        Ok(())
    });
    t.gpu("programmatic::stage8_waits_for_the_kernel_before_it", |gpu| {
        let shape = Shape::new(1, 8, 512, 64);
        let qz = quantize_per_head(&normal(shape, 83));
        let mut d = OnDevice::upload(gpu, &qz)?;
        d.launch(gpu, Stage::S8)?;
        let want = d.download(gpu)?;
        let late = gpu.load(&LATE)?;
        let st = gpu.stream.clone();
        let src = st.clone_htod(&qz.q)?;
        let n = qz.q.len() as i64;
        // About 100 µs at 2 GHz: far longer than a launch, so a kernel that does not wait reads Q's NaN codes.
        let spin: i64 = 200_000;
        let cases = [
            ("as built", None, true),
            (
                "without the wait",
                Some(Stage::S8.kernel(64).mutated("pingpong_attention.cuh", WAIT, "")?),
                false,
            ),
        ];
        for (what, spec, same) in cases {
            // Loaded by a launch on the finished Q first: loading a module waits for the device, which would let the
            // copy finish before the launch under test is queued.
            d.use_kernel(spec);
            d.launch(gpu, Stage::S8)?;
            st.synchronize()?;
            st.memcpy_htod(&vec![0x7Fu8; qz.q.len()], d.q_codes_mut())?; // 0x7F: E4M3's NaN
            d.poison_outputs(gpu)?;
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = st.launch_builder(&late.func);
            b.arg(&src).arg(d.q_codes_mut()).arg(&n).arg(&spin);
            // SAFETY: late_copy(const u8* src, u8* dst, i64 n, i64 spin): both hold n bytes.
            unsafe { b.launch(cfg) }?;
            d.launch(gpu, Stage::S8)?;
            let got = match d.download(gpu) {
                Ok(a) => bit_identical(&a, &want),
                Err(e) if format!("{e:#}").contains("never written by the kernel") => false,
                Err(e) => return Err(e),
            };
            ensure!(
                got == same,
                "stage 8 {what}, launched behind a kernel still writing Q: {}",
                if same {
                    "O / LSE differ from a launch after Q was written"
                } else {
                    "the mutant read Q after the kernel before it had written it (the test did not race)"
                }
            );
            eprintln!("programmatic: stage 8 {what}: {}", if same { "waited" } else { "mutant caught" });
        }
        Ok(())
    });
}
