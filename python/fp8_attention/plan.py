# fp8_attention.PagedPlan: a paged batch planned once (boundaries, device plan) and run once a layer.
"""``PagedPlan``: plan a paged batch once a step, run it once a layer (as FlashInfer's ``plan`` / ``run``).

A decode step attends the same batch — block table, lengths, new tokens — in every layer, over each layer's cache.
``sdpa_paged`` redoes the batch's work on every call (the key boundaries' prefix sums, the device's unit plan, its
checks); ``PagedPlan`` does it once, in its constructor and first run, and each ``run`` then queues the attention
alone (with split-KV: its prep and merge too). The batch's tensors are kept (not copied): their values must not change
until the plan's last run, or ``replan()`` must be called after they do.
"""
from __future__ import annotations

import math


class PagedPlan:
    """A batch over a paged FP8 KV cache, planned for repeated runs.

    block_table int32 [B, max_pages], seq_lens int32 [B] (keys a sequence, its new tokens last) and cu_seqlens_q int32
    [B + 1] on the GPU, as ``sdpa_paged`` takes them; `page_size` the cache's rows a page. `validate` (on by default)
    copies them to the host once, here, and checks them (a sync; then ``run`` also checks that q holds the batch's
    tokens and the pool holds every page the table names). `causal`, `window`, `pack_heads` and `split_kv` are the
    batch's, as ``sdpa_paged``'s.
    """

    def __init__(self, block_table, seq_lens, cu_seqlens_q, *, page_size, causal=False, window=None, pack_heads=True,
                 split_kv=True, validate=True):
        from . import _check_boundaries, _core, _dtype, _is_tensor, as_tensor, window_sides
        import torch

        self._win = window_sides(window)
        named = (("block_table", as_tensor(block_table, "block_table"), 2), ("seq_lens", as_tensor(seq_lens, "seq_lens"), 1),
                 ("cu_seqlens_q", as_tensor(cu_seqlens_q, "cu_seqlens_q"), 1))
        for name, t, rank in named:
            if not _is_tensor(t):
                raise TypeError(f"`{name}` must be a torch tensor, not {type(t).__name__}")
            if getattr(t.device, "type", None) != "cuda" or getattr(t.device, "index", 0) not in (0, None):
                raise ValueError(f"`{name}` is on {t.device}: fp8_attention runs on cuda:0")
            if _dtype(t) != "torch.int32" or len(t.shape) != rank:
                raise TypeError(f"`{name}` is {_dtype(t)} of shape {tuple(t.shape)}: it must be int32 of rank {rank}")
        table, lens, cu_q = (t.contiguous() for _, t, _ in named)
        b = cu_q.shape[0] - 1
        if lens.shape[0] != b or table.shape[0] != b:
            raise ValueError(f"cu_seqlens_q bounds {b} sequences, seq_lens has {lens.shape[0]} and block_table "
                             f"{table.shape[0]} rows")
        if page_size not in (16, 32, 64, 128, 256):
            raise ValueError(f"page size {page_size}: the kernels take a power of two from 16 to 256")
        self.batch, self.page_size, self.max_pages = b, page_size, table.shape[1]
        self.causal = bool(causal)
        self._table, self._lens, self._cu_q = table, lens, cu_q
        # Known only when validated: the packed query tokens, and the largest page index the table's used entries name.
        self._total_q = self._top_page = None
        if validate:
            c = cu_q.tolist()
            _check_boundaries("cu_seqlens_q", cu_q, c[-1] if c else 0)
            self._total_q = c[-1]
            top = -1
            for i, (n, row) in enumerate(zip(lens.tolist(), table.tolist())):
                if n < 0 or n > self.max_pages * page_size:
                    raise ValueError(f"sequence {i} has {n} keys: its {self.max_pages} pages of {page_size} hold 0 "
                                     f"to {self.max_pages * page_size}")
                for j in range((n + page_size - 1) // page_size):
                    if row[j] < 0:
                        raise ValueError(f"block_table[{i}][{j}] = {row[j]} is not a page index")
                    top = max(top, row[j])
            self._top_page = top
        # The keys' boundaries: the prefix sums of the lengths, on the device, once.
        self._cu_k = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
        self._core = _core.KeptPlan(pack_heads=bool(pack_heads), split_kv=bool(split_kv))
        self._checked = None

    def replan(self):
        """The batch's tensors changed in place: the next run plans again (their values are not checked again)."""
        import torch

        torch.cumsum(self._lens, 0, dtype=torch.int32, out=self._cu_k[1:])
        self._core.replan()

    @property
    def plans_made(self):
        """Device plans queued so far (one for the batch, unless runs changed its shape or replan was called)."""
        return self._core.plans_made()

    @property
    def last_split(self):
        """Chunks a sequence's keys were cut into at the last run (1: no split)."""
        return self._core.last_split()

    def _check(self, q, k_cache, v_cache, q_scale, k_scale, v_scale, scale, out_dtype):
        """check_paged_args on the plan's batch, then what the plan fixed: the page size, the tokens, the pool's pages."""
        from . import check_paged_args

        check_paged_args(q, k_cache, v_cache, self._table, self._lens, self._cu_q, q_scale=q_scale, k_scale=k_scale,
                         v_scale=v_scale, scale=scale, out_dtype=out_dtype)
        tq, num_pages, page = q.shape[0], k_cache.shape[0], k_cache.shape[1]
        if page != self.page_size:
            raise ValueError(f"`k_cache` has pages of {page} rows: the plan is for {self.page_size}")
        if self._total_q is not None and tq != self._total_q:
            raise ValueError(f"`q` holds {tq} tokens: the plan's cu_seqlens_q ends at {self._total_q}")
        if self._top_page is not None and self._top_page >= num_pages:
            raise ValueError(f"the plan's block_table names page {self._top_page}: the pool holds {num_pages}")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("`k_cache` and `v_cache` must be contiguous pools")

    def run(self, q, k_cache, v_cache, *, q_scale, k_scale, v_scale, scale=None, out_dtype=None, return_lse=False):
        """The batch's attention over one layer's cache: q [total_q, H, D] E4M3 codes, k_cache and v_cache [num_pages,
        page_size, Hkv, D] E4M3 pools, f32 scales per (sequence, head) or one. As ``sdpa_paged(q, k_cache, v_cache,
        *batch)``, bit for bit; runs on torch's current stream. Returns O [total_q, H, D] (bf16 unless `out_dtype`),
        and with `return_lse` the LSE [H, total_q].
        """
        args, o, lse = self._launch_args(q, k_cache, v_cache, q_scale, k_scale, v_scale, scale, out_dtype)
        if args is not None:
            self._core.launch(*args)
        return (o, lse) if return_lse else o

    def _launch_args(self, q, k_cache, v_cache, q_scale, k_scale, v_scale, scale, out_dtype):
        """run's checks and outputs, and the extension's launch arguments (None: nothing to launch); O and LSE shaped."""
        from . import _check_fp8_scales, _check_scale, _out_name, _packed_scales, _stream
        import torch

        sig = (tuple(q.shape), tuple(q.stride()), q.dtype, q.device, tuple(k_cache.shape), k_cache.dtype,
               k_cache.device, tuple(v_cache.shape), v_cache.dtype, v_cache.device, k_cache.is_contiguous(),
               v_cache.is_contiguous())
        if sig != self._checked:
            self._check(q, k_cache, v_cache, q_scale, k_scale, v_scale, scale, out_dtype)
            self._checked = sig
        (tq, h, d), (num_pages, page, hkv, _) = q.shape, k_cache.shape
        b = self.batch
        nq, nkv = b * h, b * hkv
        _check_fp8_scales((("q_scale", q_scale, nq), ("k_scale", k_scale, nkv), ("v_scale", v_scale, nkv)),
                          "(sequence, head)", "E4M3 inputs need", on_gpu=True)
        _check_scale(scale)
        out = _out_name(out_dtype, "bf16")
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
        if b == 0 or tq == 0:
            o = torch.empty(tq, h, d, dtype=tdt, device=q.device)
            return None, o, torch.full((h, tq), float("-inf"), dtype=torch.float32, device=q.device)
        qst = q.stride()
        if qst[2] != 1 or q.data_ptr() % 16 or qst[0] % 16 or qst[1] % 16:
            q = q.contiguous()
            qst = q.stride()
        # A one-element scale goes as it is: the kernels read it for every (sequence, head) (no copy, no kernel).
        scales, one = _packed_scales(q_scale, k_scale, v_scale, nq, nkv)
        o = torch.empty(tq, h, d, dtype=tdt, device=q.device)
        lse = torch.empty(h, tq, dtype=torch.float32, device=q.device)
        tensors = [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), scales[0].data_ptr(), scales[1].data_ptr(),
                   scales[2].data_ptr(), o.data_ptr(), lse.data_ptr()]
        strides = [[qst[0], qst[1]], [hkv * d, d], [hkv * d, d]]
        batch = ((tensors, [self._cu_q.data_ptr(), self._cu_k.data_ptr()], strides),
                 (b, h, hkv, d, tq, self.max_pages * page), self.causal,
                 float(scale if scale is not None else 1.0 / math.sqrt(d)), out,
                 (self._table.data_ptr(), self.max_pages, page, num_pages), self._win, one)
        args = (batch, _stream(q.device))
        # Kept until the next run, past the launch's queueing (torch's caching allocator reuses freed memory in stream
        # order, so a later run's buffers wait for this launch).
        self._scales = scales
        return args, o, lse
