# fp8_attention.PagedPlan on the GPU: plan once, run per layer — sdpa_paged's bits, one device plan, graphs, bad input.
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import fp8_attention as fa  # noqa: E402


def paged_batch(lens, h, hkv, d, page, g, layers=2):
    """A batch of (new tokens, keys) `lens` over `layers` layers' paged caches (pages shuffled through each pool):
    (q codes, cu_seqlens_q, seq_lens, block_table, [(k_cache, v_cache, q_scale, k_scale, v_scale)] a layer)."""
    to8 = lambda x: (x / 0.02).clamp(-448, 448).to(torch.float8_e4m3fn)  # noqa: E731
    b = len(lens)
    cq = torch.tensor([0] + [sum(x[0] for x in lens[: i + 1]) for i in range(b)], dtype=torch.int32, device="cuda")
    pages = [(sk + page - 1) // page for _, sk in lens]
    n, mp = sum(pages), max(pages)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5)).tolist()
    table = torch.zeros(b, mp, dtype=torch.int32)
    at = 0
    for i in range(b):
        for j in range(pages[i]):
            table[i, j] = perm[at]
            at += 1
    q = to8(torch.randn(int(cq[-1]), h, d, device="cuda", generator=g))
    per = []
    for layer in range(layers):
        kc = to8(torch.randn(n, page, hkv, d, device="cuda", generator=g))
        vc = to8(torch.randn(n, page, hkv, d, device="cuda", generator=g))
        # Layer 0: one scale each; later layers: one per (sequence, head).
        if layer == 0:
            sc = [torch.full((1,), 0.02, device="cuda") for _ in range(3)]
        else:
            sc = [torch.rand(b * m, device="cuda", generator=g) * 0.02 + 0.01 for m in (h, hkv, hkv)]
        per.append((kc, vc, *sc))
    seq_lens = torch.tensor([sk for _, sk in lens], dtype=torch.int32, device="cuda")
    return q, cq, seq_lens, table.cuda(), per


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("lens, h, hkv, d, causal", [
    ([(1, 20000), (1, 3000)], 8, 2, 128, True),  # decode of two long sequences: split-KV
    ([(1, 700), (5, 1300), (0, 64), (1, 1)], 8, 2, 64, True),  # a mixed step, no split
    ([(3, 900), (1, 2000)], 4, 4, 128, False),  # heads not grouped
])
def test_a_plan_runs_each_layer_as_sdpa_paged_bit_for_bit(lens, h, hkv, d, causal):
    # Plan once, run layer 0, layer 1 and layer 0 again: each run gives sdpa_paged's bits (O and LSE) for its layer,
    # and the device planned the batch once.
    page = 64
    g = torch.Generator(device="cuda").manual_seed(41)
    q, cq, seq_lens, table, layers = paged_batch(lens, h, hkv, d, page, g)
    plan = fa.PagedPlan(table, seq_lens, cq, page_size=page, causal=causal)
    for layer in (0, 1, 0):
        kc, vc, qs, ks, vs = layers[layer]
        got, gl = plan.run(q, kc, vc, q_scale=qs, k_scale=ks, v_scale=vs, return_lse=True)
        want, wl = fa.sdpa_paged(q, kc, vc, table, seq_lens, cq, causal=causal, q_scale=qs, k_scale=ks, v_scale=vs,
                                 return_lse=True)
        assert same_bits(got, want) and torch.equal(gl, wl), layer
    assert plan.plans_made == 1, plan.plans_made
    if lens[0] == (1, 20000):
        assert plan.last_split > 1


def test_replan_after_the_batch_changes_in_place():
    # The lengths change in place (a step later, one sequence shorter): after replan the run gives sdpa_paged's bits
    # for the new lengths, with a second device plan.
    h, hkv, d, page = 8, 2, 128, 64
    g = torch.Generator(device="cuda").manual_seed(43)
    q, cq, seq_lens, table, layers = paged_batch([(1, 5000), (1, 3000)], h, hkv, d, page, g, layers=1)
    kc, vc, qs, ks, vs = layers[0]
    sc = dict(q_scale=qs, k_scale=ks, v_scale=vs)
    plan = fa.PagedPlan(table, seq_lens, cq, page_size=page, causal=True)
    plan.run(q, kc, vc, **sc)
    seq_lens[0] = 2500
    plan.replan()
    got = plan.run(q, kc, vc, **sc)
    assert same_bits(got, fa.sdpa_paged(q, kc, vc, table, seq_lens, cq, causal=True, **sc))
    assert plan.plans_made == 2


def test_a_planned_run_replays_from_a_cuda_graph():
    # A run captured in a CUDA graph (after a first run planned the batch) replays to the eager run's bits, over a
    # cache rewritten in place between replays.
    h, hkv, d, page = 8, 2, 128, 64
    g = torch.Generator(device="cuda").manual_seed(47)
    q, cq, seq_lens, table, layers = paged_batch([(1, 20000), (1, 3000)], h, hkv, d, page, g)
    kc, vc, qs, ks, vs = layers[0]
    sc = dict(q_scale=qs, k_scale=ks, v_scale=vs)
    plan = fa.PagedPlan(table, seq_lens, cq, page_size=page, causal=True)
    plan.run(q, kc, vc, **sc)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.run(q, kc, vc, **sc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(q, kc, vc, **sc)
    for layer in (1, 0):
        kc.copy_(layers[layer][0])
        vc.copy_(layers[layer][1])
        graph.replay()
        torch.cuda.synchronize()
        assert same_bits(out, fa.sdpa_paged(q, kc, vc, table, seq_lens, cq, causal=True, **sc)), layer


def test_bad_runs_are_named_before_any_launch():
    h, hkv, d, page = 8, 2, 64, 64
    g = torch.Generator(device="cuda").manual_seed(53)
    q, cq, seq_lens, table, layers = paged_batch([(2, 300), (1, 100)], h, hkv, d, page, g, layers=1)
    kc, vc, qs, ks, vs = layers[0]
    sc = dict(q_scale=qs, k_scale=ks, v_scale=vs)
    plan = fa.PagedPlan(table, seq_lens, cq, page_size=page)
    with pytest.raises(ValueError, match="holds 2 tokens: the plan's cu_seqlens_q ends at 3"):
        plan.run(q[:2], kc, vc, **sc)
    with pytest.raises(ValueError, match="the pool holds 3"):
        plan.run(q, kc[:3], vc[:3], **sc)
    with pytest.raises(ValueError, match="pages of 32 rows: the plan is for 64"):
        plan.run(q, kc.view(-1, 32, hkv, d), vc.view(-1, 32, hkv, d), **sc)
    with pytest.raises(TypeError, match="`k_scale` .* float32"):
        plan.run(q, kc, vc, q_scale=qs, k_scale=ks.double(), v_scale=vs)
    with pytest.raises(ValueError, match="page size 48"):
        fa.PagedPlan(table, seq_lens, cq, page_size=48)
    bad = seq_lens.clone()
    bad[0] = 400
    with pytest.raises(ValueError, match="sequence 0 has 400 keys: its 5 pages of 64 hold 0 to 320"):
        fa.PagedPlan(table, bad, cq, page_size=64)
    assert plan.plans_made == 0
