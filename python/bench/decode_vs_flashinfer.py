# FP8 paged decode: fp8_attention.PagedPlan beside FlashInfer's BatchDecodeWithPagedKVCacheWrapper, same cache, same run.
"""python3 python/bench/decode_vs_flashinfer.py [--batch 64] [--keys 8192] [--page 64] [--out FILE]

Issue 34's decode anchor: one new token a sequence (Hq = 32, Hkv = 8, D = 128) over `--keys` cached keys in an E4M3
paged cache [num_pages, page, Hkv, D] (NHD: the layout both libraries read, so they read the same tensors), pages
shuffled through the pool. Times (CUDA events around 20 back-to-back calls, median of 7, after a warm-up):
  - ours: `fp8_attention.PagedPlan` planned once, `run` on E4M3 Q codes (as FlashInfer's plan / run); beside it the
    one-shot `sdpa_paged` (validate=False: no host copy of the table), which plans on every call;
  - FlashInfer: `BatchDecodeWithPagedKVCacheWrapper` planned once, on CUDA cores and on tensor cores, `run` on bf16 Q
    holding our Q codes' values with the FP8 cache (k_scale and v_scale as floats; FlashInfer's decode takes no FP8
    Q), if the flashinfer package imports and its kernels build on this machine (it compiles them with the machine's
    nvcc on first use); else why not;
  - a device-to-device copy of 1 GiB (torch), the bandwidth anchor.
Beside each events time: the host's time a call (queued without waiting), the time replayed from a CUDA graph, and
the kernels' device time (torch.profiler). Bandwidth: the bytes a call must move (K and V codes, Q, O in bf16, the table), over the time. Prints JSON.
"""
import argparse
import json
import sys
from unittest import mock

import torch

import fp8_attention as fa
from bench import cpu_us, events_us, kernels_us  # python/bench/bench.py: the same timers


