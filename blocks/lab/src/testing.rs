// The test binary of every block: model, compile and GPU tests, with GPU tests skipped (never passed) without a GPU.
use anyhow::Result;
use libtest_mimic::{Arguments, Failed, Trial};

use crate::compile::{Arch, KernelSpec};
use crate::gpu::{Gate, Gpu, gate, require_gpu_from_env, status};

/// Test names carry their kind as a prefix; the runner's table counts them by it.
pub const MODEL: &str = "model::";
pub const COMPILE: &str = "compile::";
pub const GPU: &str = "gpu::";
/// Set in the child process of [`Suite::gpu_isolated`] to the one test it runs.
const ISOLATED: &str = "LAB_ISOLATED_TEST";

/// Held by each multi-GPU test while it runs ([`Suite::gpus`]).
static MULTI_GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A block's test binary (`tests/gpu.rs`, `harness = false`). Build it, add tests, then [`Suite::run`].
#[derive(Debug)]
pub struct Suite {
    trials: Vec<Trial>,
    gate: Gate,
}

fn to_failed(r: Result<()>) -> Result<(), Failed> {
    r.map_err(|e| Failed::from(format!("{e:#}")))
}

impl Default for Suite {
    fn default() -> Self {
        Self::new()
    }
}

impl Suite {
    pub fn new() -> Self {
        Suite {
            trials: Vec::new(),
            gate: gate(status(), require_gpu_from_env()),
        }
    }

