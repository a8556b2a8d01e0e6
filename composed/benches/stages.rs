// Criterion benches of every stage at the mission shape (1, 8, 512, 64): device time of CUDA-graph replays.
use composed::Stage;
use composed::bench::{input_sets, total_time};
use criterion::{Criterion, criterion_group, criterion_main};
use fixtures::Shape;

fn stages(c: &mut Criterion) {
    let gpu = match lab::Gpu::get() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("stages bench skipped: {e}");
            return;
        }
    };
    let shape = Shape::new(1, 8, 512, 64);
    let mut sets = input_sets(gpu, shape, 3).expect("uploading the inputs");
    let mut g = c.benchmark_group("sdpa_1x8x512x64");
    for stage in Stage::ALL {
        g.bench_function(stage.name(), |b| {
            b.iter_custom(|iters| total_time(gpu, stage, &mut sets, iters).expect("timing"))
        });
    }
    g.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
