// test_frag_layout_fp8.cu: probes of the e4m3/e5m2 mma.sync.m16n8k32 layouts (the instruction needs sm_89+).

#include "mma_probe.cuh"

LAB_MMA_PROBE(probe_mma_m16n8k32_e4m3, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
LAB_MMA_PROBE(probe_mma_m16n8k32_e5m2, "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32")
