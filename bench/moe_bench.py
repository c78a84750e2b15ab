#!/usr/bin/env python3
"""Our moe_gemm kernels against torch's grouped GEMMs, side by side in one process.

  python3 bench/moe_bench.py --manifest DIR/manifest.json --shim build/bench/libcubist_moe_shim.so
         [--shapes qwen3,...] [--pairs bf16xbf16,...] [--acts identity,swiglu]
         [--csv FILE] [--plot FILE.png] [--rep MS]

Ours run through the engine API (Runtime + MoeGemm::Run, via bench/moe_shim.cc) on torch's
tensors and torch's current stream: every kernel that can solve the problem pinned in
turn ("tuned best" = the fastest), and the dispatcher's own untuned choice (the cost
model alone). Baselines, in the same process on the same inputs:
  bf16 x bf16  torch._grouped_mm (+ torch's SwiGLU for the swiglu rows, which is what an
               engine without us runs)
  fp8 x fp8    torch._scaled_grouped_mm with row-wise scales
  dense peaks  torch.mm (bf16) and torch._scaled_mm (fp8) on 8192^3
  memory floor a device-to-device copy of the weight (+ scale) bytes, for FP4 decode
Every time is the median of triton.testing.do_bench, which flushes the L2 cache (a 256 MB
write) before each timed call. Each of our runs is checked against the baseline's output
(relative L2 error) so that no fast garbage is reported.
"""
import argparse
import csv
import ctypes
import math
import sys

import torch
import triton.testing

DEV = "cuda"
SHAPES = {  # name: experts, tokens per expert (None: skewed routing), N, K
    "qwen3": (128, 64, 1536, 2048),
    "gptoss": (128, 128, 5760, 2880),
    "dsv3": (256, 128, 4096, 7168),
    "mixtral": (8, 2048, 28672, 4096),
    "decode": (128, 8, 5760, 2880),
    "skewed": (128, None, 5760, 2880),  # Zipf-like, some experts empty, T as gptoss
    "qwen3-decode": (128, 8, 1536, 2048),
    "dsv3-decode": (256, 8, 4096, 7168),
}
DEFAULT_SHAPES = ["qwen3", "gptoss", "dsv3", "mixtral", "decode", "skewed"]
PAIRS = {"bf16xbf16": ("bf16", "bf16"), "fp8xfp8": ("fp8", "fp8"),
         "fp8-blockxfp8-block": ("fp8-block", "fp8-block"),
         "mxfp4xbf16": ("mxfp4", "bf16"), "mxfp4xmxfp8": ("mxfp4", "mxfp8"),
         "nvfp4xnvfp4": ("nvfp4", "nvfp4")}


def counts_for(e, tpe, seed=7):
    if tpe is not None:
        return [tpe] * e
    # Zipf(1.2) over a random permutation of the experts, the last eighth empty, the same
    # total as gpt-oss-120b prefill (128 tokens per expert).
    total = e * 128
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(e, generator=g).tolist()
    live = e - e // 8
    w = [1.0 / (r + 1) ** 1.2 for r in range(live)]
    s = sum(w)
    c = [int(total * x / s) for x in w]
    c[0] += total - sum(c)
    out = [0] * e
    for r, cnt in enumerate(c):
        out[order[r]] = cnt
    return out


