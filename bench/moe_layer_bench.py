#!/usr/bin/env python3
"""The routed MoE layer on cubist's published kernels against torch's composite of the
same layer, on an H200, in one process (docs/benchmarks.md, "The MoE layer").

    python3 bench/moe_layer_bench.py --manifest DIR/manifest.json [--models qwen3,gptoss]
        [--pairs bf16,fp8,fp8-block,mxfp4,mxfp4-mxfp8,nvfp4]
        [--tokens 1,16,64,256,4096,16384] [--iters 30] [--json OUT] [--plot OUT.png]
        [--fuse-intermediate on,off] [--fuse-gather on,off] [--breakdown]
        [--shape NAME=E,K,H,I --models NAME]

For each model and batch size T (uniform random routing logits from a fixed seed; router
logits are an input, the router GEMM is the engine's):
  ours     cubist.MoeLayer: routing, sort, gather, GEMM1 + activation, GEMM2, finalize
  gemms    our two GEMMs alone on pre-permuted inputs (the layer's routing, taken once),
           with gpt-oss's per-expert biases as in the layer; the faster of GEMM2
           launched programmatically after GEMM1 and in stream order
  torch    the same layer in torch: the model's routing and activation in torch,
           torch._grouped_mm for both GEMMs, index_add finalize (examples/moe_layer.py's
           torch_layer, made model-faithful); for the fp8 pair torch._scaled_grouped_mm
           with the activations quantized in torch; for the pairs torch has no grouped
           GEMM for (fp8-block, mxfp4, mxfp8, nvfp4) the bf16 layer on the dequantized
           weights, which is what an engine without those kernels runs
  floor    one read of the weights (with their scales) of the experts the batch
           touches: a sum over a buffer of that many bytes
With --fuse-intermediate MODES (fp8 pair only; default auto) the fp8 layer is built once
per mode of MoeLayer's fuse_intermediate_quantization - "on": GEMM1's epilogue writes
GEMM2's fp8 input, "off": a separate quantize kernel - each timed, its output required
bit-identical to the first mode's; "ours" is the first mode's time and every mode's is
printed and kept in the JSON ("fuse"). --nvfp4-inputs MODES does the same for the nvfp4
pair's nvfp4_gemm_inputs (auto, packed, decoded): the same products, the same bits, and
--fuse-gather MODES for the bf16 pair's fuse_gather (auto, on: GEMM1 reads the token rows
through the row map; off: the gather kernel's copy): the same bits.
With --breakdown each row also lists the device time of every kernel of one layer call
and of the two GEMMs alone, each launched without programmatic dependent launch (so no
kernel's time includes waiting for the previous one), the L2 flushed first; medians of 5
calls, in launch order, and their sum against the graph time: where the layer's time
beyond its GEMMs goes; and the layer's graph time without PDL.
Each is timed under CUDA-graph replay (a captured step, as engines run decode) with the
L2 cache flushed before every replay; medians of --iters replays. Eager times of ours and
torch are reported too. Every layer output is checked against torch's first.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

import cubist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # under PYTHONSAFEPATH too
from _operands import timing_operand  # noqa: E402

MODELS = {
    # name: (E, k, H, I, routing, extra)
    "qwen3": dict(e=128, k=8, h=2048, i=768, routing="renormalize"),
    "gptoss": dict(e=128, k=4, h=2880, i=2880, routing="renormalize", alpha=1.702, beta=1.0,
                   limit=7.0),
    "deepseek": dict(e=256, k=8, h=7168, i=2048, routing="deepseek_v3", n_group=8,
                     topk_group=4, scale=2.5),
    "mixtral": dict(e=8, k=2, h=4096, i=14336, routing="renormalize"),
}
TITLES = {"qwen3": "Qwen3-30B-A3B", "gptoss": "gpt-oss-120b", "deepseek": "DeepSeek-V3",
          "mixtral": "Mixtral-8x7B"}
# --pairs name: (weight format, activation format)
PAIRS = {"bf16": ("bf16", "bf16"), "fp8": ("fp8", "fp8"), "fp8-block": ("fp8-block", "fp8-block"),
         "mxfp4": ("mxfp4", "bf16"), "mxfp4-mxfp8": ("mxfp4", "mxfp8"),
         "nvfp4-bf16": ("nvfp4", "bf16"), "nvfp4": ("nvfp4", "nvfp4")}
def act_scale(af, amax):
    """fp8: the dequantization scale s; nvfp4: FlashInfer's global scale g."""
    s = amax / 448.0 if af == "fp8" else 448.0 * 6.0 / amax if af == "nvfp4" else 1.0
    return torch.tensor([s], dtype=torch.float32, device="cuda")


