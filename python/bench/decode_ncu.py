# One call each of FP8 paged decode and the same keys packed (then FlashInfer's tensor-core decode if it imports): for ncu.
"""ncu -k regex:'stage8_varlen_pack|BatchPrefillWithPagedKVCache' python3 python/bench/decode_ncu.py [--batch 64]

Issue 34's decode shape (Hq = 32, Hkv = 8, D = 128, --keys keys a sequence, pages of --page rows shuffled through the
pool), run in this order, each once after a warm-up call: our PagedPlan run, our sdpa_varlen over the same keys packed
(token-major, as the cache rows in sequence order), FlashInfer's BatchDecodeWithPagedKVCacheWrapper on tensor cores.
Profile with `--launch-skip 1 --launch-count 1` per kernel name to take each one's second call.
"""
import argparse

import torch

import fp8_attention as fa


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--page", type=int, default=64)
    a = ap.parse_args()
    b, sk, page, hq, hkv, d = a.batch, a.keys, a.page, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(7)
    pages = (sk + page - 1) // page
    n = b * pages
    to8 = lambda x: (x * 64).clamp(-448, 448).to(torch.float8_e4m3fn)  # noqa: E731
    kc = to8(torch.randn(n, page, hkv, d, device="cuda", generator=g))
    vc = to8(torch.randn(n, page, hkv, d, device="cuda", generator=g))
    table = torch.randperm(n, device="cuda", generator=g).to(torch.int32).view(b, pages).contiguous()
    lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    cu_k = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sk
    q8 = to8(torch.randn(b, hq, d, device="cuda", generator=g))
    one = torch.full((1,), 1.0 / 64, device="cuda")
    sc = dict(q_scale=one, k_scale=one, v_scale=one)
    plan = fa.PagedPlan(table, lens, cu_q, page_size=page, causal=True)
    k = kc[table.view(-1).long()].reshape(b * pages * page, hkv, d)[: b * sk] if pages * page == sk else None
    v = vc[table.view(-1).long()].reshape(b * pages * page, hkv, d)[: b * sk] if pages * page == sk else None
    for _ in range(2):
        plan.run(q8, kc, vc, **sc)
    torch.cuda.synchronize()
    if k is not None:
        for _ in range(2):
            fa.sdpa_varlen(q8, k, v, cu_q, cu_k, causal=True, **sc)
    torch.cuda.synchronize()
    try:
        import flashinfer
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
                                                          "NHD", use_tensor_cores=True)
        w.plan(torch.arange(0, n + 1, pages, dtype=torch.int32, device="cuda"), table.view(-1),
               torch.full((b,), sk - (pages - 1) * page, dtype=torch.int32, device="cuda"), hq, hkv, d, page,
               q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
        qf = (q8.float() / 64).to(torch.bfloat16)
        for _ in range(2):
            w.run(qf, (kc, vc), k_scale=1.0 / 64, v_scale=1.0 / 64)
    except Exception as e:  # noqa: BLE001
        print(f"flashinfer not run: {type(e).__name__}: {e}"[:300])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
