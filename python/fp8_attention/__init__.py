# fp8_attention: scaled-dot-product attention on FP8 (E4M3) tensor cores for PyTorch CUDA tensors.
"""FP8 (E4M3) scaled-dot-product attention for PyTorch.

``sdpa(q, k, v)`` takes torch CUDA tensors [B, H, S, D] (k and v may have fewer heads than q: grouped-query
attention, H a multiple of theirs) in bfloat16, float16 or float32, quantized to E4M3 on the GPU with one scale per
(batch, head); or E4M3 codes with their scales: ``torch.float8_e4m3fn`` tensors, or ``uint8`` ones holding the
codes (FP8 as bytes, for frameworks and DLPack versions without the type). Arrays of other frameworks (CuPy, JAX,
Numba, ...) are read in place through DLPack (``__dlpack__``) or ``__cuda_array_interface__``. It runs on torch's
current stream, allocates its outputs through torch, and copies nothing to the host. Every bad argument raises
``TypeError`` or ``ValueError`` naming it before anything runs on the GPU.
"""
from __future__ import annotations

import functools
import math

__all__ = [
    "sdpa", "sdpa_varlen", "sdpa_paged", "check_args", "check_varlen_args", "check_paged_args", "as_tensor", "warm",
    "window_sides", "PagedPlan",
]

_REAL = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}
_FP8 = "torch.float8_e4m3fn"
_CODES = "torch.uint8"  # E4M3 codes as bytes
_E4M3_MAX = 448.0


def _dtype(t) -> str:
    return str(t.dtype)


def _is_tensor(x) -> bool:
    return all(hasattr(x, a) for a in ("dtype", "shape", "device", "data_ptr"))


def as_tensor(x, name="x"):
    """x as a torch tensor over the same memory (no copy): a torch tensor as it is, another framework's GPU array
    through DLPack (``__dlpack__``, on torch's current stream) or ``__cuda_array_interface__``. None stays None.

    Raises TypeError naming `name` for anything else, or when torch is needed and not installed.
    """
    if x is None or _is_tensor(x):
        return x
    dl, cai = hasattr(x, "__dlpack__"), hasattr(x, "__cuda_array_interface__")
    if not (dl or cai):
        raise TypeError(
            f"`{name}` must be a torch tensor or a GPU array with __dlpack__ or __cuda_array_interface__, "
            f"not {type(x).__name__}"
        )
    try:
        import torch
    except ImportError as e:
        raise TypeError(f"`{name}` is a {type(x).__name__}: reading it needs torch, which is not installed") from e
    return torch.from_dlpack(x) if dl else torch.as_tensor(x, device="cuda")


def _check_fp8_scales(scales, per, need, on_gpu=False):
    """Each (name, scale tensor, n) in `scales`: float32, one or n (one per `per`) values, on the GPU if `on_gpu`;
    `need` opens the error for a missing one."""
    for name, sc, n in scales:
        if sc is None:
            raise TypeError(f"{need} `{name}` (float32, one per {per} or one)")
        if _dtype(sc) != "torch.float32":
            raise TypeError(f"`{name}` is {_dtype(sc)}: it must be float32")
        dev = getattr(sc, "device", None)
        if on_gpu and (getattr(dev, "type", None) != "cuda" or getattr(dev, "index", 0) not in (0, None)):
            raise ValueError(f"`{name}` is on {dev if dev is not None else '?'}: it must be on the GPU with q, k, v "
                             "(cuda:0)")
        if sc.numel() not in (1, n):
            raise ValueError(f"`{name}` holds {sc.numel()} scales: one, or one per {per} = {n}")


def _check_no_scales(*scales):
    if any(sc is not None for sc in scales):
        raise TypeError("q_scale, k_scale and v_scale go with E4M3 inputs (float8_e4m3fn or uint8 codes); real inputs "
                        "are quantized here")


