"""The package without a GPU (CI): import, errors, argument checks, fetch/verify/select
against the CLI's reports through nginx."""
import ctypes
import inspect
import json
import os
import subprocess
import sys

import pytest

import cubist


def test_import_does_not_import_torch():
    code = "import sys, cubist; print('torch' in sys.modules, cubist.__version__)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=dict(os.environ)).stdout.split()
    assert out == ["False", "0.1.0"]


def test_one_exception_class_per_status_code():
    names = {c.code for c in cubist._errors.BY_CODE[1:]}
    assert len(names) == 16
    for cls in cubist._errors.BY_CODE[1:]:
        assert issubclass(cls, cubist.Error)
    assert issubclass(cubist.InvalidArgumentError, ValueError)
    assert cubist.NotFoundError.code == "NOT_FOUND"
    assert cubist._errors.BY_CODE[15] is cubist.DataLossError


def test_runtime_errors_keep_the_cpp_message(tmp_path):
    with pytest.raises(cubist.NotFoundError,
                       match=r"^.*/missing.json: cannot open: No such file or directory$"):
        cubist.Runtime(str(tmp_path / "missing.json"), cache_dir=str(tmp_path / "c"))
    with pytest.raises(cubist.InvalidArgumentError, match=r"public key 'ed25519:notbase64!': expected 'ed25519:' and the padded base64"):
        cubist.Runtime(str(tmp_path / "m.json"), trusted_keys=["ed25519:notbase64!"])


def test_runtime_without_gpu_is_failed_precondition(tmp_path):
    import ctypes
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here (test_gpu.py covers Runtime)")
    except OSError:
        pass
    from conftest import write_set
    manifest = write_set(tmp_path / "repo")
    with pytest.raises(cubist.FailedPreconditionError, match=r"no driver: |no GPU: "):
        cubist.Runtime(str(manifest), cache_dir=str(tmp_path / "cache"), prefetch=False)


# Argument checks. Runtime needs a GPU, so these drive MoeGemm's checks (the code `run`
# and `check` use before anything reaches C++) on an op built without one, with
# __cuda_array_interface__ objects whose pointers are never dereferenced.
class FakeRuntime:
    device = 0


def gemm_without_gpu():
    g = cubist.MoeGemm.__new__(cubist.MoeGemm)
    g.runtime = FakeRuntime()
    g._formats = {}
    return g


class Cai:
    next_ptr = 0x10000000

    def __init__(self, shape, typestr, ptr=None, strides=None):
        if ptr is None:
            ptr = Cai.next_ptr if all(shape) else 0
            Cai.next_ptr += 1 << 20
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": 3}


BF16, U8, F32, I32 = "<V2", "|u1", "<f4", "<i4"