class Shim:
    def __init__(self, path, manifest):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.cubist_shim_open.restype = ctypes.c_void_p
        L.cubist_shim_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        L.cubist_shim_error.restype = ctypes.c_char_p
        L.cubist_shim_candidates.argtypes = [ctypes.c_void_p] + [ctypes.c_char_p] * 3 + \
            [ctypes.c_int64] * 4 + [ctypes.c_char_p, ctypes.c_int]
        L.cubist_shim_run.argtypes = [ctypes.c_void_p] + [ctypes.c_char_p] * 4 + \
            [ctypes.c_int64] * 4 + [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p]
        torch.cuda.init()
        torch.empty(1, device=DEV)  # the primary context, current on this thread
        self.h = L.cubist_shim_open(manifest.encode(), None)
        if not self.h:
            raise RuntimeError("cubist_shim_open: " + L.cubist_shim_error().decode())

    def candidates(self, wf, af, act, e, t, n, k):
        buf = ctypes.create_string_buffer(1 << 16)
        r = self.lib.cubist_shim_candidates(self.h, wf.encode(), af.encode(), act.encode(),
                                            e, t, n, k, buf, len(buf))
        if r < 0:
            raise RuntimeError(self.lib.cubist_shim_error().decode())
        return [x for x in buf.value.decode().split("\n") if x]

    def runner(self, pinned, wf, af, act, e, t, n, k, ptrs):
        arr = (ctypes.c_uint64 * 11)(*ptrs)
        args = (self.h, pinned.encode(), wf.encode(), af.encode(), act.encode(), e, t, n, k, arr)
        run = self.lib.cubist_shim_run
        err = self.lib.cubist_shim_error

        def fn():
            if run(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)) != 0:
                raise RuntimeError(f"run {pinned or '(untuned)'}: {err().decode()}")
        return fn


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class Problem:
    """Random operands of one shape and format pair, and their bf16 dequantisation."""

    def __init__(self, shape, wf, af):
        e, tpe, n, k = SHAPES[shape]
        self.counts = counts_for(e, tpe)
        self.e, self.n, self.k = e, n, k
        self.t = sum(self.counts)
        self.wf, self.af = wf, af
        self.offsets = torch.tensor([0] + list(torch.tensor(self.counts).cumsum(0).tolist()),
                                    device=DEV, dtype=torch.int32)
        g = torch.Generator(device=DEV).manual_seed(1234)
        self.a, self.a_scale, self.a_gs = self._operand(af, (self.t, k), g)
        self.b, self.b_scale, self.b_gs = self._operand(wf, (e, n, k), g)
        self.out = torch.empty((self.t, n), device=DEV, dtype=torch.bfloat16)

    @staticmethod
    def _operand(fmt, shape, g):
        *lead, rows, k = shape
        if fmt == "bf16":
            return (torch.randn(shape, device=DEV, generator=g) * 0.5).to(torch.bfloat16), None, None
        if fmt in ("fp8", "fp8-block", "mxfp8"):
            x = (torch.randn(shape, device=DEV, generator=g) * 2).to(torch.float8_e4m3fn)
            if fmt == "fp8":
                return x, None, torch.rand(lead or [1], device=DEV, generator=g) * 0.1 + 0.05
            if fmt == "fp8-block":
                br = 128 if lead else 1
                s = torch.rand((*lead, (rows + br - 1) // br, (k + 127) // 128), device=DEV,
                               generator=g) * 0.1 + 0.05
                return x, s, None
            return x, torch.randint(118, 124, (*lead, rows, k // 32), device=DEV,
                                    dtype=torch.uint8, generator=g), None
        x = torch.randint(0, 256, (*lead, rows, k // 2), device=DEV, dtype=torch.uint8, generator=g)
        if fmt == "mxfp4":
            return x, torch.randint(118, 124, (*lead, rows, k // 32), device=DEV,
                                    dtype=torch.uint8, generator=g), None
        s = (torch.rand((*lead, rows, k // 16), device=DEV, generator=g) + 0.5).to(torch.float8_e4m3fn)
        return x, s, torch.rand(lead or [1], device=DEV, generator=g) * 0.1 + 0.05

    def ptrs(self, out=None):
        p = lambda x: 0 if x is None else x.data_ptr()
        return [p(self.a), p(self.b), p(self.a_scale), p(self.b_scale), p(self.a_gs),
                p(self.b_gs), p(self.offsets), 0, 0, 0, p(self.out if out is None else out)]

    def weight_bytes(self):
        b = self.b.numel() * self.b.element_size()
        return b + (0 if self.b_scale is None else self.b_scale.numel() * self.b_scale.element_size())


def median_us(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=ARGS.rep, return_mode="median") * 1e3


def torch_swiglu(c):
    n = c.shape[-1] // 2
    return torch.nn.functional.silu(c[:, n:].float()).mul(c[:, :n].float()).to(torch.bfloat16)


def baseline(pb, act):
    """(name, fn producing out) for the pair, or None."""
    offs = pb.offsets[1:]
    if pb.wf == "bf16":
        bt = pb.b.transpose(-2, -1)
        if act == "swiglu":
            return "torch._grouped_mm + torch SwiGLU", lambda: torch_swiglu(
                torch._grouped_mm(pb.a, bt, offs=offs))
        return "torch._grouped_mm", lambda: torch._grouped_mm(pb.a, bt, offs=offs)
    if pb.wf == "fp8":
        sa = torch.full((pb.t,), float(pb.a_gs[0]), device=DEV)
        sb = pb.b_gs[:, None].expand(pb.e, pb.n).contiguous()
        bt = pb.b.transpose(-2, -1)
        f = lambda: torch._scaled_grouped_mm(pb.a, bt, sa, sb, offs=offs, out_dtype=torch.bfloat16)
        if act == "swiglu":
            return "torch._scaled_grouped_mm + torch SwiGLU", lambda: torch_swiglu(f())
        return "torch._scaled_grouped_mm", f
    return None


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def dense_peaks():
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    flops = 2 * 8192 ** 3
    bf = flops / median_us(lambda: torch.mm(a, b)) * 1e-6
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=DEV)
    f8 = flops / median_us(lambda: torch._scaled_mm(a8, b8.t(), one, one,
                                                     out_dtype=torch.bfloat16)) * 1e-6
    return bf, f8


def copy_floor_us(nbytes):
    src = torch.empty(nbytes, device=DEV, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return median_us(lambda: dst.copy_(src))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--pairs", default="bf16xbf16,fp8xfp8,fp8-blockxfp8-block")
    ap.add_argument("--acts", default="identity,swiglu")
    ap.add_argument("--csv")
    ap.add_argument("--rep", type=int, default=100, help="do_bench milliseconds per timing")
    ARGS = ap.parse_args()
    shim = Shim(ARGS.shim, ARGS.manifest)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    bf_peak, f8_peak = dense_peaks()
    print(f"dense peaks (8192^3): torch.mm bf16 {bf_peak:.0f} TFLOP/s, "
          f"torch._scaled_mm fp8 {f8_peak:.0f} TFLOP/s", flush=True)
    rows = []
    hdr = ("| shape | pair | act | baseline | base us | tuned best (ours) | best us | untuned "
           "choice | untuned us | best/base | untuned/best | TFLOP/s | floor us | err |")
    print(hdr)
    print("|" + " --- |" * (hdr.count("|") - 1))
    for shape in ARGS.shapes.split(","):
        for pair in ARGS.pairs.split(","):
            wf, af = PAIRS[pair]
            try:
                pb = Problem(shape, wf, af)
            except Exception as exc:  # out of memory or an unsupported format in torch
                print(f"| {shape} | {pair} | - | setup failed: {exc} |", flush=True)
                continue
            floor = copy_floor_us(pb.weight_bytes()) if wf in ("mxfp4", "nvfp4") else None
            for act in ARGS.acts.split(","):
                flops = 2.0 * pb.t * pb.n * pb.k
                base = baseline(pb, act)
                base_us, ref = None, None
                if base is not None:
                    try:
                        base_us = median_us(base[1])
                        ref = base[1]()
                    except Exception as exc:  # a baseline torch lacks: report, go on
                        print(f"baseline {base[0]} failed: {type(exc).__name__}: {exc}",
                              flush=True)
                        base = None
                try:
                    cands = shim.candidates(wf, af, act, pb.e, pb.t, pb.n, pb.k)
                except RuntimeError as exc:
                    print(f"| {shape} | {pair} | {act} | no kernel: {exc} |", flush=True)
                    continue
                times = {}
                err = None
                for name in cands:
                    fn = shim.runner(name, wf, af, act, pb.e, pb.t, pb.n, pb.k, pb.ptrs())
                    times[name] = median_us(fn)
                best = min(times, key=times.get)
                untuned = cands[0]
                untuned_fn = shim.runner("", wf, af, act, pb.e, pb.t, pb.n, pb.k, pb.ptrs())
                untuned_us = median_us(untuned_fn)
                out_cols = pb.n // 2 if act == "swiglu" else pb.n
                if ref is not None:
                    pb.out.fill_(float("nan"))
                    shim.runner(best, wf, af, act, pb.e, pb.t, pb.n, pb.k, pb.ptrs())()
                    torch.cuda.synchronize()
                    ours = pb.out.view(-1)[: pb.t * out_cols].view(pb.t, out_cols)
                    err = rel_err(ours, ref)
                r = dict(shape=shape, pair=pair, act=act, baseline=base[0] if base else "",
                         base_us=base_us, best=best, best_us=times[best], untuned=untuned,
                         untuned_us=untuned_us, tflops=flops / times[best] * 1e-6,
                         floor_us=floor, err=err, bf16_peak=bf_peak, fp8_peak=f8_peak,
                         candidates=";".join(f"{k}={v:.1f}" for k, v in times.items()))
                rows.append(r)
                fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
                print(f"| {shape} | {pair} | {act} | {r['baseline'] or '-'} | {fmt(base_us)} | "
                      f"{best} | {times[best]:.1f} | {untuned} | {untuned_us:.1f} | "
                      f"{fmt(base_us / times[best] if base_us else None, '{:.2f}')} | "
                      f"{untuned_us / times[best]:.2f} | {r['tflops']:.0f} | {fmt(floor)} | "
                      f"{fmt(err, '{:.1e}')} |", flush=True)
            del pb
            torch.cuda.empty_cache()
    if ARGS.csv and rows:
        with open(ARGS.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    # Geomeans of ours (tuned best) over the baseline, per pair and activation.
    for pair in ARGS.pairs.split(","):
        for act in ARGS.acts.split(","):
            rs = [r["base_us"] / r["best_us"] for r in rows
                  if r["pair"] == pair and r["act"] == act and r["base_us"]]
            if rs:
                gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
                print(f"geomean {pair} {act}: {gm:.3f}x of the baseline (min {min(rs):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
