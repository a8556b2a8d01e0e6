// sdpa-cli's test binary: the `sdpa` command as a user runs it, end to end on the GPU.
use anyhow::{Result, ensure};
use clap::Parser;
use fixtures::{Raw, Shape, reference_unquantized};
use lab::Suite;
use lab::numerics::{Tolerance, error_stats};
use sdpa_cli::Args;

fn main() {
    let mut t = Suite::new();
    t.gpu("sdpa_run_end_to_end_with_remedies", |_gpu| -> Result<()> {
        // The CLI as a user runs it: an F32 file, quantized on the GPU with both remedies, every row checked, O
        // written; the written O must be the unquantized problem's within the FP8 error.
        use safetensors::tensor::{Dtype, TensorView};
        let shape = Shape::cross(1, 2, 150, 260, 128);
        let raw = Raw::generate(shape, 5, fixtures::Dist::KBias);
        let dir = std::env::temp_dir().join(format!("sdpa-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (input, output) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
        let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let (qb, kb, vb) = (bytes(&raw.q), bytes(&raw.k), bytes(&raw.v));
        let dims = |s: usize| vec![shape.b, shape.h, s, shape.d];
        let views = [
            ("q", TensorView::new(Dtype::F32, dims(shape.sq), &qb)?),
            ("k", TensorView::new(Dtype::F32, dims(shape.sk), &kb)?),
            ("v", TensorView::new(Dtype::F32, dims(shape.sk), &vb)?),
        ];
        std::fs::write(&input, safetensors::serialize(views, None)?)?;
        let args = Args::try_parse_from([
            "sdpa", "run", "--stage", "stage5", "--check", "full", "--smooth-k", "--rotate", "hadamard",
            "--out-dtype", "f32", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap(),
        ])?;
        sdpa_cli::execute(args)?;
        let out = std::fs::read(&output)?;
        let st = safetensors::SafeTensors::deserialize(&out)?;
        let f32s = |name: &str| -> Result<Vec<f32>> {
            Ok(st.tensor(name)?.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        };
        let (o, lse) = (f32s("o")?, f32s("lse")?);
        std::fs::remove_dir_all(&dir)?;
        let r = reference_unquantized(&raw, 1.0 / (shape.d as f32).sqrt());
        let e = error_stats(&o, &r.o, Tolerance { atol: 0.0, rtol: 0.0 });
        let lse_err = lse.iter().zip(&r.lse).map(|(&a, &b)| (f64::from(a) - b).abs()).fold(0.0, f64::max);
        ensure!(e.rel_l2 < 0.1 && lse_err < 0.1, "sdpa run's O rel-L2 {:.3e}, LSE max abs {lse_err:.3e}", e.rel_l2);
        eprintln!("sdpa run --smooth-k --rotate hadamard on k-bias inputs: written O {e}; LSE max abs {lse_err:.3e}");
        Ok(())
    });
    t.model("a_file_that_is_not_safetensors_is_named", || {
        let dir = std::env::temp_dir().join(format!("sdpa-notst-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let input = dir.join("notes.txt");
        std::fs::write(&input, "these are not tensors, only words of a text file")?;
        let args = Args::try_parse_from([
            "sdpa",
            "run",
            "--stage",
            "stage7",
            "--input",
            input.to_str().unwrap(),
        ])?;
        let e = format!("{:#}", sdpa_cli::execute(args).unwrap_err());
        std::fs::remove_dir_all(&dir)?;
        ensure!(
            e.contains("notes.txt") && e.contains("not a safetensors file"),
            "{e}"
        );
        Ok(())
    });
    t.model("checks_that_need_no_gpu_come_before_it", || {
        // The same answer with or without a GPU: what is wrong with the request, not "needs a CUDA GPU".
        for (args, want) in [
            (
                &[
                    "bench",
                    "--stage",
                    "stage5",
                    "--shape",
                    "1,2,64,64",
                    "--causal",
                ][..],
                "stage5 has no causal masking",
            ),
            (
                &[
                    "bench",
                    "--stage",
                    "stage6",
                    "--shape",
                    "1,4,64,64",
                    "--kv-heads",
                    "2",
                ][..],
                "stage6 has no grouped-query",
            ),
            (
                &["bench", "--stage", "stage7", "--shape", "1,2,64,96"][..],
                "D = 96 is not supported",
            ),
            (
                &["trace", "--shape", "1,2,64,80"][..],
                "D = 80 is not supported",
            ),
        ] {
            let mut v = vec!["sdpa"];
            v.extend_from_slice(args);
            let e = format!(
                "{:#}",
                sdpa_cli::execute(Args::try_parse_from(v)?).unwrap_err()
            );
            ensure!(e.contains(want) && !e.contains("CUDA GPU"), "{args:?}: {e}");
        }
        Ok(())
    });
    t.model("without_a_gpu_the_reason_is_kept", || {
        if !matches!(lab::status(), lab::GpuStatus::Absent(_)) {
            eprintln!("a GPU is present: nothing to check");
            return Ok(());
        }
        let v = ["sdpa", "bench", "--stage", "stage7", "--shape", "1,2,64,64"];
        let e = format!(
            "{:#}",
            sdpa_cli::execute(Args::try_parse_from(v)?).unwrap_err()
        );
        let lab::GpuStatus::Absent(why) = lab::status() else {
            unreachable!()
        };
        ensure!(
            e.starts_with("bench needs a CUDA GPU: no usable GPU: ") && e.contains(why.as_str()),
            "{e}"
        );
        Ok(())
    });
    t.run()
}
