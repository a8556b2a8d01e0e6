# cudnn_fp8_launch.py: cuDNN's FP8 SDPA launched a few times and nothing else timed, for a profiler (xtask profile --against).
"""argv[1]: B,H,S,D (Sq = Sk: cuDNN's FP8 SDPA is built here for one sequence length). The inputs and graph are
torch_sdpa.py's (standard-normal codes cast to E4M3, unit descales, E4M3 O), so that the profile is of the kernel
the ladder times. Prints one JSON line: the shape and the launches made."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa  # noqa: E402  (beside this file)

LAUNCHES = 4


def main():
    import cudnn  # the wheel travels with the bundle (--no-deps)

    b, h, s, d = (int(x) for x in sys.argv[1].split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    handle = cudnn.create_handle()
    (q, dq), (k, dk), (v, dv) = (torch_sdpa.e4m3_input((b, h, s, d), gen, "unit") for _ in range(3))
    _, _, _, _, _, _, run = torch_sdpa.cudnn_fp8_graph(handle, q, k, v, False)
    one = lambda x: torch.full((1, 1, 1, 1), x, dtype=torch.float32, device="cuda")
    scales = [one(x) for x in (dq, dk, dv, 1.0, 1.0, 1.0)]
    for _ in range(LAUNCHES):
        run(scales)
    torch.cuda.synchronize()
    print(json.dumps({"shape": [b, h, s, d], "launches": LAUNCHES}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
