# fp8_attention's argument checks, without a GPU or torch: every bad argument named, before anything runs.
import pytest

import fp8_attention as fa


class Dev:
    def __init__(self, type="cuda", index=0):
        self.type, self.index = type, index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class T:
    """What fp8_attention reads of a torch tensor: dtype, shape, device, data_ptr, numel."""

    def __init__(self, shape, dtype="torch.bfloat16", device=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device or Dev()

    def data_ptr(self):
        return 1 << 20

    def numel(self):
        n = 1
        for x in self.shape:
            n *= x
        return n


def qkv(b=2, h=8, hkv=2, sq=100, sk=300, d=128, dtype="torch.bfloat16"):
    return T((b, h, sq, d), dtype), T((b, hkv, sk, d), dtype), T((b, hkv, sk, d), dtype)


def test_good_arguments_pass():
    assert fa.check_args(*qkv()) == (2, 8, 2, 100, 300, 128, False, "bf16")
    q, k, v = qkv(dtype="torch.float8_e4m3fn")
    got = fa.check_args(q, k, v, q_scale=T((2, 8), "torch.float32"), k_scale=T((1,), "torch.float32"),
                        v_scale=T((4,), "torch.float32"), out_dtype="torch.float16")
    assert got[-2:] == (True, "f16")


@pytest.mark.parametrize(
    "change, kind, words",
    [
        (lambda a: ([1, 2], a[1], a[2]), TypeError, "`q` must be a torch tensor"),
        (lambda a: (T(a[0].shape, device=Dev("cpu", None)), a[1], a[2]), ValueError, "`q` is on cpu"),
        (lambda a: (a[0], T(a[1].shape, device=Dev("cuda", 1)), a[2]), ValueError, "`k` is on cuda:1"),
        (lambda a: (T((8, 100, 128)), a[1], a[2]), ValueError, "`q` has shape (8, 100, 128)"),
        (lambda a: (T(a[0].shape, "torch.float16"), a[1], a[2]), TypeError, "must share a dtype"),
        (lambda a: tuple(T(x.shape, "torch.int8") for x in a), TypeError, "dtype torch.int8 is not supported"),
        (lambda a: (a[0], a[1], T((2, 2, 299, 128))), ValueError, "must have the same shape"),
        (lambda a: (T((2, 8, 100, 96)), T((2, 2, 300, 96)), T((2, 2, 300, 96))), ValueError, "D = 96"),
        (lambda a: (a[0], T((2, 3, 300, 128)), T((2, 3, 300, 128))), ValueError, "H = 8"),
        (lambda a: (T((3, 8, 100, 128)), a[1], a[2]), ValueError, "B and D must agree"),
        (lambda a: (T((2, 8, 0, 128)), a[1], a[2]), ValueError, "at least 1"),
    ],
)
def test_bad_tensors_are_named(change, kind, words):
    with pytest.raises(kind, match=None) as e:
        fa.check_args(*change(qkv()))
    assert words in str(e.value), str(e.value)


def test_scales_and_options_are_named():
    q, k, v = qkv(dtype="torch.float8_e4m3fn")
    f32 = lambda n: T((n,), "torch.float32")  # noqa: E731
    with pytest.raises(TypeError, match="need `q_scale`"):
        fa.check_args(q, k, v)
    with pytest.raises(TypeError, match="`k_scale` is torch.float16"):
        fa.check_args(q, k, v, q_scale=f32(16), k_scale=T((4,), "torch.float16"), v_scale=f32(4))
    with pytest.raises(ValueError, match="`v_scale` holds 3 scales"):
        fa.check_args(q, k, v, q_scale=f32(16), k_scale=f32(4), v_scale=f32(3))
    with pytest.raises(ValueError, match="`q_scale` is on cpu"):
        fa.check_args(q, k, v, q_scale=T((16,), "torch.float32", Dev("cpu", None)), k_scale=f32(4), v_scale=f32(4))
    with pytest.raises(TypeError, match="go with E4M3 inputs"):
        fa.check_args(*qkv(), q_scale=f32(16))
    with pytest.raises(ValueError, match="scale = -1.0"):
        fa.check_args(*qkv(), scale=-1.0)
    with pytest.raises(TypeError, match="out_dtype torch.int32"):
        fa.check_args(*qkv(), out_dtype="torch.int32")


def test_sdpa_checks_before_it_needs_torch_or_a_gpu():
    # The same errors from the op itself, before it imports torch or asks for the GPU.
    with pytest.raises(ValueError, match="D = 80"):
        fa.sdpa(T((1, 2, 64, 80)), T((1, 2, 64, 80)), T((1, 2, 64, 80)))


def test_uint8_codes_are_e4m3_with_their_scales():
    # FP8 as bytes (DLPack and some frameworks have no float8 type): uint8 inputs are E4M3 codes.
    q, k, v = qkv(dtype="torch.uint8")
    f32 = lambda n: T((n,), "torch.float32")  # noqa: E731
    got = fa.check_args(q, k, v, q_scale=f32(16), k_scale=f32(4), v_scale=f32(1))
    assert got[-2:] == (True, "bf16")
    with pytest.raises(TypeError, match=r"E4M3 inputs \(torch.uint8\) need `q_scale`"):
        fa.check_args(q, k, v)


class Cai:
    """A foreign GPU array: only __cuda_array_interface__."""

    def __init__(self, shape):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f2", "data": (1 << 20, False), "version": 3}


def test_as_tensor_names_what_it_cannot_read():
    assert fa.as_tensor(None) is None
    t = T((1, 2, 3, 64))
    assert fa.as_tensor(t) is t
    with pytest.raises(TypeError, match="`k` must be a torch tensor or a GPU array with __dlpack__"):
        fa.as_tensor([1, 2], "k")
    with pytest.raises(TypeError, match="`q` must be a torch tensor or a GPU array"):
        fa.sdpa("not an array", T((1, 2, 3, 64)), T((1, 2, 3, 64)))


def test_a_foreign_array_without_torch_is_named():
    try:
        import torch  # noqa: F401

        pytest.skip("torch is installed: a fake array's address would be read")
    except ImportError:
        pass
    with pytest.raises(TypeError, match="`v` is a Cai: reading it needs torch"):
        fa.as_tensor(Cai((1, 2, 3, 64)), "v")


def packed(tq=300, tk=900, h=8, hkv=2, d=128, b=3, dtype="torch.bfloat16"):
    return (T((tq, h, d), dtype), T((tk, hkv, d), dtype), T((tk, hkv, d), dtype), T((b + 1,), "torch.int32"),
            T((b + 1,), "torch.int32"))


def test_varlen_arguments_are_named():
    assert fa.check_varlen_args(*packed()) == (3, 8, 2, 300, 900, 128, False, "bf16")
    f32 = lambda n: T((n,), "torch.float32")  # noqa: E731
    a = packed(dtype="torch.uint8")
    assert fa.check_varlen_args(*a, q_scale=f32(24), k_scale=f32(6), v_scale=f32(1))[-2:] == (True, "bf16")
    bad = [
        (lambda a: (T((300, 8, 2, 128)),) + a[1:], ValueError, "expected packed [total tokens, heads, D]"),
        (lambda a: a[:3] + (T((4,), "torch.int64"), a[4]), TypeError, "`cu_seqlens_q` is torch.int64"),
        (lambda a: a[:4] + (T((5,), "torch.int32"),), ValueError, "cu_seqlens_q has 4 entries and cu_seqlens_k 5"),
        (lambda a: (T((300, 8, 256)), T((900, 2, 256)), T((900, 2, 256))) + a[3:], ValueError, "D = 256"),
        (lambda a: (a[0], T((900, 3, 128)), T((900, 3, 128))) + a[3:], ValueError, "H = 8"),
        (lambda a: (a[0], a[1], T((899, 2, 128))) + a[3:], ValueError, "must have the same shape"),
    ]
    for change, kind, words in bad:
        with pytest.raises(kind) as e:
            fa.check_varlen_args(*change(packed()))
        assert words in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="`v_scale` holds 5 scales"):
        fa.check_varlen_args(*a, q_scale=f32(24), k_scale=f32(6), v_scale=f32(5))
    # A scale the kernels would read from the host (or another GPU) is named before anything is launched.
    for dev in (Dev("cpu", None), Dev("cuda", 1)):
        with pytest.raises(ValueError, match=f"`k_scale` is on {dev}: it must be on the GPU"):
            fa.check_varlen_args(*a, q_scale=f32(24), k_scale=T((1,), "torch.float32", dev), v_scale=f32(1))