def window_sides(window):
    """A sliding window as the kernels take it: None (no window) → (-1, -1); (left, right), each a number of keys
    (0 or more) or -1 (or None) for unbounded. Checked on the CPU; anything else is named."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"`window` must be None or (left, right), not {window!r}")
    sides = []
    for name, x in zip(("left", "right"), window):
        if x is None:
            x = -1
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"`window` {name} must be an int (keys; -1 for unbounded), not {type(x).__name__}")
        if x < -1:
            raise ValueError(f"`window` {name} = {x}: a number of keys (0 or more) or -1 for unbounded")
        sides.append(x)
    return tuple(sides)


def _check_scale(scale):
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale = {scale!r} is not a positive finite number")


def _out_name(out_dtype, default):
    """O's dtype as the extension names it: `default` when out_dtype is None."""
    out = default if out_dtype is None else _REAL.get(str(out_dtype))
    if out is None:
        raise TypeError(f"out_dtype {out_dtype} is not supported: torch.bfloat16, torch.float16 or torch.float32")
    return out


def check_args(q, k, v, *, q_scale=None, k_scale=None, v_scale=None, scale=None, out_dtype=None):
    """Checks sdpa's arguments without touching the GPU; returns (B, H, Hkv, Sq, Sk, D, fp8, out dtype name).

    Raises TypeError for a wrong type or dtype and ValueError for a wrong device, shape, head ratio or scale, each
    naming the argument.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _is_tensor(t):
            raise TypeError(f"`{name}` must be a torch tensor (as_tensor reads other arrays), not {type(t).__name__}")
        if getattr(t.device, "type", None) != "cuda":
            raise ValueError(f"`{name}` is on {t.device}: fp8_attention runs on CUDA tensors")
        if getattr(t.device, "index", 0) not in (0, None):
            raise ValueError(f"`{name}` is on {t.device}: fp8_attention runs on cuda:0")
        if len(t.shape) != 4:
            raise ValueError(f"`{name}` has shape {tuple(t.shape)}: expected [B, H, S, D]")
    dts = {_dtype(q), _dtype(k), _dtype(v)}
    if len(dts) != 1:
        raise TypeError(f"q, k and v must share a dtype; they are {_dtype(q)}, {_dtype(k)}, {_dtype(v)}")
    dt = dts.pop()
    fp8 = dt in (_FP8, _CODES)
    if not fp8 and dt not in _REAL:
        raise TypeError(f"dtype {dt} is not supported: bfloat16, float16, float32, float8_e4m3fn or uint8 (E4M3 codes)")
    (b, h, sq, d), (bk, hkv, sk, dk) = tuple(q.shape), tuple(k.shape)
    if tuple(v.shape) != (bk, hkv, sk, dk):
        raise ValueError(f"`k` {tuple(k.shape)} and `v` {tuple(v.shape)} must have the same shape")
    if (b, d) != (bk, dk):
        raise ValueError(f"`q` {tuple(q.shape)} and `k` {tuple(k.shape)}: B and D must agree")
    if min(b, h, sq, sk, hkv) < 1:
        raise ValueError(f"`q` {tuple(q.shape)}, `k` {tuple(k.shape)}: every size must be at least 1")
    if d not in (64, 128, 256):
        raise ValueError(f"head dimension D = {d} is not supported: D = 64, 128 or 256")
    if h % hkv:
        raise ValueError(f"H = {h} query heads is not a multiple of Hkv = {hkv} key/value heads")
    scales = (("q_scale", q_scale, b * h), ("k_scale", k_scale, b * hkv), ("v_scale", v_scale, b * hkv))
    if fp8:
        _check_fp8_scales(scales, "(batch, head)", f"E4M3 inputs ({dt}) need", on_gpu=True)
    else:
        _check_no_scales(q_scale, k_scale, v_scale)
    _check_scale(scale)
    out = _out_name(out_dtype, "bf16" if fp8 else _REAL[dt])
    return b, h, hkv, sq, sk, d, fp8, out


def _readable(t, d):
    """t, or a contiguous copy when the device quantizer cannot read it in place (D not contiguous, an address or
    a stride not a multiple of 16 bytes, rows overlapping)."""
    st, es = t.stride(), t.element_size()
    if st[3] == 1 and st[2] >= d and t.data_ptr() % 16 == 0 and all(x * es % 16 == 0 for x in st[:3]):
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)  # a new allocation: aligned, whatever t's offset


def _pad4(n):
    return (n + 3) // 4 * 4


def _quantize(q, k, v, dt, b, h, hkv, sq, sk, d, stream):
    """E4M3 codes of q, k, v (their own layouts, read in place) with one scale per (batch, head), made on the GPU
    by one amax and one quantize kernel a tensor, into buffers torch allocates (so a CUDA graph can capture it)."""
    import torch

    from . import _core

    q, k, v = (_readable(t, d) for t in (q, k, v))
    nq, nkv = b * h * sq * d, b * hkv * sk * d
    codes = torch.empty(nq + 2 * nkv, dtype=torch.uint8, device=q.device)
    sq4, skv4 = _pad4(b * h), _pad4(b * hkv)
    scales = torch.empty(sq4 + 2 * skv4, dtype=torch.float32, device=q.device)
    amax = torch.zeros(b * h + 2 * b * hkv, dtype=torch.int32, device=q.device)
    cp, sp = codes.data_ptr(), scales.data_ptr()
    c = (cp, cp + nq, cp + nq + nkv)
    s = (sp, sp + 4 * sq4, sp + 4 * (sq4 + skv4))
    _core.quantize([(t.data_ptr(), tuple(t.stride()[:3])) for t in (q, k, v)], dt, c, s, amax.data_ptr(),
                   b, h, hkv, sq, sk, d, stream)
    return c, s, (codes, scales)


def _per_head(sc, n):
    if sc.numel() == n and sc.is_contiguous():
        return sc
    return (sc.reshape(1).expand(n) if sc.numel() == 1 else sc.reshape(n)).contiguous()


def _packed_scales(q_scale, k_scale, v_scale, nq, nkv):
    """A packed batch's three scales as the extension takes them: (tensors, one) — a one-element scale as it is, read
    for every (sequence, head) by the kernels (no expanded copy, no kernel), else its `nq` or `nkv` contiguous values;
    `one` says which are one-element."""
    named = ((q_scale, nq), (k_scale, nkv), (v_scale, nkv))
    one = tuple(sc.numel() == 1 for sc, _ in named)
    return tuple(sc if o else _per_head(sc, n) for (sc, n), o in zip(named, one)), one


def _stream(device):
    """The raw handle of torch's current CUDA stream on `device` (torch's own fast getter where it has one:
    torch.cuda.current_stream builds a Stream object, ~8 µs a call)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


