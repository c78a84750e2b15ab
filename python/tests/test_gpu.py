"""The package on a GPU (docs/gpu-results.md): results against torch, empty batches,
errors on real tensors, tuning, CUDA-graph capture, torch.compile, the example layer.
Needs torch with CUDA, an sm_90 GPU and CUBIST_TEST_MANIFEST (a kernel set built by
scripts/build-artifacts); skips otherwise."""
import itertools
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
MANIFEST = os.environ.get("CUBIST_TEST_MANIFEST")
if not MANIFEST:
    pytest.skip("CUBIST_TEST_MANIFEST is not set", allow_module_level=True)

import cubist  # noqa: E402
import cubist.ops  # noqa: E402,F401

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import moe_layer  # noqa: E402

F = torch.nn.functional


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    return cubist.Runtime(MANIFEST, cache_dir=str(tmp_path_factory.mktemp("cache")),
                          tuning_file="none")


@pytest.fixture(scope="module")
def gemm(rt):
    return cubist.MoeGemm(rt)


def problem(e, counts, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(counts)
    a = (torch.randn(t, k, generator=g, device="cuda")).to(torch.bfloat16)
    b = (torch.randn(e, n, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    offsets = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32,
                           device="cuda")
    return a, b, offsets


def reference(a, b, offsets, act, a_scale=1.0, b_scale=None, bias=None):
    outs, bounds = [], offsets.tolist()
    for e in range(b.shape[0]):
        c = a[bounds[e]:bounds[e + 1]].float() @ b[e].float().t() * a_scale
        if b_scale is not None:
            c = c * b_scale[e]
        if bias is not None:  # after the global scales, before the activation
            c = c + bias[e].float()
        if act == "swiglu":
            half = c.shape[1] // 2
            c = F.silu(c[:, half:]) * c[:, :half]
        outs.append(c)
    return torch.cat(outs).to(torch.bfloat16)


def rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("act", ["swiglu", "identity"])
@pytest.mark.parametrize("e, counts, n, k", [
    (8, [16, 0, 33, 1, 64, 7, 0, 5], 512, 256),  # ragged, two experts with no tokens
    (32, [64] * 32, 1536, 2048),                 # prefill-like
    (128, [8] * 128, 5760, 2880),                # gpt-oss decode shape
])
def test_bf16_matches_torch(gemm, act, e, counts, n, k):
    a, b, offsets = problem(e, counts, n, k)
    out = torch.empty(a.shape[0], n // 2 if act == "swiglu" else n, dtype=torch.bfloat16,
                      device="cuda")
    gemm.run(a, b, offsets, out, activation=act)
    assert rel(out, reference(a, b, offsets, act)) < 1e-2


def test_fp8_per_tensor_matches_torch(gemm):
    e, n, k = 8, 1024, 1024
    a, b, offsets = problem(e, [32] * e, n, k)
    a8, b8 = a.to(torch.float8_e4m3fn), (b * 8).to(torch.float8_e4m3fn)
    a_gs = torch.tensor([0.5], device="cuda")
    b_gs = torch.full((e,), 0.125, device="cuda")
    out = torch.empty(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
    gemm.run(a8, b8, offsets, out, a_global_scale=a_gs, b_global_scale=b_gs)
    want = reference(a8.float().to(torch.bfloat16), b8.float().to(torch.bfloat16), offsets,
                     "identity", 0.5, [0.125] * e)
    assert rel(out, want) < 2e-2


def test_bias_is_added_before_the_activation_bf16_and_fp8(gemm):
    # gpt-oss's per-expert bias [E, N] (both halves when gated), through run, check and
    # the custom op; version-3 kernels serve it.
    e, counts, n, k = 8, [16, 0, 33, 1, 64, 7, 0, 5], 512, 256
    a, b, offsets = problem(e, counts, n, k, seed=5)
    bias = torch.randn(e, n, generator=torch.Generator(device="cuda").manual_seed(6),
                       device="cuda")
    out = torch.empty(a.shape[0], n // 2, dtype=torch.bfloat16, device="cuda")
    gemm.check(a, b, offsets, out, activation="swiglu", bias=bias)
    gemm.run(a, b, offsets, out, activation="swiglu", bias=bias)
    want = reference(a, b, offsets, "swiglu", bias=bias)
    assert rel(out, want) < 1e-2
    assert rel(reference(a, b, offsets, "swiglu"), want) > 0.1  # the bias matters
    op_out = torch.zeros_like(out)
    gemm.op(a, b, offsets, op_out, activation="swiglu", bias=bias)
    torch.cuda.synchronize()
    assert torch.equal(op_out, out)

    # fp8 per tensor: the bias is added after a's and b's global scales.
    a8, b8 = a.to(torch.float8_e4m3fn), (b * 8).to(torch.float8_e4m3fn)
    a_gs = torch.tensor([0.5], device="cuda")
    b_gs = torch.full((e,), 0.125, device="cuda")
    out = torch.empty(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
    gemm.run(a8, b8, offsets, out, a_global_scale=a_gs, b_global_scale=b_gs, bias=bias)
    want = reference(a8.float().to(torch.bfloat16), b8.float().to(torch.bfloat16), offsets,
                     "identity", 0.5, [0.125] * e, bias=bias)
    assert rel(out, want) < 2e-2


def test_bias_errors_name_it(gemm):
    a, b, offsets = problem(8, [16] * 8, 512, 256)
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    bias = torch.zeros(8, 512, device="cuda")
    for bad, error in ((bias.cpu(), r"^bias: is on cpu; cubist runs on CUDA tensors$"),
                       (bias.half(), r"^bias: expected float32 \[E=8, N=512\] .*got float16 \[8, 512\]$"),
                       (bias[:, :256], r"^bias: must be contiguous"),
                       (bias[:, :256].contiguous(), r"^bias: expected float32 \[E=8, N=512\] .*got float32 \[8, 256\]$")):
        with pytest.raises(cubist.InvalidArgumentError, match=error):
            gemm.run(a, b, offsets, out, activation="swiglu", bias=bad)
        with pytest.raises(cubist.InvalidArgumentError, match=error):
            gemm.check(a, b, offsets, out, activation="swiglu", bias=bad)


def test_run_uses_the_current_stream(gemm):
    a, b, offsets = problem(8, [32] * 8, 512, 256)
    out = torch.zeros(a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm.run(a, b, offsets, out, activation="swiglu")
    s.synchronize()
    assert rel(out, reference(a, b, offsets, "swiglu")) < 1e-2


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-block", "mxfp4", "mxfp8", "nvfp4"])
def test_empty_batch_is_a_no_op_for_every_format(gemm, fmt):
    # torch gives empty tensors a null data pointer: a, its scales and out are all null.
    e, n, k = 8, 512, 256
    packed = fmt in ("mxfp4", "nvfp4")
    dt = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn,
          "fp8-block": torch.float8_e4m3fn, "mxfp8": torch.float8_e4m3fn}.get(fmt, torch.uint8)
    a = torch.empty(0, k // 2 if packed else k, dtype=dt, device="cuda")
    b = torch.zeros(e, n, k // 2 if packed else k, dtype=dt, device="cuda")
    scales = {"fp8-block": (torch.float32, (e, n // 128, k // 128)),
              "mxfp4": (torch.uint8, (e, n, k // 32)), "mxfp8": (torch.uint8, (e, n, k // 32)),
              "nvfp4": (torch.float8_e4m3fn, (e, n, k // 16))}
    b_scale = None
    if fmt in scales:
        b_scale = torch.ones(scales[fmt][1], device="cuda").to(scales[fmt][0])
    a_scale = torch.empty(0, device="cuda").to(scales[fmt][0]) if fmt in scales else None
    offsets = torch.zeros(e + 1, dtype=torch.int32, device="cuda")
    out = torch.empty(0, n // 2, dtype=torch.bfloat16, device="cuda")
    assert a.data_ptr() == 0 and out.data_ptr() == 0
    gemm.run(a, b, offsets, out, activation="swiglu", weights=fmt, activations=fmt,
             a_scale=a_scale, b_scale=b_scale)
    if fmt == "bf16":  # CanImplement too: a kernel exists, nothing else is needed
        gemm.check(a, b, offsets, out, activation="swiglu")
    torch.cuda.synchronize()


def test_errors_name_the_argument(gemm):
    a, b, offsets = problem(8, [16] * 8, 512, 256)
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(cubist.InvalidArgumentError, match=r"^a: is on cpu; cubist runs on CUDA"):
        gemm.run(a.cpu(), b, offsets, out, activation="swiglu")
    with pytest.raises(cubist.InvalidArgumentError, match=r"^b: must be contiguous"):
        gemm.run(a, b.transpose(1, 2), offsets, out, activation="swiglu")
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^offsets: expected int32 \[E\+1\] \(E >= 1\), got int64"):
        gemm.run(a, b, offsets.long(), out, activation="swiglu")
    with pytest.raises(cubist.InvalidArgumentError, match=r"^out: expected bfloat16 \[T=128, N/2=256\]"):
        gemm.run(a, b, offsets, out.float(), activation="swiglu")
    shifted = torch.empty(a.numel() + 1, dtype=torch.bfloat16, device="cuda")[1:].view(a.shape)
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"moe_gemm arguments: a = 0x[0-9a-f]+ is not 16-byte aligned"):
        gemm.run(shifted, b, offsets, out, activation="swiglu")
    with pytest.raises(cubist.NotFoundError, match=r"no kernel for moe_gemm"):
        gemm.kernel_for(weights="bf16", activations="bf16", activation="identity",
                        experts=8, tokens=128, n=512, k=250)
    assert gemm.can_implement(a, b, offsets, out, activation="swiglu") is True
    assert gemm.can_implement(a.cpu(), b, offsets, out, activation="swiglu") is False


def test_fast_path_takes_plain_tensors_and_matches_the_python_path(gemm):
    # MoeGemm.run reads plain CUDA torch tensors in C++ (cubist_ext.cc, FastRun) and hands
    # everything else to the Python checks; both launch the same thing.
    a, b, offsets = problem(8, [16] * 8, 512, 256, seed=3)
    fast = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    slow = torch.empty_like(fast)
    gemm.run(a, b, offsets, fast, activation="swiglu")  # torch is registered by now
    nones = (None,) * 9
    assert gemm._fast_run(a, b, offsets, fast, "swiglu", *nones, None) is True
    for bad in ((a.cpu(), b, offsets, fast), (a, b.transpose(1, 2), offsets, fast),
                (a, b, offsets.long(), fast), (a, b, offsets, fast.float()),
                (a, b, offsets, fast[:, :128]), (torch.nn.Parameter(a), b, offsets, fast)):
        assert gemm._fast_run(*bad, "swiglu", *nones, None) is False
    assert gemm._fast_run(a, b, offsets, fast, "gelu", *nones, None) is False
    assert gemm._fast_run(a, b, offsets, fast, "swiglu", *nones,
                          torch.cuda.current_stream()) is False
    gemm.run(a, b, offsets, slow, activation="swiglu", stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert torch.equal(fast, slow) and rel(fast, reference(a, b, offsets, "swiglu")) < 1e-2
    # torch's DLPack exchange API (torch.Tensor.__dlpack_c_exchange_api__) is the reader
    # where torch has it; the attribute reader launches the same.
    config = cubist._cubist._fast_path_config
    assert config()["exchange_api"] is hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    by_attributes = torch.zeros_like(fast)
    try:
        config(exchange=False)
        assert gemm._fast_run(a, b, offsets, by_attributes, "swiglu", *nones, None) is True
    finally:
        config(exchange=True)
    torch.cuda.synchronize()
    assert torch.equal(by_attributes, fast)


def test_tensors_changed_in_place_are_read_again(gemm):
    # The fast path keeps nothing about a tensor between calls: the same Python object
    # given another dtype (.data =), shape (resize_) or layout (as_strided_) is refused.
    a, b, offsets = problem(8, [16] * 8, 512, 256)
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    gemm.run(a, b, offsets, out, activation="swiglu")
    out.data = torch.empty(128, 256, dtype=torch.float32, device="cuda")
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^out: expected bfloat16 \[T=128, N/2=256\], got float32 \[128, 256\]$"):
        gemm.run(a, b, offsets, out, activation="swiglu")
    out.data = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    gemm.run(a, b, offsets, out, activation="swiglu")
    out.resize_(128, 128)
    with pytest.raises(cubist.InvalidArgumentError,
                       match=r"^out: expected bfloat16 \[T=128, N/2=256\], got bfloat16 \[128, 128\]$"):
        gemm.run(a, b, offsets, out, activation="swiglu")
    b.as_strided_((8, 256, 512), (512 * 256, 1, 256))  # a transposed view of the same memory
    with pytest.raises(cubist.InvalidArgumentError, match=r"^b: must be contiguous"):
        gemm.run(a, b, offsets, out, activation="swiglu")
    torch.cuda.synchronize()


def test_kernel_for_and_tune(gemm, rt):
    args = dict(weights="bf16", activations="bf16", activation="swiglu", experts=32,
                tokens=2048, n=1536, k=2048)
    k = gemm.kernel_for(**args)
    assert k["kernel"].startswith("moe_gemm") and k["arch"] == "sm_90a"
    r = gemm.tune(**args, top_k=3, iterations=5, record=False)
    measured = [t for t in r["timings"] if t["measured_us"] is not None]
    assert r["winner"] in [t["kernel"] for t in measured] and r["winner_us"] > 0
    assert r["winner_us"] == min(t["measured_us"] for t in measured)
    assert gemm.kernel_for(**args)["kernel"] == r["winner"]


def test_inexact_kernels_are_tuned_only_when_allowed(tmp_path):
    """No kernel of the family rounds an operand on purpose, but a manifest from elsewhere
    may carry one ("exact": false): here a copy of the bf16 identity kernels' first, under
    its own name and artifact path, which tuning times only when inexact kernels are
    allowed."""
    import json
    import shutil
    doc = json.loads(pathlib.Path(MANIFEST).read_text())
    kernels = [k for k in doc["kernels"] if k["op"] == "moe_gemm" and k["arch"] == "sm_90a"
               and (k["weight_format"], k["activation_format"], k["activation"])
               == ("bf16", "bf16", "identity")]
    assert kernels, "the manifest has no bf16 x bf16 identity kernel"
    inexact = dict(kernels[0], name="inexact_" + kernels[0]["name"],
                   artifact="cubins/sm_90a/inexact.cubin", exact=False)
    # Artifact entries of the set, each with the file it is copied from.
    by_path = {a["path"]: a for a in doc["artifacts"]}
    copies = {k["artifact"]: (by_path[k["artifact"]], k["artifact"]) for k in kernels}
    copies[inexact["artifact"]] = (dict(by_path[kernels[0]["artifact"]],
                                        path=inexact["artifact"]), kernels[0]["artifact"])
    root = tmp_path / "set"
    for entry, src in copies.values():
        (root / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pathlib.Path(MANIFEST).parent / src, root / entry["path"])
    (root / "manifest.json").write_text(json.dumps(dict(
        doc, name="py-test-inexact", artifacts=[e for e, _ in copies.values()],
        kernels=kernels + [inexact])))
    rt = cubist.Runtime(root / "manifest.json", cache_dir=str(tmp_path / "cache"),
                        tuning_file="none")
    args = dict(weights="bf16", activations="bf16", activation="identity", experts=8,
                tokens=1024, n=1024, k=1024, top_k=64, warmup=1, iterations=2, record=False)
    exact_only = {t["kernel"] for t in cubist.MoeGemm(rt).tune(**args)["timings"]}
    allowed = cubist.MoeGemm(rt, allow_inexact=True)
    with_inexact = {t["kernel"] for t in allowed.tune(**args)["timings"]}
    assert exact_only and inexact["name"] not in exact_only
    assert with_inexact == exact_only | {inexact["name"]}


def test_dlpack_and_cuda_array_interface_inputs(gemm):
    a, b, offsets = problem(8, [16] * 8, 512, 256)
    want = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    gemm.run(a, b, offsets, want, activation="swiglu")

    class DLPackOnly:  # what JAX or TensorFlow hand over
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__()

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    class Cai:  # CuPy/Numba style; torch itself has no bf16 typestr
        def __init__(self, t, typestr):
            self.t = t
            self.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": typestr,
                                             "data": (t.data_ptr(), False), "strides": None,
                                             "version": 3}

    got = torch.zeros_like(want)
    gemm.run(DLPackOnly(a), DLPackOnly(b), DLPackOnly(offsets), DLPackOnly(got),
             activation="swiglu")
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    got.zero_()
    gemm.run(Cai(a, "<V2"), Cai(b, "<V2"), Cai(offsets, "<i4"), Cai(got, "<V2"),
             activation="swiglu", stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_cuda_graph_capture_replays_like_eager(gemm):
    a, b, offsets = problem(16, [32] * 16, 1024, 512)
    out_run = torch.empty(a.shape[0], 512, dtype=torch.bfloat16, device="cuda")
    out_op = torch.empty_like(out_run)
    gemm.check(a, b, offsets, out_run, activation="swiglu")  # select + load before capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch asks before capture
        gemm.run(a, b, offsets, out_run, activation="swiglu")
        gemm.op(a, b, offsets, out_op, activation="swiglu")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.run(a, b, offsets, out_run, activation="swiglu")
        gemm.op(a, b, offsets, out_op, activation="swiglu")
    a.copy_(torch.randn_like(a, dtype=torch.float32).to(torch.bfloat16))  # new inputs
    out_run.zero_()
    out_op.zero_()
    graph.replay()
    eager = torch.empty_like(out_run)
    gemm.run(a, b, offsets, eager, activation="swiglu")
    torch.cuda.synchronize()
    assert torch.equal(out_run, eager) and torch.equal(out_op, eager)
    assert eager.abs().sum() > 0


def test_torch_compile_calls_the_custom_op(gemm):
    a, b, offsets = problem(8, [16] * 8, 512, 256)

    def f(a, b, offsets):
        out = torch.empty(a.shape[0], b.shape[1] // 2, dtype=torch.bfloat16, device=a.device)
        gemm.op(a, b, offsets, out, activation="swiglu")
        return out * 2

    def g(a, b, offsets):  # the op spelled out, as a model's code would
        out = torch.empty(a.shape[0], b.shape[1] // 2, dtype=torch.bfloat16, device=a.device)
        torch.ops.cubist.moe_gemm(gemm.handle, a, b, offsets, out, None, None, None, None,
                                  None, None, None, "", "", "swiglu")
        return out * 2

    want = f(a, b, offsets)
    for fn in (f, g):
        got = torch.compile(fn, fullgraph=True)(a, b, offsets)
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_example_layer_matches_torch(rt):
    experts, hidden, inter, top_k, tokens = 32, 2048, 1024, 4, 512
    router, w1, w2 = moe_layer.make_weights(experts, hidden, inter)
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    layer = moe_layer.MoeLayer(rt, router, w1, w2, top_k)
    got = layer(x)
    want = moe_layer.torch_layer(x, router, w1, w2, top_k, grouped=False)
    assert moe_layer.relative_error(got, want) < 1e-2
    graph = torch.cuda.CUDAGraph()  # the whole layer captures (no host sync inside)
    with torch.cuda.graph(graph):
        captured = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    # index_add_'s float atomics may sum a row's top-k terms in another order.
    assert moe_layer.relative_error(captured, got) < 1e-3


def _layer_problem(e=16, k=4, h=256, inter=128, t=37, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16)
    logits = torch.randn(t, e, generator=g, device="cuda")
    w1 = (torch.randn(e, 2 * inter, h, generator=g, device="cuda") * h ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, inter, generator=g, device="cuda") * inter ** -0.5).to(torch.bfloat16)
    return x, logits, w1, w2


def _torch_layer(x, logits, w1, w2, k):
    """renormalize routing + SwiGLU in plain torch, one expert at a time (reference)."""
    vals, ids = logits.float().topk(k, dim=-1)
    w = torch.softmax(vals, dim=-1)
    inter = w1.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(k):
            e = ids[t, j]
            c = x[t].float() @ w1[e].float().t()
            hid = (F.silu(c[inter:]) * c[:inter]).to(torch.bfloat16)
            y = (hid.float() @ w2[e].float().t()).to(torch.bfloat16)
            out[t] += w[t, j] * y.float()
    return out.to(torch.bfloat16), ids.int(), w


def test_moe_layer_matches_torch_and_is_deterministic(rt):
    x, logits, w1, w2 = _layer_problem()
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128)
    got = layer(x, w1, w2, router_logits=logits)
    want, _, _ = _torch_layer(x, logits, w1, w2, 4)
    assert moe_layer.relative_error(got, want) < 1e-2
    again = layer(x, w1, w2, router_logits=logits)
    torch.cuda.synchronize()
    assert torch.equal(got, again)  # the deterministic finalize: the same bits


def test_moe_layer_pre_routed_equals_routed(rt):
    x, logits, w1, w2 = _layer_problem(seed=1)
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128)
    routed = layer(x, w1, w2, router_logits=logits)
    vals, ids = logits.topk(4, dim=-1)
    pre = layer(x, w1, w2, topk_ids=ids.int().contiguous(),
                topk_weights=torch.softmax(vals, dim=-1).contiguous())
    torch.cuda.synchronize()
    assert moe_layer.relative_error(pre, routed) < 1e-5


def test_moe_layer_captures_in_a_graph_and_compiles(rt):
    x, logits, w1, w2 = _layer_problem(seed=2, t=20)
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128)
    layer.prepare(64, w1, w2)  # every kernel for T <= 64 loaded; workspace sized
    eager = layer(x, w1, w2, router_logits=logits)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer(x, w1, w2, router_logits=logits, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x, w1, w2, router_logits=logits, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)

    def f(x, logits):
        return layer.op(x, w1, w2, router_logits=logits) * 2
    got = torch.compile(f, fullgraph=True)(x, logits)
    torch.cuda.synchronize()
    assert torch.equal(got, eager * 2)


def test_moe_layer_errors_name_the_argument(rt):
    x, logits, w1, w2 = _layer_problem()
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128)
    with pytest.raises(cubist.InvalidArgumentError, match=r"w1: expected bfloat16 \[16, 256, 256\]"):
        layer(x, w1[:, :128].contiguous(), w2, router_logits=logits)
    with pytest.raises(cubist.InvalidArgumentError, match="topk_ids: is null"):
        layer(x, w1, w2)
    with pytest.raises(cubist.InvalidArgumentError, match="top_k: 17 is outside"):
        cubist.MoeLayer(rt, num_experts=16, top_k=17, hidden=256, intermediate=128)


def test_gated_weights_turn_checkpoint_layouts_into_cubists():
    e, inter, h = 2, 3, 4
    up = torch.arange(e * inter * h, dtype=torch.float32, device="cuda").view(e, inter, h)
    gate = -up - 1
    ours = torch.cat((up, gate), dim=1)
    assert torch.equal(cubist.gated_weights(ours, "up_gate"), ours)
    assert torch.equal(cubist.gated_weights(torch.cat((gate, up), dim=1), "gate_up"), ours)
    interleaved = torch.stack((gate, up), dim=2).reshape(e, 2 * inter, h)  # g0 u0 g1 u1 ...
    assert torch.equal(cubist.gated_weights(interleaved, "gate_up_interleaved"), ours)
    # A bias [E, 2I] (gpt-oss's gate_up_proj_bias) moves with its rows.
    bias_ours = ours[:, :, 0]
    assert torch.equal(cubist.gated_weights(interleaved[:, :, 0], "gate_up_interleaved"),
                       bias_ours)
    assert torch.equal(cubist.gated_weights(torch.cat((gate, up), dim=1)[:, :, 0], "gate_up"),
                       bias_ours)
    with pytest.raises(cubist.InvalidArgumentError, match="layout: 'w13'"):
        cubist.gated_weights(ours, "w13")
    with pytest.raises(cubist.InvalidArgumentError, match=r"even row count, got \[2, 5\]"):
        cubist.gated_weights(ours[:, :5, 0], "gate_up")


# The quantized pairs of the layer (dispatch/moe_layer.h): weights from
# cubist.quantize_weights, activation scales as an engine calibrates them, against torch
# on the dequantized weights with the activations quantized as the layer's moe_quantize
# kernels do (cubist._quantize._quantize_activations, the rule of
# dispatch/moe_quantize_reference.cc), within dispatch/moe_layer_reference.cc's
# MoeLayerTolerance.
QUANTIZED_PAIRS = [("fp8", "fp8"), ("fp8-block", "fp8-block"), ("mxfp4", "bf16"),
                   ("mxfp4", "mxfp8"), ("nvfp4", "bf16"), ("nvfp4", "nvfp4")]


def _activation_scale(fmt, amax):
    """ActivationScaleFor: fp8's s = amax / 448, nvfp4's g = 448 x 6 / amax; fp32 [1]."""
    amax = amax if amax > 0 else 1.0
    s = amax / 448.0 if fmt == "fp8" else 448.0 * 6.0 / amax
    return torch.tensor([s], dtype=torch.float32, device="cuda")


def _quantized_layer_args(wf, af, x, w1, w2):
    """(w1q, w2q, the call's scale keywords) for the pair."""
    w1q, w1s, w1g = cubist.quantize_weights(w1, wf)
    w2q, w2s, w2g = cubist.quantize_weights(w2, wf)
    kw = {}
    if w1s is not None:
        kw.update(w1_scale=w1s, w2_scale=w2s)
    if w1g is not None:
        kw.update(w1_global_scale=w1g, w2_global_scale=w2g)
    if af in ("fp8", "nvfp4"):
        # From the input's amax, and a fixed bound for GEMM1's output (O(1) here), as
        # tests/dispatch/moe_layer_gpu_test.cc calibrates them.
        kw.update(input_scale=_activation_scale(af, x.float().abs().max().item()),
                  intermediate_scale=_activation_scale(af, 4.0))
    return w1q, w2q, kw


def _torch_quantized_layer(x, logits, w1d, w2d, k, af, s1, s2):
    """renormalize routing + SwiGLU in torch (double accumulation) on the dequantized
    weights, both GEMMs' inputs quantized as the layer quantizes them; the bf16 roundings
    of GEMM1's and GEMM2's outputs as the kernels store them. float64 [T, H]."""
    quantize = cubist._quantize._quantize_activations
    vals, ids = logits.float().topk(k, dim=-1)
    w = torch.softmax(vals, dim=-1)
    inter = w1d.shape[1] // 2
    xq = quantize(x.float(), af, s1)  # per row: the gathered rows quantize the same
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(w1d.shape[0]):
        rows, slots = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        c = xq[rows].double() @ w1d[e].double().t()
        hid = (F.silu(c[:, inter:]) * c[:, :inter]).to(torch.bfloat16)
        y = (quantize(hid.float(), af, s2).double() @ w2d[e].double().t()).to(torch.bfloat16)
        out.index_add_(0, rows, w[rows, slots].double()[:, None] * y.double())
    return out


def _assert_within_layer_tolerance(got, want, af):
    """MoeLayerTolerance(af) with CompareBf16's bounds: the Frobenius relative error and
    every element within atol_rel x max|ref| + rtol x |ref|."""
    quantized = af != "bf16"
    rel_fro = 3e-2 if af == "nvfp4" else 1.5e-2 if quantized else 5e-3
    rtol, atol_rel = (0.15, 4e-2) if quantized else (3e-2, 1e-2)
    err = got.double() - want
    rel = (err.norm() / want.norm()).item()
    bound = atol_rel * want.abs().max() + rtol * want.abs()
    bad = int((err.abs() > bound).sum())
    assert rel < rel_fro and bad == 0, f"{af}: rel_fro {rel:.3g}, {bad} elements out of bounds"
    return rel


@pytest.mark.parametrize("t", [5, 300])
@pytest.mark.parametrize("wf, af", QUANTIZED_PAIRS)
def test_moe_layer_quantized_pairs_match_torch(rt, wf, af, t):
    x, logits, w1, w2 = _layer_problem(seed=10 + t, t=t)
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                            weights=wf, activations=af)
    w1q, w2q, kw = _quantized_layer_args(wf, af, x, w1, w2)
    got = layer(x, w1q, w2q, router_logits=logits, **kw)
    s1 = kw["input_scale"].item() if "input_scale" in kw else 1.0
    s2 = kw["intermediate_scale"].item() if "intermediate_scale" in kw else 1.0
    w1d = cubist.dequantize_weights(w1q, kw.get("w1_scale"), kw.get("w1_global_scale"), wf)
    w2d = cubist.dequantize_weights(w2q, kw.get("w2_scale"), kw.get("w2_global_scale"), wf)
    want = _torch_quantized_layer(x, logits, w1d, w2d, 4, af, s1, s2)
    torch.cuda.synchronize()
    rel = _assert_within_layer_tolerance(got, want, af)
    print(f"[ layer    ] {wf} x {af} T={t}: rel_fro {rel:.3g}")
    again = layer(x, w1q, w2q, router_logits=logits, **kw)
    torch.cuda.synchronize()
    assert torch.equal(got, again)  # deterministic, quantized or not
    layout = layer.workspace_layout(t)
    for name in ("gathered", "gathered_scale", "activated", "quantized", "quantized_scale",
                 "global_scales"):
        assert 0 <= layout[name] < layout["bytes"]


@pytest.mark.parametrize("t", [5, 300])
def test_moe_layer_nvfp4_decoded_inputs_match_packed_ones(rt, t):
    """nvfp4_gemm_inputs: the GEMMs on nvfp4's bytes and on their bf16 values compute the
    same products: both within the layer tolerance of torch, and the same bits."""
    x, logits, w1, w2 = _layer_problem(seed=30 + t, t=t)
    w1q, w2q, kw = _quantized_layer_args("nvfp4", "nvfp4", x, w1, w2)
    outs = {}
    for mode in ("packed", "decoded"):
        layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                                weights="nvfp4", activations="nvfp4", nvfp4_gemm_inputs=mode)
        assert layer.decodes_nvfp4_inputs(t) == (mode == "decoded")
        outs[mode] = layer(x, w1q, w2q, router_logits=logits, **kw)
    w1d = cubist.dequantize_weights(w1q, kw["w1_scale"], kw["w1_global_scale"], "nvfp4")
    w2d = cubist.dequantize_weights(w2q, kw["w2_scale"], kw["w2_global_scale"], "nvfp4")
    want = _torch_quantized_layer(x, logits, w1d, w2d, 4, "nvfp4", kw["input_scale"].item(),
                                  kw["intermediate_scale"].item())
    torch.cuda.synchronize()
    for got in outs.values():
        _assert_within_layer_tolerance(got, want, "nvfp4")
    assert torch.equal(outs["packed"], outs["decoded"])
    with pytest.raises(cubist.InvalidArgumentError, match=r"'decoded' needs the nvfp4 x nvfp4"):
        cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                        weights="nvfp4", activations="bf16", nvfp4_gemm_inputs="decoded")


@pytest.mark.parametrize("t", [1, 300])
def test_moe_layer_fused_gather_is_bit_identical(rt, t):
    """fuse_gather: GEMM1 reading the token rows through the row map ("on") and from the
    gather kernel's copy ("off") give the same bits, within the layer tolerance of torch."""
    x, logits, w1, w2 = _layer_problem(seed=50 + t, t=t)
    probe = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128)
    if not probe.fuses_gather:
        pytest.skip("the manifest has no gathering GEMM1 kernel (the _gather kernels)")
    outs = {}
    for mode in ("on", "off"):
        layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                                fuse_gather=mode)
        assert layer.fuses_gather == (mode == "on")
        outs[mode] = layer(x, w1, w2, router_logits=logits)
    want = _torch_quantized_layer(x, logits, w1, w2, 4, "bf16", 1.0, 1.0)
    torch.cuda.synchronize()
    _assert_within_layer_tolerance(outs["on"], want, "bf16")
    assert torch.equal(outs["on"], outs["off"])
    with pytest.raises(cubist.InvalidArgumentError, match=r"'on' needs the bf16 x bf16 pair"):
        cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                        weights="fp8", activations="fp8", fuse_gather="on")


@pytest.mark.parametrize("fmt", ["fp8", "fp8-block", "mxfp4", "mxfp8", "nvfp4"])
def test_quantize_weights_on_the_gpu_gives_the_cpus_bytes(fmt):
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(3, 200, 320, generator=g, device="cuda")
    w = (w * torch.exp2(torch.randint(-8, 8, (3, 200, 10), generator=g, device="cuda")
                        .float().repeat_interleave(32, dim=2))).to(torch.bfloat16)
    gpu = cubist.quantize_weights(w, fmt)
    cpu = cubist.quantize_weights(w.cpu(), fmt)
    for a, b in zip(gpu, cpu):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.is_cuda and a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8))


def test_moe_layer_quantized_op_captures_in_a_graph_and_compiles(rt):
    x, logits, w1, w2 = _layer_problem(seed=3, t=20)
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                            weights="nvfp4", activations="nvfp4")
    w1q, w2q, kw = _quantized_layer_args("nvfp4", "nvfp4", x, w1, w2)
    weight_scales = {k: v for k, v in kw.items() if k.startswith("w")}
    layer.prepare(64, w1q, w2q, **weight_scales)  # kernels for T <= 64; placeholders
    eager = layer(x, w1q, w2q, router_logits=logits, **kw)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        layer.op(x, w1q, w2q, router_logits=logits, out=out, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.op(x, w1q, w2q, router_logits=logits, out=out, **kw)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager) and eager.abs().sum() > 0
    # New scales in the same tensors: the replay reads them (nothing is baked in).
    kw["input_scale"].mul_(0.5)
    graph.replay()
    rescaled = layer(x, w1q, w2q, router_logits=logits, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, rescaled)

    def f(x, logits):
        return layer.op(x, w1q, w2q, router_logits=logits, **kw) * 2
    got = torch.compile(f, fullgraph=True)(x, logits)
    torch.cuda.synchronize()
    assert torch.equal(got, rescaled * 2)
    # The op spelled out: a bf16 caller's positional arguments are unchanged; the scales
    # come after `accumulate`.
    spelled = torch.empty_like(x)
    torch.ops.cubist.moe(layer.handle, x, w1q, w2q, spelled, logits, None, None, None, None,
                         None, None, False, kw["w1_scale"], kw["w2_scale"],
                         kw["w1_global_scale"], kw["w2_global_scale"], kw["input_scale"],
                         kw["intermediate_scale"])
    torch.cuda.synchronize()
    assert torch.equal(spelled, rescaled)


def test_moe_layer_quantized_errors_name_the_argument(rt):
    x, logits, w1, w2 = _layer_problem()
    layer = cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                            weights="mxfp4", activations="mxfp8")
    w1q, w2q, kw = _quantized_layer_args("mxfp4", "mxfp8", x, w1, w2)
    with pytest.raises(cubist.InvalidArgumentError, match=r"^w1_scale: mxfp4 x mxfp8 needs"):
        layer(x, w1q, w2q, router_logits=logits, w2_scale=kw["w2_scale"])
    with pytest.raises(cubist.InvalidArgumentError, match=r"^w1: expected uint8 or "
                       r"float4_e2m1fn_x2 \[16, 256, 128\]"):
        layer(x, w1, w2q, router_logits=logits, **kw)
    with pytest.raises(cubist.InvalidArgumentError, match=r"^w2_scale: is on cpu"):
        layer(x, w1q, w2q, router_logits=logits, w1_scale=kw["w1_scale"],
              w2_scale=kw["w2_scale"].cpu())
    with pytest.raises(cubist.UnimplementedError, match=r"nvfp4 x mxfp8 pair is not served"):
        cubist.MoeLayer(rt, num_experts=16, top_k=4, hidden=256, intermediate=128,
                        weights="nvfp4", activations="mxfp8")
