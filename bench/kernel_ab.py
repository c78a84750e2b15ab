#!/usr/bin/env python3
"""Two builds of the kernel family, kernel by kernel, in one process (an A/B).

    python3 bench/kernel_ab.py BEFORE/manifest.json AFTER/manifest.json \\
        [--shape E,TOKENS_PER_EXPERT,N,K] [--activations identity,swiglu] \\
        [--kernels SUBSTRING] [--reps 9] [--bits] [--list]

For every bf16-output GEMM kernel both manifests list (with one of --activations, and
SUBSTRING in its name; the e4m3-output twins are the layer's and are left out), the
kernel of each build pinned on the same operands, the two run interleaved, the L2 flushed
(a 256 MiB write) before every timing; medians of --reps. Prints each
kernel's time in both builds and after / before. --bits also runs both on random block
scales and says whether their outputs are bit-identical, which a change that keeps the
arithmetic must show. The shape is E experts of TOKENS_PER_EXPERT rows each, N weight rows,
K deep; without --shape, gpt-oss-120b's decode step (128, 8, 5760, 2880) for tiles of fewer
than 64 rows and (32, 512, 4096, 2048) for the others. Needs torch with CUDA and the cubist
package (scripts/build-wheel).
"""
import argparse
import json
import os
import sys

GATED = ("swiglu", "geglu", "situ")


def parse_shape(text):
    """'E,T,N,K' -> four positive ints, or None."""
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def compared_kernels(before, after, acts, substring):
    """The after manifest's kernels to time: bf16-output moe_gemm kernels that the before
    manifest lists too, with an activation in acts and substring in the name. (The
    e4m3-output twins are the layer's; MoeGemm writes bf16, and their bf16 twin is timed.)"""
    with open(before) as f:
        names_b = {k["name"] for k in json.load(f)["kernels"]}
    with open(after) as f:
        kernels = json.load(f)["kernels"]
    return [k for k in kernels
            if k.get("op") == "moe_gemm" and k["name"] in names_b
            and k.get("activation") in acts and substring in k["name"]
            and k.get("output_format", "bf16") == "bf16"]


def random_scales(torch, s):
    """Block scales like s with random values in range (None stays None)."""
    if s is None:
        return None
    if s.dtype == torch.float32:
        return torch.rand_like(s) * 0.02 + 1e-3
    if s.dtype == torch.uint8:  # ue8m0
        return torch.randint(115, 131, s.shape, dtype=torch.uint8, device=s.device)
    return (torch.rand(s.shape, device=s.device) + 0.5).to(s.dtype)  # e4m3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="manifest.json of the first build")
    ap.add_argument("after", help="manifest.json of the second build")
    ap.add_argument("--shape", help="E,TOKENS_PER_EXPERT,N,K (default: by tile, see above)")
    ap.add_argument("--activations", default="identity,swiglu")
    ap.add_argument("--kernels", default="", help="only kernels whose name holds this")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--bits", action="store_true", help="compare outputs on random scales")
    ap.add_argument("--list", action="store_true",
                    help="print the kernels it would compare and exit (no GPU needed)")
    args = ap.parse_args()
    shape = None
    if args.shape is not None:
        shape = parse_shape(args.shape)
        if shape is None:
            sys.exit(f"kernel_ab: --shape {args.shape!r} is not four positive integers "
                     "E,TOKENS_PER_EXPERT,N,K (e.g. 8,2048,28672,4096)")
    if args.reps < 1:
        sys.exit(f"kernel_ab: --reps {args.reps} must be at least 1")
    kernels = compared_kernels(args.before, args.after, args.activations.split(","),
                               args.kernels)
    if not kernels:
        sys.exit("kernel_ab: no GEMM kernel is in both manifests with those activations "
                 f"({args.activations}) and names ({args.kernels!r})")
    if args.list:
        for k in kernels:
            print(k["name"])
        print(f"{len(kernels)} kernels")
        return
    import torch
    import cubist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # under PYTHONSAFEPATH too
    from _operands import flushed_us, timing_operand

    rt_b, rt_a = cubist.Runtime(args.before), cubist.Runtime(args.after)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    worst, count = 0.0, 0
    made, ops = None, None  # the operands of the last (formats, shape), shared by its kernels
    for k in kernels:
        wf, af, act = k["weight_format"], k["activation_format"], k["activation"]
        e, tpe, n, kk = shape or ((128, 8, 5760, 2880) if k["tile_m"] < 64
                                  else (32, 512, 4096, 2048))
        t = e * tpe
        if made != (wf, af, e, tpe, n, kk):
            # The last operands freed before the next are made: every name holding them.
            ops = a = a_s = a_g = w = w_s = w_g = None
            ops = (timing_operand(torch, af, t, kk), timing_operand(torch, wf, n, kk, e))
            made = (wf, af, e, tpe, n, kk)
        (a, a_s, a_g), (w, w_s, w_g) = ops
        offs = torch.arange(0, t + 1, tpe, dtype=torch.int32, device="cuda")
        cols = n // 2 if act in GATED else n
        out = torch.empty(t, cols, dtype=torch.bfloat16, device="cuda")
        kw = dict(weights=wf, activations=af, activation=act, a_scale=a_s, a_global_scale=a_g,
                  b_scale=w_s, b_global_scale=w_g)
        g_b = cubist.MoeGemm(rt_b, pinned_kernel=k["name"])
        g_a = cubist.MoeGemm(rt_a, pinned_kernel=k["name"])
        g_b.check(a, w, offs, out, **kw)
        g_a.check(a, w, offs, out, **kw)
        if args.bits:
            kr = dict(kw, a_scale=random_scales(torch, a_s), b_scale=random_scales(torch, w_s))
            o_b, o_a = torch.zeros_like(out), torch.ones_like(out)
            g_b.run(a, w, offs, o_b, **kr)
            g_a.run(a, w, offs, o_a, **kr)
            torch.cuda.synchronize()
            same = torch.equal(o_b, o_a)
            diff = "" if same else f" (max |diff| {(o_b.float() - o_a.float()).abs().max().item():g})"
            print(f"{k['name']:56s} bits {'identical' if same else 'DIFFER'}{diff}", flush=True)
        run_b = lambda: g_b.run(a, w, offs, out, **kw)
        run_a = lambda: g_a.run(a, w, offs, out, **kw)
        for _ in range(3):
            run_b(); run_a()
        tb, ta = [], []
        for _ in range(args.reps):
            tb.append(flushed_us(torch, flush, run_b))
            ta.append(flushed_us(torch, flush, run_a))
        tb.sort(); ta.sort()
        mb, ma = tb[len(tb) // 2], ta[len(ta) // 2]
        worst, count = max(worst, ma / mb), count + 1
        print(f"{k['name']:56s} before {mb:9.1f} us  after {ma:9.1f} us  after/before "
              f"{ma / mb:.3f}  ({e}, {tpe}, {n}, {kk})", flush=True)
    print(f"{count} kernels; largest after/before {worst:.3f}")


if __name__ == "__main__":
    main()
