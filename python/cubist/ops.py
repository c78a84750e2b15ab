"""torch.ops.cubist.moe_gemm: MoeGemm.run as a torch custom op (torch.library).

Importing this module imports torch and registers the op once. torch.compile traces
the op through its fake (meta) implementation, without launching, and calls it as one
opaque kernel; CUDA-graph capture records the launch on the capturing stream. The op
names the MoeGemm by its handle (an int: custom ops take no Python objects):

    import cubist.ops
    torch.ops.cubist.moe_gemm(gemm.handle, a, b, offsets, out, None, None, None, None,
                              None, None, None, "", "", "swiglu")
    gemm.op(a, b, offsets, out, activation="swiglu")   # the same, spelled shortly

Empty strings for the formats mean "from the dtypes", as in MoeGemm.run. The per-expert
bias (float32 [E, N], MoeGemm.run's `bias`) comes last and defaults to None.
"""
from typing import Optional

import torch

from . import _live_gemms, _live_layers, InvalidArgumentError


@torch.library.custom_op("cubist::moe_gemm", mutates_args=("out",), device_types="cuda")
def moe_gemm(handle: int, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
             out: torch.Tensor, a_scale: Optional[torch.Tensor],
             b_scale: Optional[torch.Tensor], a_global_scale: Optional[torch.Tensor],
             b_global_scale: Optional[torch.Tensor], alpha: Optional[torch.Tensor],
             beta: Optional[torch.Tensor], limit: Optional[torch.Tensor], weights: str,
             activations: str, activation: str, bias: Optional[torch.Tensor] = None) -> None:
    gemm = _live_gemms.get(handle)
    if gemm is None:
        raise InvalidArgumentError(f"handle: no live cubist.MoeGemm has handle {handle}")
    gemm.run(a, b, offsets, out, activation=activation, weights=weights or None,
             activations=activations or None, a_scale=a_scale, b_scale=b_scale,
             a_global_scale=a_global_scale, b_global_scale=b_global_scale, alpha=alpha,
             beta=beta, limit=limit, bias=bias)


@moe_gemm.register_fake
def _(handle, a, b, offsets, out, a_scale, b_scale, a_global_scale, b_global_scale, alpha,
      beta, limit, weights, activations, activation, bias=None):
    return None


@torch.library.custom_op("cubist::moe", mutates_args=("out",), device_types="cuda")
def moe(handle: int, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, out: torch.Tensor,
        router_logits: Optional[torch.Tensor], routing_bias: Optional[torch.Tensor],
        topk_ids: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor],
        alpha: Optional[torch.Tensor], beta: Optional[torch.Tensor],
        limit: Optional[torch.Tensor], accumulate: bool,
        w1_scale: Optional[torch.Tensor] = None, w2_scale: Optional[torch.Tensor] = None,
        w1_global_scale: Optional[torch.Tensor] = None,
        w2_global_scale: Optional[torch.Tensor] = None,
        input_scale: Optional[torch.Tensor] = None,
        intermediate_scale: Optional[torch.Tensor] = None,
        w1_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None) -> None:
    """torch.ops.cubist.moe: cubist.MoeLayer.__call__ into `out`, the layer named by its
    handle (MoeLayer.handle). The workspace is the layer's own, from torch's caching
    allocator (call layer.prepare(max_tokens, ...) before capturing a graph). The
    quantized pairs' tensors (the weights' scales, the activations' scales) come last
    and default to None, so a bf16 call leaves them out."""
    layer = _live_layers.get(handle)
    if layer is None:
        raise InvalidArgumentError(f"handle: no live cubist.MoeLayer has handle {handle}")
    layer(x, w1, w2, router_logits=router_logits, routing_bias=routing_bias,
          topk_ids=topk_ids, topk_weights=topk_weights, alpha=alpha, beta=beta, limit=limit,
          out=out, accumulate=accumulate, w1_scale=w1_scale, w2_scale=w2_scale,
          w1_global_scale=w1_global_scale, w2_global_scale=w2_global_scale,
          input_scale=input_scale, intermediate_scale=intermediate_scale, w1_bias=w1_bias,
          w2_bias=w2_bias)


@moe.register_fake
def _(handle, x, w1, w2, out, router_logits, routing_bias, topk_ids, topk_weights, alpha,
      beta, limit, accumulate, w1_scale=None, w2_scale=None, w1_global_scale=None,
      w2_global_scale=None, input_scale=None, intermediate_scale=None, w1_bias=None,
      w2_bias=None):
    return None
