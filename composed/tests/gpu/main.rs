// composed's test binary: every stage against the f64 reference over the correctness matrix, by capability.
mod cases;
mod checks;
mod matrix;
mod models;
mod prep;
mod programmatic;
mod split_kv;
mod stage7;
mod stage8;
mod tables;
mod varlen;
mod views;
mod window;

/// What every test module uses: the crates' items and the shared cases and checks.
mod prelude {
    pub use std::collections::HashMap;
    pub use std::sync::{Arc, Mutex, OnceLock};

    pub use crate::cases::*;
    pub use crate::checks::*;
    pub use anyhow::{Context, Result, ensure};
    pub use composed::{OnDevice, OutDtype, Stage, bc};
    pub use fixtures::{
        Attention, Quantized, Raw, Shape, emulate, emulate_fp8p, quantize_per_head,
        quantize_per_tensor, reference, reference_unquantized,
    };
    pub use lab::numerics::{Tolerance, error_stats};
    pub use lab::{Gpu, Suite};
}

use lab::Suite;

fn main() {
    let mut t = Suite::new();
    t.kernels(composed::KERNELS);
    t.kernels(composed::PREP_KERNELS);
    lab::sass_snapshots!(t, composed::KERNELS);
    models::add(&mut t);
    prep::add(&mut t);
    matrix::add(&mut t);
    stage7::add(&mut t);
    stage8::add(&mut t);
    varlen::add(&mut t);
    views::add(&mut t);
    split_kv::add(&mut t);
    window::add(&mut t);
    programmatic::add(&mut t);
    tables::add(&mut t);
    t.run()
}
