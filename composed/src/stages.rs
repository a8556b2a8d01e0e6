// The stages: their kernel sources, entry points, shared memory and resource budgets.
use lab::{Arch, Budget, Header, KernelSpec, Source};

/// Headers of this crate; stage sources also see every block header they include.
pub const HEADERS: &[Header] = &[
    Header {
        name: "sdpa_common.cuh",
        code: include_str!("../cuda/sdpa_common.cuh"),
    },
    Header {
        name: "smem_softmax.cuh",
        code: include_str!("../cuda/smem_softmax.cuh"),
    },
    Header {
        name: "register_softmax.cuh",
        code: include_str!("../cuda/register_softmax.cuh"),
    },
    Header {
        name: "wgmma_softmax.cuh",
        code: include_str!("../cuda/wgmma_softmax.cuh"),
    },
    Header {
        name: "tma_attention.cuh",
        code: include_str!("../cuda/tma_attention.cuh"),
    },
    Header {
        name: "pingpong_attention.cuh",
        code: include_str!("../cuda/pingpong_attention.cuh"),
    },
    Header {
        name: "pingpong_schedule.cuh",
        code: include_str!("../cuda/pingpong_schedule.cuh"),
    },
    Header {
        name: "pingpong_producer.cuh",
        code: include_str!("../cuda/pingpong_producer.cuh"),
    },
    Header {
        name: "pingpong_epilogue.cuh",
        code: include_str!("../cuda/pingpong_epilogue.cuh"),
    },
    Header {
        name: "v_staging.cuh",
        code: include_str!("../cuda/v_staging.cuh"),
    },
    Header {
        name: "ragged_units.cuh",
        code: include_str!("../cuda/ragged_units.cuh"),
    },
];

pub(crate) const BLOCK_HEADERS: &[&[Header]] = &[
    frag_layout::HEADERS,
    warp_reduce::HEADERS,
    online_softmax::HEADERS,
    cp_async_ring::HEADERS,
    fp8_codec::HEADERS,
    frag_layout::WGMMA_HEADERS,
    wgmma::HEADERS,
    fp8_relayout::HEADERS,
    tma_ring::HEADERS,
    ragged_plan::HEADERS,
    paged_kv::HEADERS,
    attn_merge::HEADERS,
    HEADERS,
];

macro_rules! source {
    ($file:literal) => {
        Source {
            file: $file,
            code: include_str!(concat!("../cuda/", $file)),
            headers: BLOCK_HEADERS,
        }
    };
}