def torch_fp8_layer(x, logits, w, m, bias, s1, s2):
    """The fp8 x fp8 layer in torch: activations quantized per tensor with the same
    scales, torch._scaled_grouped_mm (row-wise scales) for both GEMMs."""
    (w1q, _, g1), (w2q, _, g2) = w
    e = w1q.shape[0]
    _, token, weight, offs = torch_permute(x, logits, m, bias, e)
    a = (x[token].float() * (1.0 / s1)).to(torch.float8_e4m3fn)
    rows = a.shape[0]
    c = torch._scaled_grouped_mm(a, w1q.transpose(-2, -1), s1.expand(rows).contiguous(),
                                 g1[:, None].expand(e, w1q.shape[1]).contiguous(), offs=offs,
                                 out_dtype=torch.bfloat16)
    h = (torch_act(c, m).float() * (1.0 / s2)).to(torch.float8_e4m3fn)
    y = torch._scaled_grouped_mm(h, w2q.transpose(-2, -1), s2.expand(rows).contiguous(),
                                 g2[:, None].expand(e, w2q.shape[1]).contiguous(), offs=offs,
                                 out_dtype=torch.bfloat16)
    return torch_finalize(x, token, weight, y)


def torch_route(logits, m, bias):
    """The model's routing in torch (fp32): (ids [T, k] int64, weights [T, k] fp32)."""
    k = m["k"]
    x = logits.float()
    if m["routing"] == "deepseek_v3":
        s = torch.sigmoid(x)
        biased = s + bias
        t, e = x.shape
        g = m["n_group"]
        grp = biased.view(t, g, e // g).topk(2, dim=-1).values.sum(-1)
        keep = grp.topk(m["topk_group"], dim=-1).indices
        mask = torch.zeros(t, g, dtype=torch.bool, device=x.device).scatter_(1, keep, True)
        mask = mask.repeat_interleave(e // g, dim=1)
        ids = biased.masked_fill(~mask, float("-inf")).topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * m["scale"]
        return ids, w
    vals, ids = x.topk(k, dim=-1)
    return ids, torch.softmax(vals, dim=-1)  # renormalize: softmax over the chosen


def torch_act(c, m):
    inter = c.shape[1] // 2
    x0, x1 = c[:, :inter].float(), c[:, inter:].float()
    if "limit" in m:
        x1 = x1.clamp(max=m["limit"])
        x0 = x0.clamp(-m["limit"], m["limit"])
    alpha, beta = m.get("alpha", 1.0), m.get("beta", 0.0)
    return (x1 * torch.sigmoid(alpha * x1) * (x0 + beta)).to(torch.bfloat16)


def torch_permute(x, logits, m, bias, e):
    """Routing and the sort by expert in torch: (expert of each sorted row, its token,
    its routing weight, grouped-GEMM offsets [E] (cumulative ends))."""
    ids, w = torch_route(logits, m, bias)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    # counts by scatter_add: torch.bincount syncs with the host, which graphs forbid
    counts = torch.zeros(e, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    return flat[order], order // m["k"], w.flatten()[order], offs


def torch_finalize(x, token, weight, y):
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, y.float() * weight[:, None])
    return out.to(torch.bfloat16)


def torch_first_half(x, logits, w1, m, bias, b1=None):
    """Routing, GEMM1 and the activation: (expert, token, weight, offsets, intermediate)."""
    expert, token, weight, offs = torch_permute(x, logits, m, bias, w1.shape[0])
    c = torch._grouped_mm(x[token], w1.transpose(-2, -1), offs=offs)
    if b1 is not None:  # gpt-oss: per-expert biases after each GEMM
        c = (c.float() + b1[expert]).to(torch.bfloat16)
    return expert, token, weight, offs, torch_act(c, m)


def calibrate(m, w1, bias, b1):
    """The activations' amax on a calibration batch of 512 tokens, as an engine measures
    them once: (the hidden states', GEMM1's output's). Per-tensor fp8 and nvfp4 scales
    come from these (too small an amax saturates, too large wastes precision)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(512, m["h"], device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(512, m["e"], device="cuda", generator=g)
    h = torch_first_half(x, logits, w1, m, bias, b1)[4]
    return x.float().abs().max().item(), h.float().abs().max().item()


def torch_layer(x, logits, w1, w2, m, bias, b1=None, b2=None):
    expert, token, weight, offs, h = torch_first_half(x, logits, w1, m, bias, b1)
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    if b2 is not None:
        y = (y.float() + b2[expert]).to(torch.bfloat16)
    return torch_finalize(x, token, weight, y)


def timed(fn, iters, flush, graph=True, warm_s=0.2):
    """Median microseconds of fn(): under CUDA-graph replay (graph=True) or eager, the
    L2 flushed before each, after warm_s seconds of the same replays: the first tens of
    milliseconds of a call run slower (185 then 165 us for one layer measured three times
    in a row on an H100), and a row timed before its GPU settled would lose to the
    baseline timed after it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        for _ in range(8):
            flush.zero_()
            run()
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    times.sort()
    return times[len(times) // 2]


def kernel_times(fn, flush, reps=5):
    """[(kernel name, median device us)] of the kernels one fn() call launches, in launch
    order, the L2 flushed before each of `reps` profiled calls (torch.profiler's CUDA
    activity records every kernel of the context, ours launched through the driver too)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
        runs.append([(e.name, e.time_range.elapsed_us()) for e in ev])
    if any(len(r) != len(runs[0]) for r in runs):  # a call that launched differently
        return [(name, float("nan")) for name, _ in runs[0]]
    out = []
    for i, (name, _) in enumerate(runs[0]):
        ts = sorted(r[i][1] for r in runs)
        out.append((name, ts[len(ts) // 2]))
    return out


def short(name):
    """A kernel's name without the family prefix and template noise, for one-line lists."""
    name = name.split("(")[0]
    return name[len("moe_gemm_tma_"):] if name.startswith("moe_gemm_tma_") else name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--models", default="qwen3,gptoss,deepseek,mixtral",
                    help=f"models: {','.join(MODELS)}")
    ap.add_argument("--pairs", default="bf16", help=f"format pairs: {','.join(PAIRS)}")
    ap.add_argument("--tokens", default="1,16,64,256,4096,16384")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--chunk", type=int, default=0,
                    help="the layer's max_chunk_tokens (0: one pass, the default)")
    ap.add_argument("--fuse-intermediate", default="auto",
                    help="fp8 pair: the layer's fuse_intermediate_quantization modes to time "
                         "(auto, on, off; comma-separated, e.g. on,off)")
    ap.add_argument("--nvfp4-inputs", default="auto",
                    help="nvfp4 pair: the layer's nvfp4_gemm_inputs modes to time (auto, "
                         "packed, decoded; comma-separated; the first is 'ours')")
    ap.add_argument("--fuse-gather", default="auto",
                    help="bf16 pair: the layer's fuse_gather modes to time (auto, on, off; "
                         "comma-separated; the first is 'ours')")
    ap.add_argument("--breakdown", action="store_true",
                    help="also list each kernel's device time (no PDL) for the layer and the "
                         "two GEMMs")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=E,K,H,I",
                    help="a model shape of your own (renormalize routing, plain SwiGLU), "
                         "then usable in --models; repeatable")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    for spec in args.shape:
        name, _, dims = spec.partition("=")
        try:
            e, k, h, i = (int(v) for v in dims.split(","))
        except ValueError:
            ap.error(f"--shape: {spec!r} is not NAME=E,K,H,I (four integers)")
        if not name or name in MODELS or min(e, k, h, i) <= 0 or k > e:
            ap.error(f"--shape: {spec!r}: give a new name and positive E, K <= E, H, I")
        MODELS[name] = dict(e=e, k=k, h=h, i=i, routing="renormalize")
        TITLES[name] = name
    modes = [v for v in args.fuse_intermediate.split(",") if v]
    if not modes or any(v not in ("auto", "on", "off") for v in modes):
        ap.error(f"--fuse-intermediate: {args.fuse_intermediate!r} is not a list of auto, on, off")
    g_modes = [v for v in args.fuse_gather.split(",") if v]
    if not g_modes or any(v not in ("auto", "on", "off") for v in g_modes):
        ap.error(f"--fuse-gather: {args.fuse_gather!r} is not a list of auto, on, off")
    nv_modes = [v for v in args.nvfp4_inputs.split(",") if v]
    if not nv_modes or any(v not in ("auto", "packed", "decoded") for v in nv_modes):
        ap.error(f"--nvfp4-inputs: {args.nvfp4_inputs!r} is not a list of auto, packed, decoded")
    # Unknown names are refused before the GPU work starts, not as a KeyError mid-run.
    for flag, given, known in (("--models", args.models, MODELS), ("--pairs", args.pairs, PAIRS)):
        bad = [v for v in given.split(",") if v not in known]
        if bad:
            ap.error(f"{flag}: unknown {', '.join(map(repr, bad))}; choose from {','.join(known)}")
    torch.manual_seed(0)
    rt = cubist.Runtime(args.manifest)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # 512 MB > L2
    rows = []
    for name in args.models.split(","):
        for pair in args.pairs.split(","):
            rows += bench_model(rt, name, pair, args, flush)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    bound = {"bf16": 2e-2, "fp8": 8e-2, "fp8-block": 8e-2, "mxfp4": 2e-2, "mxfp4-mxfp8": 8e-2,
             "nvfp4-bf16": 2e-2, "nvfp4": 0.2}
    return 0 if all(r["rel_err"] < bound[r["pair"]] and r["modes_identical"] for r in rows) else 1


