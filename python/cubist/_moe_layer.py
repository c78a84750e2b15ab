"""cubist.MoeLayer: the routed Mixture-of-Experts layer as one op (dispatch/moe_layer.h).

    layer = cubist.MoeLayer(rt, num_experts=128, top_k=8, hidden=2048, intermediate=768,
                            routing="renormalize", activation="swiglu")
    layer.prepare(max_tokens=256, w1=w1, w2=w2)      # loads every kernel: before capture
    y = layer(x, w1, w2, router_logits=logits)       # bf16 [T, H]

Routing, the sort of token slots by expert, the gather, both GEMMs and the weighted sum
run as kernels of the runtime's manifest on torch's current stream, with no host
synchronization: a step can be captured in a CUDA graph. The workspace comes from
torch's caching allocator unless one is given. `cubist.ops` registers the same call as
the torch custom op `torch.ops.cubist.moe` for torch.compile.
"""
import sys
import weakref

from . import _cubist
from ._errors import InvalidArgumentError
from ._tensors import describe

ROUTING_METHODS = ("default", "renormalize", "renormalize_naive", "deepseek_v3", "llama4",
                   "topk", "sigmoid", "sigmoid_renorm")
_live_layers = weakref.WeakValueDictionary()  # handle -> MoeLayer, for cubist.ops


def _bad(name, what):
    return InvalidArgumentError(f"{name}: {what}")


