// The `sdpa` command's arguments: subcommands, flags, their help and how each value is parsed.
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, Subcommand, ValueEnum};
use composed::Stage;
use fixtures::{Dist, Granularity, OutDtype, Rotate, Scheme, Shape};

#[derive(Parser, Debug)]
#[command(
    name = "sdpa",
    about = "The lab's fused FP8 SDPA forward, stage by stage"
)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// A serving mode `sdpa bench --mode` times on stage 8's packed kernel (varlen.rs's `serving_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A packed prefill batch of --tokens tokens, sequences of 100 to the shape's S (Sq = Sk each).
    Varlen,
    /// B sequences of the shape's Sq ≤ 16 new tokens over Sk keys each (--shape B,H,Sq,Sk,D), from packed keys and,
    /// with --page, a paged cache; bytes moved a second against a device copy's.
    Decode,
    /// B sequences of Sq new tokens over Sk keys each (--shape B,H,Sq,Sk,D; the first Sk − Sq cached) from a paged
    /// cache of --page rows, against the same keys packed.
    Paged,
}

/// How much of O `sdpa run` checks against the f64 reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Check {
    /// Every row (the reference costs Sq·Sk·D multiply-adds a head on the CPU).
    Full,
    /// A seeded sample of rows per head (--rows-per-head), always the first and the last.
    Sample,
    /// No reference: time and write the outputs only.
    None,
}

/// How real-valued inputs become E4M3 (on the device): `--scales`, `--smooth-k`, `--rotate`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct SchemeArgs {
    /// One scale per head or one per tensor (amax / 448).
    #[arg(long, value_enum, default_value_t = Scales::PerHead)]
    pub scales: Scales,
    /// Subtract K's per-channel mean over keys before quantizing (the softmax is unchanged; the LSE is
    /// corrected back). Off by default: docs/accuracy.md says where it helps.
    #[arg(long)]
    pub smooth_k: bool,
    /// Rotate Q and K along D by the same orthonormal Hadamard matrix before quantizing (hadamard-signs: with
    /// seeded sign flips). D must be a power of two. Off by default: docs/accuracy.md says where it helps.
    #[arg(long, default_value = "none", value_parser = Rotate::from_str)]
    pub rotate: Rotate,
}

/// `--scales` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scales {
    PerHead,
    PerTensor,
}