def nbytes(t):
    return 0 if t is None else t.numel() * t.element_size()


def expert_weights(e, rows, cols, wf, chunk=16):
    """Random weights [e, rows, cols] quantized to wf (as quantize_weights returns them) and
    the bf16 weights they stand for, made `chunk` experts at a time: quantizing is per
    expert, and DeepSeek-V3's fp32 temporaries over all 256 experts at once (about 30 GB a
    tensor) do not fit beside the layer's operands."""
    deq = torch.empty(e, rows, cols, dtype=torch.bfloat16, device="cuda")
    parts = []
    for lo in range(0, e, chunk):
        n = min(chunk, e - lo)
        w = (torch.randn(n, rows, cols, device="cuda") * cols ** -0.5).to(torch.bfloat16)
        if wf == "bf16":
            deq[lo:lo + n] = w
            continue
        q = cubist.quantize_weights(w, wf)
        deq[lo:lo + n] = cubist.dequantize_weights(*q, wf).to(torch.bfloat16)
        parts.append(q)
        del w
    if wf == "bf16":
        return deq, (deq, None, None)
    return deq, tuple(None if parts[0][i] is None else torch.cat([p[i] for p in parts])
                      for i in range(3))


def bench_model(rt, name, pair, args, flush):
    m = MODELS[name]
    wf, af = PAIRS[pair]
    e, k, h, inter = m["e"], m["k"], m["h"], m["i"]
    # Quantized weights (and the bf16 weights they stand for, for torch's composite).
    w1, q1 = expert_weights(e, 2 * inter, h, wf)
    w2, q2 = expert_weights(e, h, inter, wf)
    bias = (0.1 * torch.randn(e, device="cuda")) if m["routing"] == "deepseek_v3" else None
    act = {}
    for key in ("alpha", "beta", "limit"):
        if key in m:
            act[key] = torch.full((e,), m[key], dtype=torch.float32, device="cuda")
    b1 = b2 = None
    if name == "gptoss":  # its experts add a bias after each GEMM
        b1 = 0.1 * torch.randn(e, 2 * inter, device="cuda")
        b2 = 0.1 * torch.randn(e, h, device="cuda")
        act.update(w1_bias=b1, w2_bias=b2)
    in_amax, inter_amax = calibrate(m, w1, bias, b1)
    s1, s2 = act_scale(af, in_amax), act_scale(af, inter_amax)
    wkw = {}
    if wf != "bf16":
        wkw = dict(w1_scale=q1[1], w2_scale=q2[1], w1_global_scale=q1[2],
                   w2_global_scale=q2[2])
        wkw = {key: v for key, v in wkw.items() if v is not None}
    if af in ("fp8", "nvfp4"):
        wkw.update(input_scale=s1, intermediate_scale=s2)
    max_t = max(int(t) for t in args.tokens.split(","))
    # One layer per fusion mode (the fp8 pair's; the others quantize with block scales in
    # a kernel of their own, "auto" alone).
    # nvfp4: one layer per nvfp4_gemm_inputs mode (--nvfp4-inputs); bf16: per fuse_gather
    # mode (--fuse-gather).
    modes = (args.fuse_intermediate.split(",") if pair == "fp8" else
             args.nvfp4_inputs.split(",") if pair == "nvfp4" else
             args.fuse_gather.split(",") if pair == "bf16" else ["auto"])

    def make_layer(mode, pdl=True):
        mode_kw = ({"fuse_intermediate_quantization": mode} if pair == "fp8" else
                   {"nvfp4_gemm_inputs": mode} if pair == "nvfp4" else
                   {"fuse_gather": mode} if pair == "bf16" else {})
        lm = cubist.MoeLayer(
            rt, num_experts=e, top_k=k, hidden=h, intermediate=inter, routing=m["routing"],
            activation="swiglu", weights=wf, activations=af, n_group=m.get("n_group", 0),
            topk_group=m.get("topk_group", 0), routed_scaling_factor=m.get("scale", 1.0),
            max_chunk_tokens=args.chunk, pdl=pdl, **mode_kw)
        lm.prepare(max_t, q1[0], q2[0], **act, **wkw)
        return lm
    layers = {mode: make_layer(mode) for mode in modes}
    layer = layers[modes[0]]
    # The baseline's GEMMs: on the layer's routed rows, priced so (the tiles the layer's
    # own GEMMs take); it overlaps its two launches too.
    routed = dict(routed_top_k=k, routed_experts=e)
    gemm = cubist.MoeGemm(rt, pdl=True, **routed)
    # --breakdown: the first mode's layer and the GEMMs again, launched without PDL.
    nopdl = make_layer(modes[0], pdl=False) if args.breakdown else None
    # The baseline's GEMM2 launched early can run slower than in stream order (its CTAs
    # crowd onto the SMs GEMM1 frees first): the baseline is the faster of the two.
    gemm_nopdl = cubist.MoeGemm(rt, pdl=False, **routed)
    # Bytes per expert of both GEMMs' weights with their scales: the floor's unit.
    per_expert = sum(nbytes(t) for t in (*q1, *q2)) / e
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        logits = torch.randn(t, e, device="cuda")
        out = torch.empty_like(x)
        kw = dict(router_logits=logits, routing_bias=bias, out=out, **act, **wkw)
        ref_name, ref_fn = "torch", lambda: torch_layer(x, logits, w1, w2, m, bias, b1, b2)
        if pair == "fp8" and b1 is None:
            try:
                torch_fp8_layer(x, logits, (q1, q2), m, bias, s1, s2)
                ref_name = "torch fp8"
                ref_fn = lambda: torch_fp8_layer(x, logits, (q1, q2), m, bias, s1, s2)
            except RuntimeError as err:  # torch without fp8 grouped GEMMs for this shape
                print(f"  torch._scaled_grouped_mm unavailable ({err}); bf16 composite")
        elif wf != "bf16":
            ref_name = "torch bf16 (dequantized)"
        want = torch_layer(x, logits, w1, w2, m, bias, b1, b2)
        got = layer(x, q1[0], q2[0], **kw).clone()
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        fuse = {}  # each mode: its time, what "auto" chose, and its output against the first's
        for mode, lm in layers.items():
            mine = lm(x, q1[0], q2[0], **kw)
            same = torch.equal(mine, got)
            diff = ((mine.float() - got.float()).norm() / got.float().norm()).item()
            fuse[mode] = dict(us=timed(lambda: lm(x, q1[0], q2[0], **kw), args.iters, flush),
                              fused=lm.fuses_intermediate_quantization, identical=same,
                              rel_diff=diff, decoded=lm.decodes_nvfp4_inputs(t),
                              gather_fused=lm.fuses_gather)
        ours = fuse[modes[0]]["us"]
        ours_eager = timed(lambda: layer(x, q1[0], q2[0], **kw), args.iters, flush, graph=False)
        ref = timed(ref_fn, args.iters, flush)
        ref_eager = timed(ref_fn, args.iters, flush, graph=False)
        # Our two GEMMs alone on pre-permuted inputs (the same routing), in the pair's
        # formats (timing only: the inputs' bytes need not be the layer's).
        ids, _ = torch_route(logits, m, bias)
        flat = ids.flatten()
        offs = torch.zeros(e + 1, dtype=torch.int32, device="cuda")
        offs[1:] = torch.cumsum(torch.bincount(flat, minlength=e), 0)  # eager: fine
        a, a_s, a_g = timing_operand(torch, af, flat.numel(), h)
        hq, h_s, h_g = timing_operand(torch, af, flat.numel(), inter)
        hbuf = torch.empty(flat.numel(), inter, dtype=torch.bfloat16, device="cuda")
        ybuf = torch.empty(flat.numel(), h, dtype=torch.bfloat16, device="cuda")
        gact = {key: v for key, v in act.items() if key in ("alpha", "beta", "limit")}
        g1 = dict(weights=wf, activations=af, a_scale=a_s, a_global_scale=a_g, b_scale=q1[1],
                  b_global_scale=q1[2], activation="swiglu", **gact)
        g2 = dict(weights=wf, activations=af, a_scale=h_s, a_global_scale=h_g, b_scale=q2[1],
                  b_global_scale=q2[2], activation="identity")
        if b1 is not None:  # gpt-oss: the same GEMMs as the layer's, biases included
            g1.update(bias=b1)
            g2.update(bias=b2)
        if af == "bf16":
            hq = hbuf

        def gemms(op):
            op.run(a, q1[0], offs, hbuf, **g1)
            op.run(hq, q2[0], offs, ybuf, **g2)
        for op in (gemm, gemm_nopdl):
            op.check(a, q1[0], offs, hbuf, **g1)
            op.check(hq, q2[0], offs, ybuf, **g2)
        two = min(timed(lambda: gemms(gemm), args.iters, flush),
                  timed(lambda: gemms(gemm_nopdl), args.iters, flush))
        touched = len(set(flat.tolist()))
        buf = torch.empty(int(touched * per_expert) // 4, dtype=torch.float32, device="cuda")
        floor = timed(lambda: buf.sum(), args.iters, flush)
        del buf
        target = min(1.5 * floor + 20, 1.10 * two + 15)
        row = dict(model=name, pair=pair, tokens=t, ours_us=ours, torch_us=ref,
                   torch_baseline=ref_name, gemms_us=two, floor_us=floor,
                   ours_eager_us=ours_eager, torch_eager_us=ref_eager, experts_touched=touched,
                   rel_err=err, target_us=target, vs_torch=ref / ours, fuse=fuse,
                   modes_identical=all(f["identical"] for f in fuse.values()))
        if args.breakdown:
            row["breakdown"] = dict(
                ours=kernel_times(lambda: nopdl(x, q1[0], q2[0], **kw), flush),
                gemms=kernel_times(lambda: (gemm_nopdl.run(a, q1[0], offs, hbuf, **g1),
                                            gemm_nopdl.run(hq, q2[0], offs, ybuf, **g2)), flush))
            for what, ks in row["breakdown"].items():
                print(f"    {what} without PDL: " + ", ".join(f"{short(n)} {us:.1f}" for n, us in ks)
                      + f"; sum {sum(us for _, us in ks):.1f} us", flush=True)
            # The same layer under graph replay without PDL: what the overlap buys.
            row["ours_no_pdl_us"] = timed(lambda: nopdl(x, q1[0], q2[0], **kw), args.iters, flush)
            print(f"    ours under graphs without PDL: {row['ours_no_pdl_us']:.1f} us", flush=True)
        rows.append(row)
        print(f"{TITLES[name]:14s} {pair:11s} T={t:6d}: ours {ours:9.1f} us  {ref_name} "
              f"{ref:9.1f} x{ref / ours:5.2f}  gemms {two:9.1f}  floor {floor:8.1f} "
              f"(target {target:8.1f}: {'met' if ours <= target else 'OPEN'})  "
              f"eager {ours_eager:8.1f} / {ref_eager:8.1f}  err {err:.1e}", flush=True)
        if pair == "nvfp4" and len(fuse) > 1:
            print("    nvfp4_gemm_inputs: " + "  ".join(
                f"{mode} {f['us']:9.1f} us ({'decoded' if f['decoded'] else 'packed'}, "
                f"{'identical' if f['identical'] else 'rel. diff %.1e' % f['rel_diff']})"
                for mode, f in fuse.items()), flush=True)
        elif pair == "bf16" and len(fuse) > 1:
            print("    fuse_gather: " + "  ".join(
                f"{mode} {f['us']:9.1f} us ({'GEMM1 gathers' if f['gather_fused'] else 'gather kernel'}"
                f"{'' if f['identical'] else ', OUTPUT DIFFERS'})" for mode, f in fuse.items()),
                flush=True)
        elif len(fuse) > 1 or pair == "fp8":
            print("    fuse_intermediate_quantization: " + "  ".join(
                f"{mode} {f['us']:9.1f} us ({'fused' if f['fused'] else 'quantize kernel'}"
                f"{'' if f['identical'] else ', OUTPUT DIFFERS'})" for mode, f in fuse.items()),
                flush=True)
    return rows


def plot(rows, path):
    """Layer time vs T per model: ours for each pair, torch's composite (bf16, or the
    pair's own baseline when only one pair ran) and the bf16 weights' floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, name in zip(axes[0], models):
        for pair in pairs:
            rs = [r for r in rows if r["model"] == name and r["pair"] == pair]
            if rs:
                ax.plot([r["tokens"] for r in rs], [r["ours_us"] for r in rs], marker="o",
                        label=f"cubist {pair}")
        base = [r for r in rows if r["model"] == name and r["pair"] == pairs[0]]
        ts = [r["tokens"] for r in base]
        ax.plot(ts, [r["torch_us"] for r in base], marker="s", ls="--",
                label=f"torch composite ({base[0]['torch_baseline']})")
        ax.plot(ts, [r["floor_us"] for r in base], ls=":", label=f"floor ({pairs[0]} weights)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(TITLES[name])
        ax.set_xlabel("tokens")
        ax.set_ylabel("us (CUDA graph, L2 flushed)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
