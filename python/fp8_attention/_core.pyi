# Type stubs of fp8_attention._core, the Rust extension that fp8_attention.sdpa calls.
from typing import Optional

def output_rows(
    b: int, h: int, hkv: int, sq: int, sk: int, d: int, causal: bool, window: tuple[int, int] = ...,
) -> int: ...
def launch(
    q: int, k: int, v: int, q_scale: int, k_scale: int, v_scale: int, o: int, lse: int,
    b: int, h: int, hkv: int, sq: int, sk: int, d: int, causal: bool, softmax_scale: float, out_dtype: str,
    stream: int, window: tuple[int, int] = ...,
) -> None: ...
def quantize(
    views: list[tuple[int, tuple[int, int, int]]], dtype: str, codes: tuple[int, int, int],
    scales: tuple[int, int, int], amax: int, b: int, h: int, hkv: int, sq: int, sk: int, d: int, stream: int,
) -> None: ...
# A packed batch: ((tensors, cu, strides), (batch, h, hkv, d, total_q, total_k), causal, softmax_scale, out_dtype,
# paged (block table, max_pages, page_size, num_pages) or None, window (left, right; -1 unbounded), one_scale (Q's, K's,
# V's scale one value for the batch)).
Batch = tuple[
    tuple[list[int], list[int], list[list[int]]], tuple[int, int, int, int, int, int], bool, float, str,
    Optional[tuple[int, int, int, int]], tuple[int, int], tuple[bool, bool, bool],
]
def launch_varlen(batch: Batch, stream: int, pack_heads: bool = ..., split_kv: bool = ...) -> None: ...
def warm(d: int) -> None: ...
