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
def launch_varlen(
    tensors: list[int], cu: list[int], strides: list[list[int]], batch: int, h: int, hkv: int, d: int, total_q: int,
    total_k: int, causal: bool, softmax_scale: float, out_dtype: str, stream: int,
    paged: Optional[tuple[int, int, int, int]] = ..., window: tuple[int, int] = ..., pack_heads: bool = ...,
    split_kv: bool = ...,
) -> None: ...
def warm(d: int) -> None: ...
