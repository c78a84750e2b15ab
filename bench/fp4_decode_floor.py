#!/usr/bin/env python3
"""FP4 decode kernels against one read of their bytes, in one process (H200).

    python3 bench/fp4_decode_floor.py ART/manifest.json [OTHER/manifest.json ...]

For each shape and each 8-token SwiGLU kernel (mxfp4 x bf16, mxfp4 x mxfp8, nvfp4 x
nvfp4), the kernel pinned from every manifest given (an A/B when there are several) on the
same operands, and a sum over a buffer of the weight + scale bytes - the floor a decode
step cannot beat (a copy moves the bytes twice and is not it). L2 flushed before every
timing (a 256 MiB write), medians of --reps; the read's time is the lower of two medians,
one before and one after the kernels. Prints time, floor and ratio per kernel and manifest.
Needs torch with CUDA and the cubist package.
"""
import argparse
import os
import sys

SHAPES = {  # name: (experts, tokens per expert, N, K)
    "gptoss-decode": (128, 8, 5760, 2880), "qwen3-decode": (128, 8, 1536, 2048),
    "dsv3-decode": (256, 8, 4096, 7168),
    # one token routed to k experts: the layer's first GEMM at T = 1
    "qwen3-T1": (8, 1, 1536, 2048), "gptoss-T1": (4, 1, 5760, 2880),
}
KERNELS = ["moe_gemm_tma_mxfp4_bf16_swiglu_m8n128k256",
           "moe_gemm_tma_mxfp4_mxfp8_swiglu_m8n128k256",
           "moe_gemm_tma_nvfp4_nvfp4_swiglu_m8n128k256"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifests", nargs="+", help="manifest.json of a built family (A/B if several)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {','.join(SHAPES)}")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    for s in args.shapes.split(","):
        if s not in SHAPES:
            sys.exit(f"fp4_decode_floor: unknown shape {s!r}; choose from {','.join(SHAPES)}")
    import json
    import torch
    import cubist
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # under PYTHONSAFEPATH too
    from _operands import flushed_us, timing_operand
    rts = [cubist.Runtime(m) for m in args.manifests]
    specs = {k["name"]: k for k in json.load(open(args.manifests[0]))["kernels"]}
    missing = [k for k in KERNELS if k not in specs]
    if missing:
        sys.exit(f"fp4_decode_floor: {args.manifests[0]} lacks {', '.join(missing)}; "
                 "build the FP4 pairs (scripts/build-artifacts ART --formats mxfp4,nvfp4)")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def median_us(fn):
        ts = sorted(flushed_us(torch, flush, fn) for _ in range(args.reps))
        return ts[len(ts) // 2]

    tags = [os.path.basename(os.path.dirname(os.path.abspath(m))) for m in args.manifests]
    print("shape kernel read_MB read_us read_TB/s " +
          " ".join(f"{t}_us {t}_ratio" for t in tags))
    for shape in args.shapes.split(","):
        e, tpe, n, k = SHAPES[shape]
        for name in KERNELS:
            spec = specs[name]
            wf, af = spec["weight_format"], spec["activation_format"]
            a, a_s, a_g = timing_operand(torch, af, e * tpe, k)
            w, w_s, w_g = timing_operand(torch, wf, n, k, e)
            offs = torch.arange(0, e * tpe + 1, tpe, dtype=torch.int32, device="cuda")
            out = torch.empty(e * tpe, n // 2, dtype=torch.bfloat16, device="cuda")
            kw = dict(weights=wf, activations=af, activation="swiglu", a_scale=a_s,
                      a_global_scale=a_g, b_scale=w_s, b_global_scale=w_g)
            nbytes = w.numel() * w.element_size() + w_s.numel() * w_s.element_size()
            buf = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
            gemms = [cubist.MoeGemm(rt, pinned_kernel=name) for rt in rts]
            for g in gemms:
                g.check(a, w, offs, out, **kw)
            runs = [(lambda g=g: g.run(a, w, offs, out, **kw)) for g in gemms]
            for r in runs:
                r(); r()
            read = median_us(lambda: buf.sum())
            times = [median_us(r) for r in runs]
            read = min(read, median_us(lambda: buf.sum()))
            print(f"{shape} {name[13:]} {nbytes / 1e6:.0f} {read:.1f} {nbytes / read / 1e6:.2f} " +
                  " ".join(f"{t:.1f} {t / read:.2f}" for t in times), flush=True)
            del buf


if __name__ == "__main__":
    main()
