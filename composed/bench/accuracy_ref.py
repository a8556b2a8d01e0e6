# accuracy_ref.py: cuDNN's FP8 SDPA and PyTorch's fp16 SDPA on the accuracy study's inputs (xtask accuracy).
"""For each DIR/<case>.json ({"shape": [B, H, Sq, Sk, D]}) beside raw little-endian f32 DIR/<case>.{q,k,v}.f32
([B, H, S, D]), writes DIR/<case>.o_torch_fp16.f32 and DIR/<case>.o_cudnn_fp8.f32 where each could run, and
prints one JSON line a case (errors: why not). Raw files, so that nothing beyond torch and numpy is needed.

cuDNN FP8 gets what a calibrated user gives it: per-tensor scales amax / 448 for Q, K, V (the only granularity
its descale tensors take), scale_s = 448 and descale_s = 1/448 for P (P is in [0, 1]), and scale_o = 448 /
amax(O) from a first run, so that its E4M3 O (what Hopper requires) uses the whole range."""
import json
import os
import sys

import torch
import numpy as np

from torch_sdpa import cudnn_fp8_graph

E4M3_MAX = 448.0


def to_e4m3(x, descale):
    return (x / descale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def cudnn_fp8(handle, q, k, v):
    import cudnn

    descales = [x.abs().max().clamp(min=1e-30) / E4M3_MAX for x in (q, k, v)]
    q8, k8, v8 = (to_e4m3(x, s) for x, s in zip((q, k, v), descales))
    one = lambda x: torch.full((1, 1, 1, 1), float(x), dtype=torch.float32, device="cuda")
    _, o, amax_o, _, _, _, run = cudnn_fp8_graph(handle, q8, k8, v8, False)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    base = [one(descales[0]), one(descales[1]), one(descales[2]), one(1.0 / E4M3_MAX), one(E4M3_MAX)]
    run(base + [one(1.0)])
    torch.cuda.synchronize()
    amax = float(amax_o.item())
    scale_o = E4M3_MAX / amax if amax > 0 else 1.0
    run(base + [one(scale_o)])
    torch.cuda.synchronize()
    return o.float() / scale_o, amax


def main(directory):
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name()}), flush=True)
    handle = None
    try:
        import cudnn

        handle = cudnn.create_handle()
        print(json.dumps({"cudnn_frontend": cudnn.__version__, "cudnn": cudnn.backend_version()}), flush=True)
    except Exception as e:  # no wheel: reported, the torch column still fills
        print(json.dumps({"cudnn_error": f"{type(e).__name__}: {e}"}), flush=True)
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        case = name[: -len(".json")]
        with open(os.path.join(directory, name)) as f:
            b, h, sq, sk, d = json.load(f)["shape"]
        path = lambda what: os.path.join(directory, f"{case}.{what}.f32")
        read = lambda what, s: torch.from_numpy(np.fromfile(path(what), dtype="<f4").reshape(b, h, s, d)).cuda()
        q, k, v = read("q", sq), read("k", sk), read("v", sk)
        line = {"case": case}
        o16 = torch.nn.functional.scaled_dot_product_attention(q.half(), k.half(), v.half()).float()
        o16.cpu().numpy().astype("<f4").tofile(path("o_torch_fp16"))
        if handle is not None:
            try:
                o, amax = cudnn_fp8(handle, q, k, v)
                o.cpu().numpy().astype("<f4").tofile(path("o_cudnn_fp8"))
                line["cudnn_amax_o"] = amax
            except Exception as e:  # a refusal is reported, never silently absent
                line["cudnn_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