def args(**over):
    e, t, n, k = 4, 16, 256, 128
    base = dict(a=Cai((t, k), BF16), b=Cai((e, n, k), BF16), offsets=Cai((e + 1,), I32),
                out=Cai((t, n // 2), BF16), weights=None, activations=None,
                activation="swiglu", a_scale=None, b_scale=None, a_global_scale=None,
                b_global_scale=None, alpha=None, beta=None, limit=None)
    base.update(over)
    return base


def test_good_bf16_arguments_give_sizes_and_pointers():
    a = args()
    wf, af, act, e, t, n, k, ptrs, device = gemm_without_gpu()._args(**a)
    assert (e, t, n, k, device) == (4, 16, 256, 128, 0)
    assert wf == af == cubist._FORMAT_CODES["bf16"]
    assert act == cubist._ACTIVATION_CODES["swiglu"]
    assert ptrs[0] == a["a"].__cuda_array_interface__["data"][0]
    assert ptrs[10] == a["out"].__cuda_array_interface__["data"][0]
    assert ptrs[2:6] == [0, 0, 0, 0]
    assert len(ptrs) == 12 and ptrs[11] == 0  # no bias


@pytest.mark.parametrize("over, error", [
    (dict(offsets=Cai((5,), "<i8")), r"^offsets: expected int32 \[E\+1\] \(E >= 1\), got int64 \[5\]$"),
    (dict(b=Cai((3, 256, 128), BF16)), r"^b: expected \[E=4, N, K\], got \[3, 256, 128\]$"),
    (dict(a=Cai((16, 64), BF16)), r"^a: has K = 64 but b has K = 128"),
    (dict(out=Cai((16, 256), BF16)), r"^out: expected bfloat16 \[T=16, N/2=128\], got bfloat16 \[16, 256\]$"),
    (dict(activation="gelu"), r"^activation: 'gelu' is not one of identity, relu2, swiglu, geglu, situ$"),
    (dict(a=[[1.0]]), r"^a: expected a CUDA tensor \(torch, __cuda_array_interface__ or __dlpack__\), got list$"),
    (dict(a=Cai((16, 128), BF16, strides=(2, 256))), r"^a: must be contiguous"),
    (dict(a=Cai((16, 128), "<f2")), r"^a: dtype float16 is not a cubist format; give activations= one of bf16"),
    (dict(b=Cai((4, 256, 64), U8)), r"^b_scale: b holds packed fp4 \(uint8\); mxfp4 and nvfp4 need block scales$"),
    (dict(weights="int4"), r"^weights: 'int4' is not one of bf16, fp8, fp8-block"),
    (dict(alpha=Cai((3,), F32)), r"^alpha: expected float32 with 4 elements, got float32 \[3\]$"),
    (dict(b=Cai((4, 256, 64), U8), b_scale=Cai((4, 256, 3), U8)),
     r"^b_scale: expected 4096 mxfp4 scales for T=16 E=4 N=256 K=128, got shape \[4, 256, 3\]$"),
])
def test_argument_errors_name_the_argument(over, error):
    with pytest.raises(cubist.InvalidArgumentError, match=error):
        gemm_without_gpu()._args(**args(**over))


def test_bias_is_the_twelfth_pointer():
    bias = Cai((4, 256), F32)
    ptrs = gemm_without_gpu()._args(**args(bias=bias))[7]
    assert ptrs[11] == bias.__cuda_array_interface__["data"][0]
    # Not gated: one per row of b all the same, [E, N].
    ptrs = gemm_without_gpu()._args(**args(activation="identity", out=Cai((16, 256), BF16),
                                           bias=bias))[7]
    assert ptrs[11] == bias.__cuda_array_interface__["data"][0]


def test_formats_come_from_dtypes_and_scales():
    g = gemm_without_gpu()
    code = cubist._FORMAT_CODES
    # mxfp4 weights (packed bytes, e8m0 byte scales) x bf16 activations.
    r = g._args(**args(b=Cai((4, 256, 64), U8), b_scale=Cai((4, 256, 4), U8)))
    assert (r[0], r[1], r[6]) == (code["mxfp4"], code["bf16"], 128)
    # fp8-block both sides: fp32 scales [T, K/128] and [E, N/128, K/128].
    r = g._args(**args(a=Cai((16, 128), U8), b=Cai((4, 256, 128), U8),
                       a_scale=Cai((16, 1), F32), b_scale=Cai((4, 2, 1), F32),
                       weights="fp8-block", activations="fp8-block"))
    assert (r[0], r[1]) == (code["fp8-block"], code["fp8-block"])


def test_empty_batch_needs_no_activation_pointers():
    # torch gives empty tensors a null data pointer; T = 0 is a no-op (no a_scale needed).
    r = gemm_without_gpu()._args(**args(
        a=Cai((0, 128), U8), out=Cai((0, 128), BF16), b=Cai((4, 256, 128), U8),
        b_scale=Cai((4, 2, 1), F32), weights="fp8-block", activations="fp8-block"))
    t, ptrs = r[4], r[7]
    assert t == 0 and ptrs[0] == 0 and ptrs[2] == 0 and ptrs[10] == 0


# MoeGemm.run's C++ fast path (cubist_ext.cc, ReadFastArgs) on stand-ins for torch's
# tensor type and dtypes: what it accepts gives the sizes and pointers the Python checks
# give; everything else is declined (None), and the Python checks then word the error.
class FakeDtype:
    pass


FBF16, FFP8, FI32, FI64, FF32 = (FakeDtype() for _ in range(5))
FAKE_TYPESTR = {FBF16: BF16, FFP8: "|u1", FI32: I32, FI64: "<i8", FF32: F32}


class FakeTensor:
    """A stand-in for a torch tensor: torch's attributes (the fast path's attribute
    reader), a `dl` description for the fake DLPack exchange API below (its other
    reader), and __cuda_array_interface__ (the Python checks' view of the same tensor).
    `reads` counts the attribute reader's calls."""

    def __init__(self, shape, dtype, cuda=True, contiguous=True, device=0, strides=None):
        self.shape, self.dtype, self.is_cuda = tuple(shape), dtype, cuda
        self._device = device
        self._ptr = Cai.next_ptr if all(shape) else 0
        Cai.next_ptr += 1 << 20
        if strides is None:
            strides = list(_dense(self.shape))
            if not contiguous:  # as a transpose of the last two dimensions (1-D: every other)
                if len(strides) >= 2:
                    strides[-1], strides[-2] = strides[-2], strides[-1]
                elif strides:
                    strides[0] = 2
        self.strides = tuple(strides)
        self._contiguous = contiguous
        self.reads = 0
        self.dl_fails = False  # the fake exchange API refuses this tensor

    attrs_fail = False  # the attribute reader fails on every FakeTensor (is_contiguous raises)

    def is_contiguous(self):
        self.reads += 1
        if self.attrs_fail:
            raise RuntimeError("the attribute reader was used")
        return self._contiguous

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._device if self.is_cuda else -1

    def cai(self):
        return Cai(self.shape, FAKE_TYPESTR[self.dtype], ptr=self._ptr)

    @property
    def __cuda_array_interface__(self):
        return self.cai().__cuda_array_interface__


def _dense(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


# DLPack's C exchange API (dlpack.h, DLPackExchangeAPI) in ctypes, describing FakeTensors:
# what torch.Tensor.__dlpack_c_exchange_api__ is to the fast path, without torch.
DL_CODE = {FBF16: (4, 16), FFP8: (10, 8), FI32: (0, 32), FI64: (0, 64), FF32: (2, 32)}


class DLTensorC(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensorC))
WORK_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                               ctypes.POINTER(ctypes.c_void_p))


class ExchangeApiC(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("prev_api", ctypes.c_void_p), ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", FROM_PY),
                ("current_work_stream", WORK_STREAM)]


@FROM_PY
def _dltensor_from_py(obj, out):
    x = ctypes.cast(obj, ctypes.py_object).value
    if x.dl_fails:
        return -1
    x._dl_shape = (ctypes.c_int64 * max(1, len(x.shape)))(*x.shape)
    x._dl_strides = (ctypes.c_int64 * max(1, len(x.strides)))(*x.strides)
    d = out.contents
    d.data = x._ptr or None
    d.device_type, d.device_id = (2, x._device) if x.is_cuda else (1, 0)
    d.ndim = len(x.shape)
    (d.code, d.bits), d.lanes = DL_CODE[x.dtype], 1
    d.shape = ctypes.cast(x._dl_shape, ctypes.POINTER(ctypes.c_int64))
    d.strides = ctypes.cast(x._dl_strides, ctypes.POINTER(ctypes.c_int64))
    d.byte_offset = 0
    return 0


@WORK_STREAM
def _current_work_stream(device_type, device_id, out):
    out[0] = 0x7000 + device_id
    return 0


_EXCHANGE_API = ExchangeApiC(1, 1, None, None, None, None, _dltensor_from_py,
                             _current_work_stream)
_CAPSULE_NAME = b"dlpack_exchange_api"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def exchange_capsule():
    return _capsule_new(ctypes.addressof(_EXCHANGE_API), _CAPSULE_NAME, None)


# The bias's checks, with __dlpack__ objects for the devices (an array-interface object
# does not say its device).
_DLTENSOR_NAME = b"dltensor"


class Dlpack:
    """A `__dlpack__` object (the legacy capsule) on a DLPack device (type, ordinal), of
    DLPack dtype (code, bits); its data pointer is never dereferenced."""

    def __init__(self, shape, dtype=(2, 32), device=(2, 0)):
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._device = device
        self._t = DLTensorC(data=0x1000, device_type=device[0], device_id=device[1],
                            ndim=len(shape), code=dtype[0], bits=dtype[1], lanes=1,
                            shape=ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                            strides=None, byte_offset=0)

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self._t), _DLTENSOR_NAME, None)


@pytest.mark.parametrize("bias, error", [
    (Cai((4, 256), "<f2"), r"^bias: expected float32 \[E=4, N=256\] \(one per expert and "
                           r"row of b, both halves\), got float16 \[4, 256\]$"),
    (Cai((4, 128), F32), r"^bias: expected float32 \[E=4, N=256\] .*, got float32 \[4, 128\]$"),
    (Cai((3, 256), F32), r"^bias: expected float32 \[E=4, N=256\] .*, got float32 \[3, 256\]$"),
    (Cai((4 * 256,), F32), r"^bias: expected float32 \[E=4, N=256\] .*, got float32 \[1024\]$"),
    (Cai((4, 256), F32, strides=(4, 16)), r"^bias: must be contiguous \(row-major, dense\)"),
    (Dlpack((4, 256)), None),  # on the runtime's device: accepted
    (Dlpack((4, 256), device=(2, 1)), r"^bias: is on cuda:1; this runtime runs on cuda:0$"),
    (Dlpack((4, 256), device=(1, 0)),
     r"^bias: is on DLPack device type 1; cubist runs on CUDA tensors \(kDLCUDA = 2\)$"),
    (Dlpack((4, 256), dtype=(4, 16)), r"^bias: expected float32 \[E=4, N=256\] .*, got bfloat16"),
    ([[0.0] * 256] * 4, r"^bias: expected a CUDA tensor \(torch, __cuda_array_interface__ or "
                        r"__dlpack__\), got list$"),
])
def test_bias_errors_say_what_is_expected(bias, error):
    if error is None:
        assert gemm_without_gpu()._args(**args(bias=bias))[7][11] == 0x1000
        return
    with pytest.raises(cubist.InvalidArgumentError, match=error):
        gemm_without_gpu()._args(**args(bias=bias))




