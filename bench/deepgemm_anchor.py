#!/usr/bin/env python3
"""Our grouped GEMMs beside DeepSeek's DeepGEMM, built and timed in one process
(docs/benchmarks.md, "MoE GEMM against DeepGEMM").

    python3 bench/deepgemm_anchor.py --manifest ART/manifest.json
        [--deepgemm-src DeepGEMM.tar.xz --build-dir DIR | --deepgemm DIR]
        [--shapes qwen3,qwen3-64,gptoss,dsv3,mixtral,gptoss-decode] [--formats fp8-block,bf16]
        [--iters 30] [--rounds 3] [--warm-jobs 6] [--graph] [--json OUT] [--markdown OUT]
    python3 bench/deepgemm_anchor.py --list [--deepgemm-src TARBALL]   # the plan, no GPU
    python3 bench/deepgemm_anchor.py --self-test     # CPU checks (torch optional, CPU is enough)
    python3 bench/deepgemm_anchor.py --deepgemm-src T --build-dir DIR --build-only

DeepGEMM: --deepgemm-src unpacks a source tarball (a DeepGEMM/ tree with its cutlass and
fmt submodules in third-party/, no .git needed) into --build-dir and builds its extension
in place with the system gcc/g++ (CC=/usr/bin/gcc CXX=/usr/bin/g++ DG_USE_LOCAL_VERSION=0
python3 setup.py build_ext --inplace; skipped when deep_gemm/_C*.so is already there).
Its kernels compile with nvcc on their first call: before timing, each shape's first
calls run in --warm-jobs parallel processes that fill DG_JIT_CACHE_DIR (default
BUILD_DIR/jit-cache); a warm process killed by a signal (an extension built with another
compiler crashes in its first GEMM) leaves DeepGEMM out of the run, one that fails leaves
out its shape's DeepGEMM rows, each said in the table. Without DeepGEMM, ours and the
dense peaks are still timed.

For each shape and format both get the same operands: FP8 is e4m3 with 1x128 activation
scales [T, ceil(K/128)] and 128x128 weight scales [E, ceil(N/128), ceil(K/128)], fp32
(our fp8-block pair; weights by cubist.quantize_weights), BF16 plain. Ours run through
cubist.MoeGemm on the sorted rows with int32 offsets [E+1], the dispatcher's choice
(printed; --tuning-file, default untuned). DeepGEMM gets the same rows in its layout:
  contiguous  m_grouped_{fp8,bf16}_gemm_nt_contiguous, each expert's rows padded to
              get_mk_alignment_for_contiguous_layout(), m_indices int32 per row (-1: pad)
  psum        the same call with use_psum_layout=True: expert e's rows start at the
              previous end rounded up to the alignment, grouped_layout[e] = its end;
              with and without expected_m_for_psum_layout = tokens per expert (it
              changes DeepGEMM's tile heuristic), the faster reported
  masked      m_grouped_{fp8,bf16}_gemm_nt_masked, [E, max_m, K], masked_m, expected_m
Activation scales go through get_mn_major_tma_aligned_tensor before timing (once per
batch, as an engine does). Outputs are compared (max |difference|; bit-identical is
expected) before timing. Times: medians of --iters calls with the L2 flushed before each
(moe_layer_bench.timed: CUDA events, eager unless --graph), the median of --rounds
rounds that alternate DeepGEMM and ours. Ratio = DeepGEMM us / ours us (> 1: ours
faster). Also timed in the same process: torch.mm bf16 and torch._scaled_mm fp8 (per
tensor) on 8192^3, and our fp8 per-tensor pair on --per-tensor-shapes against the latter
(and against DeepGEMM's 1x128 block GEMM of the shape, which has no per-tensor kernel).
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time

SHAPES = {  # name: (model, experts, tokens per expert, N, K, DeepGEMM layout)
    "qwen3": ("Qwen3-30B-A3B", 128, 128, 1536, 2048, "contiguous"),
    "qwen3-64": ("Qwen3-30B-A3B", 128, 64, 1536, 2048, "psum"),
    "gptoss": ("gpt-oss-120b", 128, 128, 5760, 2880, "contiguous"),
    "dsv3": ("DeepSeek-V3", 256, 128, 4096, 7168, "contiguous"),
    "mixtral": ("Mixtral-8x7B", 8, 2048, 28672, 4096, "contiguous"),
    "gptoss-decode": ("gpt-oss-120b decode", 128, 8, 5760, 2880, "masked"),
}
FORMATS = ("fp8-block", "bf16")  # both sides; "fp8" (per tensor) is ours alone
DENSE = 8192  # the dense peaks' M = N = K
DEV = "cuda"  # where operands live (--self-test runs the GPU half's bookkeeping on "cpu")
BUILD_ENV = {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "DG_USE_LOCAL_VERSION": "0"}
# setup.py imports wheel.bdist_wheel and packaging at the top, though build_ext never
# runs bdist_wheel. setuptools >= 71 puts its vendored copies of both on sys.path when
# imported, so it goes first; without any wheel, setuptools' own bdist_wheel (>= 70.1) or
# a bare Command stands in. The tree's directory goes first on sys.path (setup.py imports
# its scripts/ package), whatever PYTHONSAFEPATH says.
SETUP_SHIM = """import os, runpy, sys, types
import setuptools
sys.path.insert(0, os.getcwd())
try:
    import wheel.bdist_wheel
except ImportError:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from setuptools import Command as bdist_wheel
    module = types.ModuleType("wheel.bdist_wheel")
    module.bdist_wheel = bdist_wheel
    sys.modules.setdefault("wheel", types.ModuleType("wheel"))
    sys.modules["wheel.bdist_wheel"] = module
