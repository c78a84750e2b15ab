"""Device tensors from any library, without importing one.

`describe(x, name)` returns a TensorInfo for a torch tensor (read directly: the fast
path), any object with `__cuda_array_interface__` (CuPy, Numba, ...) or with `__dlpack__`
(JAX, TensorFlow, ...). Only dense row-major CUDA tensors are accepted; every error names
the argument.
"""
import ctypes
import sys

from . import _cubist
from ._errors import InvalidArgumentError

# dtype names (torch's spelling) by source.
_TORCH_DTYPE_NAMES = {}  # torch.dtype -> name, filled on first torch tensor
_TORCH_NAMES = (
    "bfloat16", "float16", "float32", "int32", "int64", "uint8", "int8",
    "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2",
)
_CAI_TYPESTR = {
    "<f4": "float32", "<f2": "float16", "<i4": "int32", "<i8": "int64", "|u1": "uint8",
    "|i1": "int8", "<V2": "bfloat16", "<u2": "bfloat16",
}
# DLPack (code, bits) -> name; codes from dlpack.h (v1.1): 0 int, 1 uint, 2 float,
# 4 bfloat, 6..13 the float8/float6/float4 types.
_DLPACK = {
    (0, 8): "int8", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
    (2, 16): "float16", (2, 32): "float32", (4, 16): "bfloat16",
    (6, 8): "float8_e4m3fn", (13, 8): "float8_e8m0fnu",
}
_KDLCUDA = 2
_torch_tensor_type = None


class TensorInfo:
    __slots__ = ("ptr", "dtype", "shape", "device")

    def __init__(self, ptr, dtype, shape, device):
        self.ptr = ptr        # int; 0 for an empty tensor
        self.dtype = dtype    # str, torch's spelling
        self.shape = shape    # tuple of ints
        self.device = device  # CUDA ordinal; None when the source does not say


def _bad(name, what):
    return InvalidArgumentError(f"{name}: {what}")


def _torch_type():
    global _torch_tensor_type
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if _torch_tensor_type is None:
        for n in _TORCH_NAMES:
            dt = getattr(torch, n, None)
            if dt is not None:
                _TORCH_DTYPE_NAMES[dt] = n
        _torch_tensor_type = torch.Tensor
        # MoeGemm.run's C++ fast path reads torch tensors with these (cubist_ext.cc):
        # through DLPack's C exchange API where torch has it, else their attributes.
        _cubist._set_torch(torch.Tensor, torch.bfloat16, getattr(torch, "float8_e4m3fn", None),
                           torch.int32, getattr(torch._C, "_cuda_getCurrentRawStream", None),
                           getattr(torch.Tensor, "__dlpack_c_exchange_api__", None))
    return _torch_tensor_type


def describe(x, name):
    tt = _torch_type()
    if tt is not None and isinstance(x, tt):
        if not x.is_cuda:
            raise _bad(name, f"is on {x.device}; cubist runs on CUDA tensors")
        if not x.is_contiguous():
            raise _bad(name, f"must be contiguous (row-major, dense); got strides "
                       f"{tuple(x.stride())} for shape {tuple(x.shape)}: call .contiguous()")
        dt = _TORCH_DTYPE_NAMES.get(x.dtype)
        return TensorInfo(x.data_ptr(), dt if dt is not None else str(x.dtype),
                          tuple(x.shape), x.get_device())
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(cai, name)
    if hasattr(x, "__dlpack__"):
        return _from_dlpack(x, name)
    raise _bad(name, f"expected a CUDA tensor (torch, __cuda_array_interface__ or "
               f"__dlpack__), got {type(x).__name__}")


def _dense_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _from_cai(cai, name):
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    dtype = _CAI_TYPESTR.get(typestr, typestr)
    ptr = cai["data"][0] or 0
    strides = cai.get("strides")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    if strides is not None and tuple(strides) != _dense_strides(shape, itemsize):
        if any(d > 1 for d in shape):
            raise _bad(name, f"must be contiguous (row-major, dense); got strides "
                       f"{tuple(strides)} for shape {shape}")
    # The interface does not say which device owns the memory: None = not checked.
    return TensorInfo(ptr, dtype, shape, None)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_get_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_capsule_pointer.restype = ctypes.c_void_p
_get_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(x, name):
    dev_type, dev_id = x.__dlpack_device__()
    if dev_type != _KDLCUDA:
        raise _bad(name, f"is on DLPack device type {dev_type}; cubist runs on CUDA "
                   f"tensors (kDLCUDA = 2)")
    # The legacy (unversioned) capsule: its DLManagedTensor starts with the DLTensor.
    # `x` keeps the memory alive while the caller uses the pointer; the capsule, never
    # consumed, frees only its own metadata.
    capsule = x.__dlpack__(stream=None)
    t = _DLTensor.from_address(_get_capsule_pointer(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    dtype = _DLPACK.get((t.dtype.code, t.dtype.bits), f"dlpack({t.dtype.code},{t.dtype.bits})")
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
        if strides != _dense_strides(shape, 1) and any(d > 1 for d in shape):
            raise _bad(name, f"must be contiguous (row-major, dense); got element strides "
                       f"{strides} for shape {shape}")
    ptr = (t.data or 0) + t.byte_offset
    return TensorInfo(ptr, dtype, shape, dev_id)