def test_paged_arguments_are_named():
    u8 = "torch.uint8"
    q, kc, vc = T((300, 8, 128), u8), T((40, 64, 2, 128), u8), T((40, 64, 2, 128), u8)
    bt, sl, cu = T((3, 20), "torch.int32"), T((3,), "torch.int32"), T((4,), "torch.int32")
    f32 = lambda n: T((n,), "torch.float32")  # noqa: E731
    sc = dict(q_scale=f32(24), k_scale=f32(6), v_scale=f32(1))
    assert fa.check_paged_args(q, kc, vc, bt, sl, cu, **sc) == (3, 8, 2, 300, 128, 40, 64, 20, "bf16")
    bad = [
        ((T((300, 8, 128)), kc, vc, bt, sl, cu), TypeError, "a paged call takes E4M3 codes"),
        ((q, T((40, 48, 2, 128), u8), T((40, 48, 2, 128), u8), bt, sl, cu), ValueError, "page size 48"),
        ((q, kc, T((40, 64, 2, 64), u8), bt, sl, cu), ValueError, "expected the same"),
        ((q, kc, vc, bt, T((2,), "torch.int32"), cu), ValueError, "seq_lens has 2"),
        ((q, kc, vc, T((3, 20), "torch.int64"), sl, cu), TypeError, "`block_table` is torch.int64"),
        ((q, T((40, 64, 3, 128), u8), T((40, 64, 3, 128), u8), bt, sl, cu), ValueError, "H = 8"),
    ]
    for args, kind, words in bad:
        with pytest.raises(kind) as e:
            fa.check_paged_args(*args, **sc)
        assert words in str(e.value), str(e.value)
    with pytest.raises(TypeError, match="need `k_scale`"):
        fa.check_paged_args(q, kc, vc, bt, sl, cu, q_scale=f32(24))
    with pytest.raises(ValueError, match="`v_scale` is on cpu: it must be on the GPU"):
        fa.check_paged_args(q, kc, vc, bt, sl, cu, **dict(sc, v_scale=T((1,), "torch.float32", Dev("cpu", None))))


