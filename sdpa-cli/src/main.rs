// The `sdpa` command: run a stage on a safetensors file, time one on generated inputs, or list the stages.
use std::process::ExitCode;

use clap::Parser;
use sdpa_cli::{Args, main as sdpa};

fn main() -> ExitCode {
    match sdpa(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdpa: {e:#}");
            ExitCode::from(2)
        }
    }
}
