# torch_sdpa.py: PyTorch's fp16 SDPA (cuDNN and flash backends) timed like the lab's stages; one JSON line a case.
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 1, 32, 64), (1, 8, 512, 64), (1, 8, 2048, 64), (2, 8, 256, 64), (4, 16, 4096, 64), (4, 16, 4096, 128)]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def time_one(backend, shape, warmup=20, iters=200, sets=3):
    """One CUDA graph per input set, replayed between CUDA events, as the lab times its stages."""
    b, h, s, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = [tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3)) for _ in range(sets)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    graphs = []
    with sdpa_kernel(backend):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                sdpa(*inputs[i % sets])
        torch.cuda.current_stream().wait_stream(side)
        for x in inputs:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                sdpa(*x)
            graphs.append(g)
    for i in range(warmup):
        graphs[i % sets].replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (a, e) in enumerate(events):
        a.record()
        graphs[i % sets].replay()
        e.record()
    torch.cuda.synchronize()
    us = sorted(a.elapsed_time(e) * 1e3 for a, e in events)
    return us[len(us) // 2], us[round((len(us) - 1) * 0.9)]


def main():
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    for shape in SHAPES:
        for name, backend in BACKENDS.items():
            try:
                p50, p90 = time_one(backend, shape)
                print(json.dumps({"backend": name, "shape": shape, "p50_us": p50, "p90_us": p90}), flush=True)
            except RuntimeError as e:  # a backend that refuses a shape is reported, not fatal
                print(json.dumps({"backend": name, "shape": shape, "error": str(e).splitlines()[0]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
