//! The lab's task runner: a thin dispatcher, one module per task.
mod ab;
mod accuracy;
mod build;
mod ci;
mod gpu_bundle;
mod ladder;
mod layouts;
mod profile;
mod ptxas;
mod registry;
mod runner;
mod sanitize;
mod test_blocks;
#[cfg(test)]
mod tidy;
#[cfg(test)]
mod tidy_mutants;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    about = "Build, test, resource-check and bundle the lab's kernels"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    /// The main job: every block's model, compile and GPU tests, ending with a table per block.
    TestBlocks {
        /// Build the tests in release mode.
        #[arg(long)]
        release: bool,
    },
    /// Compile every kernel for sm_80, sm_89 and sm_90 and print the ptxas resource table.
    Ptxas {
        /// Architectures to compile for (repeatable): sm_80, sm_89, sm_90, sm_90a.
        #[arg(long = "arch")]
        archs: Vec<String>,
        /// Fail if any kernel breaks its committed budget.
        #[arg(long)]
        check: bool,
        /// Only the kernels whose name contains this text (repeatable; default every kernel).
        #[arg(long = "kernel")]
        kernels: Vec<String>,
    },
    /// Pack every test binary and a runner into DIR (default .bundle), to run where there is no Rust.
    GpuBundle {
        dir: Option<PathBuf>,
        /// Only these packages' tests (repeatable; default: every package's). With attempts, `--only composed`
        /// keeps the bundle under the device tool's limit.
        #[arg(long = "only", value_name = "PACKAGE")]
        only: Vec<String>,
        /// A git revision (a branch with a change to measure) built beside the tree: its `sdpa` and the GPU
        /// tests of composed and of each block it changes go into DIR/attempts/NAME/ (NAME: the revision, '/' as
        /// '-'), for `xtask ab` and its own tests in the same device call (repeatable).
        #[arg(long = "attempt", value_name = "REV")]
        attempts: Vec<String>,
    },
    /// What CI runs: fmt, clippy, all tests with snapshots in check mode, and `ptxas --check`.
    Ci,
    /// Time every stage and PyTorch's SDPA on the GPU machine: Markdown table and SVG chart into OUT.
    Ladder {
        #[arg(long, default_value = "target/ladder")]
        out: PathBuf,
        /// Timed launches per (stage, shape).
        #[arg(long, default_value_t = 200)]
        iters: usize,
        /// Only these stages (comma-separated names, e.g. stage7,stage8); PyTorch's and cuDNN's rows always.
        #[arg(long, value_delimiter = ',')]
        stages: Vec<String>,
    },
    /// On the GPU machine: the FP8 accuracy study (input families × quantization schemes, with cuDNN FP8 and
    /// PyTorch fp16 on the same inputs): accuracy.md and accuracy.json into OUT.
    Accuracy {
        #[arg(long, default_value = "target/accuracy")]
        out: PathBuf,
        /// Where the inputs are written for the Python references (removed at the end).
        #[arg(long, default_value = "/tmp/lab-accuracy")]
        work: PathBuf,
        /// Shapes B,H,S,D (repeatable).
        #[arg(long = "shape", value_parser = fixtures::Shape::parse, default_values = ["2,8,1024,128", "2,8,1024,64"])]
        shapes: Vec<fixtures::Shape>,
        /// Seeds a (shape, family): single-seed differences of a few percent are noise.
        #[arg(long, default_value_t = 3)]
        seeds: u64,
    },
    /// On the GPU machine: `sdpa` binaries (a change and what it changes, built here) timed against each other
    /// in alternating processes, every other round in the reverse order: ab.md (each round's p50 against the first
    /// binary's) and ab.txt into OUT.
    Ab {
        /// NAME=PATH of an `sdpa` binary (repeatable, at least two; the first is the reference).
        #[arg(long = "bin", value_name = "NAME=PATH", value_parser = ab::parse_bin, required = true)]
        bins: Vec<ab::Bin>,
        /// `sdpa bench` arguments after the stage, e.g. "--shape 4,16,4096,128 --causal" (repeatable); a packed batch's
        /// case ("--shape … --varlen 65536") is read by its `varlen on STAGE` line (the call's median).
        #[arg(
            long = "case",
            value_name = "ARGS",
            required = true,
            allow_hyphen_values = true
        )]
        cases: Vec<String>,
        #[arg(long, default_value = "stage7")]
        stage: String,
        #[arg(long, default_value_t = 2)]
        rounds: usize,
        #[arg(long, default_value = "target/ab")]
        out: PathBuf,
    },
    /// On the GPU machine: one stage at one shape under Nsight Compute (ncu), summarised: throughputs,
    /// occupancy, the tensor pipe, the top warp stalls.
    Profile {
        #[arg(long)]
        stage: String,
        /// B,H,Sq,Sk,D (or B,H,S,D)
        #[arg(long)]
        shape: String,
        /// Profile a reference at the same shape too and print it beside the stage: `cudnn-fp8` (cuDNN's FP8
        /// SDPA; Sq = Sk; needs the nvidia-cudnn-frontend wheel on PYTHONPATH).
        #[arg(long)]
        against: Option<String>,
    },
    /// Print every fragment layout the lab knows (sm_90 entries are the ones the device probes check).
    Layouts {
        /// One JSON array of {arch, op, operand, dtype, source, entries: [[lane, reg, row, col], ...]}.
        #[arg(long)]
        json: bool,
        /// Write one SVG picture per layout into DIR.
        #[arg(long, value_name = "DIR")]
        svg: Option<PathBuf>,
    },
    /// Print one kernel's SASS (nvdisasm), to read what a stage's loop really issues.
    Sass {
        /// The kernel's name, as in `ptxas`'s table (e.g. stage5_d128).
        kernel: String,
        /// Architecture to build for (default: the kernel's first).
        #[arg(long)]
        arch: Option<String>,
        /// Decode each instruction's control code (stall cycles, yield, dependency barriers) and end with the
        /// stall cycles per opcode: where a warp's fixed-latency waits (ncu's `wait`) come from.
        #[arg(long)]
        control: bool,
        /// With --control: summarise only instructions at addresses START..END (hex, as the listing prints them).
        #[arg(long, value_name = "START..END", requires = "control")]
        range: Option<String>,
        /// Print the hot loop's schedule instead: one mnemonic a line (registers left out) after a line with its
        /// size, stall cycles and fingerprint. Saved from two builds and diffed, it tells whether a change also
        /// moved ptxas's schedule of the loop (a new schedule is worth ±1–3% at stage 7: docs/decisions.md, "Six unread `Params` fields").
        #[arg(long = "loop", conflicts_with = "control")]
        hot_loop: bool,
    },
    /// Find (or install) NVRTC and the CUDA headers, and say which ones the lab uses.
    Toolchain,
    /// Run a bundle's tests (what the bundle's `run` script calls on the GPU machine).
    #[command(hide = true)]
    RunBundle { bundle: PathBuf, out: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::TestBlocks { release } => test_blocks::run(release, &[]),
        Task::Ptxas {
            archs,
            check,
            kernels,
        } => ptxas::run(&archs, check, &kernels),
        Task::GpuBundle {
            dir,
            only,
            attempts,
        } => gpu_bundle::build(dir, &only, &attempts).map(|()| true),
        Task::Ci => ci::run(),
        Task::Ladder { out, iters, stages } => stages
            .iter()
            .map(|s| composed::Stage::parse(s))
            .collect::<anyhow::Result<Vec<_>>>()
            .and_then(|only| ladder::run(&out, iters, &only)),
        Task::Accuracy {
            out,
            work,
            shapes,
            seeds,
        } => accuracy::run(&out, &work, &shapes, seeds),
        Task::Ab {
            bins,
            cases,
            stage,
            rounds,
            out,
        } => ab::run(&bins, &cases, &stage, rounds, &out),
        Task::Profile {
            stage,
            shape,
            against,
        } => profile::run(&stage, &shape, against.as_deref()),
        Task::Layouts { json, svg } => layouts::run(json, svg.as_deref()),
        Task::Sass {
            kernel,
            arch,
            control,
            range,
            hot_loop,
        } => ptxas::sass(
            &kernel,
            arch.as_deref(),
            control,
            range.as_deref(),
            hot_loop,
        ),
        Task::Toolchain => lab::toolchain().map(|tc| {
            println!(
                "CUDA headers: {}\nNVRTC: {}\nfrom: {}",
                tc.include.display(),
                tc.nvrtc
                    .as_ref()
                    .map_or("found by the system loader".into(), |p| p
                        .display()
                        .to_string()),
                tc.origin
            );
            println!("GPU: {}", build::device_words());
            true
        }),
        Task::RunBundle { bundle, out } => gpu_bundle::run(&bundle, &out),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