@functools.lru_cache(maxsize=1024)
def _output_rows(b, h, hkv, sq, sk, d, causal, window=(-1, -1)):
    from . import _core

    return _core.output_rows(b, h, hkv, sq, sk, d, causal, window)


def sdpa(q, k, v, *, causal=False, scale=None, out_dtype=None, return_lse=False, q_scale=None, k_scale=None,
         v_scale=None, window=None):
    """softmax(scale · q·kᵀ) · v on E4M3 tensor cores.

    q [B, H, Sq, D], k and v [B, Hkv, Sk, D] (H a multiple of Hkv), all on cuda:0, in bfloat16, float16 or float32
    (quantized to E4M3 here, one scale per (batch, head)), or E4M3 codes (float8_e4m3fn, or uint8 bytes) with
    `q_scale`, `k_scale`, `v_scale` (float32: one per (batch, head), or one). Torch tensors, or other frameworks'
    GPU arrays read in place through DLPack or __cuda_array_interface__ (`as_tensor`). `causal` masks key j from query i when j > i + Sk − Sq (bottom-right).
    `scale` defaults to 1/√D; `out_dtype` to q's dtype (bfloat16 for FP8 inputs). `window` = (left, right) keys, -1 for
    unbounded: query i sees keys i + Sk − Sq − left ≤ j ≤ i + Sk − Sq + right (with `causal`, right is 0; D = 64 or
    128). Returns O [B, H, Sq, D], and with `return_lse` also the LSE [B, H, Sq] (float32, natural log). Runs on torch's
    current stream.
    """
    win = window_sides(window)
    q, k, v = as_tensor(q, "q"), as_tensor(k, "k"), as_tensor(v, "v")
    q_scale, k_scale = as_tensor(q_scale, "q_scale"), as_tensor(k_scale, "k_scale")
    v_scale = as_tensor(v_scale, "v_scale")
    b, h, hkv, sq, sk, d, fp8, out = check_args(q, k, v, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                                scale=scale, out_dtype=out_dtype)
    import torch

    from . import _core

    stream = _stream(q.device)
    if fp8:
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        qs, ks, vs = _per_head(q_scale, b * h), _per_head(k_scale, b * hkv), _per_head(v_scale, b * hkv)
        c = (qc.data_ptr(), kc.data_ptr(), vc.data_ptr())
        sc = (qs.data_ptr(), ks.data_ptr(), vs.data_ptr())
    else:
        c, sc, _keep = _quantize(q, k, v, _REAL[_dtype(q)], b, h, hkv, sq, sk, d, stream)
    rows = _output_rows(b, h, hkv, sq, sk, d, bool(causal), win)
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
    o = torch.empty(rows * d, dtype=tdt, device=q.device)
    lse = torch.empty(rows, dtype=torch.float32, device=q.device)
    _core.launch(*c, *sc, o.data_ptr(), lse.data_ptr(), b, h, hkv, sq, sk, d, bool(causal),
                 float(scale if scale is not None else 1.0 / math.sqrt(d)), out, stream, win)
    o = o[: b * h * sq * d].view(b, h, sq, d)
    return (o, lse[: b * h * sq].view(b, h, sq)) if return_lse else o


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, *, q_scale=None, k_scale=None, v_scale=None, scale=None,
                      out_dtype=None):
    """Checks sdpa_varlen's arguments without touching the GPU; returns (B, H, Hkv, total_q, total_k, D, fp8, out dtype
    name). The boundaries' values are not read here (sdpa_varlen's `validate` does).

    Raises TypeError for a wrong type or dtype and ValueError for a wrong device, shape, head ratio or scale count,
    each naming the argument.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not _is_tensor(t):
            raise TypeError(f"`{name}` must be a torch tensor (as_tensor reads other arrays), not {type(t).__name__}")
        if getattr(t.device, "type", None) != "cuda" or getattr(t.device, "index", 0) not in (0, None):
            raise ValueError(f"`{name}` is on {t.device}: fp8_attention runs on cuda:0")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 3:
            raise ValueError(f"`{name}` has shape {tuple(t.shape)}: expected packed [total tokens, heads, D]")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if _dtype(t) != "torch.int32" or len(t.shape) != 1 or t.shape[0] < 1:
            raise TypeError(f"`{name}` is {_dtype(t)} of shape {tuple(t.shape)}: it must be int32 [B + 1]")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries and cu_seqlens_k {cu_seqlens_k.shape[0]}:"
                         " both are B + 1")
    b = cu_seqlens_q.shape[0] - 1
    dts = {_dtype(q), _dtype(k), _dtype(v)}
    if len(dts) != 1:
        raise TypeError(f"q, k and v must share a dtype; they are {_dtype(q)}, {_dtype(k)}, {_dtype(v)}")
    dt = dts.pop()
    fp8 = dt in (_FP8, _CODES)
    if not fp8 and dt not in _REAL:
        raise TypeError(f"dtype {dt} is not supported: bfloat16, float16, float32, float8_e4m3fn or uint8 (E4M3 codes)")
    (tq, h, d), (tk, hkv, dk) = tuple(q.shape), tuple(k.shape)
    if tuple(v.shape) != (tk, hkv, dk):
        raise ValueError(f"`k` {tuple(k.shape)} and `v` {tuple(v.shape)} must have the same shape")
    if d != dk:
        raise ValueError(f"`q` {tuple(q.shape)} and `k` {tuple(k.shape)}: D must agree")
    if min(h, hkv) < 1:
        raise ValueError(f"`q` {tuple(q.shape)}, `k` {tuple(k.shape)}: heads must be at least 1")
    if d not in (64, 128):
        raise ValueError(f"head dimension D = {d} is not supported by packed batches: D = 64 or 128")
    if h % hkv:
        raise ValueError(f"H = {h} query heads is not a multiple of Hkv = {hkv} key/value heads")
    scales = (("q_scale", q_scale, b * h), ("k_scale", k_scale, b * hkv), ("v_scale", v_scale, b * hkv))
    if fp8:
        _check_fp8_scales(scales, "(sequence, head)", f"E4M3 inputs ({dt}) need", on_gpu=True)
    else:
        _check_no_scales(q_scale, k_scale, v_scale)
    _check_scale(scale)
    out = _out_name(out_dtype, "bf16" if fp8 else _REAL[dt])
    return b, h, hkv, tq, tk, d, fp8, out


def _check_boundaries(name, cu, total):
    """The boundaries' values on the host (one copy, a sync): from 0, non-decreasing, to the packed tokens."""
    c = cu.tolist()
    if c[0] != 0:
        raise ValueError(f"`{name}` starts at {c[0]}, not 0")
    for i in range(len(c) - 1):
        if c[i + 1] < c[i]:
            raise ValueError(f"`{name}` decreases: [{i + 1}] = {c[i + 1]} after [{i}] = {c[i]} (it must be non-decreasing)")
    if c[-1] != total:
        raise ValueError(f"`{name}` ends at {c[-1]}, and the packed tensor holds {total} tokens")


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, out_dtype=None, return_lse=False,
                q_scale=None, k_scale=None, v_scale=None, validate=True, window=None, pack_heads=True,
                split_kv=True):
    """softmax(scale · q·kᵀ) · v over a packed (variable-length) batch, on E4M3 tensor cores (stage 8, sm_90).

    q [total_q, H, D], k and v [total_k, Hkv, D] (H a multiple of Hkv; D = 64 or 128; any token and head strides that
    are multiples of 16 bytes, D contiguous), sequence i's rows from cu_seqlens_q[i] and cu_seqlens_k[i] (int32
    [B + 1] on cuda:0). Real inputs are quantized here with a scale per head; E4M3 codes (float8_e4m3fn or uint8) take
    `q_scale`, `k_scale`, `v_scale` per (sequence, head) or one. `causal` is bottom-right per sequence, as is `window`
    (left, right: sdpa's, per sequence). `validate`
    copies the boundaries to the host to check them (a sync: pass False inside a CUDA graph; the device then trusts
    them). `pack_heads` (on by default) puts each K/V head's query heads (H / Hkv of them, dividing 64; no window) in one
    unit's rows, so that they share one pass over its keys (decode runs in a third of the time); the same bits.
    `split_kv` (on by default) cuts a few long sequences' keys into chunks merged after, where the batch's units would
    leave SMs idle (decode of one sequence over 131,072 keys runs 9× faster); close to, not bit for bit, unsplit.
    Returns O [total_q, H, D], and with `return_lse` the LSE [H, total_q]. Runs on torch's current stream.
    """
    win = window_sides(window)
    q, k, v = as_tensor(q, "q"), as_tensor(k, "k"), as_tensor(v, "v")
    cu_seqlens_q, cu_seqlens_k = as_tensor(cu_seqlens_q, "cu_seqlens_q"), as_tensor(cu_seqlens_k, "cu_seqlens_k")
    q_scale, k_scale = as_tensor(q_scale, "q_scale"), as_tensor(k_scale, "k_scale")
    v_scale = as_tensor(v_scale, "v_scale")
    b, h, hkv, tq, tk, d, fp8, out = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, q_scale=q_scale,
                                                       k_scale=k_scale, v_scale=v_scale, scale=scale,
                                                       out_dtype=out_dtype)
    if validate:
        _check_boundaries("cu_seqlens_q", cu_seqlens_q, tq)
        _check_boundaries("cu_seqlens_k", cu_seqlens_k, tk)
    import torch

    if b == 0 or tq == 0:
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
        o = torch.empty(tq, h, d, dtype=tdt, device=q.device)
        lse = torch.full((h, tq), float("-inf"), dtype=torch.float32, device=q.device)
        return (o, lse) if return_lse else o

    from . import _core

    stream = _stream(q.device)
    keep = []
    if fp8:
        codes = []
        for t in (q, k, v):
            if t.stride(2) != 1 or t.data_ptr() % 16 or t.stride(0) % 16 or t.stride(1) % 16:
                t = t.contiguous()
            codes.append(t)
        strides = [[t.stride(0), t.stride(1)] for t in codes]
        c = [t.data_ptr() for t in codes]
        scales, one = _packed_scales(q_scale, k_scale, v_scale, b * h, b * hkv)
        keep += codes + list(scales)
    else:
        # One scale a head over the whole packed tensor: the [1, H, total, D] views quantized in place, codes
        # contiguous [1, H, total, D], the scales repeated for every sequence.
        views = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]
        c, s, kept = _quantize(*views, _REAL[_dtype(q)], 1, h, hkv, tq, tk, d, stream)
        keep.append(kept)
        strides = [[d, tq * d], [d, tk * d], [d, tk * d]]
        heads = (kept[1][: h], kept[1][_pad4(h): _pad4(h) + hkv], kept[1][_pad4(h) + _pad4(hkv): _pad4(h) + _pad4(hkv) + hkv])
        scales = [x.unsqueeze(0).expand(b, x.numel()).contiguous() for x in heads]
        one = (False, False, False)
        keep += scales
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
    o = torch.empty(max(tq * h * d, 1), dtype=tdt, device=q.device)
    lse = torch.empty(max(h * tq, 1), dtype=torch.float32, device=q.device)
    tensors = [c[0], c[1], c[2], scales[0].data_ptr(), scales[1].data_ptr(), scales[2].data_ptr(), o.data_ptr(),
               lse.data_ptr()]
    batch = ((tensors, [cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()], strides), (b, h, hkv, d, tq, tk),
             bool(causal), float(scale if scale is not None else 1.0 / math.sqrt(d)), out, None, win, one)
    _core.launch_varlen(batch, stream, pack_heads=bool(pack_heads), split_kv=bool(split_kv))
    o = o[: tq * h * d].view(tq, h, d)
    return (o, lse[: h * tq].view(h, tq)) if return_lse else o


