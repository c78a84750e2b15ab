"""cubist for Python: verified, cached MoE GEMM kernels on CUDA tensors.

    import torch, cubist
    rt = cubist.Runtime("https://kernels.example/moe/manifest.json")
    gemm = cubist.MoeGemm(rt)
    gemm.run(a, b, offsets, out, activation="swiglu")   # on torch's current stream

The native layer (cubist._cubist) is the C++ library itself (dispatch/runtime.h,
dispatch/moe_gemm.h, report/reports.h); this file turns tensors into pointers and sizes
and checks them, naming the argument in every error. torch is never imported here:
tensors come as torch tensors, `__cuda_array_interface__` or `__dlpack__` objects.
`cubist.ops` (imported on demand) registers the torch custom op `cubist::moe_gemm` for
torch.compile and CUDA-graph capture.
"""
import json
import sys
import weakref

from . import _cubist
from ._errors import *  # noqa: F401,F403 (the exception classes are the package's API)
from ._errors import BY_CODE, Error, InvalidArgumentError, __all__ as _error_names
from ._tensors import describe

_cubist._register_errors(BY_CODE)

__all__ = ["Runtime", "MoeGemm", "MoeLayer", "fetch", "verify", "select", "FORMATS",
           "ACTIVATIONS", "ROUTING_METHODS", "GATED_LAYOUTS", "gated_weights",
           "quantize_weights", "dequantize_weights", "WEIGHT_FORMATS"] + list(
               _error_names)
__version__ = "0.1.0"

FORMATS = ("bf16", "fp8", "fp8-block", "mxfp4", "mxfp8", "nvfp4")
ACTIVATIONS = ("identity", "relu2", "swiglu", "geglu", "situ")
_GATED = {"swiglu", "geglu", "situ"}
_PACKED = {"mxfp4", "nvfp4"}  # two e2m1 elements per byte along K
_FP8 = ("float8_e4m3fn", "uint8", "int8")
_FP4 = ("uint8", "int8", "float4_e2m1fn_x2")
_ELEMENT_DTYPES = {"bf16": ("bfloat16",), "fp8": _FP8, "fp8-block": _FP8, "mxfp8": _FP8,
                   "mxfp4": _FP4, "nvfp4": _FP4}
_E8M0 = ("uint8", "int8", "float8_e8m0fnu")
_SCALE_DTYPES = {"fp8-block": ("float32",), "mxfp8": _E8M0, "mxfp4": _E8M0,
                 "nvfp4": ("float8_e4m3fn", "uint8", "int8")}
_FORMAT_CODES = {f: _cubist.format_code(f) for f in FORMATS}
_ACTIVATION_CODES = {a: _cubist.activation_code(a) for a in ACTIVATIONS}


def _bad(name, what):
    return InvalidArgumentError(f"{name}: {what}")


def _infer_format(elem, scale, which):
    """The format of a or b from its dtypes (str names), or raise naming the argument."""
    if elem == "bfloat16":
        return "bf16"
    if elem == "float8_e4m3fn":
        if scale is None:
            return "fp8"
        return "fp8-block" if scale == "float32" else "mxfp8"
    if elem in _FP4:  # raw bytes are packed fp4 unless weights=/activations= say fp8
        if scale is None:
            raise _bad(f"{which}_scale", f"{which} holds packed fp4 ({elem}); mxfp4 and "
                       f"nvfp4 need block scales")
        return "nvfp4" if scale == "float8_e4m3fn" else "mxfp4"
    raise _bad(which, f"dtype {elem} is not a cubist format; give "
               f"{'weights' if which == 'b' else 'activations'}= one of {', '.join(FORMATS)}")


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _device_of(device):
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device
    if index is not None or getattr(device, "type", None) == "cuda":
        return index or 0
    if isinstance(device, str) and device.startswith("cuda"):
        return int(device.partition(":")[2] or 0)
    raise _bad("device", f"expected a CUDA ordinal, 'cuda:N' or a torch.device, got {device!r}")


def _strs(v):
    if v is None:
        return []
    return [v] if isinstance(v, str) else [str(x) for x in v]