pub const STAGE1: Source = source!("stage1.cu");
pub const STAGE2: Source = source!("stage2.cu");
pub const STAGE3A: Source = source!("stage3a.cu");
pub const STAGE3B: Source = source!("stage3b.cu");
pub const STAGE4: Source = source!("stage4.cu");
pub const STAGE5: Source = source!("stage5.cu");
pub const STAGE6: Source = source!("stage6.cu");
pub const STAGE7: Source = source!("stage7.cu");
pub const STAGE7_ACC: Source = source!("stage7_acc.cu");
pub const STAGE8: Source = source!("stage8.cu");
pub const STAGE8_VARLEN: Source = source!("stage8_varlen.cu");
pub const STAGE8_VARLEN_PACK: Source = source!("stage8_varlen_pack.cu");
pub const STAGE8_WINDOW: Source = source!("stage8_window.cu");
pub const SPLIT_KV: Source = source!("split_kv.cu");

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    S1,
    S2,
    S3a,
    S3b,
    S4,
    S5,
    S6,
    S7,
    S8,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::S1,
        Stage::S2,
        Stage::S3a,
        Stage::S3b,
        Stage::S4,
        Stage::S5,
        Stage::S6,
        Stage::S7,
        Stage::S8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::S1 => "stage1",
            Stage::S2 => "stage2",
            Stage::S3a => "stage3a",
            Stage::S3b => "stage3b",
            Stage::S4 => "stage4",
            Stage::S5 => "stage5",
            Stage::S6 => "stage6",
            Stage::S7 => "stage7",
            Stage::S8 => "stage8",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Stage> {
        Stage::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown stage `{s}`: expected one of stage1, stage2, stage3a, stage3b, stage4, stage5, stage6, stage7, stage8"
                )
            })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Stage::S1 => {
                "K/V double-buffered with cp.async (ring N=2), tensor-core Q·Kᵀ, softmax in shared memory, scalar P·V"
            }
            Stage::S2 => "stage1 with tensor-core P·V (P in its own f16 buffer)",
            Stage::S3a => "stage2 with P written over the score buffer; bit-identical to stage2",
            Stage::S3b => {
                "softmax in registers on the accumulator fragments, no score buffer (frag-layout, warp-reduce, online-softmax)"
            }
            Stage::S4 => "stage3b with the 3-stage K/V ring",
            Stage::S5 => {
                "Q·Kᵀ and P·V on FP8 wgmma (sm_90a), P rounded to E4M3 in registers (×2^8, FlashAttention-3's Max_offset), V transposed to K-major in shared memory; two warpgroups of 64 query rows share 128-key tiles from the cp.async ring"
            }
            Stage::S6 => {
                "stage5's math fed by a producer warpgroup: Q, K and Vᵀ (transposed in global memory once, keys in P's register order) by TMA into an mbarrier ring; two consumer warpgroups with setmaxnreg and no block barrier in the loop"
            }
            Stage::S7 => {
                "stage6 with the consumers in pingpong: each issues Q·Kᵀ(t) and P·V(t − 1) in its turn on the tensor cores, then runs its softmax under the other's GEMMs"
            }
            Stage::S8 => {
                "stage7 reading V as the caller has it: V's tiles by TMA into staging slots, transposed into the ring's Vᵀ by three producer warps (ldmatrix.trans, byte permutes, stmatrix); no kernel before it"
            }
        }
    }

    /// What the stage needs to run: the architecture it is built for and how it is launched.
    pub fn needs(self) -> String {
        let archs: Vec<&str> = self.kernel(64).archs.iter().map(|a| a.name()).collect();
        format!(
            "{}; {} threads a block, {} query rows a block{}, {} keys a tile, D = {}",
            archs.join(" / "),
            self.threads(),
            self.rows_per_block(),
            if self == Stage::S6 {
                " (64 when blocks of 128 would fill at most half the SMs)"
            } else {
                ""
            },
            if self.bc(64) == self.bc(128) {
                self.bc(64).to_string()
            } else {
                format!("{} (D = 64) or {} (D = 128)", self.bc(64), self.bc(128))
            },
            self.dims()
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// The head dimensions the stage is built for: stage 7 also 256, every stage 64 and 128 (stage 8's V staging
    /// does not fit beside D = 256's tiles yet).
    pub fn dims(self) -> &'static [usize] {
        if self == Stage::S7 {
            &[64, 128, 256]
        } else {
            &[64, 128]
        }
    }

    /// Threads of one block.
    pub fn threads(self) -> usize {
        match self {
            Stage::S5 => 256,
            Stage::S6 | Stage::S7 | Stage::S8 => 384,
            _ => 128,
        }
    }

    /// Query rows one block owns at most.
    pub fn rows_per_block(self) -> usize {
        if self.fp8_p() { 128 } else { 64 }
    }

    /// Query rows one block owns when `s` is launched on a device of `sms` SMs. Stage 6 halves its blocks to 64
    /// rows (one consumer warpgroup) when blocks of 128 would cover at most half the SMs: every block then still
    /// has an SM of its own, and one consumer alone finishes a block sooner than two sharing the tensor cores
    /// and the MUFU pipe (the mission shape, 8 heads × 512 rows: 32 blocks → 64 on 132 SMs).
    pub fn rows_for(self, s: &fixtures::Shape, sms: usize) -> usize {
        let full = self.rows_per_block();
        if self == Stage::S6 && 2 * s.heads() * s.sq.div_ceil(full) <= sms {
            full / 2
        } else {
            full
        }
    }

    /// Keys per K/V tile. For stages 6 and 7 this must agree with `STAGE6(D, BC)` / `STAGE7(D, BC, STAGES, P)`, which
    /// size the tensor maps' boxes and the shared memory. 224 keys at stage 7's D = 128 (FlashAttention-3's FP8
    /// choice) is the widest S that fits beside P in 232 registers; stage 8's at D = 128 are 192, so that three ring
    /// stages fit beside V's staging; 256 at D = 64 for stages 7 and 8 (half the turns of 128-key tiles, whose fixed
    /// costs bound D = 64); 128 elsewhere (docs/decisions.md, "224-key tiles", "192-key tiles", "256-key tiles, four
    /// ways", "Stage 8's third ring stage", "256-key tiles at D = 64").
    pub fn bc(self, d: usize) -> usize {
        match self {
            Stage::S7 if d == 128 => 224,
            Stage::S7 | Stage::S8 if d == 64 => 256,
            Stage::S8 if d == 128 => 192,
            _ if self.fp8_p() => 128,
            _ => bc(d),
        }
    }

    /// P's rounding before P·V: E4M3 with a 2^8 offset for the FP8 wgmma stages, f16 for the others.
    pub fn fp8_p(self) -> bool {
        matches!(self, Stage::S5 | Stage::S6 | Stage::S7 | Stage::S8)
    }

    /// Whether the stage takes causal masking (`Shape::causal`); the others refuse it by name at launch.
    pub fn causal(self) -> bool {
        matches!(self, Stage::S7 | Stage::S8)
    }

    /// Whether the stage takes grouped-query attention (`Shape::hkv` < H); the others refuse it by name.
    pub fn gqa(self) -> bool {
        matches!(self, Stage::S7 | Stage::S8)
    }

    /// Whether the stage is persistent: its grid is one block an SM (at most one a (head, query tile) work unit,
    /// `sdpa::unit_coord`), each block taking units as it frees up, its producer loading a unit's Q and first key
    /// tiles under the unit before (`plan::grid`). Stage 7 is, at both head dimensions (`pingpong_attention`): units
    /// from a counter, causal ones longest first within L2-sized sections (docs/decisions.md, "Units from a
    /// counter").
    pub fn persistent(self) -> bool {
        matches!(self, Stage::S7 | Stage::S8)
    }

    /// Whether the stage's kernels can take a split tail's pieces from the counter (`SplitPlan::taken`): stage 7's
    /// (stage 8's deal them: the taking branch moved ptxas's schedule of its consumer loop).
    pub fn takes_pieces(self) -> bool {
        self == Stage::S7
    }

    /// Whether the stage has a halved kernel (`stage8h_dD`, `plan::SplitPlan::halved`): a unit's rows in two blocks,
    /// each block's keys halved between its consumers, where the units would leave most SMs idle.
    pub fn halves(self) -> bool {
        self == Stage::S8
    }

    /// Keys per K/V tile of the stage's halved kernel on `sk` keys (`plan::SplitPlan::halved`): at D = 64, 128 where
    /// Sk's 128-key tiles halve evenly and the ring holds them all (2 or 4 tiles: Sk in 129..=256 or 385..=512; each
    /// consumer's tiles then overlap their turns where one 256-key tile runs its Q·Kᵀ, softmax and P·V in series);
    /// else `bc(d)` (Sk in 257..=384 halves on 256-key tiles). `STAGE8H_AS`'s `stage8h_d64_k128`.
    pub fn halved_bc(self, d: usize, sk: usize) -> usize {
        let tiles = sk.div_ceil(128);
        match self {
            Stage::S8 if d == 64 && tiles.is_multiple_of(2) && tiles <= self.ring_stages(d) => 128,
            _ => self.bc(d),
        }
    }

    /// The halved kernel of the stage at `s.d` (on `halved_bc`'s tiles), from `source` (the stage's, or a variant).
    pub fn halved_kernel(self, s: &fixtures::Shape, source: &'static Source) -> KernelSpec {
        let bc = self.halved_bc(s.d, s.sk);
        let name = if bc == self.bc(s.d) {
            format!("{}h_d{}", self.name(), s.d)
        } else {
            format!("{}h_d{}_k{bc}", self.name(), s.d)
        };
        KernelSpec {
            source,
            ..KernelSpec::find(KERNELS, &name)
        }
    }

    /// Whether the stage's kernels may be launched as programmatic dependent launches (`lab::Order::Programmatic`):
    /// they touch only shared memory and their parameters before `griddepcontrol.wait` (pingpong_attention.cuh).
    pub fn programmatic(self) -> bool {
        matches!(self, Stage::S7 | Stage::S8)
    }

    /// Whether the stage loads through TMA: its kernel takes tensor maps of Q, K and Vᵀ (or V: `transposes_v`)
    /// after the parameters.
    pub fn tma(self) -> bool {
        matches!(self, Stage::S6 | Stage::S7 | Stage::S8)
    }

    /// Whether the stage reads V as the caller has it and transposes it in the kernel (stage 8: its third map is
    /// V's). The other TMA stages read Vᵀ made beforehand: `reads_vt`.
    pub fn transposes_v(self) -> bool {
        self == Stage::S8
    }

    /// Whether V must first be transposed in global memory for the stage (`prep_vt`, or `prep_vt_tiles`:
    /// `vt_image`): the TMA stages but stage 8.
    pub fn reads_vt(self) -> bool {
        self.tma() && !self.transposes_v()
    }

    /// V staging slots of stage 8 (`STAGE8`'s VS): V tiles in flight between the loads and the transposing warps.
    /// One at D = 128, where the shared memory goes to a third ring stage (192-key tiles); two at D = 64.
    pub fn v_slots(self, d: usize) -> usize {
        match (self.transposes_v(), d) {
            (false, _) => 0,
            (true, 128) => 1,
            (true, _) => 2,
        }
    }

    /// Whether the TMA stage at head dimension `d` reads Vᵀ as tile images (`prep_vt_tiles`, one bulk copy a tile)
    /// instead of through Vᵀ's tensor map: where its key tiles make Vᵀ 32-byte panels (`TmaBlock::kVtImage`,
    /// `bc(d)` not a multiple of 64: stage 7 at D = 128). Its third tensor map is then not read (K's fills it).
    pub fn vt_image(self, d: usize) -> bool {
        self.reads_vt() && !self.bc(d).is_multiple_of(64)
    }

    pub fn source(self) -> &'static Source {
        match self {
            Stage::S1 => &STAGE1,
            Stage::S2 => &STAGE2,
            Stage::S3a => &STAGE3A,
            Stage::S3b => &STAGE3B,
            Stage::S4 => &STAGE4,
            Stage::S5 => &STAGE5,
            Stage::S6 => &STAGE6,
            Stage::S7 => &STAGE7,
            Stage::S8 => &STAGE8,
        }
    }

    /// K/V ring stages at head dimension `d`. For stages 6 and 7 this must agree with `STAGE6` / `STAGE7`: stage 7
    /// at D = 128 has 224-key tiles, of which three pairs fit; stage 8 three pairs of 192-key tiles beside a V slot.
    pub fn ring_stages(self, d: usize) -> usize {
        match self {
            Stage::S7 if d == 128 => 3,
            Stage::S7 if d == 256 => 2,
            Stage::S8 if d == 128 => 3,
            Stage::S4 => 3,
            Stage::S6 | Stage::S7 | Stage::S8 => 4,
            _ => 2,
        }
    }

    /// Dynamic shared memory of the TMA stage: 1024 for alignment, Q (128 rows; two buffers when persistent, so
    /// that the next unit's lands under this one), per ring stage a K tile and a Vᵀ tile (`bc(d)` keys × D
    /// each), O's staging panels, and stage 8's V staging slots (a V tile each). Its mbarriers are static.
    fn tma_smem(self, d: usize) -> usize {
        self.tma_smem_bc(d, self.bc(d))
    }

    /// `tma_smem` on tiles of `bc` keys (a halved kernel's: `halved_bc`).
    pub fn tma_smem_bc(self, d: usize, bc: usize) -> usize {
        let q_bufs = if self.persistent() { 2 } else { 1 };
        // O's staging panels (64 rows × 128 bytes a consumer) for the TMA stores of a stage that has them.
        let o_staging = if self.tma_store() { 2 * 64 * 128 } else { 0 };
        1024 + q_bufs * 128 * d
            + self.ring_stages(d) * 2 * bc * d
            + o_staging
            + self.v_slots(d) * bc * d
    }

    /// Whether the TMA stage writes O (bf16, f16) through shared memory and a TMA store: its kernel takes O's
    /// tensor map after Vᵀ's (`pingpong_epilogue.cuh`'s `epilogue_staged`).
    pub fn tma_store(self) -> bool {
        matches!(self, Stage::S7 | Stage::S8)
    }

    /// Dynamic shared memory in bytes for head dimension `d` (64 query rows, K/V tiles of `bc(d)` keys).
    pub fn smem_bytes(self, d: usize) -> usize {
        if self.tma() {
            return self.tma_smem(d);
        }
        if self == Stage::S5 {
            // 1024 for alignment, Q (128 rows), the K and V rings (2 × 2 stages × 128 keys), Vᵀ (2 × D × 128).
            return 1024 + 128 * d + 2 * 2 * 128 * d + 2 * d * 128;
        }
        let (bq, bc) = (64, bc(d));
        // Q, K and V as half, rows padded by 8 halves (sdpa_common.cuh's kLd).
        let common = 2 * self.ring_stages(d) * bc * d + (bq + 2 * bc) * (d + 8) * 2;
        let stats = 3 * bq * 4;
        common
            + match self {
                Stage::S1 | Stage::S3a => bq * bc * 4 + stats,
                Stage::S2 => bq * bc * 4 + stats + bq * bc * 2,
                Stage::S3b | Stage::S4 | Stage::S5 | Stage::S6 | Stage::S7 | Stage::S8 => 0,
            }
    }

    pub fn kernel(self, d: usize) -> KernelSpec {
        KernelSpec::find(KERNELS, &format!("{}_d{d}", self.name()))
    }

    /// Stage 7's kernel of head dimension `d` that merges each row into the f32 O and LSE already in its outputs
    /// instead of writing them (`stage7acc_dD`: ring attention's later steps), where there is one (D = 64, 128).
    pub fn accumulating_kernel(self, d: usize) -> Option<KernelSpec> {
        (self == Stage::S7 && matches!(d, 64 | 128))
            .then(|| KernelSpec::find(KERNELS, &format!("stage7acc_d{d}")))
    }

    /// The kernel a launch on `s` runs: the stage's, or stage 8's windowed one (`stage8w_dD`) where `s` has a
    /// sliding window.
    pub fn kernel_for(self, s: &fixtures::Shape) -> KernelSpec {
        if self == Stage::S8 && s.window.is_bounded() {
            KernelSpec::find(KERNELS, &format!("stage8w_d{}", s.d))
        } else {
            self.kernel(s.d)
        }
    }

    /// Whether the stage takes a sliding window (`Shape::window`): stage 8, by its windowed kernel.
    pub fn windows(self) -> bool {
        self == Stage::S8
    }
}

