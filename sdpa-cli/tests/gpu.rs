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
    t.gpu("sdpa_run_on_packed_and_paged_files", |_gpu| -> Result<()> {
        // Two sequences of different lengths (GQA 4:2, D = 64, causal with more keys than queries), written once as
        // a packed file and once as a paged one (pages of 16 rows in a shuffled order): both must write the same
        // bits, each sequence's rows within twice the stage's emulated error of its f64 reference alone.
        use safetensors::tensor::{Dtype, TensorView};
        let (h, hkv, d, page) = (4usize, 2usize, 64usize, 16usize);
        let seqs: Vec<fixtures::Quantized> = [(37usize, 90usize, 3u64), (70, 70, 4)]
            .iter()
            .map(|&(sq, sk, seed)| {
                let shape = Shape::cross(1, h, sq, sk, d)
                    .with_kv_heads(hkv)?
                    .with_causal(true);
                Ok(fixtures::quantize_per_head(&Raw::random(shape, seed, 1.0)))
            })
            .collect::<Result<_>>()?;
        let (mut q, mut k, mut v, mut cu_q, mut cu_k) =
            (vec![], vec![], vec![], vec![0i32], vec![0i32]);
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        // Token-major rows [tokens, heads, D] from a [1, heads, S, D] sequence.
        let tokens = |x: &[u8], heads: usize, s: usize| -> Vec<u8> {
            (0..s)
                .flat_map(|r| {
                    (0..heads)
                        .flat_map(move |hi| x[(hi * s + r) * d..(hi * s + r + 1) * d].to_vec())
                })
                .collect()
        };
        for z in &seqs {
            let (sq, sk) = (z.shape.sq, z.shape.sk);
            q.extend(tokens(&z.q, h, sq));
            k.extend(tokens(&z.k, hkv, sk));
            v.extend(tokens(&z.v, hkv, sk));
            cu_q.push(cu_q.last().unwrap() + sq as i32);
            cu_k.push(cu_k.last().unwrap() + sk as i32);
            qs.extend(&z.q_scale);
            ks.extend(&z.k_scale);
            vs.extend(&z.v_scale);
        }
        // The paged cache: sequence i's page j is page `order[n]` for its n-th page overall.
        let pages_of = |sk: usize| sk.div_ceil(page);
        let max_pages = seqs.iter().map(|z| pages_of(z.shape.sk)).max().unwrap();
        let num_pages: usize = seqs.iter().map(|z| pages_of(z.shape.sk)).sum::<usize>() + 1;
        let order: Vec<usize> = (0..num_pages).map(|n| (n * 5 + 2) % num_pages).collect();
        let row = page * hkv * d;
        let (mut kc, mut vc) = (vec![0u8; num_pages * row], vec![0u8; num_pages * row]);
        let mut table = vec![0i32; seqs.len() * max_pages];
        let mut n = 0;
        for (i, z) in seqs.iter().enumerate() {
            let (k0, sk) = (cu_k[i] as usize, z.shape.sk);
            for j in 0..pages_of(sk) {
                let (p, rows) = (order[n], page.min(sk - j * page));
                table[i * max_pages + j] = p as i32;
                let src = (k0 + j * page) * hkv * d..(k0 + j * page + rows) * hkv * d;
                kc[p * row..p * row + src.len()].copy_from_slice(&k[src.clone()]);
                vc[p * row..p * row + src.len()].copy_from_slice(&v[src]);
                n += 1;
            }
        }
        let lens: Vec<i32> = seqs.iter().map(|z| z.shape.sk as i32).collect();
        let b32 = |x: &[i32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let f32b = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
        let (tq, tk, bsz) = (cu_q[2] as usize, cu_k[2] as usize, seqs.len());
        let (cuqb, cukb, qsb, ksb, vsb) = (b32(&cu_q), b32(&cu_k), f32b(&qs), f32b(&ks), f32b(&vs));
        let (tb, lb) = (b32(&table), b32(&lens));
        let common = |extra: Vec<(&'static str, TensorView<'_>)>| -> Result<Vec<u8>> {
            let mut views = vec![
                ("q", TensorView::new(Dtype::F8_E4M3, vec![tq, h, d], &q)?),
                ("q_scale", TensorView::new(Dtype::F32, vec![bsz * h], &qsb)?),
                (
                    "k_scale",
                    TensorView::new(Dtype::F32, vec![bsz * hkv], &ksb)?,
                ),
                (
                    "v_scale",
                    TensorView::new(Dtype::F32, vec![bsz * hkv], &vsb)?,
                ),
                (
                    "cu_seqlens_q",
                    TensorView::new(Dtype::I32, vec![bsz + 1], &cuqb)?,
                ),
            ];
            views.extend(extra);
            Ok(safetensors::serialize(views, None)?)
        };
        let packed = common(vec![
            ("k", TensorView::new(Dtype::F8_E4M3, vec![tk, hkv, d], &k)?),
            ("v", TensorView::new(Dtype::F8_E4M3, vec![tk, hkv, d], &v)?),
            (
                "cu_seqlens_k",
                TensorView::new(Dtype::I32, vec![bsz + 1], &cukb)?,
            ),
        ])?;
        let paged = common(vec![
            (
                "k_cache",
                TensorView::new(Dtype::F8_E4M3, vec![num_pages, page, hkv, d], &kc)?,
            ),
            (
                "v_cache",
                TensorView::new(Dtype::F8_E4M3, vec![num_pages, page, hkv, d], &vc)?,
            ),
            (
                "block_table",
                TensorView::new(Dtype::I32, vec![bsz, max_pages], &tb)?,
            ),
            ("seq_lens", TensorView::new(Dtype::I32, vec![bsz], &lb)?),
        ])?;
        let dir = std::env::temp_dir().join(format!("sdpa-packed-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut outs = vec![];
        for (name, bytes) in [("packed", &packed), ("paged", &paged)] {
            let (input, output) = (
                dir.join(format!("{name}.safetensors")),
                dir.join(format!("{name}-o.safetensors")),
            );
            std::fs::write(&input, bytes)?;
            let args = Args::try_parse_from([
                "sdpa",
                "run",
                "--stage",
                "stage8",
                "--causal",
                "--out-dtype",
                "f32",
                "--input",
                input.to_str().unwrap(),
                "--output",
                output.to_str().unwrap(),
            ])?;
            sdpa_cli::execute(args)?;
            outs.push(std::fs::read(&output)?);
        }
        std::fs::remove_dir_all(&dir)?;
        ensure!(
            outs[0] == outs[1],
            "the paged file's O and LSE differ from the packed file's"
        );
        let st = safetensors::SafeTensors::deserialize(&outs[0])?;
        let o: Vec<f32> = st
            .tensor("o")?
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        for (i, z) in seqs.iter().enumerate() {
            let r = fixtures::reference(z);
            let (sq, t0) = (z.shape.sq, cu_q[i] as usize);
            let got: Vec<f32> = (0..h)
                .flat_map(|hi| (0..sq).map(move |row| (t0 + row, hi)))
                .flat_map(|(t, hi)| o[(t * h + hi) * d..(t * h + hi + 1) * d].to_vec())
                .collect();
            // The lab's rule: within twice the error of the stage's emulation (f32 with E4M3 P, its key blocks).
            let stage = fp8_attention::Stage::S8;
            ensure!(
                stage.fp8_p(),
                "stage 8's P is E4M3: its emulation is emulate_fp8p"
            );
            let emu = fixtures::emulate_fp8p(
                z,
                stage.bc(d),
                composed::FP8_P_OFFSET,
                fixtures::OutDtype::F32,
            );
            let e_emu = emu
                .o
                .iter()
                .zip(&r.o)
                .map(|(&a, &b)| (f64::from(a) - b).abs())
                .fold(0.0, f64::max);
            let e = error_stats(
                &got,
                &r.o,
                Tolerance {
                    atol: 2.0 * e_emu + 1e-6,
                    rtol: 0.0,
                },
            );
            ensure!(
                e.nan + e.inf == 0 && e.max_abs <= 2.0 * e_emu + 1e-6,
                "sequence {i}: O {e} (emulation max abs {e_emu:.3e})"
            );
            eprintln!("sdpa run on a packed and a paged file, sequence {i} ({sq} queries): {e}");
        }
        Ok(())
    });
    t.model(
        "a_packed_file_names_what_does_not_apply_before_the_gpu",
        || {
            // A packed file asks for stage 8 and its own codes; its faults are named with or without a GPU.
            use safetensors::tensor::{Dtype, TensorView};
            let dir = std::env::temp_dir().join(format!("sdpa-packed-args-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let input = dir.join("batch.safetensors");
            let (codes, one, cu) = (vec![56u8; 4 * 2 * 64], 0.01f32.to_le_bytes(), [0i32, 1, 4]);
            let cu: Vec<u8> = cu.iter().flat_map(|v| v.to_le_bytes()).collect();
            let three = [one, one, one].concat();
            let views = [
                (
                    "q",
                    TensorView::new(Dtype::F8_E4M3, vec![4, 2, 64], &codes)?,
                ),
                (
                    "k",
                    TensorView::new(Dtype::F8_E4M3, vec![4, 2, 64], &codes)?,
                ),
                (
                    "v",
                    TensorView::new(Dtype::F8_E4M3, vec![4, 2, 64], &codes)?,
                ),
                ("q_scale", TensorView::new(Dtype::F32, vec![1], &one)?),
                ("k_scale", TensorView::new(Dtype::F32, vec![1], &one)?),
                ("v_scale", TensorView::new(Dtype::F32, vec![3], &three)?),
                ("cu_seqlens_q", TensorView::new(Dtype::I32, vec![3], &cu)?),
                ("cu_seqlens_k", TensorView::new(Dtype::I32, vec![3], &cu)?),
            ];
            std::fs::write(&input, safetensors::serialize(views, None)?)?;
            let path = input.to_str().unwrap();
            let mut errors = vec![];
            for (args, want) in [
                (
                    &["--stage", "stage7"][..],
                    "packed and paged batches run on stage8, not stage7",
                ),
                (&["--stage", "stage8", "--json"][..], "--json do not apply"),
                (
                    &["--stage", "stage8", "--smooth-k"][..],
                    "--smooth-k/--rotate",
                ),
                (
                    &["--stage", "stage8"][..],
                    "`v_scale` has 3 values: expected 1 (per tensor) or B·H = 4",
                ),
            ] {
                let mut v = vec!["sdpa", "run", "--input", path];
                v.extend_from_slice(args);
                let e = format!(
                    "{:#}",
                    sdpa_cli::execute(Args::try_parse_from(v)?).unwrap_err()
                );
                errors.push((args, want, e));
            }
            std::fs::remove_dir_all(&dir)?;
            for (args, want, e) in errors {
                ensure!(e.contains(want) && !e.contains("CUDA GPU"), "{args:?}: {e}");
            }
            Ok(())
        },
    );
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