impl SchemeArgs {
    pub fn scheme(&self) -> Scheme {
        Scheme {
            per: match self.scales {
                Scales::PerHead => Granularity::PerHead,
                Scales::PerTensor => Granularity::PerTensor,
            },
            smooth_k: self.smooth_k,
            rotate: self.rotate,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run one stage: q, k, v in F16/BF16/F32 (quantized on the GPU), or F8_E4M3 with q_scale, k_scale, v_scale.
    Run {
        /// Which stage runs: stage1, stage2, stage3a, stage3b, stage4 (sm_80 and later), stage5, stage6, stage7,
        /// stage8 (sm_90). stage7 is the fastest measured past 2,048 keys and at D = 256, stage8 (V transposed in
        /// the kernel: one launch) up to them; both take --causal and grouped-query heads; `sdpa stages` lists what
        /// each needs.
        #[arg(long, value_parser = Stage::parse)]
        stage: Stage,
        /// A safetensors file holding `q` [B, H, Sq, D] and `k`, `v` [B, Hkv, Sk, D] (Hkv dividing H; D = 64 or 128, or 256 on stage7):
        /// F16, BF16 or F32, quantized on the GPU by --scales / --smooth-k / --rotate; or all three F8_E4M3 with
        /// F32 `q_scale`, `k_scale`, `v_scale` (one per (batch, head), or one for the tensor).
        #[arg(long)]
        input: PathBuf,
        /// Write `o` (in --out-dtype) and `lse` (F32) here.
        #[arg(long)]
        output: Option<PathBuf>,
        /// Rows of O checked against the f64 reference.
        #[arg(long, value_enum, default_value_t = Check::Sample)]
        check: Check,
        /// Rows a head that `--check sample` checks.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
        rows_per_head: u32,
        /// What the stage writes O as: f16, bf16 or f32.
        #[arg(long, default_value_t = OutDtype::F16, value_parser = OutDtype::from_str)]
        out_dtype: OutDtype,
        /// Print the report as one JSON object on stdout (progress stays on stderr).
        #[arg(long)]
        json: bool,
        /// Causal masking, aligned bottom-right (row i sees keys j <= i + Sk - Sq); stage7 and stage8.
        #[arg(long)]
        causal: bool,
        #[command(flatten)]
        scheme: SchemeArgs,
    },
    /// List the stages and what each needs.
    Stages,
    /// Time a stage on generated inputs (quantized on the GPU): no file needed.
    Bench {
        /// Which stage runs: stage1, stage2, stage3a, stage3b, stage4 (sm_80 and later), stage5, stage6, stage7,
        /// stage8 (sm_90). stage7 is the fastest measured past 2,048 keys and at D = 256, stage8 (V transposed in
        /// the kernel: one launch) up to them; both take --causal and grouped-query heads; `sdpa stages` lists what
        /// each needs.
        #[arg(long, value_parser = Stage::parse)]
        stage: Stage,
        /// B,H,Sq,Sk,D (or B,H,S,D)
        #[arg(long, value_parser = Shape::parse)]
        shape: Shape,
        /// Input family: normal, outliers-k-x10 … outliers-qk-x100, large-logits, heavy-tail, k-bias.
        #[arg(long, default_value = "normal", value_parser = Dist::from_str)]
        dist: Dist,
        /// A source variant timed beside the stage in the same process, as LABEL=HEADER:FROM=>TO (the first FROM
        /// in block header HEADER becomes TO; several edits joined by &&); repeatable. For "change one thing,
        /// measure": the A/B of a change is its revert as a variant. With --mode decode|paged (or --page), a variant
        /// of the packed kernel the paged cache runs, timed beside it planned once.
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// A persistent stage (stage7, stage8), and each variant, also timed launched with this many blocks instead of one
        /// an SM (as many as its work units: one unit a block, as a non-persistent launch); repeatable.
        #[arg(long = "blocks")]
        blocks: Vec<usize>,
        /// Causal stage7, and each variant, also timed with its units ordered in schedule sections of this many
        /// heads (longest units first within a section) instead of as many as keep 16 MiB of K and V; repeatable.
        #[arg(long = "section")]
        sections: Vec<usize>,
        /// Stage 7 or 8 also timed as ordinary launches, each after the one before has finished (the stage's own
        /// launches are programmatic dependent launches: the next may start while one runs, up to its wait).
        #[arg(long)]
        serial: bool,
        /// A persistent stage (stage7, stage8) also timed with every unit whole, taken from the counter: no split tail
        /// (the last, partial wave's units cut by key tiles among the blocks and merged after), as ring steps run.
        #[arg(long)]
        whole_units: bool,
        /// Q, K and V moved to [B, S, H, D] on the device and read in place through those strides (stage8 at any B;
        /// stage7 at B = 1, where its flat heads read them).
        #[arg(long)]
        bshd: bool,
        /// Causal masking (stage7 and stage8); its TFLOP/s count half the work.
        #[arg(long)]
        causal: bool,
        /// Key/value heads a batch, for grouped-query attention (stage7 and stage8; must divide H).
        #[arg(long)]
        kv_heads: Option<usize>,
        /// A sliding window LEFT,RIGHT (keys each side of the bottom-right diagonal; -1 unbounded): stage8 only.
        #[arg(long, value_parser = fixtures::Window::parse, allow_hyphen_values = true)]
        window: Option<fixtures::Window>,
        /// Also time the library's call (`fp8_attention::Attention::forward` on device tensors, V's transpose and
        /// every other kernel of the call included; with --stage stage8, the op on stage 8: one launch a call): calls
        /// back to back on one stream, device time between CUDA events and the host's time a call.
        #[arg(long)]
        api: bool,
        /// Ring attention over NCCL on this many GPUs of the host instead (one rank a GPU, the sequence in zigzag
        /// shards; stage7), timed beside stage 7 on the whole problem on GPU 0.
        #[arg(long)]
        ranks: Option<usize>,
        /// With --ranks: also time the kept state on a second communicator whose NCCL kernels may take this many
        /// blocks (ncclConfig_t's maxCTAs), with a block an SM and with 1 SM left to NCCL, in the same rounds as
        /// NCCL's own width (0, the default: no second communicator).
        #[arg(long, requires = "ranks", default_value_t = 0)]
        nccl_max_ctas: usize,
        /// With --ranks: the ring's launches for that many ranks all on GPU 0 with no transfer (every rank's steps
        /// against stage 7 on the whole problem there): the ring's kernels on one GPU.
        #[arg(long, requires = "ranks")]
        one_device: bool,
        /// A serving mode's batch on stage8's packed kernel: varlen (with --tokens), decode (--shape B,H,Sq,Sk,D,
        /// Sq ≤ 16; --page adds the paged cache), paged (--shape B,H,Sq,Sk,D and --page). The spelled-out form of
        /// --varlen, --prefix and --page.
        #[arg(long, value_enum, conflicts_with_all = ["varlen", "prefix", "ranks", "api"])]
        mode: Option<Mode>,
        /// With --mode varlen: the batch's tokens in all.
        #[arg(long, requires = "mode")]
        tokens: Option<usize>,
        /// A packed (variable-length) batch of this many tokens instead, on stage8's packed kernel: sequences of 100
        /// to S tokens (the shape's S; Sq = Sk each), the shape's heads and D; timed beside dense stages 7 and 8 at
        /// about the same query×key pairs.
        #[arg(long)]
        varlen: Option<usize>,
        /// With --varlen: every sequence the shape's S new tokens over this many cached keys (Sk = S + prefix).
        /// With S ≤ 16 this is decode (B = tokens / S): reported as bytes moved a second against a device copy's.
        #[arg(long, default_value_t = 0)]
        prefix: usize,
        /// With --varlen or --mode: the same keys again from a paged cache of pages of this many rows (16 to 256, a
        /// power of two), timed against the packed keys.
        #[arg(long)]
        page: Option<usize>,
        #[command(flatten)]
        scheme: SchemeArgs,
    },
    /// Stage 7's consumer warps on a timeline: clock64 at each turn's grant and handover, each softmax's start and
    /// end, and each unit's start, last P·V commit and epilogue end, in the first blocks of one launch; summarised
    /// (a turn's parts, a unit's cost beyond its key tiles, how far apart the two consumers' turns are, the last
    /// turn's parts).
    Trace {
        /// B,H,Sq,Sk,D (or B,H,S,D)
        #[arg(long, value_parser = Shape::parse)]
        shape: Shape,
        /// Causal masking.
        #[arg(long)]
        causal: bool,
        /// Key/value heads a batch, for grouped-query attention (must divide H).
        #[arg(long)]
        kv_heads: Option<usize>,
        /// Also write every stamp here as CSV: block, warp, cycle, mark.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use fixtures::Dist;

    fn parse_err(args: &[&str]) -> String {
        let mut v = vec!["sdpa"];
        v.extend_from_slice(args);
        Args::try_parse_from(v).unwrap_err().to_string()
    }

    const RUN: [&str; 5] = ["run", "--stage", "stage4", "--input", "x.safetensors"];

    #[test]
    fn a_serving_mode_parses_and_excludes_the_varlen_flags() {
        let v = [
            "sdpa",
            "bench",
            "--stage",
            "stage8",
            "--shape",
            "64,32,1,8192,128",
            "--kv-heads",
            "8",
            "--mode",
            "decode",
            "--page",
            "64",
        ];
        let Cmd::Bench {
            mode, page, shape, ..
        } = Args::try_parse_from(v).unwrap().cmd
        else {
            panic!("not bench")
        };
        assert_eq!((mode, page, shape.sk), (Some(Mode::Decode), Some(64), 8192));
        let bench = ["bench", "--stage", "stage8", "--shape", "1,16,8192,128"];
        let with = |extra: &[&str]| {
            let mut a = bench.to_vec();
            a.extend_from_slice(extra);
            parse_err(&a)
        };
        assert!(with(&["--mode", "varlen", "--varlen", "64"]).contains("cannot be used with"));
        assert!(with(&["--mode", "decode", "--prefix", "8"]).contains("cannot be used with"));
        assert!(with(&["--tokens", "64"]).contains("--mode"));
        assert!(with(&["--mode", "prefill"]).contains("invalid value"));
    }

    #[test]
    fn run_defaults_are_sample_f16_text() {
        let mut v = vec!["sdpa"];
        v.extend_from_slice(&RUN);
        let Cmd::Run {
            check,
            out_dtype,
            json,
            rows_per_head,
            scheme,
            ..
        } = Args::try_parse_from(v).unwrap().cmd
        else {
            panic!("not run")
        };
        assert_eq!(
            (check, out_dtype, json, rows_per_head),
            (Check::Sample, OutDtype::F16, false, 32)
        );
        assert_eq!(scheme.scheme(), Scheme::default());
        assert_eq!(scheme.scheme().name(), "per-head");
        let mut v = vec!["sdpa"];
        v.extend_from_slice(&RUN);
        v.extend([
            "--scales",
            "per-tensor",
            "--smooth-k",
            "--rotate",
            "hadamard-signs",
        ]);
        let Cmd::Run { scheme, .. } = Args::try_parse_from(v).unwrap().cmd else {
            panic!("not run")
        };
        assert_eq!(scheme.scheme().name(), "per-tensor+smooth-k+hadamard-signs");
    }

    #[test]
    fn bad_flags_are_named() {
        let with = |extra: &[&str]| {
            let mut v = RUN.to_vec();
            v.extend_from_slice(extra);
            parse_err(&v)
        };
        let e = with(&["--out-dtype", "f8"]);
        assert!(
            e.contains("--out-dtype") && e.contains("unknown output dtype `f8`"),
            "{e}"
        );
        let e = with(&["--check", "most"]);
        assert!(
            e.contains("--check") && e.contains("full, sample, none"),
            "{e}"
        );
        let e = with(&["--rows-per-head", "0"]);
        assert!(e.contains("--rows-per-head"), "{e}");
        let e = with(&["--rotate", "fourier"]);
        assert!(
            e.contains("--rotate") && e.contains("unknown rotation `fourier`"),
            "{e}"
        );
        let e = with(&["--scales", "per-row"]);
        assert!(
            e.contains("--scales") && e.contains("per-head, per-tensor"),
            "{e}"
        );
        let e = parse_err(&["run", "--stage", "stage9", "--input", "x"]);
        assert!(e.contains("unknown stage `stage9`"), "{e}");
        let e = parse_err(&["bench", "--stage", "stage5", "--shape", "4,16,x,128"]);
        assert!(
            e.contains("--shape") && e.contains("expected B,H,Sq,Sk,D"),
            "{e}"
        );
        let e = parse_err(&["bench", "--stage", "stage5", "--shape", "4,16,0,128"]);
        assert!(e.contains("at least 1"), "{e}");
        let e = parse_err(&[
            "bench", "--stage", "stage5", "--shape", "1,1,8,64", "--dist", "cauchy",
        ]);
        assert!(e.contains("unknown input family `cauchy`"), "{e}");
    }

    #[test]
    fn every_family_and_dtype_parses_back() {
        for d in Dist::all() {
            assert_eq!(Dist::from_str(&d.name()).unwrap(), d);
        }
        for o in OutDtype::ALL {
            assert_eq!(OutDtype::from_str(o.name()).unwrap(), o);
        }
    }

    #[test]
    fn stage_and_input_have_help() {
        for cmd in ["run", "bench"] {
            let e = parse_err(&[cmd, "--help"]);
            assert!(
                e.contains("stage1, stage2, stage3a") && e.contains("stage7 is the fastest"),
                "{e}"
            );
        }
        let e = parse_err(&["run", "--help"]);
        assert!(
            e.contains("safetensors file holding `q`") && e.contains("F8_E4M3"),
            "{e}"
        );
    }
}