class _NoTorchTensor:
    """While stand-ins are registered, the Python checks must not register torch (if the
    test run imported it) over them: they see this as torch's tensor type."""


def _register_fakes(*args):
    cubist._cubist._set_torch(FakeTensor, FBF16, FFP8, FI32, lambda d: 0x5000 + d, *args)
    cubist._tensors._torch_tensor_type = _NoTorchTensor


def _reset_fast_path():
    cubist._cubist._set_torch(None, None, None, None, None)
    cubist._cubist._fast_path_config(exchange=True, cpu_as_device=False)
    cubist._tensors._torch_tensor_type = None  # torch, if imported, registers again


@pytest.fixture
def fake_torch():
    """The fast path on stand-ins for torch's objects, reading tensors by attribute."""
    _register_fakes()
    yield
    _reset_fast_path()


@pytest.fixture(params=["attributes", "exchange"])
def any_reader(request):
    """The fast path on stand-ins, reading tensors by attribute or (param "exchange") only
    through the fake DLPack exchange API: there the attribute reader fails, so whatever
    the exchange reader declines stays declined."""
    exchange = request.param == "exchange"
    _register_fakes(exchange_capsule() if exchange else None)
    assert cubist._cubist._fast_path_config()["exchange_api"] is exchange
    FakeTensor.attrs_fail = exchange
    yield request.param
    FakeTensor.attrs_fail = False
    _reset_fast_path()


