#!/usr/bin/env python3
"""Runs one moe_gemm (ours, pinned, or torch's baseline) a few times, for a profiler.

  ncu --kernel-name regex:moe_gemm --launch-skip 2 --launch-count 1 \\
      python3 bench/moe_profile.py --manifest DIR/manifest.json --shim libcubist_moe_shim.so \\
      --shape mixtral --pair bf16xbf16 --act identity --kernel moe_gemm_tma_..._m128n256k64

`--kernel torch` runs the pair's torch baseline instead (bench/moe_bench.py's); without a
profiler it prints the median time of each, so the same command is also a quick A/B.
The operands and the shim are bench/moe_bench.py's.
"""
import argparse
import sys

import torch

sys.path.insert(0, __import__("os").path.dirname(__file__))
import moe_bench as mb  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--shape", default="mixtral")
    ap.add_argument("--pair", default="bf16xbf16")
    ap.add_argument("--act", default="identity")
    ap.add_argument("--kernel", action="append", required=True,
                    help="a kernel name, 'untuned' or 'torch'; repeatable. NAME@MANIFEST runs "
                         "the kernel of another manifest (A/B of two builds in one process)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rep", type=int, default=0, help="also time with do_bench (ms)")
    args = ap.parse_args()
    mb.ARGS = argparse.Namespace(rep=args.rep or 100)
    wf, af = mb.PAIRS[args.pair]
    pb = mb.Problem(args.shape, wf, af)
    shims = {}

    def shim_for(manifest):
        if manifest not in shims:
            shims[manifest] = mb.Shim(args.shim, manifest)
        return shims[manifest]

    for name in args.kernel:
        if name == "torch":
            base = mb.baseline(pb, args.act)
            if base is None:
                raise SystemExit(f"no torch baseline for {args.pair}")
            fn = base[1]
        else:
            kernel, _, manifest = name.partition("@")
            fn = shim_for(manifest or args.manifest).runner(
                "" if kernel == "untuned" else kernel, wf, af, args.act, pb.e, pb.t, pb.n, pb.k,
                pb.ptrs())
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        if args.rep:
            us = mb.median_us(fn)
            flops = 2.0 * pb.t * pb.n * pb.k
            print(f"{args.shape} {args.pair} {args.act} {name}: {us:.1f} us, "
                  f"{flops / us * 1e-6:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
