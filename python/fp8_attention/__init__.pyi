# Type stubs of fp8_attention's Python API.
from typing import Any, Optional, Tuple, Union

def check_args(
    q: Any, k: Any, v: Any, *, q_scale: Any = ..., k_scale: Any = ..., v_scale: Any = ..., scale: Optional[float] = ...,
    out_dtype: Any = ...,
) -> Tuple[int, int, int, int, int, int, bool, str]: ...
def as_tensor(x: Any, name: str = ...) -> Any: ...
def sdpa(
    q: Any, k: Any, v: Any, *, causal: bool = ..., scale: Optional[float] = ..., out_dtype: Any = ...,
    return_lse: bool = ..., q_scale: Any = ..., k_scale: Any = ..., v_scale: Any = ...,
    window: Optional[Tuple[Optional[int], Optional[int]]] = ...,
) -> Union[Any, Tuple[Any, Any]]: ...
def check_varlen_args(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, q_scale: Any = ..., k_scale: Any = ...,
    v_scale: Any = ..., scale: Optional[float] = ..., out_dtype: Any = ...,
) -> Tuple[int, int, int, int, int, int, bool, str]: ...
def sdpa_varlen(
    q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *, causal: bool = ..., scale: Optional[float] = ...,
    out_dtype: Any = ..., return_lse: bool = ..., q_scale: Any = ..., k_scale: Any = ..., v_scale: Any = ...,
    validate: bool = ..., window: Optional[Tuple[Optional[int], Optional[int]]] = ..., pack_heads: bool = ...,
    split_kv: bool = ...,
) -> Union[Any, Tuple[Any, Any]]: ...
def check_paged_args(
    q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, cu_seqlens_q: Any, *, q_scale: Any = ...,
    k_scale: Any = ..., v_scale: Any = ..., scale: Optional[float] = ..., out_dtype: Any = ...,
) -> Tuple[int, int, int, int, int, int, int, int, str]: ...
def sdpa_paged(
    q: Any, k_cache: Any, v_cache: Any, block_table: Any, seq_lens: Any, cu_seqlens_q: Any, *, causal: bool = ...,
    scale: Optional[float] = ..., out_dtype: Any = ..., return_lse: bool = ..., q_scale: Any = ..., k_scale: Any = ...,
    v_scale: Any = ..., validate: bool = ..., window: Optional[Tuple[Optional[int], Optional[int]]] = ...,
    pack_heads: bool = ..., split_kv: bool = ...,
) -> Union[Any, Tuple[Any, Any]]: ...
def warm(head_dim: int) -> None: ...
def window_sides(window: Optional[Tuple[Optional[int], Optional[int]]]) -> Tuple[int, int]: ...