    /// A CPU-only test of the model.
    pub fn model(
        &mut self,
        name: &str,
        f: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> &mut Self {
        self.trials.push(Trial::test(
            format!("{MODEL}{name}"),
            move || to_failed(f()),
        ));
        self
    }

    /// A test that needs NVRTC but no GPU.
    pub fn compile(
        &mut self,
        name: &str,
        f: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> &mut Self {
        self.trials
            .push(Trial::test(format!("{COMPILE}{name}"), move || {
                to_failed(f())
            }));
        self
    }

    /// For each kernel and each architecture it lists: it compiles, its ptxas report fits its budget, ptxas
    /// warns of nothing and its SASS holds the opcodes it exists to use. A kernel that skips some of
    /// `Arch::REQUIRED` (sm_90a-only kernels, fp8 mma.sync on sm_80) gets one more test, `refuses_other_archs`:
    /// building it for those is refused by name. Nothing is reported as passed for an architecture it was
    /// not built for.
    pub fn kernels(&mut self, specs: &[KernelSpec]) -> &mut Self {
        for spec in specs {
            for &arch in spec.archs {
                let spec = *spec;
                self.compile(&format!("{}::{arch}", spec.name), move || {
                    spec.check_budget(arch).map(|_| ())
                });
            }
            let others: Vec<Arch> = Arch::REQUIRED
                .into_iter()
                .filter(|a| !spec.archs.contains(a))
                .collect();
            if !others.is_empty() {
                let spec = *spec;
                self.compile(&format!("{}::refuses_other_archs", spec.name), move || {
                    for arch in others {
                        match spec.compile(arch) {
                            Ok(_) => anyhow::bail!(
                                "{} was built for {arch}, which it does not list",
                                spec.name
                            ),
                            Err(e) => {
                                let e = format!("{e:#}");
                                anyhow::ensure!(
                                    e.contains("is built only for") && e.contains(arch.name()),
                                    "the refusal for {arch} does not say why: {e}"
                                );
                            }
                        }
                    }
                    Ok(())
                });
            }
        }
        self
    }

    /// A test that runs on the device. Skipped, with the reason printed, where there is none; failed instead
    /// under `LAB_REQUIRE_GPU=1`.
    pub fn gpu(
        &mut self,
        name: &str,
        f: impl FnOnce(&Gpu) -> Result<()> + Send + 'static,
    ) -> &mut Self {
        let g = self.gate.clone();
        let trial = Trial::test(format!("{GPU}{name}"), move || match g {
            Gate::Run => to_failed(Gpu::get().and_then(f)),
            // Reached only when skipped tests are run on purpose (`--include-ignored`): never a silent pass.
            Gate::Skip(why) | Gate::Fail(why) => Err(Failed::from(why)),
        });
        self.trials
            .push(trial.with_ignored_flag(matches!(self.gate, Gate::Skip(_))));
        self
    }

    /// A test on `n` GPUs of this host (devices 0 … n − 1, one a rank). Skipped, with the reason, where the host has
    /// fewer (a one-GPU machine runs the rest of the suite); failed instead when `LAB_REQUIRE_GPUS` asks for at
    /// least `n` and they are not there, or as [`Suite::gpu`] where there is no GPU at all.
    pub fn gpus(
        &mut self,
        n: usize,
        name: &str,
        f: impl FnOnce(&[&'static Gpu]) -> Result<()> + Send + 'static,
    ) -> &mut Self {
        let have = crate::gpu::device_count();
        let required = std::env::var("LAB_REQUIRE_GPUS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let g = match &self.gate {
            Gate::Run if have >= n => Gate::Run,
            Gate::Run if required >= n => Gate::Fail(format!(
                "LAB_REQUIRE_GPUS={required} but this host has {have} GPU(s); the test needs {n}"
            )),
            Gate::Run => Gate::Skip(format!("needs {n} GPUs; this host has {have}")),
            other => other.clone(),
        };
        let skip = matches!(g, Gate::Skip(_));
        let trial = Trial::test(format!("{GPU}{name}"), move || match g {
            Gate::Run => {
                // One multi-GPU test at a time: libtest runs trials on parallel threads, and two tests' NCCL
                // communicators over the same GPUs, each rank's kernels queued behind the other test's, can wait on
                // each other for ever.
                let _alone = MULTI_GPU.lock().unwrap_or_else(|p| p.into_inner());
                to_failed(
                    (0..n)
                        .map(Gpu::device)
                        .collect::<Result<Vec<_>>>()
                        .and_then(|gpus| f(&gpus)),
                )
            }
            Gate::Skip(why) | Gate::Fail(why) => Err(Failed::from(why)),
        });
        self.trials.push(trial.with_ignored_flag(skip));
        self
    }

    /// A GPU test run in a child process of this test binary: for mutants that may kill the CUDA context (an
    /// illegal mbarrier state, a trap), which would otherwise fail every later test of the process. The child
    /// runs `f` alone; this test passes when the child's does, and shows its output either way.
    pub fn gpu_isolated(
        &mut self,
        name: &str,
        f: impl FnOnce(&Gpu) -> Result<()> + Send + 'static,
    ) -> &mut Self {
        let full = format!("{GPU}{name}");
        if std::env::var(ISOLATED).ok().as_deref() == Some(full.as_str()) {
            return self.gpu(name, f);
        }
        self.gpu(name, move |_| {
            let out = std::process::Command::new(std::env::current_exe()?)
                .args(["--exact", &full, "--test-threads", "1", "--nocapture"])
                .env(ISOLATED, &full)
                .output()?;
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            eprint!("{stderr}");
            if out.status.success() && stdout.contains("1 passed") {
                Ok(())
            } else {
                anyhow::bail!(
                    "the isolated run of {full} failed ({}):\n{stdout}",
                    out.status
                )
            }
        })
    }

    /// Runs the suite with libtest's command line, and exits.
    pub fn run(self) -> ! {
        let args = Arguments::from_args();
        if !args.list {
            match &self.gate {
                Gate::Run => {
                    if let crate::gpu::GpuStatus::Present { name, major, minor } = status() {
                        eprintln!("lab: GPU tests run on {name} (sm_{major}{minor})");
                    }
                }
                Gate::Skip(why) => eprintln!("lab: GPU tests SKIPPED: {why}"),
                Gate::Fail(why) => eprintln!("lab: GPU tests will FAIL: {why}"),
            }
        }
        libtest_mimic::run(&args, self.trials).exit()
    }
}

/// Adds `compile::sass_histogram::<kernel>` to a `Suite` for each kernel: its SASS opcode table on every
/// architecture it is built for (`lab::sass::table`), as an insta snapshot under the calling crate's
/// `tests/snapshots/sass__<kernel>.snap`. A macro, so that insta files the snapshot beside the caller's
/// tests, and so that the caller's own insta is used.
#[macro_export]
macro_rules! sass_snapshots {
    ($suite:expr, $specs:expr) => {
        for spec in $specs.iter().copied() {
            let spec: $crate::KernelSpec = spec;
            $suite.compile(&format!("sass_histogram::{}", spec.name), move || {
                let table = $crate::sass::table(&spec)?;
                insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false, omit_expression => true }, {
                    insta::assert_snapshot!(format!("sass__{}", spec.name), table);
                });
                Ok(())
            });
        }
    };
}