def test_warm_names_a_bad_head_dim_before_the_gpu():
    with pytest.raises(TypeError, match="`head_dim` must be an int, not float"):
        fa.warm(128.0)
    with pytest.raises(TypeError, match="not bool"):
        fa.warm(True)
    with pytest.raises(ValueError, match="`head_dim` = 96: the kernels are built for 64, 128 and 256"):
        fa.warm(96)


def test_core_launch_names_a_misaligned_address_before_any_launch():
    # TMA reads the codes in 16-byte pieces; a scale is one f32 (a slice of a scale vector is fine): both checked
    # before the GPU is touched, so nothing here launches.
    from fp8_attention import _core

    def launch(**at):
        a = dict(q=1 << 20, k=1 << 20, v=1 << 20, q_scale=1 << 20, k_scale=1 << 20, v_scale=1 << 20, o=1 << 20,
                 lse=1 << 20)
        a.update(at)
        _core.launch(*a.values(), 1, 2, 2, 64, 64, 64, False, 0.125, "bf16", 0)

    with pytest.raises(ValueError, match=r"`v` is at address 0x100008: it must be a device address aligned to 16"):
        launch(v=(1 << 20) + 8)
    with pytest.raises(ValueError, match=r"`k_scale` is at address 0x100002: .* aligned to 4 bytes"):
        launch(k_scale=(1 << 20) + 2)
    with pytest.raises(ValueError, match=r"`q` is at address 0x0"):
        launch(q=0)


def test_a_window_is_checked_on_the_cpu():
    assert fa.window_sides(None) == (-1, -1)
    assert fa.window_sides((128, 0)) == (128, 0)
    assert fa.window_sides([None, 5]) == (-1, 5)
    with pytest.raises(TypeError, match="`window` must be None or \\(left, right\\)"):
        fa.window_sides(64)
    with pytest.raises(TypeError, match="`window` left must be an int"):
        fa.window_sides((1.5, 0))
    with pytest.raises(TypeError, match="not bool"):
        fa.window_sides((True, 0))
    with pytest.raises(ValueError, match="`window` right = -2: a number of keys"):
        fa.window_sides((4, -2))
    # sdpa checks it before it needs torch or a GPU.
    with pytest.raises(ValueError, match="`window` right = -3"):
        fa.sdpa(*qkv(), window=(0, -3))


def test_varlen_and_paged_check_their_window_first():
    with pytest.raises(ValueError, match="`window` left = -5"):
        fa.sdpa_varlen(None, None, None, None, None, window=(-5, 0))
    with pytest.raises(TypeError, match="`window` must be None or \\(left, right\\)"):
        fa.sdpa_paged(None, None, None, None, None, None, window="64")