/// K/V tile width: 64 keys for D = 64, 32 for D = 128 (so that every stage fits an sm_89 block).
pub fn bc(d: usize) -> usize {
    if d == 64 { 64 } else { 32 }
}

/// P's scale in the FP8 wgmma stage, log2 units: P = exp2(s·c − m·c + 8), in (0, 256] (`kFp8POffset`).
pub const FP8_P_OFFSET: i32 = 8;

/// The head dimensions some stage is built for (each stage's own: [`Stage::dims`]).
pub const DIMS: [usize; 3] = [64, 128, 256];

const fn k(name: &'static str, source: &'static Source) -> KernelSpec {
    // 168 registers × 128 threads still lets 3 blocks share an SM's 64K registers; the stages' 40–65 KB of
    // shared memory limit residency before registers do. Shared memory is dynamic (set at launch, not in the
    // ptxas report), so the static budget is 0. Spills and stack: 0, as everywhere.
    KernelSpec {
        block: "composed",
        name,
        source,
        budget: Budget::new(168, 0),
        archs: &Arch::REQUIRED,
        sass: &[],
    }
}

const fn k90a(name: &'static str, source: &'static Source) -> KernelSpec {
    // 256 threads, one block an SM (launch bounds (256, 1)): 65536 / 256 = 255 registers a thread are there to
    // use (S 64 f32, O up to 64, P's A registers, the V transpose's 16 offsets). Spills stay at 0.
    KernelSpec {
        block: "composed",
        name,
        source,
        budget: Budget::new(255, 0),
        archs: &[Arch::Sm90a],
        sass: &["QGMMA"],
    }
}

