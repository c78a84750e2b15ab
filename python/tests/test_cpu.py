"""The package without a GPU (CI): import, errors, argument checks, fetch/verify/select
against the CLI's reports through nginx."""
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
    def __init__(self, shape, dtype, cuda=True, contiguous=True, device=0):
        self.shape, self.dtype, self.is_cuda = tuple(shape), dtype, cuda
        self._contiguous, self._device = contiguous, device
        self._ptr = Cai.next_ptr if all(shape) else 0
        Cai.next_ptr += 1 << 20

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._device if self.is_cuda else -1

    def cai(self):
        return Cai(self.shape, FAKE_TYPESTR[self.dtype], ptr=self._ptr)


@pytest.fixture
def fake_torch():
    cubist._cubist._set_torch(FakeTensor, FBF16, FFP8, FI32, lambda device: 0x5000 + device)
    yield
    cubist._cubist._set_torch(None, None, None, None, None)
    cubist._tensors._torch_tensor_type = None  # torch, if imported, registers again


def fast_args(device=0, **over):
    e, t, n, k = 4, 16, 256, 128
    a = dict(a=FakeTensor((t, k), FBF16), b=FakeTensor((e, n, k), FBF16),
             offsets=FakeTensor((e + 1,), FI32), out=FakeTensor((t, n // 2), FBF16),
             activation="swiglu", weights=None, activations=None, a_scale=None, b_scale=None,
             a_global_scale=None, b_global_scale=None, alpha=None, beta=None, limit=None,
             stream=None)
    a.update(over)
    return a, cubist._cubist._fast_args(device, *a.values())


@pytest.mark.parametrize("over", [
    {}, dict(activation="identity", out=FakeTensor((16, 256), FBF16)),
    dict(a=FakeTensor((16, 128), FFP8), b=FakeTensor((4, 256, 128), FFP8)),
    dict(a=FakeTensor((0, 128), FBF16), out=FakeTensor((0, 128), FBF16)), dict(stream=7),
])
def test_fast_path_gives_what_the_python_checks_give(fake_torch, over):
    a, got = fast_args(**over)
    assert got is not None
    cai = {k: v.cai() if isinstance(v, FakeTensor) else v for k, v in a.items()}
    del cai["stream"]
    if a["a"].dtype is FFP8:  # as bytes over the array interface: say what they hold
        cai.update(weights="fp8", activations="fp8")
    want = gemm_without_gpu()._args(**cai)
    assert got[:7] == want[:7] and list(got[7]) == want[7]
    assert got[8] == (over.get("stream") or 0x5000)


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
    dict(stream=object()), dict(stream=-1),
])
def test_fast_path_declines_everything_else(fake_torch, over):
    assert fast_args(**over)[1] is None


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
    obj.write_bytes(b"x" * obj.stat().st_size)  # same size: only --deep sees it
    assert cubist.verify(url, cache_dir=str(cache))["ok"] is True
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


def test_select_equals_the_cli_report(served_set, cli):
    _, manifest = served_set
    report = cubist.select(str(manifest), weights="bf16", activations="bf16",
                           activation="swiglu", experts=8, tokens_per_expert=16, n=1024,
                           k=512, sm="90", explain=True)
    assert report["kernel"] == "moe_gemm_bf16_bf16_swiglu_m64n128k64"
    assert report["problem"]["tokens"] == 128
    by_cli = json.loads(subprocess.run(
        [cli, "select", "--manifest", str(manifest), "--weights", "bf16", "--activations",
         "bf16", "--activation", "swiglu", "--experts", "8", "--tokens-per-expert", "16",
         "--n", "1024", "--k", "512", "--sm", "90", "--explain", "--json"],
        check=True, capture_output=True, text=True).stdout)
    assert by_cli == report
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
