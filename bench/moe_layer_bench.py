#!/usr/bin/env python3
"""The routed MoE layer on cubist's published kernels against torch's composite of the
same layer, on an H200, in one process (docs/benchmarks.md, "The MoE layer").

    python3 bench/moe_layer_bench.py --manifest DIR/manifest.json [--models qwen3,gptoss]
        [--tokens 1,16,64,256,4096,16384] [--iters 30] [--json OUT] [--plot OUT.png]

For each model and batch size T (uniform random routing logits from a fixed seed; router
logits are an input, the router GEMM is the engine's):
  ours     cubist.MoeLayer: routing, sort, gather, GEMM1 + activation, GEMM2, finalize
  gemms    our two GEMMs alone on pre-permuted inputs (the layer's routing, taken once)
  torch    the same layer in torch: the model's routing and activation in torch,
           torch._grouped_mm for both GEMMs, index_add finalize (examples/moe_layer.py's
           torch_layer, made model-faithful)
  floor    one read of the weights of the experts the batch touches: a sum over a
           buffer of that many bytes
Each is timed under CUDA-graph replay (a captured step, as engines run decode) with the
L2 cache flushed before every replay; medians of --iters replays. Eager times of ours and
torch are reported too. Every layer output is checked against torch's first.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

import cubist

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


def torch_layer(x, logits, w1, w2, m, bias):
    e = w1.shape[0]
    ids, w = torch_route(logits, m, bias)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    # counts by scatter_add: torch.bincount syncs with the host, which graphs forbid
    counts = torch.zeros(e, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    token = order // m["k"]
    a = x[token]
    c = torch._grouped_mm(a, w1.transpose(-2, -1), offs=offs)
    h = torch_act(c, m)
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, y.float() * w.flatten()[order][:, None])
    return out.to(torch.bfloat16)


def timed(fn, iters, flush, graph=True):
    """Median microseconds of fn(): under CUDA-graph replay (graph=True) or eager, the
    L2 flushed before each."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--models", default="qwen3,gptoss,deepseek,mixtral")
    ap.add_argument("--tokens", default="1,16,64,256,4096,16384")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--chunk", type=int, default=0,
                    help="the layer's max_chunk_tokens (0: one pass, the default)")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    args = ap.parse_args()
    torch.manual_seed(0)
    rt = cubist.Runtime(args.manifest)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # 512 MB > L2
    rows = []
    for name in args.models.split(","):
        m = MODELS[name]
        e, k, h, inter = m["e"], m["k"], m["h"], m["i"]
        w1 = (torch.randn(e, 2 * inter, h, device="cuda") * h ** -0.5).to(torch.bfloat16)
        w2 = (torch.randn(e, h, inter, device="cuda") * inter ** -0.5).to(torch.bfloat16)
        bias = (0.1 * torch.randn(e, device="cuda")) if m["routing"] == "deepseek_v3" else None
        act = {}
        for key in ("alpha", "beta", "limit"):
            if key in m:
                act[key] = torch.full((e,), m[key], dtype=torch.float32, device="cuda")
        layer = cubist.MoeLayer(
            rt, num_experts=e, top_k=k, hidden=h, intermediate=inter, routing=m["routing"],
            activation="swiglu", n_group=m.get("n_group", 0),
            topk_group=m.get("topk_group", 0), routed_scaling_factor=m.get("scale", 1.0),
            max_chunk_tokens=args.chunk)
        max_t = max(int(t) for t in args.tokens.split(","))
        layer.prepare(max_t, w1, w2, **act)
        gemm = cubist.MoeGemm(rt)
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
            logits = torch.randn(t, e, device="cuda")
            out = torch.empty_like(x)
            kw = dict(router_logits=logits, routing_bias=bias, out=out, **act)
            want = torch_layer(x, logits, w1, w2, m, bias)
            got = layer(x, w1, w2, **kw)
            err = ((got.float() - want.float()).norm() / want.float().norm()).item()
            ours = timed(lambda: layer(x, w1, w2, **kw), args.iters, flush)
            ours_eager = timed(lambda: layer(x, w1, w2, **kw), args.iters, flush, graph=False)
            ref = timed(lambda: torch_layer(x, logits, w1, w2, m, bias), args.iters, flush)
            ref_eager = timed(lambda: torch_layer(x, logits, w1, w2, m, bias), args.iters,
                              flush, graph=False)
            # Our two GEMMs alone on pre-permuted inputs (the same routing).
            ids, _ = torch_route(logits, m, bias)
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)
            offs = torch.zeros(e + 1, dtype=torch.int32, device="cuda")
            offs[1:] = torch.cumsum(torch.bincount(flat, minlength=e), 0)  # eager: fine
            a = x[order // k].contiguous()
            hbuf = torch.empty(a.shape[0], inter, dtype=torch.bfloat16, device="cuda")
            ybuf = torch.empty(a.shape[0], h, dtype=torch.bfloat16, device="cuda")

            def gemms():
                gemm.run(a, w1, offs, hbuf, activation="swiglu", **act)
                gemm.run(hbuf, w2, offs, ybuf, activation="identity")
            gemm.check(a, w1, offs, hbuf, activation="swiglu", **act)
            gemm.check(hbuf, w2, offs, ybuf, activation="identity")
            two = timed(gemms, args.iters, flush)
            touched = len(set(flat.tolist()))
            nbytes = touched * (2 * inter * h + h * inter) * 2
            buf = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
            floor = timed(lambda: buf.sum(dtype=torch.float32), args.iters, flush)
            del buf
            target = min(1.5 * floor + 20, 1.10 * two + 15)
            row = dict(model=name, tokens=t, ours_us=ours, torch_us=ref, gemms_us=two,
                       floor_us=floor, ours_eager_us=ours_eager, torch_eager_us=ref_eager,
                       experts_touched=touched, rel_err=err, target_us=target,
                       vs_torch=ref / ours)
            rows.append(row)
            print(f"{TITLES[name]:14s} T={t:6d}: ours {ours:9.1f} us  torch {ref:9.1f}  "
                  f"x{ref / ours:5.2f}  gemms {two:9.1f}  floor {floor:8.1f} "
                  f"(target {target:8.1f}: {'met' if ours <= target else 'OPEN'})  "
                  f"eager {ours_eager:8.1f} / {ref_eager:8.1f}  err {err:.1e}", flush=True)
        del w1, w2, layer
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0 if all(r["rel_err"] < 2e-2 for r in rows) else 1


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6))
    for ax, name in zip(axes if len(models) > 1 else [axes], models):
        rs = [r for r in rows if r["model"] == name]
        ts = [r["tokens"] for r in rs]
        for key, label in (("ours_us", "cubist layer"), ("torch_us", "torch composite"),
                           ("gemms_us", "our 2 GEMMs alone"), ("floor_us", "weight-read floor")):
            ax.plot(ts, [r[key] for r in rs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(TITLES[name])
        ax.set_xlabel("tokens")
        ax.set_ylabel("us (CUDA graph, L2 flushed)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7) if len(models) > 1 else axes.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