const fn k90a_tma(name: &'static str, source: &'static Source) -> KernelSpec {
    // 384 threads under __launch_bounds__(384, 1): ptxas's report is the entry cap, 168; past setmaxnreg the
    // producer runs on 40 registers and the consumers on 232 (128·40 + 256·232 = 64512 of 65536). Spills: 0.
    // Static shared memory: the ring's and Q's mbarriers (80 bytes for 4 stages) and the Q buffers' slots (stage 7's
    // unit, part and destination a buffer, and each consumer's destination: 40 bytes).
    KernelSpec {
        block: "composed",
        name,
        source,
        budget: Budget::new(168, 160),
        archs: &[Arch::Sm90a],
        sass: &["QGMMA", "UTMALDG", "SYNCS"],
    }
}

/// Stage 8: stage 7's budget, with its V staging's barriers (40 bytes) in static shared memory too.
const fn k90a_tma8(name: &'static str) -> KernelSpec {
    KernelSpec {
        budget: Budget::new(168, 200),
        sass: &["QGMMA", "UTMALDG", "SYNCS", "LDSM", "STSM"],
        ..k90a_tma(name, &STAGE8)
    }
}

/// Stage 8 over packed batches: stage 8's budget, with a paged key tile's pool rows (`PagedRows::at`: BC / 16 words,
/// 48 bytes at most) in static shared memory too.
const fn k90a_tma8_varlen(name: &'static str, source: &'static Source) -> KernelSpec {
    KernelSpec {
        source,
        budget: Budget::new(168, 248),
        ..k90a_tma8(name)
    }
}

