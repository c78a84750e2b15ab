#!/usr/bin/env python3
"""Baselines for the moe_gemm kernels on the five MoE shapes of docs/kernels.md.

BF16 x BF16: torch._grouped_mm. Every other pair: dequantize A and B to bf16 with plain
torch ops, then torch._grouped_mm, timed together (what an engine without these
kernels does). Median of triton.testing.do_bench. Prints a markdown table; --csv FILE
writes every number. Needs a GPU, torch >= 2.9 and triton.

  python3 bench/moe_baselines.py [--shapes qwen3,gptoss,...] [--pairs bf16xbf16,...]
"""
import argparse
import csv
import sys

import torch
import triton.testing

SHAPES = [  # name, experts, tokens per expert, N, K
    ("qwen3", 128, 64, 1536, 2048),
    ("gptoss", 128, 128, 5760, 2880),
    ("dsv3", 256, 128, 4096, 7168),
    ("mixtral", 8, 2048, 28672, 4096),
    ("decode", 128, 8, 5760, 2880),
]
PAIRS = {  # name: (weights, activations)
    "bf16xbf16": ("bf16", "bf16"), "fp8xfp8": ("fp8", "fp8"),
    "fp8-blockxfp8-block": ("fp8-block", "fp8-block"), "mxfp4xbf16": ("mxfp4", "bf16"),
    "mxfp4xmxfp8": ("mxfp4", "mxfp8"), "nvfp4xnvfp4": ("nvfp4", "nvfp4"),
}
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
DEV = "cuda"


def bits(fmt):
    return {"bf16": 16, "fp8": 8, "fp8-block": 8, "mxfp8": 8, "mxfp4": 4, "nvfp4": 4}[fmt]


def scale_bytes(fmt, rows, k, experts=1, weights=False):
    if fmt in ("mxfp4", "mxfp8"):
        return rows * (k // 32)
    if fmt == "nvfp4":
        return rows * (k // 16)
    if fmt == "fp8-block":
        kb = (k + 127) // 128
        return (experts * ((rows // experts + 127) // 128) * kb * 4) if weights else rows * kb * 4
    return 0


class Operand:
    """A quantized [..., rows, K] tensor and a function that dequantizes it to bf16."""

    def __init__(self, fmt, shape, block_rows):
        *lead, rows, k = shape
        self.fmt = fmt
        g = torch.Generator(device=DEV).manual_seed(len(shape) * 7 + rows)
        if fmt == "bf16":
            self.data = torch.randn(shape, device=DEV, dtype=torch.bfloat16, generator=g)
        elif fmt in ("fp8", "fp8-block", "mxfp8"):
            self.data = (torch.randn(shape, device=DEV, dtype=torch.bfloat16, generator=g) * 4
                         ).to(torch.float8_e4m3fn)
        else:
            self.data = torch.randint(0, 256, (*lead, rows, k // 2), device=DEV,
                                      dtype=torch.uint8, generator=g)
        if fmt == "fp8":
            self.scale = torch.rand(lead or [1], device=DEV, generator=g) + 0.5
        elif fmt == "fp8-block":
            self.scale = torch.rand((*lead, (rows + block_rows - 1) // block_rows,
                                     (k + 127) // 128), device=DEV, generator=g) + 0.5
            self.block_rows = block_rows
        elif fmt in ("mxfp4", "mxfp8"):
            self.scale = torch.randint(120, 128, (*lead, rows, k // 32), device=DEV,
                                       dtype=torch.uint8, generator=g)
        elif fmt == "nvfp4":
            self.scale = (torch.rand((*lead, rows, k // 16), device=DEV, generator=g) + 0.5
                          ).to(torch.float8_e4m3fn)
            self.global_scale = torch.rand(lead or [1], device=DEV, generator=g) + 0.5
        self.k = k
        self.lut = torch.tensor(E2M1, device=DEV, dtype=torch.bfloat16)

    def dequant(self):
        f = self.fmt
        if f == "bf16":
            return self.data
        if f == "fp8":
            s = self.scale.view(-1, *([1] * (self.data.dim() - 1))) if self.data.dim() == 3 \
                else self.scale
            return (self.data.to(torch.bfloat16) * s.to(torch.bfloat16))
        if f == "fp8-block":
            s = self.scale.repeat_interleave(self.block_rows, dim=-2)[..., :self.data.shape[-2], :]
            s = s.repeat_interleave(128, dim=-1)[..., :self.k]
            return self.data.to(torch.bfloat16) * s.to(torch.bfloat16)
        if f == "mxfp8":
            s = torch.exp2(self.scale.to(torch.float32) - 127).to(torch.bfloat16)
            return self.data.to(torch.bfloat16) * s.repeat_interleave(32, dim=-1)
        # fp4: two codes per byte, low nibble first
        x = torch.stack((self.lut[(self.data & 0xF).long()], self.lut[(self.data >> 4).long()]),
                        dim=-1).flatten(-2)
        if f == "mxfp4":
            s = torch.exp2(self.scale.to(torch.float32) - 127).to(torch.bfloat16)
            return x * s.repeat_interleave(32, dim=-1)
        s = self.scale.to(torch.bfloat16).repeat_interleave(16, dim=-1)
        g = self.global_scale.view(-1, *([1] * (x.dim() - 1))) if x.dim() == 3 else self.global_scale
        return x * s * g.to(torch.bfloat16)


def run(shape, pair):
    name, e, tpe, n, k = shape
    wf, af = PAIRS[pair]
    t = e * tpe
    a = Operand(af, (t, k), 1)
    b = Operand(wf, (e, n, k), 128)
    offs = torch.arange(1, e + 1, device=DEV, dtype=torch.int32) * tpe

    def fn():
        return torch._grouped_mm(a.dequant(), b.dequant().transpose(-2, -1), offs=offs)

    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    flops = 2.0 * t * n * k
    nbytes = (t * k * bits(af) / 8 + e * n * k * bits(wf) / 8 + scale_bytes(af, t, k)
              + scale_bytes(wf, e * n, k, e, True) + 2 * t * n)
    del a, b
    torch.cuda.empty_cache()
    return ms * 1e3, flops / (ms * 1e-3) / 1e12, nbytes / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes")
    ap.add_argument("--pairs")
    ap.add_argument("--csv")
    args = ap.parse_args()
    shapes = [s for s in SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    pairs = [p for p in PAIRS if not args.pairs or p in args.pairs.split(",")]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    print("| shape | pair | baseline | median us | TFLOP/s | TB/s |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    rows = []
    for s in shapes:
        for p in pairs:
            what = "_grouped_mm" if p == "bf16xbf16" else "dequant + _grouped_mm"
            try:
                us, tf, tb = run(s, p)
                print(f"| {s[0]} | {p} | {what} | {us:.1f} | {tf:.1f} | {tb:.2f} |", flush=True)
                rows.append((s[0], p, what, f"{us:.1f}", f"{tf:.1f}", f"{tb:.3f}"))
            except Exception as exc:  # report and go on with the other shapes
                print(f"| {s[0]} | {p} | {what} | error: {type(exc).__name__}: {exc} | | |",
                      flush=True)
                torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["shape", "pair", "baseline", "us", "tflops", "tbps"])
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
