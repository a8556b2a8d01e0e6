# fp8_attention's figures on a GPU: per-call cost (eager and CUDA-graph) and the drop-in transformer; prints JSON.
"""python3 python/bench/bench.py [--out FILE] [--seq 4096]

1. Per-call cost at the mission shape (1, 8, 512, 64), FP8 inputs with scales (nothing but our kernels runs):
   - `kernels_us`: the summed device time of every kernel one call launches (torch.profiler, median over calls);
   - `graph_us`: one call's share of a captured CUDA graph of 100 back-to-back calls, replayed (CUDA events);
   - `eager_us`: back-to-back eager calls (CUDA events around 1000 calls, no sync between);
   - `eager_cpu_us` beside `torch_sdpa_cpu_us`: host time per call, ours and torch's own SDPA (bf16), no sync.
2. The drop-in transformer: 4 layers, d_model 1024, 16 heads, sequence `--seq`, bf16, random weights; its attention
   is torch's SDPA or ours (`fp8_attention.sdpa` on the same bf16 q, k, v). Logits' rel-L2 against SDPA's, and the
   forward's median time with each.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import fp8_attention as fa


def events_us(fn, n, reps=7):
    """Median over `reps` of the time of `n` back-to-back fn() calls, per call, in µs (CUDA events)."""
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / n)
    return statistics.median(out)


def cpu_us(fn, n, reps=7):
    """Median host time per call in µs, calls back to back without a sync (the queue may fill: n is modest)."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) * 1e6 / n)
    torch.cuda.synchronize()
    return statistics.median(out)


def kernels_us(fn, calls=50):
    """The summed device time of the kernels one call launches (median call), kernels a call, and each kernel's
    mean time a call by name."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name = {}
    for e in evs:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / calls
    return sum(by_name.values()), len(evs) / calls, by_name


def per_call():
    b, h, s, d = 1, 8, 512, 64
    g = torch.Generator(device="cuda").manual_seed(1)
    x = [torch.randn(b, h, s, d, device="cuda", generator=g) for _ in range(3)]
    sc = [t.abs().amax(dim=(2, 3)) / 448.0 for t in x]
    codes = [(t / c[:, :, None, None]).to(torch.float8_e4m3fn) for t, c in zip(x, sc)]

    def ours():
        return fa.sdpa(*codes, q_scale=sc[0], k_scale=sc[1], v_scale=sc[2])

    xb = [t.bfloat16() for t in x]

    def torch_sdpa():
        return F.scaled_dot_product_attention(*xb)

    ours()
    torch_sdpa()
    torch.cuda.synchronize()
    k_us, launches, names = kernels_us(ours)
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        ours()
    st.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=st):
        for _ in range(100):
            ours()
    graph.replay()
    torch.cuda.synchronize()
    # Where eager host time goes: the argument checks, the extension's launch alone (addresses ready), two outputs.
    qs = [c.contiguous() for c in sc]
    o = torch.empty(b * h * s * d, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(b * h * s, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    addrs = [t.data_ptr() for t in codes + qs] + [o.data_ptr(), lse.data_ptr()]
    parts = {
        "check_args": cpu_us(lambda: fa.check_args(*codes, q_scale=sc[0], k_scale=sc[1], v_scale=sc[2]), 200),
        "core_launch": cpu_us(lambda: fa._core.launch(*addrs, b, h, h, s, s, d, False, 0.125, "bf16", stream), 200),
        "two_torch_empty": cpu_us(lambda: (torch.empty(b * h * s * d, dtype=torch.bfloat16, device="cuda"),
                                           torch.empty(b * h * s, dtype=torch.float32, device="cuda")), 200),
        "current_stream": cpu_us(lambda: torch.cuda.current_stream(codes[0].device).cuda_stream, 200),
    }
    xr = [t.bfloat16() for t in x]
    return {
        "shape": [b, h, s, d],
        "eager_parts_cpu_us": parts,
        "bf16_eager_us": events_us(lambda: fa.sdpa(*xr), 1000),
        "bf16_kernels_us": kernels_us(lambda: fa.sdpa(*xr)),
        "kernels_us": k_us,
        "kernels": names,
        "launches_per_call": launches,
        "graph_us": events_us(graph.replay, 10) / 100,
        "eager_us": events_us(ours, 1000),
        "eager_cpu_us": cpu_us(ours, 200),
        "torch_sdpa_cpu_us": cpu_us(torch_sdpa, 200),
        "torch_sdpa_bf16_us": events_us(torch_sdpa, 1000),
    }


class Block(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, x, attn):
        b, s, dm = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, dm // self.heads).permute(2, 0, 3, 1, 4)
        o = attn(q, k, v)  # q, k, v: [B, H, S, D] views (strided); o: [B, H, S, D]
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, dm))
        return x + self.mlp(self.ln2(x))


class Model(torch.nn.Module):
    def __init__(self, vocab=32000, d_model=1024, heads=16, layers=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, attn):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, attn)
        return self.head(self.ln(x))


def drop_in(seq, causal):
    torch.manual_seed(0)
    model = Model().cuda().bfloat16().eval()
    tokens = torch.randint(0, 32000, (1, seq), device="cuda")

    def theirs(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours(q, k, v):
        return fa.sdpa(q, k, v, causal=causal)  # the one line a torch user changes

    with torch.no_grad():
        ref = model(tokens, theirs).double()
        got = model(tokens, ours).double()
        rel = ((got - ref).norm() / ref.norm()).item()
        t_ref = events_us(lambda: model(tokens, theirs), 5, reps=9)
        t_ours = events_us(lambda: model(tokens, ours), 5, reps=9)
        q = torch.randn(1, 16, seq, 64, device="cuda", dtype=torch.bfloat16)
        a_ref = events_us(lambda: theirs(q, q, q), 20, reps=9)
        a_ours = events_us(lambda: ours(q, q, q), 20, reps=9)
        a_kernels = kernels_us(lambda: ours(q, q, q), calls=10)
    return {
        "seq": seq,
        "causal": causal,
        "logits_rel_l2": rel,
        "top1_agreement": (got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
        "forward_sdpa_ms": t_ref / 1e3,
        "forward_ours_ms": t_ours / 1e3,
        "forward_speedup": t_ref / t_ours,
        "attention_sdpa_us": a_ref,
        "attention_ours_us": a_ours,
        "attention_ours_kernels_us": a_kernels,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    res = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "per_call": per_call(),
        "drop_in": [drop_in(args.seq, False), drop_in(args.seq, True)],
    }
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