/// Stage 7's split-tail merge (`sdpa::merge_split_tail`, in stage 7's source): 128 threads, a row each, plain loads
/// and stores.
const fn k90a_merge(name: &'static str) -> KernelSpec {
    KernelSpec {
        block: "composed",
        name,
        source: &STAGE7,
        budget: Budget::new(64, 0),
        archs: &[Arch::Sm90a],
        sass: &[],
    }
}

pub const KERNELS: &[KernelSpec] = &[
    k("stage1_d64", &STAGE1),
    k("stage1_d128", &STAGE1),
    k("stage2_d64", &STAGE2),
    k("stage2_d128", &STAGE2),
    k("stage3a_d64", &STAGE3A),
    k("stage3a_d128", &STAGE3A),
    k("stage3b_d64", &STAGE3B),
    k("stage3b_d128", &STAGE3B),
    k("stage4_d64", &STAGE4),
    k("stage4_d128", &STAGE4),
    k90a("stage5_d64", &STAGE5),
    k90a("stage5_d128", &STAGE5),
    k90a_tma("stage6_d64", &STAGE6),
    k90a_tma("stage6_d128", &STAGE6),
    k90a_tma("stage7_d64", &STAGE7),
    k90a_tma("stage7_d128", &STAGE7),
    k90a_tma("stage7_d256", &STAGE7),
    k90a_tma("stage7acc_d64", &STAGE7_ACC),
    k90a_tma("stage7acc_d128", &STAGE7_ACC),
    k90a_tma8("stage8_d64"),
    k90a_tma8("stage8_d128"),
    k90a_tma8("stage8h_d64"),
    k90a_tma8("stage8h_d128"),
    k90a_tma8("stage8h_d64_k128"),
    k90a_tma8_varlen("stage8_varlen_d64", &STAGE8_VARLEN),
    k90a_tma8_varlen("stage8_varlen_d128", &STAGE8_VARLEN),
    k90a_tma8_varlen("stage8_varlen_pack_d64", &STAGE8_VARLEN_PACK),
    k90a_tma8_varlen("stage8_varlen_pack_d128", &STAGE8_VARLEN_PACK),
    KernelSpec {
        source: &STAGE8_WINDOW,
        ..k90a_tma8("stage8w_d64")
    },
    KernelSpec {
        source: &STAGE8_WINDOW,
        ..k90a_tma8("stage8w_d128")
    },
    k90a_tma8_varlen("stage8w_varlen_d64", &STAGE8_WINDOW),
    k90a_tma8_varlen("stage8w_varlen_d128", &STAGE8_WINDOW),
    KernelSpec {
        block: "composed",
        name: "split_kv_prep",
        source: &SPLIT_KV,
        budget: Budget::new(64, 0),
        archs: &[Arch::Sm90a],
        sass: &[],
    },
    KernelSpec {
        block: "composed",
        name: "split_kv_merge_d64",
        source: &SPLIT_KV,
        budget: Budget::new(200, 0),
        archs: &[Arch::Sm90a],
        sass: &[],
    },
    KernelSpec {
        block: "composed",
        name: "split_kv_merge_d128",
        source: &SPLIT_KV,
        budget: Budget::new(200, 0),
        archs: &[Arch::Sm90a],
        sass: &[],
    },
    k90a_merge("stage7_merge_d64"),
    k90a_merge("stage7_merge_d128"),
    k90a_merge("stage7_merge_d256"),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// `NAME([KERNEL, ]D, BC, STAGES[, VS])` instantiations at the start of a line of `code` whose macro name is
    /// `name`: (D, BC, STAGES, VS), VS 0 where the macro has no fourth number; a first argument that names the kernel
    /// (`STAGE8H_AS`'s) is skipped.
    fn instantiations(code: &str, name: &str) -> Vec<[usize; 4]> {
        code.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix('(')?.strip_suffix(')'))
            .map(|args| {
                let n: Vec<usize> = args
                    .split(',')
                    .map(str::trim)
                    .skip_while(|a| a.starts_with(|c: char| c.is_ascii_alphabetic()))
                    .map(|a| a.parse().expect("a number"))
                    .collect();
                [n[0], n[1], n[2], n.get(3).copied().unwrap_or(0)]
            })
            .collect()
    }

    /// The kernels' tiles, ring stages and V staging slots are the host's (`bc`, `ring_stages`, `v_slots`): the host
    /// sizes the tensor maps' boxes, the expected bytes and the shared memory from them, and a kernel that counts
    /// other tiles waits for bytes that never come (a hang, not an error).
    #[test]
    fn kernel_macros_agree_with_the_host_tables() {
        let sources = [
            (Stage::S7, STAGE7.code, "STAGE7"),
            (Stage::S7, STAGE7_ACC.code, "STAGE7ACC"),
            (Stage::S8, STAGE8.code, "STAGE8"),
            (Stage::S8, STAGE8.code, "STAGE8H"),
            (Stage::S8, STAGE8_VARLEN.code, "STAGE8_VARLEN"),
            (Stage::S8, STAGE8_VARLEN_PACK.code, "STAGE8_VARLEN_PACK"),
            (Stage::S8, STAGE8_WINDOW.code, "STAGE8W"),
            (Stage::S8, STAGE8_WINDOW.code, "STAGE8W_VARLEN"),
        ];
        for (stage, code, name) in sources {
            let found = instantiations(code, name);
            let dims: Vec<usize> = found.iter().map(|x| x[0]).collect();
            // The accumulating kernels exist where Stage::accumulating_kernel names one.
            let want: Vec<usize> = if name == "STAGE7ACC" {
                stage
                    .dims()
                    .iter()
                    .copied()
                    .filter(|&d| stage.accumulating_kernel(d).is_some())
                    .collect()
            } else {
                stage.dims().to_vec()
            };
            assert_eq!(dims, want, "{name}: instantiated head dimensions");
            if name == "STAGE8H" {
                // The halved kernels: each head dimension's at the stage's tiles, and at D = 64 one on 128-key tiles
                // (`STAGE8H_AS(stage8h_d64_k128, …)`), which `halved_bc` names where Sk is 2 or 4 of them.
                assert!(
                    code.contains("STAGE8H_AS(stage8h_d64_k128,"),
                    "stage8h_d64_k128 instantiated"
                );
                assert_eq!(
                    instantiations(code, "STAGE8H_AS"),
                    [[
                        64,
                        stage.halved_bc(64, 512),
                        stage.ring_stages(64),
                        stage.v_slots(64)
                    ]],
                    "stage8h_d64_k128's (D, BC, STAGES, VS) against the host's"
                );
                for (sk, bc) in [
                    (128, 256),
                    (129, 128),
                    (256, 128),
                    (257, 256),
                    (384, 256),
                    (385, 128),
                    (512, 128),
                    (513, 256),
                ] {
                    assert_eq!(stage.halved_bc(64, sk), bc, "halved_bc(64, {sk})");
                }
                assert_eq!(stage.halved_bc(128, 384), stage.bc(128));
            }
            for [d, bc, stages, vs] in found {
                assert_eq!(
                    [bc, stages, vs],
                    [stage.bc(d), stage.ring_stages(d), stage.v_slots(d)],
                    "{name}({d}, …): the kernel's (BC, STAGES, VS) against the host's"
                );
            }
        }
    }
}
