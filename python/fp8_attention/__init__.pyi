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
) -> Union[Any, Tuple[Any, Any]]: ...
