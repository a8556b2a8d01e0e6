// The harness's own test binary: the hello loop end to end, and each harness error is clear.
use anyhow::{Result, ensure};
use lab::cudarc::driver::{LaunchConfig, PushKernelArg};
use lab::numerics::{Inputs, Tolerance, check_written, error_stats, poisoned};
use lab::{Arch, Budget, Gpu, Header, KernelSpec, Source, Suite, hello};

const BROKEN: Source = Source {
    file: "broken.cu",
    code: "#include \"lab/lab.cuh\"\nextern \"C\" __global__ void broken(float* y) { y[0] = undeclared_name; }\n",
    headers: &[lab::HEADERS],
};
const BROKEN_KERNEL: KernelSpec = KernelSpec {
    block: "lab",
    name: "broken",
    source: &BROKEN,
    budget: Budget::new(255, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};
const MISSING_KERNEL: KernelSpec = KernelSpec {
    name: "no_such_kernel",
    ..hello::KERNELS[0]
};
const SPILLY: Source = Source {
    file: "spilly.cu",
    // A store at a run-time index into a register array forces it into local memory: a stack frame.
    code: "extern \"C\" __global__ void spilly(float* y, int k) {\n  float a[256];\n#pragma unroll 1\n  for (int i = 0; i < 256; ++i) a[i] = y[i];\n  a[k & 255] += 1.0f;\n  float s = 0.0f;\n#pragma unroll 1\n  for (int i = 0; i < 256; ++i) s += a[i] * i;\n  y[0] = s;\n}\n",
    headers: &[],
};
const SPILLY_KERNEL: KernelSpec = KernelSpec {
    block: "lab",
    name: "spilly",
    source: &SPILLY,
    budget: Budget::new(255, 0),
    archs: &Arch::REQUIRED,
    sass: &[],
};
const NEEDS_QGMMA: KernelSpec = KernelSpec {
    name: "hello_axpy",
    sass: &["QGMMA"],
    ..hello::KERNELS[0]
};
const HOPPER_ONLY: KernelSpec = KernelSpec {
    archs: &[Arch::Sm90a],
    ..hello::KERNELS[0]
};
const UNBOUNDED_SETMAXNREG: Source = Source {
    file: "unbounded_setmaxnreg.cu",
    // setmaxnreg with no register cap at entry (no __launch_bounds__(threads, 1)): ptxas ignores it, C7508.
    code: "extern \"C\" __global__ void unbounded(float* y) {\n  if (threadIdx.x < 128) {\n    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\\n\");\n  } else {\n    asm volatile(\"setmaxnreg.inc.sync.aligned.u32 232;\\n\");\n    y[threadIdx.x] = 1.0f;\n  }\n}\n",
    headers: &[],
};
const UNBOUNDED_KERNEL: KernelSpec = KernelSpec {
    block: "lab",
    name: "unbounded",
    source: &UNBOUNDED_SETMAXNREG,
    budget: Budget::new(255, 0),
    archs: &[Arch::Sm90a],
    sass: &[],
};
const NESTED: &[Header] = &[Header {
    name: "lab/nested.cuh",
    code: "#pragma once\n#include \"lab/lab.cuh\"\n#define NESTED_OK 1\n",
}];

fn hello_matches_the_model(gpu: &Gpu, n: usize, seed: u64) -> Result<()> {
    let k = gpu.load(&hello::KERNELS[0])?;
    ensure!(
        k.resources.smem_bytes == 1024,
        "ptxas report: {} (expected 1024 B smem)",
        k.resources
    );
    ensure!(
        k.resources.barriers >= 1,
        "ptxas report shows no barrier: {}",
        k.resources
    );
    let mut inp = Inputs::seeded(seed);
    let (x, y0) = (inp.normal(n, 0.0, 1.0), inp.normal(n, 0.0, 1.0));
    let a = 1.5f32;
    let s = &gpu.stream;
    let dx = s.clone_htod(&x)?;
    let mut dy = s.clone_htod(&y0)?;
    let blocks = (n as u32).div_ceil(hello::THREADS);
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (hello::THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let ni = n as i32;
    // SAFETY: the arguments match hello_axpy(float, const float*, float*, int); x and y hold n floats.
    unsafe {
        s.launch_builder(&k.func)
            .arg(&a)
            .arg(&dx)
            .arg(&mut dy)
            .arg(&ni)
            .launch(cfg)?
    };
    let y = s.clone_dtoh(&dy)?;
    let stats = error_stats(
        &y,
        &hello::axpy(a, &x, &y0),
        Tolerance {
            atol: 1e-6,
            rtol: 1e-6,
        },
    );
    eprintln!("hello n={n}: {stats}");
    stats.check("hello_axpy vs model")
}

fn main() {
    let mut t = Suite::new();
    t.kernels(hello::KERNELS);
    t.compile("compile_error_shows_the_log_kernel_and_options", || {
        let err = format!("{:#}", BROKEN_KERNEL.compile(Arch::Sm90).unwrap_err());
        ensure!(
            err.contains("kernel `broken` in `broken.cu`"),
            "kernel not named: {err}"
        );
        ensure!(
            err.contains("--gpu-architecture=sm_90"),
            "options not shown: {err}"
        );
        ensure!(
            err.contains("    | ") && err.contains("undeclared_name"),
            "log not shown line by line: {err}"
        );
        Ok(())
    });
    t.compile("missing_kernel_name_lists_what_the_source_defines", || {
        let err = format!("{:#}", MISSING_KERNEL.compile(Arch::Sm89).unwrap_err());
        ensure!(
            err.contains("`no_such_kernel` not found in `hello.cu`"),
            "{err}"
        );
        ensure!(err.contains("[hello_axpy]"), "{err}");
        Ok(())
    });
    t.compile("resource_report_catches_a_stack_frame", || {
        let (_, r) = SPILLY_KERNEL.compile(Arch::Sm90)?;
        let v = SPILLY_KERNEL.budget.violations(&r);
        ensure!(
            r.stack_bytes >= 1024 && v.iter().any(|m| m.contains("stack frame")),
            "{r}: {v:?}"
        );
        Ok(())
    });
    t.compile("missing_sass_opcode_fails_the_check", || {
        let err = format!("{:#}", NEEDS_QGMMA.check_budget(Arch::Sm90).unwrap_err());
        ensure!(err.contains("SASS has no QGMMA"), "{err}");
        Ok(())
    });
    t.compile(
        "sm90a_kernels_are_refused_elsewhere_and_chosen_on_sm90",
        || {
            let err = format!("{:#}", HOPPER_ONLY.compile(Arch::Sm80).unwrap_err());
            ensure!(
                err.contains("is built only for [sm_90a], not sm_80") && err.contains("wgmma"),
                "{err}"
            );
            ensure!(HOPPER_ONLY.target_for(Arch::Sm90)? == Arch::Sm90a);
            ensure!(HOPPER_ONLY.target_for(Arch::Sm89).is_err());
            ensure!(hello::KERNELS[0].target_for(Arch::Sm90)? == Arch::Sm90);
            Ok(())
        },
    );
    t.compile("ptxas_warning_fails_the_budget", || {
        let err = format!(
            "{:#}",
            UNBOUNDED_KERNEL.check_budget(Arch::Sm90a).unwrap_err()
        );
        ensure!(
            err.contains("ptxas warning")
                && err.contains("C7508")
                && err.contains("setmaxnreg ignored"),
            "setmaxnreg without a register cap must fail by its warning: {err}"
        );
        Ok(())
    });
    t.compile("nested_embedded_headers_resolve", || {
        const SRC: Source = Source {
            file: "nested.cu",
            code: "#include \"lab/nested.cuh\"\n#include <mma.h>\n#include <cuda_fp16.h>\nstatic_assert(NESTED_OK, \"\");\nextern \"C\" __global__ void nested(__half* y) { y[threadIdx.x] = __float2half(lab::lane_id()); }\n",
            headers: &[lab::HEADERS, NESTED],
        };
        let c = lab::compile(&SRC, Arch::Sm80, &[])?;
        ensure!(c.image.starts_with(b"\x7fELF"), "a cubin is an ELF image");
        c.kernel("nested").map(|_| ())
    });
    t.gpu("hello_axpy_matches_the_model", |gpu| {
        hello_matches_the_model(gpu, 1 << 16, 1)
    });
    t.gpu("hello_axpy_partial_last_block", |gpu| {
        hello_matches_the_model(gpu, 1001, 2)
    });
    t.gpu("poisoned_output_catches_an_unwritten_tail", |gpu| {
        // Launch one block too few: the helper must report exactly the tail the kernel never touched.
        let k = gpu.load(&hello::KERNELS[0])?;
        let n = 3 * hello::THREADS as usize;
        let s = &gpu.stream;
        let x = s.clone_htod(&vec![1.0f32; n])?;
        let mut y = s.clone_htod(&poisoned::<f32>(n))?;
        let cfg = LaunchConfig {
            grid_dim: (2, 1, 1),
            block_dim: (hello::THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (a, ni) = (1.0f32, n as i32);
        // SAFETY: as above; two blocks cover the first 512 of n elements.
        unsafe {
            s.launch_builder(&k.func)
                .arg(&a)
                .arg(&x)
                .arg(&mut y)
                .arg(&ni)
                .launch(cfg)?
        };
        let out = s.clone_dtoh(&y)?;
        let err = check_written(&out, "y").unwrap_err().to_string();
        ensure!(
            err.contains("256 of 768") && err.contains("index 512"),
            "{err}"
        );
        Ok(())
    });
    t.gpu(
        "telemetry_reads_the_clock_and_power_of_this_device",
        |gpu| {
            // The driver ships NVML: on a GPU machine the sampler must find the device by its PCI bus id and read a
            // clock, a power and a limit that a real device has, across a stretch of work.
            let bus = gpu.pci_bus_id()?;
            let sampler = lab::Sampler::start(gpu, std::time::Duration::from_millis(5))
                .ok_or_else(|| anyhow::anyhow!("NVML did not find the device at {bus}"))?;
            let began = std::time::Instant::now();
            for seed in 0..20 {
                hello_matches_the_model(gpu, 1 << 20, seed)?;
            }
            let t = sampler
                .stop()
                .ok_or_else(|| anyhow::anyhow!("no readings"))?;
            let secs = began.elapsed().as_secs_f64();
            eprintln!("telemetry over the hello loop: {t}");
            ensure!(t.samples >= 2, "{t}");
            ensure!(
                (100..=5000).contains(&t.sm_mhz_min) && t.sm_mhz_max >= t.sm_mhz_min,
                "{t}"
            );
            ensure!(
                t.power_w_p50 > 1.0 && t.power_limit_w >= t.power_w_p50 * 0.5,
                "{t}"
            );
            ensure!((0.0..=1.0).contains(&t.power_capped), "{t}");
            // The energy counter (Volta and later keep one): the interval's energy over its wall time is a power that
            // a powered device draws and its limit bounds (the counter's interval also holds the sampler's last read).
            let joules = t
                .energy_j
                .ok_or_else(|| anyhow::anyhow!("no energy counter: {t}"))?;
            let watts = joules / secs;
            eprintln!("energy over the hello loop: {joules:.3} J in {secs:.3} s, {watts:.0} W");
            ensure!(
                watts > 1.0 && watts < 1.5 * t.power_limit_w,
                "{joules} J in {secs} s: {watts} W against a {} W limit",
                t.power_limit_w
            );
            Ok(())
        },
    );
    t.gpu("missing_kernel_name_fails_at_load", |gpu| {
        let err = format!("{:#}", gpu.load(&MISSING_KERNEL).unwrap_err());
        ensure!(err.contains("no_such_kernel"), "{err}");
        Ok(())
    });
    t.run()
}
