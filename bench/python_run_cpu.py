"""The host cost of cubist's Python `run` call without a GPU: torch CPU tensors, an op
that records its launch instead of making it (_cubist.MoeGemm._without_gpu), and the fast
path told to take CPU tensors as if on the device (_fast_path_config(cpu_as_device=True)).
What it times is everything `run` does before the driver call: the call itself, reading
and checking the four tensors, building the launch arguments. It guides the work on
docs/benchmarks.md "Python package" between GPU runs; python/benchmarks.py measures the
real thing against C++ Run on a GPU.

    python bench/python_run_cpu.py [--calls N] [--rounds R]

Needs torch (CPU is enough) and the built package on PYTHONPATH. The stream is given as
an integer (there is no CUDA stream to look up without a GPU).
"""
import argparse
import statistics
import sys
import time

import torch

import cubist
from cubist import _cubist


def per_call_ns(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=15)
    opt = p.parse_args()

    e, t, n, k = 8, 64, 256, 256
    a = torch.randn(t, k).to(torch.bfloat16)
    b = torch.randn(e, n, k).to(torch.bfloat16)
    offsets = torch.arange(0, t + 1, t // e, dtype=torch.int32)
    out = torch.empty(t, n // 2, dtype=torch.bfloat16)

    gemm = cubist.MoeGemm.__new__(cubist.MoeGemm)  # no Runtime: no GPU here
    gemm.runtime = type("R", (), {"device": 0})()
    gemm._formats = {}
    native = gemm._native = _cubist.MoeGemm._without_gpu(0)
    gemm._native_run, gemm._fast_run = native.run, native.fast_run
    cubist._tensors._torch_type()  # registers torch with the fast path, as run's first call
    info = _cubist._fast_path_config(cpu_as_device=True)

    def check(fn):
        before = native._last_launch()
        fn()
        after = native._last_launch()
        assert after is not None and (before is None or after[9] == before[9] + 1), \
            "the fast path declined"
        return after[:9]

    nones = (None,) * 9

    def previous_run(self, a, b, offsets, out, *, activation="identity", weights=None,
                     activations=None, a_scale=None, b_scale=None, a_global_scale=None,
                     b_global_scale=None, alpha=None, beta=None, limit=None, stream=None):
        # The previous MoeGemm.run (a Python method calling the nanobind fast_run).
        if self._fast_run(a, b, offsets, out, activation, weights, activations, a_scale,
                          b_scale, a_global_scale, b_global_scale, alpha, beta, limit, stream):
            return

    import types
    prev = types.MethodType(previous_run, gemm)
    wf, af, act, *_ = check(lambda: gemm.run(a, b, offsets, out, activation="swiglu",
                                              stream=7))
    ptrs = native._last_launch()[7]

    def exchange(on):
        return lambda: _cubist._fast_path_config(exchange=on)

    # (name, set-up, call): set-ups switch the tensor reader.
    paths = [
        ("native run, 19 integers (nanobind conversion only)", exchange(True),
         lambda: native.run(wf, af, act, e, t, n, k, *ptrs, 7)),
        ("previous run: Python method + nanobind fast_run, attribute reads", exchange(False),
         lambda: prev(a, b, offsets, out, activation="swiglu", stream=7)),
        ("nanobind fast_run, attribute reads", exchange(False),
         lambda: native.fast_run(a, b, offsets, out, "swiglu", *nones, 7)),
        ("nanobind fast_run, DLPack exchange API", exchange(True),
         lambda: native.fast_run(a, b, offsets, out, "swiglu", *nones, 7)),
        ("run (C method), attribute reads", exchange(False),
         lambda: gemm.run(a, b, offsets, out, activation="swiglu", stream=7)),
        ("run (C method), DLPack exchange API  <- run now", exchange(True),
         lambda: gemm.run(a, b, offsets, out, activation="swiglu", stream=7)),
    ]
    if not info["exchange_api"]:
        paths = [p for p in paths if "exchange API" not in p[0]]
    want = None
    for _, setup, fn in paths[1:]:
        setup()
        got = check(fn)
        assert want is None or got == want, (got, want)
        want = got
    rounds = {name: [] for name, _, _ in paths}
    for _ in range(opt.rounds + 1):  # rounds interleave the paths; the first is dropped
        for name, setup, fn in paths:
            setup()
            rounds[name].append(per_call_ns(fn, opt.calls))
    _cubist._fast_path_config(exchange=True, cpu_as_device=False)
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, exchange API "
          f"{'found' if info['exchange_api'] else 'absent'}; E={e} T={t} N={n} K={k} bf16 "
          f"swiglu on CPU tensors, {opt.calls} calls x {opt.rounds} rounds (median), launch "
          f"recorded, not made")
    print("| path | ns per call |\n| --- | ---: |")
    for name, _, _ in paths:
        print(f"| {name} | {statistics.median(rounds[name][1:]):.0f} |")


if __name__ == "__main__":
    main()