class Runtime:
    """One manifest's kernels on one GPU (dispatch/runtime.h).

    manifest: URL (https, http, file), local path or oci:// reference. cache_dir: the
    content-addressed cache (default $CUBIST_CACHE_DIR, $XDG_CACHE_HOME/cubist,
    ~/.cache/cubist). device: CUDA ordinal, 'cuda:N' or torch.device (default: torch's
    current device, else 0). offline: no network, everything from the cache.
    trusted_keys: 'ed25519:<base64>' keys or key files; with any, unsigned manifests are
    refused (CUBIST_TRUSTED_KEYS adds more). prefetch: download this GPU's kernels now;
    preload: also load them (before CUDA-graph capture). tuning_file: None = the cache's
    tuning.json, "none" = untuned.
    """

    def __init__(self, manifest, cache_dir=None, device=None, offline=False,
                 trusted_keys=(), *, trusted_keys_files=(), mirrors=(), allow_expired=False,
                 allow_rollback=False, prefetch=True, preload=False, tuning_file=None):
        self.device = _device_of(device)
        self.manifest = str(manifest)
        self._native = _cubist.Runtime(
            self.manifest, str(cache_dir or ""), self.device, bool(offline), _strs(mirrors),
            _strs(trusted_keys), _strs(trusted_keys_files), bool(allow_expired),
            bool(allow_rollback), bool(prefetch), bool(preload), str(tuning_file or ""))
        # Launches need the device's primary context current on the calling thread; torch
        # makes it current only once it touches the device, which may come later.
        self._native.make_current()

    device_name = property(lambda self: self._native.device_name)
    sm = property(lambda self: self._native.sm, doc="compute capability as 90, 100, ...")
    sm_count = property(lambda self: self._native.sm_count)
    driver_version = property(lambda self: self._native.driver_version)
    manifest_name = property(lambda self: self._native.manifest_name)
    manifest_version = property(lambda self: self._native.manifest_version)
    tuning_path = property(lambda self: self._native.tuning_path)

    def make_current(self):
        """Makes the runtime's context current on this thread (torch/cudart's already is)."""
        self._native.make_current()

    def prefetch(self):
        self._native.prefetch()

    def preload(self):
        self._native.preload()

    def __repr__(self):
        return (f"cubist.Runtime({self.manifest!r}, device={self.device}: "
                f"{self.device_name}, sm_{self.sm})")


_live_gemms = weakref.WeakValueDictionary()  # handle -> MoeGemm, for cubist.ops