def check_paged_args(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, *, q_scale=None, k_scale=None,
                     v_scale=None, scale=None, out_dtype=None):
    """Checks sdpa_paged's arguments without touching the GPU; returns (B, H, Hkv, total_q, D, num_pages, page_size,
    max_pages, out dtype name). The table's and lengths' values are not read here (sdpa_paged's `validate` does).

    Raises TypeError for a wrong type or dtype and ValueError for a wrong device, shape, page size or scale count, each
    naming the argument.
    """
    named = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table), ("seq_lens", seq_lens),
             ("cu_seqlens_q", cu_seqlens_q))
    for name, t in named:
        if not _is_tensor(t):
            raise TypeError(f"`{name}` must be a torch tensor (as_tensor reads other arrays), not {type(t).__name__}")
        if getattr(t.device, "type", None) != "cuda" or getattr(t.device, "index", 0) not in (0, None):
            raise ValueError(f"`{name}` is on {t.device}: fp8_attention runs on cuda:0")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if _dtype(t) not in (_FP8, _CODES):
            raise TypeError(f"`{name}` is {_dtype(t)}: a paged call takes E4M3 codes (float8_e4m3fn or uint8)")
    if len(q.shape) != 3:
        raise ValueError(f"`q` has shape {tuple(q.shape)}: expected packed [total tokens, heads, D]")
    if len(k_cache.shape) != 4 or tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"`k_cache` {tuple(k_cache.shape)} and `v_cache` {tuple(v_cache.shape)}: expected the same "
                         "[num_pages, page_size, Hkv, D]")
    for name, t, rank in (("block_table", block_table, 2), ("seq_lens", seq_lens, 1), ("cu_seqlens_q", cu_seqlens_q, 1)):
        if _dtype(t) != "torch.int32" or len(t.shape) != rank:
            raise TypeError(f"`{name}` is {_dtype(t)} of shape {tuple(t.shape)}: it must be int32 of rank {rank}")
    (tq, h, d), (num_pages, page, hkv, dk) = tuple(q.shape), tuple(k_cache.shape)
    b = cu_seqlens_q.shape[0] - 1
    if seq_lens.shape[0] != b or block_table.shape[0] != b:
        raise ValueError(f"cu_seqlens_q bounds {b} sequences, seq_lens has {seq_lens.shape[0]} and block_table "
                         f"{block_table.shape[0]} rows")
    if d != dk:
        raise ValueError(f"`q` {tuple(q.shape)} and `k_cache` {tuple(k_cache.shape)}: D must agree")
    if d not in (64, 128):
        raise ValueError(f"head dimension D = {d} is not supported by paged calls: D = 64 or 128")
    if page not in (16, 32, 64, 128, 256):
        raise ValueError(f"page size {page}: the kernels take a power of two from 16 to 256")
    if h < 1 or hkv < 1 or h % hkv:
        raise ValueError(f"H = {h} query heads is not a positive multiple of Hkv = {hkv} key/value heads")
    scales = (("q_scale", q_scale, b * h), ("k_scale", k_scale, b * hkv), ("v_scale", v_scale, b * hkv))
    _check_fp8_scales(scales, "(sequence, head)", "E4M3 inputs need", on_gpu=True)
    _check_scale(scale)
    out = _out_name(out_dtype, "bf16")
    return b, h, hkv, tq, d, num_pages, page, block_table.shape[1], out


