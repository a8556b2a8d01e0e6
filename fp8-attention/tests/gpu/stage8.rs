// The op on stage 8: one launch a call (V read as the caller has it), stage 7's bits, inputs read in place at any strides.
use anyhow::ensure;
use fixtures::{OutDtype, Raw, Shape, quantize_per_head};
use fp8_attention::{Attention, Config, Fp8, Stage, Strides};
use lab::Suite;

use crate::{forward, inputs, lab_path, same_bits};

/// [B, H, S, D] (row-major) as [B, S, H, D].
fn bshd(a: &[u8], b: usize, h: usize, s: usize, d: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let at = ((bi * h + hi) * s + si) * d;
                out.extend_from_slice(&a[at..at + d]);
            }
        }
    }
    out
}

pub fn add(t: &mut Suite) {
    let cases: [(&str, Shape, usize, bool, OutDtype); 3] = [
        (
            "mission_1x8x512x64",
            Shape::new(1, 8, 512, 64),
            8,
            false,
            OutDtype::Bf16,
        ),
        (
            "causal_gqa_2x8q2kv_300x700x128",
            Shape::cross(2, 8, 300, 700, 128),
            2,
            true,
            OutDtype::F16,
        ),
        (
            "split_tail_2x16x1024x128",
            Shape::new(2, 16, 1024, 128),
            16,
            false,
            OutDtype::Bf16,
        ),
    ];
    for (name, shape, hkv, causal, out) in cases {
        t.gpu(&format!("stage8::{name}::bits_of_stage7"), move |gpu| {
            let s = shape.with_kv_heads(hkv)?.with_causal(causal);
            let qz = quantize_per_head(&Raw::random(s, 19, 1.0));
            let st = gpu.ctx.new_stream()?;
            let x = inputs(&st, &qz)?;
            let cfg = Config {
                causal,
                out_dtype: out,
                softmax_scale: None,
            };
            let mut op = Attention::with_stage(gpu, cfg, Stage::S8)?;
            ensure!(op.stage() == Stage::S8, "the op runs {}", op.stage().name());
            let got = forward(&mut op, gpu, &st, s, &x)?.to_host(&st)?;
            ensure!(
                same_bits(&got, &lab_path(gpu, &qz, out)?),
                "{name}: stage 8's op differs from stage 7's path"
            );
            // [B, S, H, D] copies of the same codes, read in place through their strides.
            let sw = |a: &[u8], h: usize, rows: usize| bshd(a, s.b, h, rows, s.d);
            let y = inputs(
                &st,
                &fixtures::Quantized {
                    q: sw(&qz.q, s.h, s.sq),
                    k: sw(&qz.k, s.hkv, s.sk),
                    v: sw(&qz.v, s.hkv, s.sk),
                    ..qz.clone()
                },
            )?;
            let f = |codes, scales| Fp8 { codes, scales };
            let mut o = op.alloc_output(gpu, &st, &s)?;
            op.forward_strided(
                gpu,
                &st,
                s,
                f(&y.q, &y.qs),
                f(&y.k, &y.ks),
                f(&y.v, &y.vs),
                Strides::bshd(&s),
                &mut o,
            )?;
            ensure!(
                same_bits(&o.to_host(&st)?, &got),
                "{name}: [B, S, H, D] inputs give other bits"
            );
            eprintln!(
                "{name}: stage 8's op gives stage 7's bits, from [B, H, S, D] and from [B, S, H, D]"
            );
            Ok(())
        });
    }
    t.gpu("stage8::strided_inputs_refused_by_name", |gpu| {
        let s = Shape::new(1, 2, 64, 64);
        let qz = quantize_per_head(&Raw::random(s, 23, 1.0));
        let st = gpu.stream.clone();
        let x = inputs(&st, &qz)?;
        let f = |codes, scales| Fp8 { codes, scales };
        let mut seven = Attention::new(gpu, Config::default())?;
        let mut o = seven.alloc_output(gpu, &st, &s)?;
        let e = seven
            .forward_strided(
                gpu,
                &st,
                s,
                f(&x.q, &x.qs),
                f(&x.k, &x.ks),
                f(&x.v, &x.vs),
                Strides::bshd(&s),
                &mut o,
            )
            .unwrap_err()
            .to_string();
        ensure!(
            e.contains("read in place by stage8") && e.contains("runs stage7"),
            "{e}"
        );
        let mut eight = Attention::with_stage(gpu, Config::default(), Stage::S8)?;
        let wide = Strides {
            k: [2 * 64 + 16, 64, 64 * 2 * 64],
            ..Strides::bshd(&s)
        };
        let e = eight
            .forward_strided(
                gpu,
                &st,
                s,
                f(&x.q, &x.qs),
                f(&x.k, &x.ks),
                f(&x.v, &x.vs),
                wide,
                &mut o,
            )
            .unwrap_err()
            .to_string();
        // S stride 144: the view's last element is 64 + 63·144 + 64 = 9200 elements in, past the 8192 k holds.
        ensure!(
            e.contains("`k` holds 8192 elements") && e.contains("needs 9200"),
            "{e}"
        );
        let odd = Strides {
            q: [2 * 64, 72, 64 * 2 * 64],
            ..Strides::bshd(&s)
        };
        let e = eight
            .forward_strided(
                gpu,
                &st,
                s,
                f(&x.q, &x.qs),
                f(&x.k, &x.ks),
                f(&x.v, &x.vs),
                odd,
                &mut o,
            )
            .unwrap_err()
            .to_string();
        ensure!(e.contains("`q`: its stride of H is 72"), "{e}");
        let big = Shape::new(1, 2, 64, 256);
        let e = forward(
            &mut eight,
            gpu,
            &st,
            big,
            &inputs(&st, &quantize_per_head(&Raw::random(big, 1, 1.0)))?,
        )
        .unwrap_err()
        .to_string();
        ensure!(e.contains("stage8 takes D = [64, 128]"), "{e}");
        Ok(())
    });
}