class MoeGemm:
    """The MoE batched GEMM (dispatch/moe_gemm.h, docs/kernels.md):
    out[t] = act(A[t] . B[e]^T + bias[e]) for the rows t of expert e,
    offsets[e] <= t < offsets[e+1] (bias optional).

    pinned_kernel: always this kernel (debugging). pdl: programmatic dependent launch.
    allow_inexact: selection and tune may also choose kernels that round an operand on
    purpose (manifest "exact": false; MoeGemmOptions::allow_inexact). Off, results are
    exact whatever the cost model or the timings say; a pinned kernel is used either way.
    routed_top_k, routed_experts: the offsets come from a top-k router over that many
    experts (default: the call's), so each expert's rows vary and the tiles are priced
    for that spread (MoeGemmOptions::routed_top_k; docs/kernels.md "Cost model"); 0:
    rows spread evenly.
    """

    _next_handle = 1

    def __init__(self, runtime, *, pinned_kernel=None, pdl=False, allow_inexact=False,
                 routed_top_k=0, routed_experts=0):
        if not isinstance(runtime, Runtime):
            raise _bad("runtime", f"expected cubist.Runtime, got {type(runtime).__name__}")
        self.runtime = runtime
        self._native = _cubist.MoeGemm(runtime._native, str(pinned_kernel or ""), bool(pdl),
                                       bool(allow_inexact), int(routed_top_k),
                                       int(routed_experts))
        self._native_run = self._native.run
        self._native.set_device(self.runtime.device)
        self._fast_run = self._native.fast_run
        self._formats = {}  # (a, b, a_scale, b_scale dtypes) -> (weights, activations)
        self.handle = MoeGemm._next_handle
        MoeGemm._next_handle += 1
        _live_gemms[self.handle] = self

    def _args(self, a, b, offsets, out, weights, activations, activation, a_scale, b_scale,
              a_global_scale, b_global_scale, alpha, beta, limit, bias=None):
        """(wf, af, act, E, T, N, K, 12 pointers, device) after the argument checks."""
        device = self.runtime.device
        ia, ib, io, iout = (describe(a, "a"), describe(b, "b"), describe(offsets, "offsets"),
                            describe(out, "out"))
        isa = describe(a_scale, "a_scale") if a_scale is not None else None
        isb = describe(b_scale, "b_scale") if b_scale is not None else None
        key = (ia.dtype, ib.dtype, isa.dtype if isa else None, isb.dtype if isb else None,
               weights, activations)
        fmts = self._formats.get(key)
        if fmts is None:
            fmts = self._formats[key] = self._formats_for(ia, ib, isa, isb, weights,
                                                          activations)
        wf, af = fmts
        act = _ACTIVATION_CODES.get(activation)
        if act is None:
            raise _bad("activation", f"{activation!r} is not one of {', '.join(ACTIVATIONS)}")
        for info, name in ((ia, "a"), (ib, "b"), (io, "offsets"), (iout, "out")):
            if info.device is not None and info.device != device:
                raise _bad(name, f"is on cuda:{info.device}; this runtime runs on "
                           f"cuda:{device}")
        if io.dtype != "int32" or len(io.shape) != 1 or io.shape[0] < 2:
            raise _bad("offsets", f"expected int32 [E+1] (E >= 1), got {io.dtype} "
                       f"{list(io.shape)}")
        e = io.shape[0] - 1
        if len(ib.shape) != 3 or ib.shape[0] != e:
            raise _bad("b", f"expected [E={e}, N, K{'/2' if wf in _PACKED else ''}], got "
                       f"{list(ib.shape)}")
        n = ib.shape[1]
        k = ib.shape[2] * (2 if wf in _PACKED else 1)
        if len(ia.shape) != 2:
            raise _bad("a", f"expected [T, K{'/2' if af in _PACKED else ''}], got "
                       f"{list(ia.shape)}")
        t = ia.shape[0]
        if ia.shape[1] * (2 if af in _PACKED else 1) != k:
            raise _bad("a", f"has K = {ia.shape[1] * (2 if af in _PACKED else 1)} but b has "
                       f"K = {k} (a {list(ia.shape)}, b {list(ib.shape)})")
        gated = activation in _GATED
        if gated and n % 2:
            raise _bad("b", f"N = {n} must be even for the gated activation {activation}")
        out_n = n // 2 if gated else n
        if iout.dtype != "bfloat16" or iout.shape != (t, out_n):
            raise _bad("out", f"expected bfloat16 [T={t}, {'N/2' if gated else 'N'}={out_n}], "
                       f"got {iout.dtype} {list(iout.shape)}")
        ptrs = [ia.ptr, ib.ptr, 0, 0, 0, 0, io.ptr, 0, 0, 0, iout.ptr, 0]
        if isa is not None or isb is not None or wf != "bf16" or af != "bf16":
            self._scales(ptrs, isa, isb, wf, af, e, t, n, k)
        for slot, x, name, count in ((4, a_global_scale, "a_global_scale", 1),
                                     (5, b_global_scale, "b_global_scale", e),
                                     (7, alpha, "alpha", e), (8, beta, "beta", e),
                                     (9, limit, "limit", e)):
            if x is not None:
                info = describe(x, name)
                if info.dtype != "float32" or _numel(info.shape) != count:
                    raise _bad(name, f"expected float32 with {count} element"
                               f"{'s' if count != 1 else ''}, got {info.dtype} "
                               f"{list(info.shape)}")
                if info.device is not None and info.device != device:
                    raise _bad(name, f"is on cuda:{info.device}; this runtime runs on "
                               f"cuda:{device}")
                ptrs[slot] = info.ptr
        if bias is not None:
            info = describe(bias, "bias")
            if info.dtype != "float32" or tuple(info.shape) != (e, n):
                raise _bad("bias", f"expected float32 [E={e}, N={n}] (one per expert and row "
                           f"of b{', both halves' if gated else ''}), got {info.dtype} "
                           f"{list(info.shape)}")
            if info.device is not None and info.device != device:
                raise _bad("bias", f"is on cuda:{info.device}; this runtime runs on "
                           f"cuda:{device}")
            ptrs[11] = info.ptr
        return (_FORMAT_CODES[wf], _FORMAT_CODES[af], act, e, t, n, k, ptrs, device)

    def _formats_for(self, ia, ib, isa, isb, weights, activations):
        wf = weights or _infer_format(ib.dtype, isb.dtype if isb else None, "b")
        af = activations or _infer_format(ia.dtype, isa.dtype if isa else None, "a")
        for fmt, arg in ((wf, "weights"), (af, "activations")):
            if fmt not in _FORMAT_CODES:
                raise _bad(arg, f"{fmt!r} is not one of {', '.join(FORMATS)}")
        for fmt, info, name in ((wf, ib, "b"), (af, ia, "a")):
            if info.dtype not in _ELEMENT_DTYPES[fmt]:
                raise _bad(name, f"dtype {info.dtype} does not hold {fmt} elements "
                           f"(expected {' or '.join(_ELEMENT_DTYPES[fmt])})")
        for fmt, info, name in ((wf, isb, "b_scale"), (af, isa, "a_scale")):
            want = _SCALE_DTYPES.get(fmt)
            if info is not None and want is None:
                raise _bad(name, f"{fmt} has no block scales; pass None")
            if info is not None and info.dtype not in want:
                raise _bad(name, f"dtype {info.dtype} does not hold {fmt} scales (expected "
                           f"{' or '.join(want)})")
        return wf, af

    def _scales(self, ptrs, isa, isb, wf, af, e, t, n, k):
        def expect(fmt, rows, blocks_rows):
            if fmt == "fp8-block":
                return blocks_rows * -(-k // 128)
            return rows * (k // (16 if fmt == "nvfp4" else 32))

        for info, fmt, name, slot, rows, blocks_rows in (
                (isa, af, "a_scale", 2, t, t), (isb, wf, "b_scale", 3, e * n, e * -(-n // 128))):
            if fmt not in _SCALE_DTYPES:
                continue
            if info is None:
                if name == "a_scale" and t == 0:
                    continue  # an empty batch reads no activations
                raise _bad(name, f"{fmt} needs block scales; pass the {name} tensor")
            want = expect(fmt, rows, blocks_rows)
            if _numel(info.shape) != want:
                raise _bad(name, f"expected {want} {fmt} scales for T={t} E={e} N={n} K={k}, "
                           f"got shape {list(info.shape)}")
            if info.device is not None and info.device != self.runtime.device:
                raise _bad(name, f"is on cuda:{info.device}; this runtime runs on "
                           f"cuda:{self.runtime.device}")
            ptrs[slot] = info.ptr

    def run(self, a, b, offsets, out, *, activation="identity", weights=None,
            activations=None, a_scale=None, b_scale=None, a_global_scale=None,
            b_global_scale=None, alpha=None, beta=None, limit=None, bias=None, stream=None):
        """Launches out = act(a . b^T) per expert on `stream` (default: torch's current
        stream on the runtime's device; the legacy default stream without torch).

        a [T, K] (K/2 bytes packed fp4), b [E, N, K], offsets int32 [E+1] with
        offsets[E] = T, out bfloat16 [T, N] or [T, N/2] for swiglu/geglu. Formats come
        from the dtypes (bfloat16; float8_e4m3fn: fp8, fp8-block with float32 scales,
        mxfp8 with uint8/e8m0 scales; uint8 or float4_e2m1fn_x2: packed mxfp4 with
        uint8/e8m0 scales, nvfp4 with e4m3 scales) or `weights=` / `activations=`. T = 0 is a no-op.
        bias: float32 [E, N] (N = b's rows, both halves when gated), contiguous, on the
        runtime's device: added to row n of expert e's product after the global scales,
        before the activation (gpt-oss); needs a kernel of parameter struct version 3.
        """
        # `run` is a C method (cubist_ext.cc, RunMethod; installed below): plain CUDA torch
        # tensors, bf16/fp8 without scales or bias, are read, checked and launched there.
        # This body is the general path, reached for everything else, errors included.
        wf, af, act, e, t, n, k, p, device = self._args(
            a, b, offsets, out, weights, activations, activation, a_scale, b_scale,
            a_global_scale, b_global_scale, alpha, beta, limit, bias)
        if stream is None:
            stream = _current_stream(device)
        elif not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", None) or getattr(stream, "ptr", 0)
        self._native_run(wf, af, act, e, t, n, k, p[0], p[1], p[2], p[3], p[4], p[5], p[6],
                         p[7], p[8], p[9], p[10], p[11], stream)

    def check(self, a, b, offsets, out, *, activation="identity", weights=None,
              activations=None, a_scale=None, b_scale=None, a_global_scale=None,
              b_global_scale=None, alpha=None, beta=None, limit=None, bias=None):
        """Raises why `run` with these arguments cannot work (argument errors, no kernel:
        NotFoundError naming the nearest ones). Selects, and may fetch and load, the
        kernel: call it once per shape before CUDA-graph capture."""
        wf, af, act, e, t, n, k, p, _ = self._args(
            a, b, offsets, out, weights, activations, activation, a_scale, b_scale,
            a_global_scale, b_global_scale, alpha, beta, limit, bias)
        self._native.can_implement(wf, af, act, e, t, n, k, *p)

    def can_implement(self, *args, **kwargs):
        """True when `run` can serve these arguments (as check(), without the reason)."""
        try:
            self.check(*args, **kwargs)
        except Error:
            return False
        return True

    def kernel_for(self, *, weights, activations, activation, experts, tokens, n, k):
        """The kernel `run` launches for this problem (selecting, fetching and loading it
        if new): a dict with kernel, artifact, function, arch, abi, tile, cluster, threads,
        shared_mem_bytes, from_tuning."""
        return self._native.kernel_for(*self._problem(weights, activations, activation,
                                                      experts, tokens, n, k))

    def tune(self, *, weights, activations, activation, experts, tokens, n, k, top_k=4,
             warmup=3, iterations=20, record=True):
        """Times the cost model's top_k candidates on this GPU and makes the fastest this
        problem's kernel (recorded in the runtime's tuning file when `record`). Returns
        {"winner", "winner_us", "timings": [{"kernel", "model_rank", "model_us",
        "measured_us"}...]}."""
        return self._native.tune(*self._problem(weights, activations, activation, experts,
                                                tokens, n, k),
                                 int(top_k), int(warmup), int(iterations), bool(record))

    @staticmethod
    def _problem(weights, activations, activation, experts, tokens, n, k):
        for v, arg, allowed in ((weights, "weights", _FORMAT_CODES),
                                (activations, "activations", _FORMAT_CODES),
                                (activation, "activation", _ACTIVATION_CODES)):
            if v not in allowed:
                raise _bad(arg, f"{v!r} is not one of {', '.join(allowed)}")
        return (_FORMAT_CODES[weights], _FORMAT_CODES[activations],
                _ACTIVATION_CODES[activation], int(experts), int(tokens), int(n), int(k))

    def op(self, a, b, offsets, out, *, activation="identity", weights=None,
           activations=None, a_scale=None, b_scale=None, a_global_scale=None,
           b_global_scale=None, alpha=None, beta=None, limit=None, bias=None):
        """`run` through the torch custom op torch.ops.cubist.moe_gemm (cubist.ops), for
        torch.compile; eager calls and CUDA-graph capture work with `run` as well."""
        op = _torch_op or _load_torch_op()
        op(self.handle, a, b, offsets, out, a_scale, b_scale, a_global_scale,
           b_global_scale, alpha, beta, limit, weights or "", activations or "", activation,
           bias)


def _install_run(cls):
    """Makes cls.run the C method of cubist._cubist (cubist_ext.cc, RunMethod), which
    takes the fast path without a Python frame and hands every other call, as it came, to
    the Python `run` defined above (kept as cls._python_run); the signature and docstring
    stay the Python function's."""
    fn = cls.run
    code = fn.__code__
    pos = code.co_varnames[1:code.co_argcount]
    kw = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    sig = ", ".join(("$self",) + pos + ("*",) + tuple(
        f"{k}={fn.__kwdefaults__[k]!r}" for k in kw))
    cls._python_run = fn
    cls.run = _cubist._install_run(cls, fn, f"run({sig})\n--\n\n{fn.__doc__}")


_install_run(MoeGemm)
from ._moe_layer import (  # noqa: E402 (needs Runtime)
    GATED_LAYOUTS, MoeLayer, ROUTING_METHODS, _live_layers, gated_weights)
from ._quantize import WEIGHT_FORMATS, dequantize_weights, quantize_weights  # noqa: E402
_stream_getter = None
_torch_op = None  # torch.ops.cubist.moe_gemm once cubist.ops is imported


def _load_torch_op():
    global _torch_op
    from . import ops
    # The OpOverload, which torch.compile traces as one node.
    _torch_op = ops.torch.ops.cubist.moe_gemm.default
    return _torch_op


def _current_stream(device):
    global _stream_getter
    if _stream_getter is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return 0  # no torch: the legacy default stream
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _stream_getter = raw if raw is not None else (
            lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _stream_getter(device)


def _report(result, check):
    text, code, message = result
    report = json.loads(text)
    if check and code != 0:
        raise BY_CODE[code](message, report)
    return report


def fetch(manifest, cache_dir=None, offline=False, *, jobs=16, mirrors=(), filters=(),
          retries=4, fsync=True, trusted_keys=(), trusted_keys_files=(), allow_expired=False,
          allow_rollback=False, check=True):
    """Downloads the manifest's artifacts into the cache, verified (`cubist fetch`).
    Returns the report `cubist fetch --json` prints. With `check`, a report with a
    failure raises its error class (DataLossError, UnavailableError, NotFoundError, ...)
    with the report as `.report`."""
    return _report(_cubist.fetch(str(manifest), str(cache_dir or ""), int(jobs),
                                 bool(offline), _strs(mirrors), _strs(filters), int(retries),
                                 not fsync, _strs(trusted_keys), _strs(trusted_keys_files),
                                 bool(allow_expired), bool(allow_rollback)), check)


def verify(manifest, cache_dir=None, deep=False, *, offline=False, threads=0,
           trusted_keys=(), trusted_keys_files=(), allow_expired=False, allow_rollback=False,
           check=True):
    """Checks that every artifact is in the cache (`deep`: re-hashed; corrupt objects are
    removed so fetch repairs them) (`cubist verify --json`'s report). With `check`, a
    failed verification raises (NotFoundError when missing, DataLossError when corrupt)."""
    return _report(_cubist.verify(str(manifest), str(cache_dir or ""), bool(deep),
                                  bool(offline), int(threads), _strs(trusted_keys),
                                  _strs(trusted_keys_files), bool(allow_expired),
                                  bool(allow_rollback)), check)


def select(manifest, *, weights, activations, experts, n, k, sm, activation="identity",
           tokens=None, tokens_per_expert=None, sm_count=0, op="moe_gemm", output_format=None,
           kernel=None, explain=False, allow_inexact=False, cache_dir=None, offline=False,
           trusted_keys=(), trusted_keys_files=(), check=True, routed_top_k=0,
           routed_experts=0):
    """The kernel a manifest offers for a problem, without a GPU (`cubist select --json`'s
    report; `explain` adds every kernel's verdict). sm: "90", "90a", "100f", ...
    Give tokens (total) or tokens_per_expert. allow_inexact: kernels that round an operand
    on purpose (manifest "exact": false) are candidates too (`--allow-inexact`).
    routed_top_k: the rows come from a top-k router over routed_experts (default:
    experts) experts, so each expert's rows vary (`--routed-top-k`, `--routed-experts`);
    0: spread evenly. With `check`, no kernel raises NotFoundError (with the report)."""
    return _report(_cubist.select(
        str(manifest), str(cache_dir or ""), op, weights, activations, activation,
        int(experts), -1 if tokens is None else int(tokens),
        -1 if tokens_per_expert is None else int(tokens_per_expert), int(n), int(k), str(sm),
        int(sm_count), output_format or "", kernel or "", bool(explain), bool(allow_inexact),
        bool(offline), _strs(trusted_keys), _strs(trusted_keys_files), int(routed_top_k),
        int(routed_experts)), check)