def sdpa_paged(q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, *, causal=False, scale=None, out_dtype=None,
               return_lse=False, q_scale=None, k_scale=None, v_scale=None, validate=True, window=None,
               pack_heads=True, split_kv=True):
    """A packed batch's queries over a paged FP8 KV cache, on E4M3 tensor cores (stage 8, sm_90).

    q [total_q, H, D] (E4M3 codes: float8_e4m3fn or uint8), sequence i's new tokens from cu_seqlens_q[i] (int32 [B +
    1]); k_cache and v_cache [num_pages, page_size, Hkv, D] E4M3 pools (pages of 16 to 256 rows); block_table int32
    [B, max_pages] and seq_lens int32 [B] (keys a sequence, its new tokens last: causal is bottom-right). Scales per
    (sequence, head) or one. `validate` copies the table and lengths to the host to check them (a sync: pass False in a
    CUDA graph). `pack_heads`, `split_kv`: as sdpa_varlen's (for decode). Returns O [total_q, H, D], and with
    `return_lse` the LSE [H, total_q]. Runs on torch's current stream.
    """
    win = window_sides(window)
    q, k_cache, v_cache = as_tensor(q, "q"), as_tensor(k_cache, "k_cache"), as_tensor(v_cache, "v_cache")
    block_table, seq_lens = as_tensor(block_table, "block_table"), as_tensor(seq_lens, "seq_lens")
    cu_seqlens_q = as_tensor(cu_seqlens_q, "cu_seqlens_q")
    q_scale, k_scale = as_tensor(q_scale, "q_scale"), as_tensor(k_scale, "k_scale")
    v_scale = as_tensor(v_scale, "v_scale")
    b, h, hkv, tq, d, num_pages, page, max_pages, out = check_paged_args(
        q, k_cache, v_cache, block_table, seq_lens, cu_seqlens_q, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
        scale=scale, out_dtype=out_dtype)
    if validate:
        _check_boundaries("cu_seqlens_q", cu_seqlens_q, tq)
        lens, table = seq_lens.tolist(), block_table.tolist()
        for i, n in enumerate(lens):
            if n < 0 or n > max_pages * page:
                raise ValueError(f"sequence {i} has {n} keys: its {max_pages} pages of {page} hold 0 to {max_pages * page}")
            for j in range((n + page - 1) // page):
                if not 0 <= table[i][j] < num_pages:
                    raise ValueError(f"block_table[{i}][{j}] = {table[i][j]} is outside the pool of {num_pages} pages")
    import torch

    from . import _core

    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
    if b == 0 or tq == 0:
        o = torch.empty(tq, h, d, dtype=tdt, device=q.device)
        lse = torch.full((h, tq), float("-inf"), dtype=torch.float32, device=q.device)
        return (o, lse) if return_lse else o
    stream = _stream(q.device)
    if q.stride(2) != 1 or q.data_ptr() % 16 or q.stride(0) % 16 or q.stride(1) % 16:
        q = q.contiguous()
    k_cache, v_cache, block_table = k_cache.contiguous(), v_cache.contiguous(), block_table.contiguous()
    # The keys' boundaries: the prefix sums of the lengths, on the device.
    cu_k = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    scales, one = _packed_scales(q_scale, k_scale, v_scale, b * h, b * hkv)
    total_k = max_pages * page  # bounds every sequence's keys (the plan sizes its key-tile counts by it)
    o = torch.empty(tq * h * d, dtype=tdt, device=q.device)
    lse = torch.empty(h * tq, dtype=torch.float32, device=q.device)
    tensors = [q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), scales[0].data_ptr(), scales[1].data_ptr(),
               scales[2].data_ptr(), o.data_ptr(), lse.data_ptr()]
    strides = [[q.stride(0), q.stride(1)], [hkv * d, d], [hkv * d, d]]
    batch = ((tensors, [cu_seqlens_q.data_ptr(), cu_k.data_ptr()], strides), (b, h, hkv, d, tq, total_k),
             bool(causal), float(scale if scale is not None else 1.0 / math.sqrt(d)), out,
             (block_table.data_ptr(), max_pages, page, num_pages), win, one)
    _core.launch_varlen(batch, stream, pack_heads=bool(pack_heads), split_kv=bool(split_kv))
    o = o.view(tq, h, d)
    return (o, lse.view(h, tq)) if return_lse else o


def warm(head_dim):
    """Compiles and loads, ahead of the first call, every kernel a call at head dimension ``head_dim`` can launch on
    this device (the attention stage's, the packed batches' where the device runs them, and the quantizer's), so that
    no call pays for NVRTC. Kernels are kept for the process and on disk ($FP8_ATTENTION_CACHE, ``off`` for none).

    Raises TypeError for a head_dim that is not an int, ValueError for one no kernel is built for (before touching
    the GPU), RuntimeError without a CUDA GPU.
    """
    if not isinstance(head_dim, int) or isinstance(head_dim, bool):
        raise TypeError(f"`head_dim` must be an int, not {type(head_dim).__name__}")
    if head_dim not in (64, 128, 256):
        raise ValueError(f"`head_dim` = {head_dim}: the kernels are built for 64, 128 and 256")
    from . import _core
    _core.warm(head_dim)


from .plan import PagedPlan  # noqa: E402  (plan.py reads this module's helpers)