class MoeLayer:
    """The routed MoE layer. Options (keywords): num_experts E, top_k k, hidden H,
    intermediate I (w1 is [L, 2I, H] for gated activations, [L, I, H] otherwise; w2
    [L, H, I]), routing (one of ROUTING_METHODS), activation (GEMM1's), weights /
    activations (the format pair; bf16), n_group / topk_group / routed_scaling_factor
    (deepseek_v3), apply_weight_on_input (llama4), logits ("fp32" or "bf16"),
    local_expert_offset / num_local_experts (expert parallelism: L local experts),
    max_chunk_tokens (bounds the workspace), finalize ("sum", or "none"), pdl."""

    _next_handle = 1

    def __init__(self, runtime, *, num_experts, top_k, hidden, intermediate,
                 routing="renormalize", activation="swiglu", weights="bf16",
                 activations="bf16", n_group=0, topk_group=0, routed_scaling_factor=1.0,
                 apply_weight_on_input=False, logits="fp32", local_expert_offset=0,
                 num_local_experts=0, max_chunk_tokens=0, finalize="sum", pdl=True):
        from . import Runtime
        if not isinstance(runtime, Runtime):
            raise _bad("runtime", f"expected cubist.Runtime, got {type(runtime).__name__}")
        self.runtime = runtime
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.hidden, self.intermediate = int(hidden), int(intermediate)
        self.activation, self.logits = activation, logits
        self.num_local_experts = int(num_local_experts) or self.num_experts
        self._gated = activation in ("swiglu", "geglu", "situ")
        self._native = _cubist.MoeLayer(
            runtime._native, weights, activations, activation, self.num_experts, self.top_k,
            self.hidden, self.intermediate, routing, int(n_group), int(topk_group),
            float(routed_scaling_factor), bool(apply_weight_on_input), logits,
            int(local_expert_offset), int(num_local_experts), int(max_chunk_tokens),
            finalize, bool(pdl))
        self._workspace = None  # (tensor, max_tokens) grown on demand outside capture
        self.handle = MoeLayer._next_handle
        MoeLayer._next_handle += 1
        _live_layers[self.handle] = self

    def workspace_size(self, max_tokens):
        """Bytes of workspace a batch of up to max_tokens tokens needs."""
        return self._native.workspace_size(int(max_tokens))

    def workspace_layout(self, max_tokens):
        """Byte offsets of the workspace's arrays (topk_ids, topk_weights, offsets,
        dropped, expanded_to_permuted, permuted_to_expanded, rows): what finalize="none"
        leaves there."""
        return self._native.workspace_layout(int(max_tokens))

    def _pointers(self, x, w1, w2, router_logits, routing_bias, topk_ids, topk_weights,
                  alpha, beta, limit, out, workspace):
        device = self.runtime.device
        ix = describe(x, "x")
        if ix.dtype != "bfloat16" or len(ix.shape) != 2 or ix.shape[1] != self.hidden:
            raise _bad("x", f"expected bfloat16 [T, H={self.hidden}], got {ix.dtype} "
                       f"{list(ix.shape)}")
        t = ix.shape[0]
        n1 = 2 * self.intermediate if self._gated else self.intermediate
        l = self.num_local_experts
        # The native run's pointer order (MoeLayerArgs'): hidden_states, router_logits,
        # routing_bias, topk_ids, topk_weights, w1, w2, alpha, beta, limit, out, workspace.
        checks = [
            (x, "x", ("bfloat16",), (t, self.hidden)),
            (router_logits, "router_logits",
             ("float32",) if self.logits == "fp32" else ("bfloat16",), (t, self.num_experts)),
            (routing_bias, "routing_bias", ("float32",), (self.num_experts,)),
            (topk_ids, "topk_ids", ("int32",), (t, self.top_k)),
            (topk_weights, "topk_weights", ("float32",), (t, self.top_k)),
            (w1, "w1", ("bfloat16",), (l, n1, self.hidden)),
            (w2, "w2", ("bfloat16",), (l, self.hidden, self.intermediate)),
            (alpha, "alpha", ("float32",), (l,)),
            (beta, "beta", ("float32",), (l,)),
            (limit, "limit", ("float32",), (l,)),
            (out, "out", ("bfloat16",), (t, self.hidden)),
        ]
        ptrs = []
        for value, name, dtypes, shape in checks:
            if value is None:
                ptrs.append(0)
                continue
            info = describe(value, name)
            if info.dtype not in dtypes or tuple(info.shape) != shape:
                raise _bad(name, f"expected {' or '.join(dtypes)} {list(shape)}, got "
                           f"{info.dtype} {list(info.shape)}")
            if info.device is not None and info.device != device:
                raise _bad(name, f"is on cuda:{info.device}; this runtime runs on "
                           f"cuda:{device}")
            ptrs.append(info.ptr)
        iw = describe(workspace, "workspace")
        ptrs.append(iw.ptr)
        return t, ptrs, _numel(iw.shape) * _itemsize(iw.dtype)

    def _workspace_for(self, x, tokens):
        """The layer's own workspace, from torch's caching allocator, grown to `tokens`."""
        if self._workspace is None or self._workspace[1] < tokens:
            torch = sys.modules["torch"]
            size = self.workspace_size(max(tokens, 1))
            self._workspace = (torch.empty(size, dtype=torch.uint8, device=x.device), tokens)
        return self._workspace[0]

    def prepare(self, max_tokens, w1, w2, *, x=None, router_logits=None, **kwargs):
        """Checks the arguments for every batch of up to max_tokens tokens and selects,
        fetches and loads every kernel they need: call it before CUDA-graph capture.
        Also sizes the layer's own workspace for max_tokens."""
        torch = sys.modules.get("torch")
        if x is None:
            x = torch.empty(1, self.hidden, dtype=torch.bfloat16, device=w1.device)
        if router_logits is None and "topk_ids" not in kwargs:
            router_logits = torch.empty(
                x.shape[0], self.num_experts, device=x.device,
                dtype=torch.float32 if self.logits == "fp32" else torch.bfloat16)
        workspace = kwargs.pop("workspace", None)
        if workspace is None:
            workspace = self._workspace_for(x, max_tokens)
        out = kwargs.pop("out", None)
        if out is None:
            out = torch.empty_like(x)
        t, ptrs, ws_bytes = self._pointers(
            x, w1, w2, router_logits, kwargs.get("routing_bias"), kwargs.get("topk_ids"),
            kwargs.get("topk_weights"), kwargs.get("alpha"), kwargs.get("beta"),
            kwargs.get("limit"), out, workspace)
        self._native.run(t, ptrs, ws_bytes, False, 0, int(max_tokens))

    def __call__(self, x, w1, w2, *, router_logits=None, routing_bias=None, topk_ids=None,
                 topk_weights=None, alpha=None, beta=None, limit=None, out=None,
                 accumulate=False, workspace=None, stream=None):
        """The layer on x (bfloat16 [T, H]): routed from router_logits [T, E] (+ an fp32
        routing_bias [E] for deepseek_v3), or pre-routed by topk_ids int32 [T, k] and
        topk_weights fp32 [T, k]. Returns out (bfloat16 [T, H], allocated when None);
        accumulate=True adds into it."""
        from . import _current_stream
        torch = sys.modules.get("torch")
        if out is None:
            if torch is None:
                raise _bad("out", "give the output tensor (torch is not imported)")
            out = torch.empty_like(x)
            if accumulate:
                raise _bad("accumulate", "needs out")
        if workspace is None:
            workspace = self._workspace_for(x, x.shape[0])
        t, ptrs, ws_bytes = self._pointers(x, w1, w2, router_logits, routing_bias, topk_ids,
                                           topk_weights, alpha, beta, limit, out, workspace)
        if stream is None:
            stream = _current_stream(self.runtime.device)
        elif not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", None) or getattr(stream, "ptr", 0)
        self._native.run(t, ptrs, ws_bytes, bool(accumulate), stream, -1)
        return out

    def op(self, x, w1, w2, **kwargs):
        """The same call through torch.ops.cubist.moe (torch.compile-friendly)."""
        from . import ops  # noqa: F401 (registers the op)
        torch = sys.modules["torch"]
        out = kwargs.pop("out", None)
        if out is None:
            out = torch.empty_like(x)
        names = ("router_logits", "routing_bias", "topk_ids", "topk_weights", "alpha",
                 "beta", "limit")
        unknown = set(kwargs) - set(names) - {"accumulate"}
        if unknown:
            raise _bad(sorted(unknown)[0], "is not an argument of MoeLayer.op")
        torch.ops.cubist.moe(self.handle, x, w1, w2, out,
                             *(kwargs.get(n) for n in names), bool(kwargs.get("accumulate")))
        return out


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


