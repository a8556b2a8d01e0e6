# FP8 paged decode: fp8_attention.sdpa_paged beside FlashInfer's BatchDecodeWithPagedKVCacheWrapper, same cache, same run.
"""python3 python/bench/decode_vs_flashinfer.py [--batch 64] [--keys 8192] [--page 64] [--out FILE]

Issue 34's decode anchor: one new token a sequence (Hq = 32, Hkv = 8, D = 128) over `--keys` cached keys in an E4M3
paged cache [num_pages, page, Hkv, D] (NHD: the layout both libraries read, so they read the same tensors), pages
shuffled through the pool. Times (CUDA events around 20 back-to-back calls, median of 7, after a warm-up):
  - ours: `fp8_attention.sdpa_paged` on E4M3 Q codes (validate=False: no host copy of the table);
  - FlashInfer: `BatchDecodeWithPagedKVCacheWrapper` planned once, `run` on bf16 Q with the FP8 cache (k_scale and
    v_scale as floats; FlashInfer's decode takes no FP8 Q), if the flashinfer package imports and its kernels build on
    this machine (it compiles them with the machine's nvcc on first use); else why not;
  - a device-to-device copy of 1 GiB (torch), the bandwidth anchor.
Bandwidth: the bytes a call must move (K and V codes, Q, O in bf16, the table), over the time. Prints JSON.
"""
import argparse
import json
import statistics

import torch

import fp8_attention as fa


def events_us(fn, n=20, reps=7):
    """Median over `reps` of one call's share of `n` back-to-back calls, in µs (CUDA events)."""
    fn()
    torch.cuda.synchronize()
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--out", default=None)
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
    scale = 1.0 / 64
    one = torch.full((1,), scale, device="cuda")
    res = {"shape": {"batch": b, "keys": sk, "page": page, "hq": hq, "hkv": hkv, "d": d},
           "device": torch.cuda.get_device_name()}
    moved = 2 * num_pages * page * hkv * d + b * hq * d * 2 + b * hq * d * 2 + table.numel() * 4

    def ours():
        return fa.sdpa_paged(q8, k_cache, v_cache, table, seq_lens, cu_q, causal=True, q_scale=one, k_scale=one,
                             v_scale=one, validate=False, out_dtype=torch.bfloat16)

    us = events_us(ours)
    res["ours_us"] = us
    res["ours_gbs"] = moved / us / 1e3
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    cus = events_us(lambda: y.copy_(x), n=5)
    res["copy_gbs"] = 2 * x.numel() / cus / 1e3
    res["ours_vs_copy"] = res["ours_gbs"] / res["copy_gbs"]
    try:
        import flashinfer
        ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        indptr = torch.arange(0, num_pages + 1, pages, dtype=torch.int32, device="cuda")
        last = torch.full((b,), sk - (pages - 1) * page, dtype=torch.int32, device="cuda")
        w.plan(indptr, table.view(-1), last, hq, hkv, d, page, q_data_type=torch.bfloat16,
               kv_data_type=torch.float8_e4m3fn)
        fi = lambda: w.run(q_real, (k_cache, v_cache), k_scale=scale, v_scale=scale)  # noqa: E731
        o_fi = fi()
        o_ours = ours()
        res["flashinfer_us"] = events_us(fi)
        res["flashinfer_gbs"] = moved / res["flashinfer_us"] / 1e3
        res["ours_vs_flashinfer"] = res["flashinfer_us"] / us
        # Both attend over the same codes (Q: ours its E4M3 codes, FlashInfer the bf16 values they came from).
        res["rel_l2_between"] = ((o_ours.float() - o_fi.float()).norm() / o_fi.float().norm()).item()
    except Exception as e:  # noqa: BLE001  (any failure to import, build or run is reported, not raised)
        res["flashinfer"] = f"not run: {type(e).__name__}: {e}"[:2000]
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
