// mma_probe.cuh: a kernel that runs one mma.sync on registers the host packed, for the layout probes.
#pragma once

// mma.sync on raw registers the host prepared: a[run][lane][4], b[run][lane][2] words, d[run][lane][4] floats.
// The host places values, so the same kernel probes C (through the math), A and B (through selection matrices).
#define LAB_MMA_PROBE(NAME, INSTR)                                                                     \
  extern "C" __global__ void NAME(const unsigned* a, const unsigned* b, float* d, int runs) {          \
    const int lane = threadIdx.x;                                                                      \
    for (int r = 0; r < runs; ++r) {                                                                   \
      const unsigned* ar = a + (r * 32 + lane) * 4;                                                    \
      const unsigned* br = b + (r * 32 + lane) * 2;                                                    \
      float d0, d1, d2, d3;                                                                            \
      asm volatile(INSTR " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"                \
                   : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                                            \
                   : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "f"(0.0f)); \
      float* dr = d + (r * 32 + lane) * 4;                                                             \
      dr[0] = d0; dr[1] = d1; dr[2] = d2; dr[3] = d3;                                                  \
    }                                                                                                  \
  }
