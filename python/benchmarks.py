"""Host overhead of cubist's Python `run` against the C++ MoeGemm::Run, and the example
MoE layer against the same layer in plain torch, side by side in one process on one GPU
(docs/benchmarks.md "Python package").

    python python/benchmarks.py MANIFEST

Overhead: per-call host time of N back-to-back launches of a small problem from an
idle GPU (N launches fit in the launch queue, so the host is timed), the median of 15
rounds that interleave the paths: C++ Run called from a C++ loop (MoeGemm._run_loop_us);
the native binding called with integers; the nanobind fast_run on torch tensors;
MoeGemm.run on torch tensors (a C method: its fast path reads them through torch's DLPack
exchange API, current stream), the same reading them through their Python attributes,
and the previous `run` (a Python method calling fast_run, attribute reads); the general
Python path (a stream object given); the torch custom op (torch.ops.cubist.moe_gemm).
Layer: CUDA-event medians of eager calls and of CUDA-graph replays.
"""
import statistics
import sys
import time
import types

import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/examples")
import cubist  # noqa: E402
import cubist.ops  # noqa: E402,F401
import moe_layer  # noqa: E402

CALLS, ROUNDS = 400, 15


def one_round_us(fn):
    """Host microseconds per call of CALLS back-to-back calls, from an idle GPU: drained
    first, so that the launch queue never fills and the host, not the GPU, is timed."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - t0) * 1e6 / CALLS


def gpu_us(fn, iters=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def overhead(rt):
    gemm = cubist.MoeGemm(rt)
    e, t, n, k = 8, 64, 256, 256
    a = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(e, n, k, device="cuda").to(torch.bfloat16)
    offsets = torch.arange(0, t + 1, t // e, dtype=torch.int32, device="cuda")
    out = torch.empty(t, n // 2, dtype=torch.bfloat16, device="cuda")
    gemm.run(a, b, offsets, out, activation="swiglu")
    args = gemm._args(a, b, offsets, out, None, None, "swiglu", None, None, None, None, None,
                      None, None)
    wf, af, act, e_, t_, n_, k_, p, dev = args
    stream = torch.cuda.current_stream().cuda_stream
    native = gemm._native
    nones = (None,) * 9
    torch_stream = torch.cuda.current_stream()  # a stream object: the Python path
    config = cubist._cubist._fast_path_config

    def previous_run(self, a, b, offsets, out, *, activation="identity", weights=None,
                     activations=None, a_scale=None, b_scale=None, a_global_scale=None,
                     b_global_scale=None, alpha=None, beta=None, limit=None, stream=None):
        # MoeGemm.run before it became a C method: a Python method calling fast_run.
        if self._fast_run(a, b, offsets, out, activation, weights, activations, a_scale,
                          b_scale, a_global_scale, b_global_scale, alpha, beta, limit, stream):
            return
        raise AssertionError("the fast path declined")

    prev = types.MethodType(previous_run, gemm)

    # Both tensor readers take these tensors (else the rows would time the Python path).
    for exchange in (True, False):
        config(exchange=exchange)
        assert native.fast_run(a, b, offsets, out, "swiglu", *nones, None) is True
    config(exchange=True)
    found = config()["exchange_api"]
    print(f"torch.Tensor.__dlpack_c_exchange_api__: {'found' if found else 'absent'}")
    run_row = "cubist.MoeGemm.run(torch tensors): C method, DLPack exchange API"
    # (name, exchange API on, call)
    paths = [
        ("C++ MoeGemm::Run (C++ loop)", True,
         lambda: native._run_loop_us(wf, af, act, e_, t_, n_, k_, *p, stream, CALLS)),
        ("native binding, integer arguments", True,
         lambda: native.run(wf, af, act, e_, t_, n_, k_, *p, stream)),
        ("native fast_run(torch tensors) (nanobind call, exchange API)", True,
         lambda: native.fast_run(a, b, offsets, out, "swiglu", *nones, None)),
        (run_row, True, lambda: gemm.run(a, b, offsets, out, activation="swiglu")),
        ("cubist.MoeGemm.run(torch tensors): C method, attribute reads", False,
         lambda: gemm.run(a, b, offsets, out, activation="swiglu")),
        ("previous run: Python method + nanobind fast_run, attribute reads", False,
         lambda: prev(a, b, offsets, out, activation="swiglu")),
        ("cubist.MoeGemm.run(torch tensors), Python path (stream=torch stream)", True,
         lambda: gemm.run(a, b, offsets, out, activation="swiglu", stream=torch_stream)),
        ("torch.ops.cubist.moe_gemm (custom op)", True,
         lambda: gemm.op(a, b, offsets, out, activation="swiglu")),
    ]
    # Rounds interleave the paths, so drift (clocks, other load) reaches all of them.
    # The first (the C++ loop) times itself; one warm-up round is dropped.
    rounds = {name: [] for name, _, _ in paths}
    for _ in range(ROUNDS + 1):
        for i, (name, exchange, fn) in enumerate(paths):
            config(exchange=exchange)
            if i == 0:
                torch.cuda.synchronize()
                rounds[name].append(fn())
            else:
                rounds[name].append(one_round_us(fn))
    config(exchange=True)
    torch.cuda.synchronize()
    rounds = {name: r[1:] for name, r in rounds.items()}
    rows = [(name, statistics.median(rounds[name])) for name, _, _ in paths]
    cpp = rows[0][1]
    print(f"host time per call, E={e} T={t} N={n} K={k} bf16 swiglu, {CALLS} calls x "
          f"{ROUNDS} rounds (median):")
    print("| path | us per call | over C++ Run |\n| --- | --- | --- |")
    for name, us in rows:
        print(f"| {name} | {us:.2f} | {us - cpp:+.2f} |")
    over = dict(rows)[run_row] - cpp
    print(f"target (Python run at most 2 us over C++ Run): {over:+.2f} us, "
          f"{'met' if over <= 2.0 else 'NOT met'}")


def layer(rt):
    print("\nMoE layer (router top-k, sort, FC1 SwiGLU, FC2, weighted un-sort), GPU time "
          "per forward (median of 50, CUDA events):")
    print("| E | H | I | top-k | tokens | cubist eager us | torch eager us | cubist graph us "
          "| torch graph us | torch/cubist (graph) |\n| --- | --- | --- | --- | --- | --- | "
          "--- | --- | --- | --- |")
    for experts, hidden, inter, top_k, tokens in ((32, 2048, 1024, 4, 16),
                                                  (32, 2048, 1024, 4, 512),
                                                  (128, 2880, 2880, 4, 64),
                                                  (128, 2880, 2880, 4, 4096)):
        router, w1, w2 = moe_layer.make_weights(experts, hidden, inter)
        x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
        ours = moe_layer.MoeLayer(rt, router, w1, w2, top_k)
        theirs = lambda: moe_layer.torch_layer(x, router, w1, w2, top_k)  # noqa: E731
        err = moe_layer.relative_error(ours(x), theirs())
        assert err < 2e-2, err
        r = [gpu_us(lambda: ours(x)), gpu_us(theirs), gpu_us(graphed(lambda: ours(x))),
             gpu_us(graphed(theirs))]
        print(f"| {experts} | {hidden} | {inter} | {top_k} | {tokens} | {r[0]:.1f} | "
              f"{r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[3] / r[2]:.2f}x |")


if __name__ == "__main__":
    runtime = cubist.Runtime(sys.argv[1], tuning_file="none")
    print(f"{runtime.device_name}, driver {runtime.driver_version}, torch {torch.__version__}")
    overhead(runtime)
    layer(runtime)