def graph_us(fn, n=20):
    """A call's time replayed from a CUDA graph of `n` calls, in µs (median of 7 replays): no host time between them."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return events_us(g.replay, 1) / n


def timings(res, key, fn):
    """Events, host, graph and kernel times of `fn` into `res` under `key` (each failure reported, not raised)."""
    fn()
    torch.cuda.synchronize()
    res[key + "_us"] = events_us(fn, 20)
    for name, f in (("host", lambda f: cpu_us(f, 20)), ("graph", graph_us), ("kernels", lambda f: kernels_us(f, 20))):
        try:
            v = f(fn)
            if name == "kernels":
                total, _, per = v
                top = sorted(per.items(), key=lambda x: -x[1])[:6]
                res[key + "_kernels_us"], res[key + "_kernels"] = total, {k[:60]: round(t, 1) for k, t in top}
            else:
                res[key + f"_{name}_us"] = v
        except Exception as e:  # noqa: BLE001
            res[key + f"_{name}"] = f"not run: {type(e).__name__}: {e}"[:500]
    return res[key + "_us"]


def host_profile(fn, plan, run_args, n=20):
    """Prints where a planned run's host time goes: the whole run, the extension's launch alone (its arguments built
    once), the same launch with split-KV off, a bare call into the extension; then cProfile's top entries."""
    import cProfile
    import pstats
    from fp8_attention import _core

    args, _, _ = plan._launch_args(*run_args)
    nosplit = _core.KeptPlan(split_kv=False)
    res = {"run_host_us": cpu_us(fn, n), "launch_host_us": cpu_us(lambda: plan._core.launch(*args), n),
           "launch_unsplit_host_us": cpu_us(lambda: nosplit.launch(*args), n),
           "bare_call_us": cpu_us(plan._core.plans_made, n), "split": plan.last_split}
    print(json.dumps(res))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def import_flashinfer(res):
    """`import flashinfer`; modules its import asks for that this machine lacks (optional kernel families' packages,
    none of them on the decode path timed here) are stubbed one by one and named in `res["flashinfer_stubbed"]`."""
    stubbed = []
    for _ in range(64):
        try:
            import flashinfer
            res["flashinfer_version"] = flashinfer.__version__
            res["flashinfer_stubbed"] = stubbed
            return flashinfer
        except ModuleNotFoundError as e:
            if not e.name or e.name.startswith(("flashinfer", "torch", "tvm_ffi")) or e.name in stubbed:
                raise
            stubbed.append(e.name)
            sys.modules[e.name] = mock.MagicMock(__name__=e.name, __path__=[], __version__="99.0")
            for m in [m for m in sys.modules if m.startswith("flashinfer")]:
                del sys.modules[m]
    raise RuntimeError(f"flashinfer still does not import after stubbing {stubbed}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--host-profile", action="store_true",
                    help="where our call's host time goes (inside the extension, and cProfile's top), no FlashInfer")
    a = ap.parse_args()
    b, sk, page, hq, hkv, d = a.batch, a.keys, a.page, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(7)
    pages = (sk + page - 1) // page
    num_pages = b * pages
    to8 = lambda x: (x * 64).clamp(-448, 448).to(torch.float8_e4m3fn)  # noqa: E731  (unit normals, scale 1/64)
    k_cache = to8(torch.randn(num_pages, page, hkv, d, device="cuda", generator=g))
    v_cache = to8(torch.randn(num_pages, page, hkv, d, device="cuda", generator=g))
    perm = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32)
    table = perm.view(b, pages).contiguous()
    seq_lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    q_real = torch.randn(b, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
    q8 = to8(q_real.float())
    q_fi = (q8.float() / 64).to(torch.bfloat16)  # E4M3 values ×2⁻⁶: exact in bf16
    scale = 1.0 / 64
    one = torch.full((1,), scale, device="cuda")
    res = {"shape": {"batch": b, "keys": sk, "page": page, "hq": hq, "hkv": hkv, "d": d},
           "device": torch.cuda.get_device_name()}
    moved = 2 * num_pages * page * hkv * d + b * hq * d * 2 + b * hq * d * 2 + table.numel() * 4

    def oneshot():
        return fa.sdpa_paged(q8, k_cache, v_cache, table, seq_lens, cu_q, causal=True, q_scale=one, k_scale=one,
                             v_scale=one, validate=False, out_dtype=torch.bfloat16)

    plan = fa.PagedPlan(table, seq_lens, cu_q, page_size=page, causal=True)

    def ours():
        return plan.run(q8, k_cache, v_cache, q_scale=one, k_scale=one, v_scale=one, out_dtype=torch.bfloat16)

    if a.host_profile:
        return host_profile(ours, plan, (q8, k_cache, v_cache, one, one, one, None, torch.bfloat16))
    us = timings(res, "ours", ours)
    timings(res, "ours_oneshot", oneshot)
    res["ours_plans_made"] = plan.plans_made
    res["ours_gbs"] = moved / us / 1e3
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    cus = events_us(lambda: y.copy_(x), 5)
    res["copy_gbs"] = 2 * x.numel() / cus / 1e3
    res["ours_vs_copy"] = res["ours_gbs"] / res["copy_gbs"]
    try:
        flashinfer = import_flashinfer(res)
    except Exception as e:  # noqa: BLE001  (any failure to import is reported, not raised)
        res["flashinfer"] = f"not run: {type(e).__name__}: {e}"[:2000]
        flashinfer = None
    o_ours = ours()
    # FlashInfer's two decode paths: CUDA cores, and tensor cores (its prefill kernels, meant for GQA groups ≥ 4).
    for tc in (False, True) if flashinfer else ():
        key = "flashinfer_tc" if tc else "flashinfer_cc"
        try:
            ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
            indptr = torch.arange(0, num_pages + 1, pages, dtype=torch.int32, device="cuda")
            last = torch.full((b,), sk - (pages - 1) * page, dtype=torch.int32, device="cuda")
            w.plan(indptr, table.view(-1), last, hq, hkv, d, page, q_data_type=torch.bfloat16,
                   kv_data_type=torch.float8_e4m3fn)
            fi = lambda: w.run(q_fi, (k_cache, v_cache), k_scale=scale, v_scale=scale)  # noqa: E731
            o_fi = fi()
            fus = timings(res, key, fi)
            res[key + "_gbs"] = moved / fus / 1e3
            res[key + "_vs_copy"] = res[key + "_gbs"] / res["copy_gbs"]
            res["ours_vs_" + key] = fus / us
            # Both attend over the same values (Q: ours its E4M3 codes, FlashInfer their values in bf16, exact).
            res[key + "_rel_l2_to_ours"] = ((o_ours.float() - o_fi.float()).norm() / o_fi.float().norm()).item()
        except Exception as e:  # noqa: BLE001  (a failure to build or run is reported, not raised)
            res[key] = f"not run: {type(e).__name__}: {e}"[:2000]
        print(json.dumps(res), flush=True)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