def fast_args(device=0, **over):
    e, t, n, k = 4, 16, 256, 128
    a = dict(a=FakeTensor((t, k), FBF16), b=FakeTensor((e, n, k), FBF16),
             offsets=FakeTensor((e + 1,), FI32), out=FakeTensor((t, n // 2), FBF16),
             activation="swiglu", weights=None, activations=None, a_scale=None, b_scale=None,
             a_global_scale=None, b_global_scale=None, alpha=None, beta=None, limit=None,
             stream=None, bias=None)
    a.update(over)
    return a, cubist._cubist._fast_args(device, *a.values())


@pytest.mark.parametrize("over", [
    {}, dict(activation="identity", out=FakeTensor((16, 256), FBF16)),
    dict(a=FakeTensor((16, 128), FFP8), b=FakeTensor((4, 256, 128), FFP8)),
    dict(a=FakeTensor((0, 128), FBF16), out=FakeTensor((0, 128), FBF16)), dict(stream=7),
])
def test_fast_path_gives_what_the_python_checks_give(any_reader, over):
    a, got = fast_args(**over)
    assert got is not None
    cai = {k: v.cai() if isinstance(v, FakeTensor) else v for k, v in a.items()}
    del cai["stream"]
    assert got[7][11] == 0  # no bias
    if a["a"].dtype is FFP8:  # as bytes over the array interface: say what they hold
        cai.update(weights="fp8", activations="fp8")
    want = gemm_without_gpu()._args(**cai)
    assert got[:7] == want[:7] and list(got[7]) == want[7]
    # No stream: torch's current one, from the exchange API's current_work_stream where
    # torch has it, else torch._C._cuda_getCurrentRawStream (the stand-ins: 0x7000, 0x5000).
    assert got[8] == (over.get("stream") or (0x7000 if any_reader == "exchange" else 0x5000))


@pytest.mark.parametrize("over", [
    dict(a=FakeTensor((16, 128), FBF16, cuda=False)),
    dict(b=FakeTensor((4, 256, 128), FBF16, contiguous=False)),
    dict(offsets=FakeTensor((5,), FI64)), dict(offsets=FakeTensor((1,), FI32)),
    dict(out=FakeTensor((16, 128), FF32)), dict(out=FakeTensor((16, 256), FBF16)),
    dict(a=FakeTensor((16, 64), FBF16)), dict(b=FakeTensor((3, 256, 128), FBF16)),
    dict(b=FakeTensor((4, 255, 128), FBF16), out=FakeTensor((16, 127), FBF16)),
    dict(a=FakeTensor((16, 128), FI32)), dict(a=FakeTensor((16, 128), FBF16, device=1)),
    dict(b=FakeTensor((4, 256, 128, 1), FBF16)), dict(a=[[1.0]]),
    dict(a=type("Sub", (FakeTensor,), {})((16, 128), FBF16)),
    dict(activation="gelu"), dict(activation="silu"), dict(weights="bf16"),
    dict(alpha=FakeTensor((4,), FF32)), dict(b_scale=FakeTensor((4, 2, 1), FF32)),
    dict(stream=object()), dict(stream=-1), dict(bias=FakeTensor((4, 256), FF32)),
])
def test_fast_path_declines_everything_else(any_reader, over):
    assert fast_args(**over)[1] is None


@pytest.mark.parametrize("over", [
    # torch's is_contiguous(): a dimension of one element may have any stride, and a
    # tensor without elements is dense whatever its strides.
    dict(a=FakeTensor((1, 128), FBF16, strides=(7, 1)), out=FakeTensor((1, 128), FBF16)),
    dict(a=FakeTensor((0, 128), FBF16, strides=(1, 0)), out=FakeTensor((0, 128), FBF16)),
    dict(offsets=FakeTensor((5,), FI32, strides=(1,))),
])
def test_exchange_reader_follows_torchs_contiguity(any_reader, over):
    assert fast_args(**over)[1] is not None


@pytest.mark.parametrize("over", [
    dict(a=FakeTensor((16, 128), FBF16, strides=(256, 1))),   # rows of a wider tensor
    dict(b=FakeTensor((4, 256, 128), FBF16, strides=(32768, 128, 2))),
])
def test_exchange_reader_declines_strided_views(fake_torch, over):
    # The attribute reader is told they are contiguous; the exchange reader, reading the
    # strides, must decline on its own (and then the attribute reader is asked).
    over = {k: v for k, v in over.items()}
    for v in over.values():
        v._contiguous = False
    _register_fakes(exchange_capsule())
    FakeTensor.attrs_fail = True
    try:
        assert fast_args(**over)[1] is None
    finally:
        FakeTensor.attrs_fail = False


def test_exchange_reader_is_used_and_the_attribute_reader_is_the_fallback(fake_torch):
    _register_fakes(exchange_capsule())
    a, got = fast_args()
    assert got is not None and got[8] == 0x7000
    assert all(v.reads == 0 for v in a.values() if isinstance(v, FakeTensor))
    # A tensor the exchange API cannot describe (torch: a dtype its DLPack lacks) is read
    # through its attributes instead; the stream still comes from the exchange API.
    out = FakeTensor((16, 128), FBF16)
    out.dl_fails = True
    a, got2 = fast_args(out=out)
    assert got2 is not None and out.reads == 1 and a["a"].reads == 0
    assert got2[:7] == got[:7] and got2[7][10] == out.data_ptr()
    # Switched off (the benchmarks' comparison): attributes and the raw stream getter.
    cubist._cubist._fast_path_config(exchange=False)
    a, got3 = fast_args()
    assert got3[:7] == got[:7] and got3[8] == 0x5000 and a["a"].reads == 1


def test_exchange_api_is_taken_only_from_a_version_1_capsule(fake_torch):
    def registered(api):
        cubist._cubist._set_torch(FakeTensor, FBF16, FFP8, FI32, None, api)
        return cubist._cubist._fast_path_config()["exchange_api"]

    assert registered(exchange_capsule()) is True
    assert registered(ctypes.addressof(_EXCHANGE_API)) is False  # an int is not the protocol
    assert registered(_capsule_new(ctypes.addressof(_EXCHANGE_API), b"other", None)) is False
    v2 = ExchangeApiC(2, 0, None, None, None, None, _dltensor_from_py, _current_work_stream)
    assert registered(_capsule_new(ctypes.addressof(v2), _CAPSULE_NAME, None)) is False
    v2.prev_api = ctypes.addressof(_EXCHANGE_API)  # a newer table chaining to version 1
    assert registered(_capsule_new(ctypes.addressof(v2), _CAPSULE_NAME, None)) is True
    assert registered(None) is False


# MoeGemm.run itself is a C method (cubist_ext.cc, RunMethod) over the Python `run`. An op
# without a runtime (_cubist.MoeGemm._without_gpu) records what it would launch, so the
# whole call can be followed on the CPU: which path it took, and what it launched.
def recording_gemm():
    g = gemm_without_gpu()
    g._native = cubist._cubist.MoeGemm._without_gpu(0)
    g._native_run = g._native.run
    g._fast_run = g._native.fast_run
    return g


class PythonPathTaken(Exception):
    pass


def fast_only(g):
    """Makes the Python path raise PythonPathTaken (run's body starts with self._args)."""
    def boom(*args, **kwargs):
        raise PythonPathTaken()
    g._args = boom
    return g


def tensors():
    e, t, n, k = 4, 16, 256, 128
    return (FakeTensor((t, k), FBF16), FakeTensor((e, n, k), FBF16),
            FakeTensor((e + 1,), FI32), FakeTensor((t, n // 2), FBF16))


def launch_without_count(g):
    rec = g._native._last_launch()
    return rec[:7] + (list(rec[7]), rec[8])


def python_path_launch(*ts, **kw):
    """What the Python `run` launches for these arguments (the same op, Python path)."""
    g = recording_gemm()
    cubist.MoeGemm._python_run(g, *ts, **kw)
    return launch_without_count(g)


def test_run_launches_from_c_without_the_python_path(any_reader):
    g = fast_only(recording_gemm())
    a, b, offsets, out = tensors()
    g.run(a, b, offsets, out, activation="swiglu", stream=7)
    rec = g._native._last_launch()
    assert rec[9] == 1
    assert launch_without_count(g) == python_path_launch(a, b, offsets, out,
                                                         activation="swiglu", stream=7)
    # Keywords in any order, None for the optional tensors (as cubist.ops passes them),
    # names built at run time (not interned), activation's default.
    g.run(a, b, offsets, out, stream=9, alpha=None, limit=None, weights=None,
          **{"".join(["activ", "ation"]): "swiglu"})
    assert g._native._last_launch()[8:] == (9, 2)
    g.run(a, b, offsets, FakeTensor((16, 256), FBF16))
    assert g._native._last_launch()[2] == cubist._ACTIVATION_CODES["identity"]
    g.run(a, b, offsets, out, activation="swiglu")  # torch's current stream
    assert g._native._last_launch()[8] == (0x7000 if any_reader == "exchange" else 0x5000)


def test_run_with_a_bias_takes_the_python_path_and_launches_it(any_reader):
    a, b, offsets, out = tensors()
    g = fast_only(recording_gemm())
    g.run(a, b, offsets, out, activation="swiglu", bias=None, stream=7)  # fast: no bias
    assert launch_without_count(g)[7][11] == 0
    bias = FakeTensor((4, 256), FF32)
    with pytest.raises(PythonPathTaken):
        g.run(a, b, offsets, out, activation="swiglu", bias=bias, stream=7)
    g = recording_gemm()
    g.run(a, b, offsets, out, activation="swiglu", bias=bias, stream=7)
    got = launch_without_count(g)
    assert got[7][11] == bias.data_ptr() != 0
    want = python_path_launch(a, b, offsets, out, activation="swiglu", stream=7)
    assert got[:7] == want[:7] and got[7][:11] == want[7][:11] and got[8] == want[8] == 7
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^bias: expected float32 \[E=4, N=256\] .*got float32 \[4, 128\]$"):
        g.run(a, b, offsets, out, activation="swiglu", bias=FakeTensor((4, 128), FF32))


def test_run_hands_other_calls_to_the_python_run(fake_torch):
    a, b, offsets, out = tensors()
    want = python_path_launch(a, b, offsets, out, activation="swiglu", stream=7)
    g = recording_gemm()
    seen = []
    real = g._args

    def spy(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)
    g._args = spy
    # Tensors given by name, a stream object, scale tensors: the Python path, same launch.
    g.run(a=a, b=b, offsets=offsets, out=out, activation="swiglu", stream=7)
    assert len(seen) == 1 and launch_without_count(g) == want
    g.run(a, b, offsets, out, activation="swiglu", stream=type("S", (), {"cuda_stream": 7})())
    assert len(seen) == 2 and launch_without_count(g) == want
    # Call errors are the Python function's, word for word (3.13 adds a suggestion).
    with pytest.raises(TypeError, match=r"^MoeGemm\.run\(\) got an unexpected keyword argument 'activaton'"
                       r"(\. Did you mean 'activation'\?)?$"):
        g.run(a, b, offsets, out, activaton="swiglu")
    with pytest.raises(TypeError, match=r"^MoeGemm\.run\(\) takes 5 positional arguments but 6 were given$"):
        g.run(a, b, offsets, out, "swiglu")
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'out'"):
        g.run(a, b, offsets)
    with pytest.raises(cubist.InvalidArgumentError, match=r"^activation: 'gelu' is not one of"):
        g.run(a, b, offsets, out, activation="gelu")


def test_a_tensor_changed_in_place_is_read_again(any_reader):
    # Nothing about a tensor is kept between calls: the same object with another dtype,
    # shape or device is refused on the next call, with the message naming it.
    g = recording_gemm()
    a, b, offsets, out = tensors()
    g.run(a, b, offsets, out, activation="swiglu", stream=7)
    out.dtype = FF32
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^out: expected bfloat16 \[T=16, N/2=128\], got float32 \[16, 128\]$"):
        g.run(a, b, offsets, out, activation="swiglu", stream=7)
    out.dtype = FBF16
    b.shape, b.strides = (4, 128, 128), _dense((4, 128, 128))
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^out: expected bfloat16 \[T=16, N/2=64\], got bfloat16 \[16, 128\]$"):
        g.run(a, b, offsets, out, activation="swiglu", stream=7)
    b.shape, b.strides = (4, 256, 128), _dense((4, 256, 128))
    g.run(a, b, offsets, out, activation="swiglu", stream=7)
    assert g._native._last_launch()[9] == 2
    offsets.dtype = FI64
    with pytest.raises(cubist.InvalidArgumentError, match=r"^offsets: expected int32 \[E\+1\]"):
        g.run(a, b, offsets, out, activation="swiglu", stream=7)


def test_run_keeps_the_python_signature_and_docstring():
    run = cubist.MoeGemm.run
    # The same parameters after self (which the C method's signature marks positional-only).
    params = [list(inspect.signature(f).parameters.values())[1:]
              for f in (run, cubist.MoeGemm._python_run)]
    assert params[0] == params[1] and len(params[0]) == 16
    assert str(inspect.signature(recording_gemm().run)).startswith("(a, b, offsets, out, *, ")
    assert inspect.getdoc(run) == inspect.getdoc(cubist.MoeGemm._python_run)
    assert "torch's current" in run.__doc__


def test_fast_path_is_off_until_torch_is_registered():
    assert fast_args()[1] is None or "torch" in sys.modules


def without_timing(report):
    return {k: v for k, v in report.items() if k not in ("seconds",)}


def test_fetch_and_verify_equal_the_cli_reports(served_set, cli, tmp_path):
    url, _ = served_set
    cache = str(tmp_path / "cache")
    first = cubist.fetch(url, cache_dir=cache)
    assert first["ok"] is True
    assert first["counts"] == {"cached": 0, "downloaded": 2, "reused": 0, "failed": 0}
    assert [a["outcome"] for a in first["artifacts"]] == ["downloaded", "downloaded"]
    again = cubist.fetch(url, cache_dir=cache)
    assert again["counts"] == {"cached": 2, "downloaded": 0, "reused": 0, "failed": 0}
    by_cli = json.loads(subprocess.run([cli, "fetch", "--manifest", url, "--cache", cache,
                                        "--json"], check=True, capture_output=True,
                                       text=True).stdout)
    assert without_timing(by_cli) == without_timing(again)

    report = cubist.verify(url, cache_dir=cache, deep=True)
    assert report["ok"] is True and report["counts"] == {"ok": 2, "missing": 0, "corrupt": 0}
    by_cli = json.loads(subprocess.run([cli, "verify", "--manifest", url, "--cache", cache,
                                        "--deep", "--json"], check=True, capture_output=True,
                                       text=True).stdout)
    assert without_timing(by_cli) == without_timing(report)


def test_verify_reports_corruption_as_data_loss(served_set, tmp_path):
    url, _ = served_set
    cache = tmp_path / "cache"
    report = cubist.fetch(url, cache_dir=str(cache))
    sha = report["artifacts"][0]["sha256"]
    obj = cache / "objects/sha256" / sha[:2] / sha
    os.chmod(obj, 0o644)
    obj.write_bytes(b"x" * obj.stat().st_size)  # same size: the publish stamp catches it
    with pytest.raises(cubist.DataLossError, match="changed after it was verified") as e:
        cubist.verify(url, cache_dir=str(cache))
    bad = e.value.report["bad"]
    assert [b["state"] for b in bad] == ["sha256-mismatch"] and bad[0]["removed"] is False
    with pytest.raises(cubist.DataLossError, match=r"hash mismatch|sha256") as e:
        cubist.verify(url, cache_dir=str(cache), deep=True)
    bad = e.value.report["bad"]
    assert [b["state"] for b in bad] == ["sha256-mismatch"] and bad[0]["removed"] is True
    quiet = cubist.verify(url, cache_dir=str(cache), check=False)
    assert quiet["ok"] is False and quiet["counts"]["missing"] == 1
    assert cubist.fetch(url, cache_dir=str(cache))["counts"]["downloaded"] == 1  # repaired


def test_fetch_offline_missing_is_not_found(served_set, tmp_path):
    _, manifest = served_set
    with pytest.raises(cubist.NotFoundError) as e:
        cubist.fetch(str(manifest), cache_dir=str(tmp_path / "empty"), offline=True)
    assert e.value.report["counts"]["failed"] == 2
    assert "offline" in e.value.report["artifacts"][0]["error"]


def cli_select(cli, manifest, *flags):
    """`cubist select --json` for the bf16 SwiGLU problem of the select tests (8 experts x
    16 tokens, N 1024, K 512, sm_90), with `flags` added."""
    return json.loads(subprocess.run(
        [cli, "select", "--manifest", str(manifest), "--weights", "bf16", "--activations",
         "bf16", "--activation", "swiglu", "--experts", "8", "--tokens-per-expert", "16",
         "--n", "1024", "--k", "512", "--sm", "90", "--json", *flags],
        check=True, capture_output=True, text=True).stdout)


def test_select_equals_the_cli_report(served_set, cli):
    _, manifest = served_set
    report = cubist.select(str(manifest), weights="bf16", activations="bf16",
                           activation="swiglu", experts=8, tokens_per_expert=16, n=1024,
                           k=512, sm="90", explain=True)
    assert report["kernel"] == "moe_gemm_tma_bf16_bf16_swiglu_m64n128k64"
    assert report["problem"]["tokens"] == 128
    assert cli_select(cli, manifest, "--explain") == report
    with pytest.raises(cubist.NotFoundError, match=r"no kernel for moe_gemm\{weights=mxfp4"):
        cubist.select(str(manifest), weights="mxfp4", activations="bf16", experts=8,
                      tokens=128, n=1024, k=512, sm="90")
    miss = cubist.select(str(manifest), weights="mxfp4", activations="bf16", experts=8,
                         tokens=128, n=1024, k=512, sm="90", check=False)
    assert miss["kernel"] is None and miss["error"].startswith("no kernel for moe_gemm")
    with pytest.raises(cubist.InvalidArgumentError,
                       match="give exactly one of --tokens-per-expert T and --tokens TOTAL"):
        cubist.select(str(manifest), weights="bf16", activations="bf16", experts=8, n=1024,
                      k=512, sm="90")


def test_select_prices_routed_rows_as_the_cli_does(served_set, cli):
    """routed_top_k / routed_experts are --routed-top-k / --routed-experts: the same
    report, the same refusals."""
    _, manifest = served_set
    report = cubist.select(str(manifest), weights="bf16", activations="bf16",
                           activation="swiglu", experts=8, tokens_per_expert=16, n=1024,
                           k=512, sm="90", routed_top_k=2, routed_experts=32)
    assert report["problem"]["routed_top_k"] == 2
    assert report["problem"]["routed_experts"] == 32
    assert cli_select(cli, manifest, "--routed-top-k", "2", "--routed-experts", "32") == report
    assert "routed_top_k" not in cubist.select(
        str(manifest), weights="bf16", activations="bf16", activation="swiglu", experts=8,
        tokens_per_expert=16, n=1024, k=512, sm="90")["problem"]
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"--routed-top-k 9: give 0 \(rows spread evenly\)"):
        cubist.select(str(manifest), weights="bf16", activations="bf16", activation="swiglu",
                      experts=8, tokens_per_expert=16, n=1024, k=512, sm="90", routed_top_k=9)


def test_without_libcurl_a_download_names_the_package_to_install(served_set, tmp_path):
    """Slim images have no libcurl: the first transfer, not the import, needs it, and the
    error says what to install (apt-get or dnf) or set."""
    url, _ = served_set
    code = ("import cubist, sys\n"
            "try:\n"
            f"    cubist.fetch({url!r}, cache_dir={str(tmp_path / 'cache')!r})\n"
            "except cubist.Error as e:\n"
            "    print(type(e).__name__, e)\n")
    env = dict(os.environ, CUBIST_LIBCURL=str(tmp_path / "no-libcurl.so.4"))
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout
    assert out.startswith("FailedPreconditionError ")
    for fragment in ("no-libcurl.so.4", "apt-get install libcurl4", "dnf install libcurl",
                     "CUBIST_LIBCURL"):
        assert fragment in out


def test_the_command_keeps_its_exit_codes(cli, tmp_path):
    """The `cubist` command (the wheel's console script execs the real one): its output
    and exit codes (cli/exit_codes.h) reach the caller unchanged."""
    doctor = subprocess.run([cli, "doctor"], capture_output=True, text=True)
    assert doctor.returncode == 0 and "cache" in doctor.stdout
    usage = subprocess.run([cli, "fetchh"], capture_output=True, text=True)
    assert usage.returncode == 2 and "did you mean 'fetch'?" in usage.stderr
    missing = subprocess.run([cli, "verify", "--manifest", str(tmp_path / "none.json"),
                              "--cache", str(tmp_path / "c")], capture_output=True, text=True)
    assert missing.returncode == 5 and "run 'cubist fetch' first" in missing.stderr


def inexact_set(tmp_path):
    """write_set's kernels, marked as rounding an operand on purpose ("exact": false)."""
    from conftest import write_set
    manifest = write_set(tmp_path / "repo")
    doc = json.loads(manifest.read_text())
    for kernel in doc["kernels"]:
        kernel["exact"] = False
    manifest.write_text(json.dumps(doc, indent=1))
    return manifest


def test_select_takes_inexact_kernels_only_when_allowed(tmp_path, cli):
    manifest = inexact_set(tmp_path)
    problem = dict(weights="bf16", activations="bf16", activation="swiglu", experts=8,
                   tokens_per_expert=16, n=1024, k=512, sm="90")
    with pytest.raises(cubist.NotFoundError, match=r"no kernel for moe_gemm"):
        cubist.select(str(manifest), **problem)
    report = cubist.select(str(manifest), allow_inexact=True, **problem)
    assert report["kernel"] == "moe_gemm_tma_bf16_bf16_swiglu_m64n128k64"
    assert cli_select(cli, manifest, "--allow-inexact") == report


class RecordingNativeGemm:
    """Stands in for _cubist.MoeGemm (which needs a GPU runtime): records its arguments."""
    made = []

    def __init__(self, *args):
        RecordingNativeGemm.made.append(args)
        self.run = self.fast_run = None

    def set_device(self, device):
        pass


def test_moe_gemm_hands_allow_inexact_to_the_native_op(monkeypatch):
    monkeypatch.setattr(cubist._cubist, "MoeGemm", RecordingNativeGemm)
    rt = cubist.Runtime.__new__(cubist.Runtime)
    rt._native, rt.device = "native runtime", 0
    RecordingNativeGemm.made.clear()
    cubist.MoeGemm(rt)
    cubist.MoeGemm(rt, allow_inexact=True, pinned_kernel="k", pdl=True)
    cubist.MoeGemm(rt, routed_top_k=8, routed_experts=256)
    assert RecordingNativeGemm.made == [("native runtime", "", False, False, 0, 0),
                                        ("native runtime", "k", True, True, 0, 0),
                                        ("native runtime", "", False, False, 8, 256)]
    assert "allow_inexact" in inspect.signature(cubist.MoeGemm).parameters


def test_native_moe_gemm_takes_allow_inexact_and_the_routing():
    # The native constructor's signature (nanobind's docstring): runtime, pinned kernel,
    # pdl, allow_inexact, routed_top_k, routed_experts - what cubist.MoeGemm passes above.
    doc = cubist._cubist.MoeGemm.__init__.__doc__
    assert doc.count("bool") == 2, doc
    assert doc.count(": int") == 2, doc


def test_objects_alive_at_exit_are_not_reported_as_leaks():
    # torch keeps a MoeGemm used under torch.compile past the interpreter's end; stand-in:
    # an op whose reference is never dropped. nanobind would print "nanobind: leaked 1
    # instances!" and more at exit; the module turns that report off (cubist_ext.cc).
    code = ("import ctypes, cubist\n"
            "g = cubist._cubist.MoeGemm._without_gpu(0)\n"
            "ctypes.pythonapi.Py_IncRef(ctypes.py_object(g))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "leaked" not in r.stderr, r.stderr


# The MoE layer's argument checks per format pair (cubist.MoeLayer._pointers and the
# keywords of __call__ / prepare), on a layer built without a GPU whose native op only
# records what it is handed.
class RecordingNativeLayer:
    def __init__(self):
        self.runs = []

    def run(self, *args):
        self.runs.append(args)

    def workspace_size(self, max_tokens):
        return 1 << 20


def layer_without_gpu(weights="bf16", activations="bf16", activation="swiglu"):
    layer = cubist.MoeLayer.__new__(cubist.MoeLayer)
    layer.runtime = FakeRuntime()
    layer.num_experts, layer.top_k, layer.hidden, layer.intermediate = 4, 2, 256, 128
    layer.activation, layer.logits = activation, "fp32"
    layer.weights, layer.activations = weights, activations
    layer.num_local_experts = 4
    layer._gated = activation in ("swiglu", "geglu", "situ")
    layer.input_layout, layer.max_m = "token_major", 0
    layer._native = RecordingNativeLayer()
    return layer


FP8 = "|u1"  # raw bytes: the layer's format fixes the meaning
E, T, H, I = 4, 8, 256, 128


def layer_args(weights, activations):
    """Good arguments of a call for the pair: (positional, keywords)."""
    packed = weights in ("mxfp4", "nvfp4")
    elem = BF16 if weights == "bf16" else U8
    w1 = Cai((E, 2 * I, H // 2 if packed else H), elem)
    w2 = Cai((E, H, I // 2 if packed else I), elem)
    kw = dict(router_logits=Cai((T, E), F32), out=Cai((T, H), BF16),
              workspace=Cai((1 << 20,), U8), stream=0)
    if weights == "fp8-block":
        kw.update(w1_scale=Cai((E, 2, 2), F32), w2_scale=Cai((E, 2, 1), F32))
    if weights == "mxfp4":
        kw.update(w1_scale=Cai((E, 2 * I, H // 32), U8), w2_scale=Cai((E, H, I // 32), U8))
    if weights == "nvfp4":
        kw.update(w1_scale=Cai((E, 2 * I, H // 16), U8), w2_scale=Cai((E, H, I // 16), U8))
    if weights in ("fp8", "nvfp4"):
        kw.update(w1_global_scale=Cai((E,), F32), w2_global_scale=Cai((E,), F32))
    if activations in ("fp8", "nvfp4"):
        kw.update(input_scale=Cai((1,), F32), intermediate_scale=Cai((1,), F32))
    if weights == "mxfp4":  # gpt-oss's pair, with its expert biases
        kw.update(w1_bias=Cai((E, 2 * I), F32), w2_bias=Cai((E, H), F32))
    return (Cai((T, H), BF16), w1, w2), kw


PAIRS = [("bf16", "bf16"), ("fp8", "fp8"), ("fp8-block", "fp8-block"), ("mxfp4", "bf16"),
         ("mxfp4", "mxfp8"), ("nvfp4", "nvfp4")]
ORDER = ("x", "router_logits", "routing_bias", "topk_ids", "topk_weights", "w1", "w2",
         "w1_scale", "w2_scale", "w1_global_scale", "w2_global_scale", "input_scale",
         "intermediate_scale", "w1_bias", "w2_bias", "alpha", "beta", "limit", "out",
         "workspace", "masked_counts")


def ptr(c):
    return c.__cuda_array_interface__["data"][0]


@pytest.mark.parametrize("weights, activations", PAIRS)
def test_layer_hands_every_pairs_tensors_to_the_native_op_in_order(weights, activations):
    layer = layer_without_gpu(weights, activations)
    (x, w1, w2), kw = layer_args(weights, activations)
    out = layer(x, w1, w2, **kw)
    assert out is kw["out"]
    t, ptrs, ws_bytes, accumulate, stream, max_tokens = layer._native.runs[-1]
    assert (t, ws_bytes, accumulate, stream, max_tokens) == (T, 1 << 20, False, 0, -1)
    given = dict(kw, x=x, w1=w1, w2=w2)
    assert len(ptrs) == 21
    assert ptrs == [ptr(given[n]) if n in given else 0 for n in ORDER]
    # prepare: the same tensors; placeholders only for what it may make itself.
    kw.pop("stream")
    layer.prepare(64, w1, w2, x=x, **kw)
    assert layer._native.runs[-1][1] == ptrs and layer._native.runs[-1][5] == 64


@pytest.mark.parametrize("weights, activations, over, error", [
    # bf16 callers pass nothing new; a scale given to a pair without it is refused.
    ("bf16", "bf16", dict(w1_scale=Cai((E, 256, 8), U8)),
     r"^w1_scale: is given, but bf16 x bf16 takes no such scale; pass None$"),
    ("bf16", "bf16", dict(input_scale=Cai((1,), F32)),
     r"^input_scale: is given, but bf16 x bf16 takes no such scale; pass None$"),
    ("mxfp4", "mxfp8", dict(w1_global_scale=Cai((E,), F32)),
     r"^w1_global_scale: is given, but mxfp4 x mxfp8 takes no such scale; pass None$"),
    ("fp8-block", "fp8-block", dict(input_scale=Cai((1,), F32)),
     r"^input_scale: is given, but fp8-block x fp8-block takes no such scale"),
    # Missing: named with the expected dtype and shape, and where to get it.
    ("mxfp4", "bf16", dict(w1_scale=None),
     r"^w1_scale: mxfp4 x bf16 needs mxfp4 block scales \[L, 2I, H/32\]: pass uint8 or "
     r"float8_e8m0fnu \[4, 256, 8\] \(cubist.quantize_weights\(w1, 'mxfp4'\) returns it\)$"),
    ("nvfp4", "nvfp4", dict(w2_global_scale=None),
     r"^w2_global_scale: nvfp4 x nvfp4 needs nvfp4 per-expert dequantization scales \[L\]: "
     r"pass float32 \[4\] \(cubist.quantize_weights\(w2, 'nvfp4'\) returns it\)$"),
    ("fp8", "fp8", dict(input_scale=None),
     r"^input_scale: fp8 x fp8 needs the GEMM1 input's fp8 dequantization scale s "
     r"\(x ~ q x s\): pass float32 \[1\]$"),
    ("nvfp4", "nvfp4", dict(intermediate_scale=None),
     r"^intermediate_scale: nvfp4 x nvfp4 needs the GEMM2 input's nvfp4 global "
     r"quantization scale g = 448 x 6 / amax: pass float32 \[1\]$"),
    # Wrong dtype or shape.
    ("fp8", "fp8", dict(w1=Cai((E, 256, 256), BF16)),
     r"^w1: expected float8_e4m3fn or uint8 \[4, 256, 256\] \(\[L, 2I, H\]\), got bfloat16 "
     r"\[4, 256, 256\]$"),
    ("mxfp4", "bf16", dict(w1=Cai((E, 256, 256), U8)),
     r"^w1: expected uint8 or float4_e2m1fn_x2 \[4, 256, 128\] \(\[L, 2I, H/2\]\), got uint8 "
     r"\[4, 256, 256\]$"),
    ("nvfp4", "nvfp4", dict(w2=Cai((E, 256, 128), U8)),
     r"^w2: expected uint8 or float4_e2m1fn_x2 \[4, 256, 64\] \(\[L, H, I/2\]\)"),
    ("mxfp4", "mxfp8", dict(w1_scale=Cai((E, 256, 16), U8)),
     r"^w1_scale: expected uint8 or float8_e8m0fnu \[4, 256, 8\] \(mxfp4 block scales "
     r"\[L, 2I, H/32\]\), got uint8 \[4, 256, 16\]$"),
    ("nvfp4", "nvfp4", dict(w2_scale=Cai((E, 256, 4), U8)),
     r"^w2_scale: expected uint8 or float8_e4m3fn \[4, 256, 8\] \(nvfp4 block scales "
     r"\[L, H, I/16\]\), got uint8 \[4, 256, 4\]$"),
    ("fp8-block", "fp8-block", dict(w1_scale=Cai((E, 2, 2), U8)),
     r"^w1_scale: expected float32 \[4, 2, 2\] \(fp8-block block scales \[L, ceil\(2I/128\), "
     r"ceil\(H/128\)\]\), got uint8 \[4, 2, 2\]$"),
    ("fp8", "fp8", dict(w1_global_scale=Cai((1,), F32)),
     r"^w1_global_scale: expected float32 \[4\] \(fp8 per-expert dequantization scales "
     r"\[L\]\), got float32 \[1\]$"),
    ("nvfp4", "nvfp4", dict(input_scale=Cai((), F32)),
     r"^input_scale: expected float32 \[1\] \(the GEMM1 input's nvfp4 global quantization "
     r"scale g = 448 x 6 / amax\), got float32 \[\]$"),
    ("bf16", "bf16", dict(w1=Cai((E, 128, 256), BF16)),
     r"^w1: expected bfloat16 \[4, 256, 256\] \(\[L, 2I, H\]\), got bfloat16 \[4, 128, 256\]$"),
])
def test_layer_argument_errors_name_the_argument(weights, activations, over, error):
    layer = layer_without_gpu(weights, activations)
    (x, w1, w2), kw = layer_args(weights, activations)
    w1, w2 = over.pop("w1", w1), over.pop("w2", w2)
    kw.update(over)
    kw = {k: v for k, v in kw.items() if v is not None}
    with pytest.raises(cubist.InvalidArgumentError, match=error):
        layer(x, w1, w2, **kw)
    assert layer._native.runs == []


def test_layer_call_and_prepare_take_the_same_keywords():
    call = inspect.signature(cubist.MoeLayer.__call__).parameters
    prepare = inspect.signature(cubist.MoeLayer.prepare).parameters
    for name in cubist._moe_layer.SCALE_ARGUMENTS:
        assert call[name].default is None and prepare[name].default is None
    assert set(call) - {"self", "x"} <= set(prepare)
    # bf16 callers' positional and keyword arguments are unchanged.
    assert list(call)[:4] == ["self", "x", "w1", "w2"]
    assert list(prepare)[:4] == ["self", "max_tokens", "w1", "w2"]



def test_layer_refuses_a_bias_of_the_wrong_shape():
    layer = layer_without_gpu("bf16", "bf16")
    (x, w1, w2), kw = layer_args("bf16", "bf16")
    kw["w2_bias"] = Cai((E, H + 8), F32)
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"w2_bias: expected float32 \[%d, %d\] \(\[L, H\]\), got float32" % (E, H)):
        layer(x, w1, w2, **kw)


# The expert-major masked layout (input_layout="expert_major_masked"): x and out
# [L, max_m, H], per-expert counts, no routing tensors.
MAX_M = 8


def masked_layer_without_gpu(weights="bf16", activations="bf16"):
    layer = layer_without_gpu(weights, activations)
    layer.input_layout, layer.max_m, layer.top_k = "expert_major_masked", MAX_M, 0
    return layer


def masked_args():
    (_, w1, w2), kw = layer_args("bf16", "bf16")
    del kw["router_logits"]
    kw.update(out=Cai((E, MAX_M, H), BF16), masked_counts=Cai((E,), I32))
    return (Cai((E, MAX_M, H), BF16), w1, w2), kw


def test_masked_layer_hands_x_counts_and_out_to_the_native_op():
    layer = masked_layer_without_gpu()
    (x, w1, w2), kw = masked_args()
    assert layer(x, w1, w2, **kw) is kw["out"]
    t, ptrs, ws_bytes, accumulate, stream, max_tokens = layer._native.runs[-1]
    assert (t, ws_bytes, accumulate, stream, max_tokens) == (E * MAX_M, 1 << 20, False, 0, -1)
    given = dict(kw, x=x, w1=w1, w2=w2)
    assert ptrs == [ptr(given[n]) if n in given else 0 for n in ORDER]
    assert ptrs[ORDER.index("router_logits")] == 0
    kw.pop("stream")
    layer.prepare(0, w1, w2, x=x, **kw)
    assert layer._native.runs[-1][1] == ptrs


@pytest.mark.parametrize("change, error", [
    (dict(router_logits=Cai((E * MAX_M, E), F32)),
     r"^router_logits: is given, but expert_major_masked input is routed already; "
     r"pass masked_counts$"),
    (dict(topk_ids=Cai((E * MAX_M, 2), I32)), r"^topk_ids: is given, but expert_major"),
    (dict(masked_counts=None),
     r"^masked_counts: expert_major_masked input needs int32 \[L\] per-expert row counts"),
    (dict(masked_counts=Cai((E + 1,), I32)), r"^masked_counts: expected int32 \[4\], got"),
    (dict(masked_counts=Cai((E,), F32)), r"^masked_counts: expected int32 \[4\], got"),
    (dict(out=Cai((E * MAX_M, H), BF16)), r"^out: expected bfloat16 \[4, 8, 256\], got"),
    (dict(x=Cai((E * MAX_M, H), BF16)),
     r"^x: expected bfloat16 \[L, max_m, H\] = \[4, 8, 256\], got bfloat16 \[32, 256\]$"),
])
def test_masked_layer_refuses_routing_tensors_and_wrong_shapes(change, error):
    layer = masked_layer_without_gpu()
    (x, w1, w2), kw = masked_args()
    x = change.pop("x", x)
    kw.update(change)
    with pytest.raises(cubist.InvalidArgumentError, match=error):
        layer(x, w1, w2, **kw)
    assert not layer._native.runs


def test_token_major_layer_refuses_counts_and_the_torch_op_refuses_masked_input():
    layer = layer_without_gpu()
    (x, w1, w2), kw = layer_args("bf16", "bf16")
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^masked_counts: is for input_layout='expert_major_masked' only$"):
        layer(x, w1, w2, masked_counts=Cai((E,), I32), **kw)
    masked = masked_layer_without_gpu()
    (x, w1, w2), kw = masked_args()
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^input_layout: torch.ops.cubist.moe serves token_major input"):
        masked.op(x, w1, w2, masked_counts=kw["masked_counts"])