_ITEMSIZE = {"uint8": 1, "int8": 1, "bfloat16": 2, "float16": 2, "float32": 4, "int32": 4,
             "int64": 8}


def _itemsize(dtype):
    return _ITEMSIZE.get(dtype, 1)


GATED_LAYOUTS = ("up_gate", "gate_up", "gate_up_interleaved")


def gated_weights(w, layout):
    """GEMM1's weights [E, 2I, H] in cubist's order from a checkpoint's, by name:
        up_gate               rows 0..I-1 the linear (up) half, I..2I-1 the gate: cubist's
        gate_up               rows 0..I-1 the gate, I..2I-1 up (vLLM's w13 = [w1; w3])
        gate_up_interleaved   even rows gate, odd rows up (gpt-oss's checkpoint)
    Returns a new contiguous tensor (the input when it is already in cubist's order and
    contiguous), so a layout never runs silently wrong."""
    if layout not in GATED_LAYOUTS:
        raise _bad("layout", f"{layout!r} is not one of {', '.join(GATED_LAYOUTS)}")
    if len(w.shape) != 3 or w.shape[1] % 2:
        raise _bad("w", f"expected [E, 2I, H] with an even row count, got {list(w.shape)}")
    torch = sys.modules["torch"]
    inter = w.shape[1] // 2
    if layout == "up_gate":
        return w.contiguous()
    if layout == "gate_up":
        return torch.cat((w[:, inter:], w[:, :inter]), dim=1).contiguous()
    return torch.cat((w[:, 1::2], w[:, 0::2]), dim=1).contiguous()
