"""A Mixture-of-Experts feed-forward layer on cubist's kernels, and the same layer in
plain torch to check it against (README "Python").

    y = MoeLayer(rt, router, w1, w2, top_k)(x)

x [T, H] bf16. router [E, H]: logits -> softmax -> top-k experts per token, weights
renormalized. Tokens are sorted by expert (offsets [E+1]); FC1 = cubist SwiGLU GEMM with
w1 [E, 2I, H] (rows 0..I-1 the linear half, I..2I-1 the gate: docs/kernels.md); FC2 =
cubist identity GEMM with w2 [E, H, I]; the rows are weighted and summed back into token
order. No host synchronization: the layer can be captured in a CUDA graph.

    python examples/moe_layer.py MANIFEST   # checks the layer against torch on a GPU
"""
import sys

import torch
import torch.nn.functional as F

import cubist


def route(x, router, top_k):
    """(expert per (token, k) sorted, source token of each sorted row, its weight,
    offsets int32 [E+1]) without a host sync."""
    e = router.shape[0]
    probs = torch.softmax(x.float() @ router.float().t(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offsets = torch.zeros(e + 1, dtype=torch.int32, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0, dtype=torch.int32)
    return flat[order], order // top_k, weights.flatten()[order], offsets


class MoeLayer:
    def __init__(self, runtime, router, w1, w2, top_k):
        # The offsets come from a top-k router: the tiles are priced for its spread.
        self.gemm = cubist.MoeGemm(runtime, routed_top_k=top_k, routed_experts=router.shape[0])
        self.router, self.w1, self.w2, self.top_k = router, w1, w2, top_k

    def __call__(self, x):
        _, token, weight, offsets = route(x, self.router, self.top_k)
        a = x[token]                                            # [T*k, H], by expert
        h = torch.empty(a.shape[0], self.w1.shape[1] // 2, dtype=torch.bfloat16,
                        device=x.device)
        self.gemm.run(a, self.w1, offsets, h, activation="swiglu")    # FC1 + SwiGLU
        y = torch.empty(a.shape[0], self.w2.shape[1], dtype=torch.bfloat16, device=x.device)
        self.gemm.run(h, self.w2, offsets, y, activation="identity")  # FC2
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        out.index_add_(0, token, y.float() * weight[:, None])       # weighted un-sort
        return out.to(torch.bfloat16)


def torch_layer(x, router, w1, w2, top_k, grouped=True):
    """The same layer in plain torch: torch._grouped_mm when `grouped` (the fast path
    torch offers, torch >= 2.8 on Hopper), else one matmul per expert (the reference)."""
    _, token, weight, offsets = route(x, router, top_k)
    a = x[token]
    inter = w1.shape[1] // 2
    if grouped:
        c = torch._grouped_mm(a, w1.transpose(-2, -1), offs=offsets[1:])
        h = (F.silu(c[:, inter:].float()) * c[:, :inter].float()).to(torch.bfloat16)
        y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offsets[1:])
    else:
        h = torch.empty(a.shape[0], inter, dtype=torch.bfloat16, device=x.device)
        y = torch.empty(a.shape[0], w2.shape[1], dtype=torch.bfloat16, device=x.device)
        bounds = offsets.tolist()
        for e in range(w1.shape[0]):
            lo, hi = bounds[e], bounds[e + 1]
            c = a[lo:hi].float() @ w1[e].float().t()
            h[lo:hi] = (F.silu(c[:, inter:]) * c[:, :inter]).to(torch.bfloat16)
            y[lo:hi] = (h[lo:hi].float() @ w2[e].float().t()).to(torch.bfloat16)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, token, y.float() * weight[:, None])
    return out.to(torch.bfloat16)


def make_weights(experts, hidden, inter, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)
    return (rnd(experts, hidden, scale=1.0), rnd(experts, 2 * inter, hidden, scale=hidden ** -0.5),
            rnd(experts, hidden, inter, scale=inter ** -0.5))


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def main(manifest):
    rt = cubist.Runtime(manifest)
    experts, hidden, inter, top_k, tokens = 32, 2048, 1024, 4, 512
    router, w1, w2 = make_weights(experts, hidden, inter)
    x = torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16)
    layer = MoeLayer(rt, router, w1, w2, top_k)
    got = layer(x)
    want = torch_layer(x, router, w1, w2, top_k, grouped=False)
    err = relative_error(got, want)
    print(f"MoE layer E={experts} H={hidden} I={inter} top-{top_k} T={tokens} on "
          f"{rt.device_name}: relative error vs torch {err:.2e}")
    return 0 if err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