sys.argv = ["setup.py", "build_ext", "--inplace"]
runpy.run_path("setup.py", run_name="__main__")
"""
TARGET_RATIO, TARGET_GEOMEAN, TARGET_DENSE_FP8 = 0.98, 1.0, 0.93  # issue targets


# ---- The CPU half: the plan, DeepGEMM's row layouts, the table (no torch needed) ----

def align(x, a):
    return -(-x // a) * a


def dg_layout(counts, layout, alignment, max_m=0):
    """Where each of our rows (sorted by expert, counts[e] rows each) sits in DeepGEMM's
    buffer, and that layout's index tensor (as Python lists):
      contiguous  rows, m (buffer rows), m_indices [m] (expert of each row, -1 padding)
      psum        rows, m, grouped_layout [E] (each expert's end row)
      masked      rows (into the [E * max_m] flattened buffer), m = max_m, masked_m [E]
    """
    rows, out = [], {}
    if layout == "contiguous":
        m_indices, start = [], 0
        for e, c in enumerate(counts):
            rows += range(start, start + c)
            slot = align(c, alignment)
            m_indices += [e] * c + [-1] * (slot - c)
            start += slot
        out = dict(m=start, m_indices=m_indices)
    elif layout == "psum":
        ends, end = [], 0
        for c in counts:
            start = align(end, alignment)
            rows += range(start, start + c)
            end = start + c
            ends.append(end)
        out = dict(m=align(end, alignment), grouped_layout=ends)
    elif layout == "masked":
        if max(counts, default=0) > max_m:
            raise ValueError(f"masked layout: an expert has {max(counts)} rows, more than "
                             f"max_m = {max_m}; raise --masked-max-m")
        for e, c in enumerate(counts):
            rows += range(e * max_m, e * max_m + c)
        out = dict(m=max_m, masked_m=list(counts))
    else:
        raise ValueError(f"unknown DeepGEMM layout {layout!r}")
    out["rows"] = rows
    return out


def deepgemm_call(fmt, layout):
    """The DeepGEMM call a row times (for --list and the JSON)."""
    ab = "(a, sa), (b, sb)" if fmt == "fp8-block" else "a, b"
    kind = "fp8" if fmt == "fp8-block" else "bf16"
    if layout == "masked":
        return f"deep_gemm.m_grouped_{kind}_gemm_nt_masked({ab}, d, masked_m, expected_m)"
    extra = (", use_psum_layout=True[, expected_m_for_psum_layout=tokens/expert]: the "
             "faster" if layout == "psum" else "")
    index = "grouped_layout" if layout == "psum" else "m_indices"
    return f"deep_gemm.m_grouped_{kind}_gemm_nt_contiguous({ab}, d, {index}{extra})"


def plan(shapes, formats, per_tensor_shapes):
    """One dict per timed row, in order."""
    out = []
    for name in shapes:
        model, e, tpe, n, k, layout = SHAPES[name]
        for fmt in formats:
            ours = ("gemm.run(a, b, offsets, out" +
                    (", a_scale=sa, b_scale=sb)" if fmt == "fp8-block" else ")"))
            out.append(dict(shape=name, model=model, experts=e, tokens_per_expert=tpe, n=n,
                            k=k, format=fmt, layout=layout, deepgemm=deepgemm_call(fmt, layout),
                            ours=ours))
        if name in per_tensor_shapes:
            out.append(dict(shape=name, model=model, experts=e, tokens_per_expert=tpe, n=n,
                            k=k, format="fp8", layout="-", deepgemm="-",
                            ours="gemm.run(a, b, offsets, out, a_global_scale=s, "
                                 "b_global_scale=g)  (against torch._scaled_mm)"))
    return out


def tflops(flops, us):
    return None if not us else flops / us * 1e-6


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows, dense):
    """Geomeans and the issue's targets from the rows (each with format, ratio, ours_tflops)
    and the dense peaks ({"bf16_tflops", "fp8_tflops"}: the best of the run's timings)."""
    s = {"geomean": {}, "min_ratio": None, "targets": {}}
    both = [r for r in rows if r.get("ratio")]
    for fmt in FORMATS:
        s["geomean"][fmt] = geomean([r["ratio"] for r in both if r["format"] == fmt])
    s["geomean"]["all"] = geomean([r["ratio"] for r in both])
    if both:
        worst = min(both, key=lambda r: r["ratio"])
        s["min_ratio"] = dict(shape=worst["shape"], format=worst["format"], ratio=worst["ratio"])
        s["targets"]["every ratio >= %.2f" % TARGET_RATIO] = worst["ratio"] >= TARGET_RATIO
        s["targets"]["geomean >= %.2f" % TARGET_GEOMEAN] = (
            s["geomean"]["all"] >= TARGET_GEOMEAN)
    fp8_peak = dense.get("fp8_tflops")
    for r in rows:
        block = [b for b in rows if b["shape"] == r["shape"] and b["format"] == "fp8-block"
                 and b.get("deepgemm_us")]
        if r["format"] == "fp8" and r.get("ours_us") and block:
            # Per tensor has no DeepGEMM kernel: its 1x128 block GEMM of the shape instead.
            r["deepgemm_block_over_ours"] = block[0]["deepgemm_us"] / r["ours_us"]
        if r["format"] == "fp8" and r.get("ours_tflops") and fp8_peak:
            r["of_dense_fp8"] = r["ours_tflops"] / fp8_peak
            s["targets"][f"{r['shape']} fp8 per tensor >= {TARGET_DENSE_FP8:.2f}x "
                         f"torch._scaled_mm"] = r["of_dense_fp8"] >= TARGET_DENSE_FP8
    return s


def fmt_num(v, spec="{:.1f}"):
    return "-" if v is None else spec.format(v)


def markdown(rows, dense, summary, meta):
    """The table docs/benchmarks.md shows, and the lines under it."""
    out = ["| shape (E, tokens/expert, N, K) | format | DeepGEMM layout | DeepGEMM us | "
           "ours us | DeepGEMM / ours | DeepGEMM TFLOP/s | ours TFLOP/s | our kernel | "
           "max abs diff |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        shape = (f"{r['model']} ({r['experts']}, {r['tokens_per_expert']}, {r['n']}, "
                 f"{r['k']})")
        fmt = {"fp8-block": "FP8 1x128 block", "bf16": "BF16",
               "fp8": "FP8 per tensor"}[r["format"]]
        ratio = fmt_num(r.get("ratio"), "{:.2f}")
        if r["format"] == "fp8" and r.get("of_dense_fp8"):
            ratio = f"{r['of_dense_fp8']:.2f} of torch._scaled_mm"
            if r.get("deepgemm_block_over_ours"):
                ratio += f"; DeepGEMM 1x128 / ours {r['deepgemm_block_over_ours']:.2f}"
        kernel = (r.get("our_kernel") or "-") + (f" ({r['ours_note']})" if r.get("ours_note")
                                                 else "")
        diff = fmt_num(r.get("max_abs_diff"), "{:.3g}")
        if r.get("identical"):
            diff = "0 (bit-identical)"
        dg_us = fmt_num(r.get("deepgemm_us"))
        if r.get("deepgemm_error"):
            dg_us = "failed"
        layout = r["layout"] + (f" ({r['deepgemm_variant']})" if r.get("deepgemm_variant")
                                else "")
        out.append(f"| {shape} | {fmt} | {layout} | {dg_us} | "
                   f"{fmt_num(r.get('ours_us'))} | {ratio} | "
                   f"{fmt_num(r.get('deepgemm_tflops'), '{:.0f}')} | "
                   f"{fmt_num(r.get('ours_tflops'), '{:.0f}')} | {kernel} | {diff} |")
    out.append("")
    for r in rows:
        for key, who in (("error", "the row"), ("deepgemm_error", "DeepGEMM")):
            if r.get(key):
                out.append(f"- {r['shape']} {r['format']}: {who}: {r[key]}")
    if any(r.get("error") or r.get("deepgemm_error") for r in rows):
        out.append("")
    out.append(f"Dense peaks in the same process ({DENSE}^3, best of the run's timings): "
               f"torch.mm BF16 {fmt_num(dense.get('bf16_tflops'), '{:.0f}')} TFLOP/s, "
               f"torch._scaled_mm FP8 {fmt_num(dense.get('fp8_tflops'), '{:.0f}')} TFLOP/s.")
    g = summary["geomean"]
    out.append(f"Geomean DeepGEMM / ours: FP8 1x128 {fmt_num(g.get('fp8-block'), '{:.3f}')}, "
               f"BF16 {fmt_num(g.get('bf16'), '{:.3f}')}, all {fmt_num(g.get('all'), '{:.3f}')}"
               + (f"; lowest {summary['min_ratio']['ratio']:.2f} ({summary['min_ratio']['shape']}"
                  f" {summary['min_ratio']['format']})" if summary["min_ratio"] else "") + ".")
    if summary["targets"]:
        out.append("Targets: " + "; ".join(f"{k}: {'met' if v else 'NOT met'}"
                                           for k, v in summary["targets"].items()) + ".")
    if meta.get("deepgemm_status") != "ok":
        out.append(f"DeepGEMM: {meta.get('deepgemm_status')}")
    out.append(f"({meta.get('device', '?')}, torch {meta.get('torch', '?')}, DeepGEMM "
               f"{meta.get('deepgemm_version', '-')}, {meta.get('timing', '')})")
    return "\n".join(out) + "\n"


def check_tarball(path):
    """What --list says about a DeepGEMM source tarball (raises on a broken one)."""
    with tarfile.open(path) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    need = ["DeepGEMM/setup.py", "DeepGEMM/csrc/python_api.cpp", "DeepGEMM/deep_gemm/__init__.py",
            "DeepGEMM/scripts/generate_pyi.py", "DeepGEMM/third-party/fmt/include/fmt/format.h",
            "DeepGEMM/third-party/cutlass/include/cute/tensor.hpp",
            "DeepGEMM/third-party/cutlass/include/cutlass/arch/barrier.h"]
    missing = [n for n in need if n not in members]
    for link in ("cute", "cutlass"):
        m = members.get(f"DeepGEMM/deep_gemm/include/{link}")
        if m is None or not (m.issym() or m.isdir()):
            missing.append(f"DeepGEMM/deep_gemm/include/{link} (a link into "
                           f"third-party/cutlass/include)")
    if missing:
        raise ValueError(f"{path}: not a DeepGEMM source tree this script can build; missing "
                         f"{', '.join(missing)} (docs/benchmarks.md, \"MoE GEMM against "
                         f"DeepGEMM\", says how to assemble one)")
    files = sum(1 for m in members.values() if m.isfile())
    sources = members.get("DeepGEMM/SOURCES.txt")
    return f"{path}: {files} files, {os.path.getsize(path) / 1e6:.1f} MB" + (
        " (DeepGEMM/SOURCES.txt names the commits)" if sources else "")


def list_plan(args):
    print(f"shapes x formats ({len(args.rows)} rows; ratio = DeepGEMM us / ours us):")
    for r in args.rows:
        print(f"  {r['shape']:14s} {r['model']:20s} E={r['experts']:<4d} "
              f"tokens/expert={r['tokens_per_expert']:<5d} N={r['n']:<6d} K={r['k']:<5d} "
              f"{r['format']:9s} {r['layout']:10s}")
        print(f"      DeepGEMM: {r['deepgemm']}")
        print(f"      ours:     {r['ours']}")
    print(f"  dense peaks: torch.mm bf16 and torch._scaled_mm fp8 (per-tensor scales), "
          f"{DENSE}^3")
    if args.deepgemm_src:
        try:
            print(check_tarball(args.deepgemm_src))
        except (OSError, tarfile.TarError, ValueError) as exc:
            print(f"--deepgemm-src: {exc}")
            return 1
        print(f"build: tar -xf {args.deepgemm_src} -C {args.build_dir or 'BUILD_DIR'} && cd "
              f"DeepGEMM && " + " ".join(f"{k}={v}" for k, v in BUILD_ENV.items()) +
              " python3 setup.py build_ext --inplace")
    print(f"timing: {args.rounds} rounds x median of {args.iters} calls, L2 flushed, "
          f"{'CUDA graph replay' if args.graph else 'eager'}")
    return 0


def self_test():
    """The CPU half against hand-worked cases; exits non-zero on the first mismatch."""
    checks = 0

    def expect(got, want, what):
        nonlocal checks
        if got != want:
            raise SystemExit(f"self-test: {what}: got {got!r}, want {want!r}")
        checks += 1

    c = dg_layout([2, 0, 3], "contiguous", 4)
    expect(c["rows"], [0, 1, 4, 5, 6], "contiguous rows (expert 1 empty)")
    expect(c["m_indices"], [0, 0, -1, -1, 2, 2, 2, -1], "contiguous m_indices")
    expect(c["m"], 8, "contiguous buffer rows")
    c = dg_layout([128] * 3, "contiguous", 128)
    expect(c["rows"], list(range(384)), "aligned counts: DeepGEMM's rows are ours")
    p = dg_layout([64, 64, 64], "psum", 128)
    expect(p["grouped_layout"], [64, 192, 320], "psum ends")
    expect(p["rows"][63:66], [63, 128, 129], "psum: expert 1 starts at the next slot")
    expect(p["m"], 384, "psum buffer rows")
    p = dg_layout([130, 0, 5], "psum", 128)
    expect(p["grouped_layout"], [130, 256, 261], "psum: an empty expert ends where it starts")
    expect(p["rows"][129:], [129, 256, 257, 258, 259, 260], "psum rows after an empty expert")
    k = dg_layout([8, 3], "masked", 128, 16)
    expect(k["rows"], list(range(8)) + [16, 17, 18], "masked rows")
    expect(k["masked_m"], [8, 3], "masked_m")
    try:
        dg_layout([17], "masked", 0, 16)
        expect("no error", "ValueError", "masked: an expert over max_m")
    except ValueError as err:
        expect("--masked-max-m" in str(err), True, "masked error names the fix")
    expect(deepgemm_call("fp8-block", "psum"),
           "deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, grouped_layout, "
           "use_psum_layout=True[, expected_m_for_psum_layout=tokens/expert]: the faster)",
           "psum call")
    expect(deepgemm_call("bf16", "masked"),
           "deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)",
           "masked call")
    rows = plan(["qwen3", "mixtral"], ["fp8-block", "bf16"], ["mixtral"])
    expect([(r["shape"], r["format"]) for r in rows],
           [("qwen3", "fp8-block"), ("qwen3", "bf16"), ("mixtral", "fp8-block"),
            ("mixtral", "bf16"), ("mixtral", "fp8")], "plan order")
    expect(round(tflops(2 * 8192 ** 3, 1000.0)), 1100, "TFLOP/s from flops and us")
    rows = [dict(r) for r in rows]
    for r, (dg, ours) in zip(rows, [(100, 95), (100, 100), (400, 600), (50, 50), (None, 1000)]):
        r.update(deepgemm_us=dg, ours_us=ours, ratio=dg / ours if dg else None,
                 ours_tflops=2.0 * r["experts"] * r["tokens_per_expert"] * r["n"] * r["k"] /
                 ours * 1e-6, identical=dg is not None)
    s = summarize(rows, {"bf16_tflops": 700.0, "fp8_tflops": 1300.0})
    expect(round(s["geomean"]["fp8-block"], 4), round(math.sqrt(100 / 95 * 400 / 600), 4),
           "fp8 geomean")
    expect(s["geomean"]["bf16"], 1.0, "bf16 geomean")
    expect(s["min_ratio"]["shape"], "mixtral", "lowest ratio's shape")
    expect(s["targets"]["every ratio >= 0.98"], False, "ratio target")
    expect(round(rows[4]["of_dense_fp8"], 3), round(2.0 * 8 * 2048 * 28672 * 4096 / 1000 *
                                                    1e-6 / 1300, 3), "share of the fp8 peak")
    md = markdown(rows, {"bf16_tflops": 700.0, "fp8_tflops": 1300.0}, s,
                  {"deepgemm_status": "ok"})
    expect(md.count("\n| Qwen3-30B-A3B (128, 128, 1536, 2048) |"), 2, "one line per row")
    expect("| 400.0 | 600.0 | 0.67 |" in md, True, "the ratio column")
    expect("of torch._scaled_mm; DeepGEMM 1x128 / ours 0.40 |" in md, True,
           "the per-tensor row against torch._scaled_mm and DeepGEMM's block GEMM")
    expect("NOT met" in md, True, "an unmet target is said")
    try:
        import torch
    except ImportError:
        print(f"self-test: {checks} checks passed (no torch: the operand checks skipped)")
        return 0
    self_test_operands(torch, expect)
    print(f"self-test: {checks} checks passed")
    return 0


def self_test_operands(torch, expect):
    """The GPU half's bookkeeping on the CPU: Case's operands in both layouts and
    bench_case's comparison, with reference GEMMs standing in for DeepGEMM and ours
    (each computes from its own layout, so a misplaced row shows as a difference)."""
    global DEV
    import types

    def dequant(x, scale, rows_per_scale):
        v = x.float()
        if scale is not None:
            s = scale.float().repeat_interleave(rows_per_scale, dim=-2)[..., :v.shape[-2], :]
            v = v * s.repeat_interleave(128, dim=-1)[..., :v.shape[-1]]
        return v

    def product(a, b, sa, sb, e):  # a [R, K] with its 1x128 scales, expert e of b
        return (dequant(a, sa, 1) @ dequant(b[e], None if sb is None else sb[e], 128).t()
                ).to(torch.bfloat16)

    def split(x):
        return x if isinstance(x, tuple) else (x, None)

    def contiguous(a, b, d, index, use_psum_layout=False, expected_m_for_psum_layout=None):
        (a, sa), (b, sb) = split(a), split(b)
        if use_psum_layout:
            start = 0
            for e, end in enumerate(index.tolist()):
                start = align(start, 8)
                if end > start:
                    d[start:end] = product(a[start:end], b, sa[start:end] if sa is not None
                                           else None, sb, e)
                start = end
            return
        for e in range(b.shape[0]):
            rows = (index == e).nonzero().flatten()
            d[rows] = product(a[rows], b, None if sa is None else sa[rows], sb, e)

    def masked(a, b, d, masked_m, expected_m):
        (a, sa), (b, sb) = split(a), split(b)
        for e, m in enumerate(masked_m.tolist()):
            d[e, :m] = product(a[e, :m], b, None if sa is None else sa[e, :m], sb, e)

    dg = types.SimpleNamespace(
        get_mn_major_tma_aligned_tensor=lambda sf: sf.transpose(-1, -2).contiguous()
        .transpose(-1, -2),
        m_grouped_fp8_gemm_nt_contiguous=contiguous, m_grouped_bf16_gemm_nt_contiguous=contiguous,
        m_grouped_fp8_gemm_nt_masked=masked, m_grouped_bf16_gemm_nt_masked=masked)

    class NotFoundError(Exception):
        pass

    class Gemm:
        refuse_partial_k = True

        def check(self, a, b, offsets, out, a_scale=None, **kw):
            if a_scale is not None and a.shape[1] % 128 and self.refuse_partial_k:
                raise NotFoundError("no kernel: K is not a multiple of 128")

        def run(self, a, b, offsets, out, a_scale=None, b_scale=None, a_global_scale=None,
                b_global_scale=None):
            offs = offsets.tolist()
            for e in range(len(offs) - 1):
                lo, hi = offs[e], offs[e + 1]
                y = product(a[lo:hi], b, None if a_scale is None else a_scale[lo:hi],
                            b_scale, e).float()
                if a_global_scale is not None:
                    y = y * a_global_scale * b_global_scale[e]
                out[lo:hi] = y.to(torch.bfloat16)

        def kernel_for(self, **kw):
            return {"kernel": "moe_gemm_reference", "from_tuning": False}

    def quantize_weights(w, fmt):
        e, n, k = w.shape
        if fmt == "fp8":
            g = w.float().abs().amax(dim=(1, 2)) / 448.0
            return (w.float() / g[:, None, None]).to(torch.float8_e4m3fn), None, g
        nb, kb = -(-n // 128), -(-k // 128)
        wp = torch.zeros(e, nb * 128, kb * 128)
        wp[:, :n, :k] = w.float()
        s = wp.view(e, nb, 128, kb, 128).abs().amax(dim=(2, 4)).clamp(min=1e-4) / 448.0
        full = s.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)[:, :n, :k]
        return (w.float() / full).to(torch.float8_e4m3fn), s, None

    cubist = types.SimpleNamespace(NotFoundError=NotFoundError, quantize_weights=quantize_weights)
    tiny = {"t-contiguous": ("tiny", 3, 5, 136, 160, "contiguous"),
            "t-psum": ("tiny", 3, 5, 136, 256, "psum"),
            "t-masked": ("tiny", 3, 5, 136, 160, "masked")}
    saved_dev = DEV
    SHAPES.update(tiny)
    DEV = "cpu"
    try:
        for name in tiny:
            for fmt in FORMATS + ("fp8",):
                case = Case(torch, cubist, name, fmt, masked_max_m=7, alignment=8)
                row = dict(shape=name, format=fmt)
                fixed = lambda fns: {key: (fn(), 100.0 if key == "ours" else 98.0)[1]
                                     for key, fn in fns.items()}
                bench_case(torch, cubist, Gemm(), dg, case, row, fixed)
                what = f"{name} {fmt}"
                if name == "t-masked" and fmt == "fp8-block":
                    expect(tuple(case.dg_a.shape), (3, 7, 160), "masked buffer [E, max_m, K]")
                    expect(case.a_scale.stride(), (2, 1), "ours keeps row-major scales")
                if fmt == "fp8":
                    expect("deepgemm_us" in row, False, f"{what}: ours alone")
                    continue
                expect(row.get("deepgemm_error"), None, f"{what}: DeepGEMM's side ran")
                expect(row["max_abs_diff"], 0.0, f"{what}: DeepGEMM's rows are ours")
                expect(row["ratio"], 0.98, f"{what}: ratio")
                padded = fmt == "fp8-block" and case.k % 128 != 0
                expect("ours_note" in row, padded, f"{what}: K padded only when refused")
    finally:
        DEV = saved_dev
        for name in tiny:
            del SHAPES[name]


# ---- DeepGEMM: unpack, build, import, warm ----

def built_extension(root):
    return glob.glob(os.path.join(root, "deep_gemm", "_C*.so"))


def build_deepgemm(tarball, build_dir, log):
    """Unpacks (once) and builds (once) DeepGEMM under build_dir; returns its root. Raises
    RuntimeError naming the log on a failed build."""
    root = os.path.join(build_dir, "DeepGEMM")
    if tarball and not os.path.isdir(root):
        check_tarball(tarball)
        os.makedirs(build_dir, exist_ok=True)
        with tarfile.open(tarball) as tar:
            try:
                tar.extractall(build_dir, filter="data")
            except TypeError:  # a Python without extraction filters
                tar.extractall(build_dir)
    if built_extension(root):
        print(f"DeepGEMM: {built_extension(root)[0]} already built", flush=True)
        return root
    if not os.path.isfile(os.path.join(root, "setup.py")):
        raise RuntimeError(f"no DeepGEMM tree at {root}; give --deepgemm-src TARBALL")
    env = dict(os.environ, **BUILD_ENV)
    env.pop("PYTHONSAFEPATH", None)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    t0 = time.time()
    print(f"DeepGEMM: building in {root} ({' '.join(f'{k}={v}' for k, v in BUILD_ENV.items())}"
          f" python3 setup.py build_ext --inplace; log {log})", flush=True)
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-c", SETUP_SHIM], cwd=root, env=env, stdout=f,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0 or not built_extension(root):
        raise RuntimeError(f"DeepGEMM build failed (exit {rc}; see {log})")
    print(f"DeepGEMM: built in {time.time() - t0:.0f} s", flush=True)
    return root


def import_deepgemm(root):
    if root:
        sys.path.insert(0, root)
    import deep_gemm
    return deep_gemm


def warm_deepgemm(args):
    """Runs each shape's first DeepGEMM calls (the nvcc compiles) in parallel processes.
    Returns (why DeepGEMM must stay out of the run or None, {(shape, format): why that
    row's DeepGEMM side is left out}): a call that failed may have left a CUDA error that
    would poison this process's context, so it is not tried again here."""
    cmds = []
    for name in args.shape_list:
        cmds.append((name, [sys.executable, os.path.abspath(__file__), "--warm-only",
                            "--shapes", name, "--formats", ",".join(args.format_list),
                            "--masked-max-m", str(args.masked_max_m)] +
                     (["--deepgemm", args.deepgemm] if args.deepgemm else [])))
    logdir = args.build_dir or tempfile.mkdtemp(prefix="deepgemm-warm-")
    t0 = time.time()
    running, failed, crash = [], {}, None
    while cmds or running:
        while cmds and len(running) < args.warm_jobs:
            name, cmd = cmds.pop(0)
            log = os.path.join(logdir, f"warm-{name}.log")
            f = open(log, "w")
            running.append((name, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT),
                            f, log, time.time()))
        for item in list(running):
            name, proc, f, log, started = item
            if proc.poll() is None:
                if time.time() - started < args.warm_timeout:
                    continue
                proc.kill()
                proc.wait()
            running.remove(item)
            f.close()
            with open(log) as g:
                lines = g.read().strip().splitlines()
            rc = proc.returncode
            print(f"  warm {name}: exit {rc}\n" +
                  "".join(f"    {line}\n" for line in lines[-6:]), end="", flush=True)
            if rc < 0 and time.time() - started >= args.warm_timeout:
                for fmt in args.format_list:
                    failed[(name, fmt)] = (f"warm-up timed out after {args.warm_timeout} s "
                                           f"(log {log})")
            elif rc < 0 and crash is None:
                crash = (f"its first GEMM crashed (signal {-rc}, shape {name}, log {log}); "
                         f"an extension built with a compiler other than the system gcc/g++ "
                         f"does this: rebuild with CC=/usr/bin/gcc CXX=/usr/bin/g++")
            elif rc != 0:
                said = {tuple(line.split()[2:4]): line for line in lines
                        if line.startswith("warm failed ")}
                for fmt in args.format_list:
                    why = said.get((name, fmt + ":"))
                    if why or not said:
                        failed[(name, fmt)] = (f"warm-up failed: "
                                               f"{why or (lines[-1] if lines else 'no output')}"
                                               f" (log {log})")
        time.sleep(0.2)
    print(f"DeepGEMM JIT warm-up: {time.time() - t0:.0f} s", flush=True)
    if crash is None and failed and len(failed) == len(args.shape_list) * len(args.format_list):
        crash = f"every warm-up failed ({next(iter(failed.values()))})"
    return crash, {} if crash else failed


# ---- GPU half ----

class Case:
    """One shape and format: our operands (sorted rows, int32 offsets [E+1]) and the
    same rows in DeepGEMM's layout."""

    def __init__(self, torch, cubist, name, fmt, masked_max_m, alignment, seed=1234):
        model, e, tpe, n, k, layout = SHAPES[name]
        self.name, self.fmt, self.layout = name, fmt, layout
        self.e, self.n, self.k = e, n, k
        counts = [tpe] * e
        self.t = sum(counts)
        self.flops = 2.0 * self.t * n * k
        self.offsets = torch.tensor([0] + [tpe * (i + 1) for i in range(e)], device=DEV,
                                    dtype=torch.int32)
        torch.manual_seed(seed)
        x = torch.randn(self.t, k, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device=DEV, dtype=torch.bfloat16).mul_(k ** -0.5)
        self.a_scale = self.b_scale = self.a_global = self.b_global = None
        if fmt == "bf16":
            self.a, self.b = x, w
        elif fmt == "fp8-block":
            self.a, self.a_scale = quantize_rows_1x128(torch, x)
            self.b, self.b_scale, _ = cubist.quantize_weights(w, "fp8-block")
        else:  # fp8 per tensor
            amax = x.float().abs().amax().clamp(min=1e-4)
            self.a_global = (amax / 448.0).reshape(1)
            self.a = (x.float() / self.a_global).to(torch.float8_e4m3fn)
            self.b, _, self.b_global = cubist.quantize_weights(w, "fp8")
        del x, w
        self.out = torch.empty(self.t, n, device=DEV, dtype=torch.bfloat16)
        self.lay = None
        if fmt in FORMATS:
            self._deepgemm_operands(torch, counts, layout, masked_max_m, alignment, tpe)

    def _deepgemm_operands(self, torch, counts, layout, max_m, alignment, tpe):
        lay = dg_layout(counts, layout, alignment, max_m)
        self.lay, self.expected_m = lay, tpe
        rows = torch.tensor(lay["rows"], device=DEV, dtype=torch.int64)
        m_total = lay["m"] * (self.e if layout == "masked" else 1)
        self.dg_rows = rows
        k, kb = self.k, -(-self.k // 128)
        if rows.numel() == m_total and layout != "masked":
            a = self.a  # the same tensor: nothing to scatter
            sa = self.a_scale
        else:
            a = torch.zeros(m_total, k, device=DEV, dtype=torch.uint8 if self.fmt !=
                            "bf16" else torch.bfloat16)
            src = self.a.view(torch.uint8) if self.fmt != "bf16" else self.a
            a[rows] = src
            if self.fmt != "bf16":
                a = a.view(torch.float8_e4m3fn)
                sa = torch.zeros(m_total, kb, device=DEV, dtype=torch.float32)
                sa[rows] = self.a_scale
        if layout == "masked":
            a = a.view(self.e, max_m, k)
            if self.fmt != "bf16":
                sa = sa.view(self.e, max_m, kb)
            self.d = torch.empty(self.e, max_m, self.n, device=DEV, dtype=torch.bfloat16)
            self.masked_m = torch.tensor(lay["masked_m"], device=DEV, dtype=torch.int32)
        else:
            self.d = torch.empty(m_total, self.n, device=DEV, dtype=torch.bfloat16)
            key = "grouped_layout" if layout == "psum" else "m_indices"
            self.index = torch.tensor(lay[key], device=DEV, dtype=torch.int32)
        self.dg_a = a
        self.dg_sa = sa if self.fmt != "bf16" else None

    def prepare_scales(self, dg):
        """DeepGEMM's activation scales, MN-major and TMA-aligned (outside the timing)."""
        if self.dg_sa is not None:
            self.dg_sa = dg.get_mn_major_tma_aligned_tensor(self.dg_sa)

    def deepgemm_fns(self, dg):
        """{variant: DeepGEMM call}; the row reports the fastest. The psum layout is tried
        with and without expected_m_for_psum_layout (the tokens per expert an engine
        expects), which changes DeepGEMM's tile heuristic."""
        fp8 = self.fmt == "fp8-block"
        a = (self.dg_a, self.dg_sa) if fp8 else self.dg_a
        b = (self.b, self.b_scale) if fp8 else self.b
        if self.layout == "masked":
            f = dg.m_grouped_fp8_gemm_nt_masked if fp8 else dg.m_grouped_bf16_gemm_nt_masked
            return {"": lambda: f(a, b, self.d, self.masked_m, self.expected_m)}
        f = dg.m_grouped_fp8_gemm_nt_contiguous if fp8 else dg.m_grouped_bf16_gemm_nt_contiguous
        if self.layout == "psum":
            return {"": lambda: f(a, b, self.d, self.index, use_psum_layout=True),
                    f"expected_m_for_psum_layout={self.expected_m}": lambda: f(
                        a, b, self.d, self.index, use_psum_layout=True,
                        expected_m_for_psum_layout=self.expected_m)}
        return {"": lambda: f(a, b, self.d, self.index)}

    def deepgemm_rows(self):
        return self.d.view(-1, self.n).index_select(0, self.dg_rows)

    def ours_kwargs(self):
        kw = dict(a_scale=self.a_scale, b_scale=self.b_scale, a_global_scale=self.a_global,
                  b_global_scale=self.b_global)
        return {key: v for key, v in kw.items() if v is not None}


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


def quantize_rows_1x128(torch, x):
    """x [T, K] -> e4m3 [T, K] and fp32 scales [T, ceil(K/128)] (amax / 448 per 1x128 block
    of a row; the last block partial)."""
    t, k = x.shape
    kb = -(-k // 128)
    xp = torch.zeros(t, kb * 128, device=x.device, dtype=torch.float32)
    xp[:, :k] = x.float()
    xb = xp.view(t, kb, 128)
    s = xb.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    q = (xb / s[..., None]).to(torch.float8_e4m3fn).view(t, kb * 128)[:, :k].contiguous()
    return q, s.contiguous()


def capture_stdout(fn):
    """Runs fn with file descriptor 1 redirected (DeepGEMM's C++ prints its config there)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)
        try:
            fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return f.read().decode(errors="replace").strip()


def warm_only(args):
    """One process's share of the JIT warm-up: each format's first DeepGEMM call."""
    import torch
    import cubist
    dg = import_deepgemm(args.deepgemm)
    alignment = dg.get_mk_alignment_for_contiguous_layout()
    rc = 0
    for name in args.shape_list:
        for fmt in args.format_list:
            t0 = time.time()
            try:
                case = Case(torch, cubist, name, fmt, args.masked_max_m, alignment)
                case.prepare_scales(dg)
                for fn in case.deepgemm_fns(dg).values():
                    fn()
                sync(torch)
                print(f"{name} {fmt}: compiled and ran in {time.time() - t0:.1f} s", flush=True)
            except Exception as exc:  # the main run leaves this row's DeepGEMM side out
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                print(f"warm failed {name} {fmt}: {type(exc).__name__}: {first}", flush=True)
                rc = 1
            case = None
            torch.cuda.empty_cache()
    return rc


def prepare_deepgemm(args):
    """(deep_gemm module or None, status line, meta): builds when asked, imports, warms."""
    meta = {}
    try:
        if args.deepgemm_src or args.build_dir:
            args.deepgemm = build_deepgemm(args.deepgemm_src, args.build_dir,
                                           os.path.join(args.build_dir, "deepgemm-build.log"))
        if args.build_only:
            return None, "built", meta
        os.environ.setdefault("DG_PRINT_CONFIGS", "1")
        if args.build_dir:
            os.environ.setdefault("DG_JIT_CACHE_DIR", os.path.join(
                os.path.abspath(args.build_dir), "jit-cache"))
        dg = import_deepgemm(args.deepgemm)
        meta["deepgemm_version"] = getattr(dg, "__version__", "?")
        meta["deepgemm_path"] = os.path.dirname(dg.__file__)
    except Exception as exc:  # the caller still times ours and the dense peaks
        return None, f"unavailable ({type(exc).__name__}: {exc})", meta
    if args.warm_jobs > 0:
        why, failed = warm_deepgemm(args)
        meta["warm_failed"] = {f"{shape} {fmt}": v for (shape, fmt), v in failed.items()}
        args.warm_failed = failed
        if why:
            return None, f"left out: {why}", meta
    return dg, "ok", meta


def run(args):
    dg, status, meta = prepare_deepgemm(args)
    if args.build_only:
        print(f"DeepGEMM: {status}", flush=True)
        return 0 if status == "built" else 1
    if dg is None:
        status += "; timing ours and the dense peaks only"
    print(f"DeepGEMM: {status}", flush=True)
    import torch
    import cubist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from moe_layer_bench import timed  # L2 flush, CUDA events, median

    meta.update(deepgemm_status=status, torch=torch.__version__,
                timing=f"median of {args.rounds} rounds x median of {args.iters} calls, "
                f"L2 flushed, {'CUDA graph replay' if args.graph else 'eager'}")
    warm_failed = getattr(args, "warm_failed", {})
    rt = cubist.Runtime(args.manifest, tuning_file=args.tuning_file)
    gemm = cubist.MoeGemm(rt)
    meta.update(device=torch.cuda.get_device_name(), manifest=args.manifest,
                manifest_name=rt.manifest_name, manifest_version=rt.manifest_version,
                tuning_file=args.tuning_file, iters=args.iters, rounds=args.rounds,
                masked_max_m=args.masked_max_m, graph=args.graph)
    print(f"torch {torch.__version__}, {meta['device']}; cubist manifest "
          f"{rt.manifest_name} v{rt.manifest_version}, tuning {args.tuning_file!r}", flush=True)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)  # 512 MB > L2

    def median_of_rounds(fns):
        """{key: median over rounds of timed(fn)}, the keys alternating within a round."""
        samples = {key: [] for key in fns}
        for _ in range(args.rounds):
            for key, fn in fns.items():
                samples[key].append(timed(fn, args.iters, flush, graph=args.graph))
        return {key: sorted(v)[len(v) // 2] for key, v in samples.items()}

    dense_runs = []

    def dense_peaks():
        a = torch.randn(DENSE, DENSE, device=DEV, dtype=torch.bfloat16)
        b = torch.randn(DENSE, DENSE, device=DEV, dtype=torch.bfloat16)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=DEV)
        us = median_of_rounds({
            "bf16": lambda: torch.mm(a, b.t()),
            "fp8": lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                            out_dtype=torch.bfloat16)})
        flops = 2.0 * DENSE ** 3
        peaks = {f"{key}_us": v for key, v in us.items()}
        peaks.update({f"{key}_tflops": tflops(flops, v) for key, v in us.items()})
        dense_runs.append(peaks)
        print(f"dense {DENSE}^3: torch.mm bf16 {peaks['bf16_us']:.1f} us "
              f"{peaks['bf16_tflops']:.0f} TFLOP/s, torch._scaled_mm fp8 "
              f"{peaks['fp8_us']:.1f} us {peaks['fp8_tflops']:.0f} TFLOP/s", flush=True)

    dense_peaks()
    alignment = dg.get_mk_alignment_for_contiguous_layout() if dg else 128
    meta["alignment"] = alignment
    rows = []
    for spec in args.rows:
        row = dict(spec)
        rows.append(row)
        case = None
        try:
            case = Case(torch, cubist, spec["shape"], spec["format"], args.masked_max_m,
                        alignment)
            bench_case(torch, cubist, gemm, dg, case, row, median_of_rounds,
                       warm_failed.get((spec["shape"], spec["format"])))
        except Exception as exc:  # out of memory, a refused shape: say so, go on
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{spec['shape']} {spec['format']}: {row['error']}", flush=True)
        case = None
        torch.cuda.empty_cache()
    dense_peaks()
    dense = {key: max(r[key] for r in dense_runs) for key in ("bf16_tflops", "fp8_tflops")}
    dense["runs"] = dense_runs
    summary = summarize(rows, dense)
    md = markdown(rows, dense, summary, meta)
    print("\n" + md, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, dense=dense, rows=rows, summary=summary), f, indent=1)
    return 0


def bench_case(torch, cubist, gemm, dg, case, row, median_of_rounds, dg_skip=None):
    """Checks and times one Case into row (DeepGEMM's side left out with dg_skip's
    reason)."""
    kw = case.ours_kwargs()
    a, b = case.a, case.b
    try:
        gemm.check(a, b, case.offsets, case.out, **kw)
    except cubist.NotFoundError as exc:
        if case.fmt != "fp8-block" or case.k % 128 == 0:
            raise
        # A family that refuses a partial last 128-block: the same product on K zero-padded
        # to a multiple of 128 (the scales already cover ceil(K/128) blocks).
        kp = align(case.k, 128)
        a = torch.zeros(case.t, kp, device=DEV, dtype=torch.uint8)
        a[:, :case.k] = case.a.view(torch.uint8)
        b = torch.zeros(case.e, case.n, kp, device=DEV, dtype=torch.uint8)
        b[:, :, :case.k] = case.b.view(torch.uint8)
        a, b = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)
        gemm.check(a, b, case.offsets, case.out, **kw)
        row["ours_note"] = f"K zero-padded to {kp}: {str(exc).splitlines()[0]}"
        row["k_ours"] = kp
    wf = af = case.fmt
    chosen = gemm.kernel_for(weights=wf, activations=af, activation="identity",
                             experts=case.e, tokens=case.t, n=case.n, k=row.get("k_ours", case.k))
    row["our_kernel"] = chosen["kernel"].removeprefix("moe_gemm_")
    row["our_kernel_from_tuning"] = chosen.get("from_tuning")
    ours = lambda: gemm.run(a, b, case.offsets, case.out, **kw)
    ours()
    sync(torch)
    fns = {"ours": ours}
    if dg_skip and case.lay is not None:
        row["deepgemm_error"] = dg_skip
    elif dg is not None and case.lay is not None:
        try:
            case.prepare_scales(dg)
            configs, diffs, same, rel = [], [], True, 0.0
            want = case.out.float()
            for variant, fn in case.deepgemm_fns(dg).items():
                case.d.zero_()
                configs.append(capture_stdout(lambda: (fn(), sync(torch))))
                got = case.deepgemm_rows()
                diffs.append((got.float() - want).abs().max().item())
                same = same and bool(torch.equal(got, case.out))
                rel = max(rel, ((got.float() - want).norm() / want.norm().clamp(min=1e-30))
                          .item())
                fns["deepgemm " + variant if variant else "deepgemm"] = fn
            row.update(deepgemm_config="\n".join(c for c in configs if c),
                       max_abs_diff=max(diffs), identical=same, rel_l2=rel)
        except Exception as exc:  # this shape only; the others still run
            row["deepgemm_error"] = f"{type(exc).__name__}: {exc}"
            fns = {"ours": ours}
    us = median_of_rounds(fns)
    row["ours_us"] = us.pop("ours")
    row["ours_tflops"] = tflops(case.flops, row["ours_us"])
    if us:
        best = min(us, key=us.get)
        row["deepgemm_us"] = us[best]
        row["deepgemm_variant"] = best.removeprefix("deepgemm").strip()
        if len(us) > 1:
            row["deepgemm_variants_us"] = us
        row["deepgemm_tflops"] = tflops(case.flops, us[best])
        row["ratio"] = us[best] / row["ours_us"]
    print(f"{row['shape']:14s} {row['format']:9s} ours {row['ours_us']:8.1f} us "
          f"{row['ours_tflops']:5.0f} TFLOP/s [{row['our_kernel']}"
          f"{', ' + row['ours_note'] if row.get('ours_note') else ''}]  DeepGEMM "
          + (f"{row['deepgemm_us']:8.1f} us {row['deepgemm_tflops']:5.0f} TFLOP/s  ratio "
             f"{row['ratio']:.3f}  max|diff| {row['max_abs_diff']:.3g}"
             f"{' (bit-identical)' if row['identical'] else ''}"
             if "deepgemm_us" in row else row.get("deepgemm_error", "-")), flush=True)
    if row.get("deepgemm_config"):
        print("    DeepGEMM config: " + row["deepgemm_config"].replace("\n", "\n    "),
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", help="our kernels (scripts/build-artifacts ART: "
                    "ART/manifest.json)")
    ap.add_argument("--deepgemm-src", help="DeepGEMM source tarball to unpack and build")
    ap.add_argument("--build-dir", help="where --deepgemm-src unpacks (DIR/DeepGEMM) and "
                    "builds; its logs and JIT cache go here too")
    ap.add_argument("--deepgemm", help="a built DeepGEMM tree to import (default: "
                    "BUILD_DIR/DeepGEMM, else an installed deep_gemm)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--per-tensor-shapes", default="mixtral",
                    help="shapes that also time our fp8 per-tensor pair ('' for none)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="time under CUDA-graph replay")
    ap.add_argument("--masked-max-m", type=int, default=128,
                    help="rows per expert of DeepGEMM's masked buffer")
    ap.add_argument("--tuning-file", default="none",
                    help="our tuning file ('none': the cost model's choice)")
    ap.add_argument("--warm-jobs", type=int, default=len(SHAPES),
                    help="parallel processes compiling DeepGEMM's kernels (0: none)")
    ap.add_argument("--warm-timeout", type=int, default=180,
                    help="seconds one warm-up process may take")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--list", "--dry-run", dest="list", action="store_true",
                    help="print the plan (and check --deepgemm-src) without a GPU")
    ap.add_argument("--self-test", action="store_true", help="CPU checks of the table logic")
    ap.add_argument("--build-only", action="store_true",
                    help="unpack and build DeepGEMM, then stop")
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    args.shape_list = [s for s in args.shapes.split(",") if s]
    args.format_list = [f for f in args.formats.split(",") if f]
    per_tensor = [s for s in args.per_tensor_shapes.split(",") if s]
    for name in args.shape_list + per_tensor:
        if name not in SHAPES:
            ap.error(f"--shapes: unknown shape {name!r} (known: {', '.join(SHAPES)})")
    for fmt in args.format_list:
        if fmt not in FORMATS:
            ap.error(f"--formats: {fmt!r} is not one of {', '.join(FORMATS)}")
    args.rows = plan(args.shape_list, args.format_list,
                     [s for s in per_tensor if s in args.shape_list])
    if args.list:
        return list_plan(args)
    if (args.deepgemm_src or args.build_only) and not args.build_dir:
        ap.error("--deepgemm-src and --build-only need --build-dir")
    if args.build_dir and not args.deepgemm:
        args.deepgemm = os.path.join(args.build_dir, "DeepGEMM")
    if args.warm_only:
        return warm_only(args)
    if not args.manifest and not args.build_only:
        ap.error("--manifest is required (scripts/build-artifacts ART makes ART/manifest.json)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
