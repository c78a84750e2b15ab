"""cubist.MoeLayer: the routed Mixture-of-Experts layer as one op (dispatch/moe_layer.h).

    layer = cubist.MoeLayer(rt, num_experts=128, top_k=8, hidden=2048, intermediate=768,
                            routing="renormalize", activation="swiglu")
    layer.prepare(max_tokens=256, w1=w1, w2=w2)      # loads every kernel: before capture
    y = layer(x, w1, w2, router_logits=logits)       # bf16 [T, H]

Quantized pairs (weights= / activations=: fp8 x fp8, fp8-block x fp8-block, mxfp4 x bf16,
mxfp4 x mxfp8, nvfp4 x bf16, nvfp4 x nvfp4) take the weights in their format with their scales, and
fp8 / nvfp4 activations a per-tensor scale for each GEMM's input (the layer quantizes
both inputs itself):

    w1q, w1s, w1g = cubist.quantize_weights(w1, "nvfp4")   # and the same for w2
    layer = cubist.MoeLayer(rt, ..., weights="nvfp4", activations="nvfp4")
    y = layer(x, w1q, w2q, router_logits=logits, w1_scale=w1s, w2_scale=w2s,
              w1_global_scale=w1g, w2_global_scale=w2g,
              input_scale=g1, intermediate_scale=g2)       # fp32 [1] each

Routing, the sort of token slots by expert, the gather, both GEMMs and the weighted sum
run as kernels of the runtime's manifest on torch's current stream, with no host
synchronization: a step can be captured in a CUDA graph. The workspace comes from
torch's caching allocator unless one is given. `cubist.ops` registers the same call as
the torch custom op `torch.ops.cubist.moe` for torch.compile.

The expert-major masked input of low-latency all-to-all libraries (DeepEP's low-latency
dispatch): x bfloat16 [L, max_m, H] and masked_counts int32 [L] on the device; no routing,
no weighted sum; out [L, max_m, H] gets each valid row's expert output, rows past a count
are left untouched (dispatch/moe_layer.h, "Masked input"):

    layer = cubist.MoeLayer(rt, num_experts=E, hidden=H, intermediate=I,
                            input_layout="expert_major_masked", max_m=max_m,
                            num_local_experts=L, local_expert_offset=rank * L)
    y = layer(x, w1, w2, masked_counts=counts)      # bf16 [L, max_m, H]
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


# Per format: the dtypes that hold its weight elements, and its weights' block scales
# (kernels/moe_gemm_abi.h). fp4 elements are packed two per byte along K.
_FP8 = ("float8_e4m3fn", "uint8")
_FP4 = ("uint8", "float4_e2m1fn_x2")
_E8M0 = ("uint8", "float8_e8m0fnu")
_ELEMENTS = {"bf16": ("bfloat16",), "fp8": _FP8, "fp8-block": _FP8, "mxfp8": _FP8,
             "mxfp4": _FP4, "nvfp4": _FP4}
_BLOCK_SCALES = {"fp8-block": ("float32",), "mxfp4": _E8M0, "mxfp8": _E8M0,
                 "nvfp4": ("uint8", "float8_e4m3fn")}
_PACKED = ("mxfp4", "nvfp4")
_GLOBAL = ("fp8", "nvfp4")  # per-expert weight / per-tensor activation scales
INPUT_LAYOUTS = ("token_major", "expert_major_masked")
# The token-major layer's routing tensors, which the masked layout refuses.
_ROUTING_ARGUMENTS = ("router_logits", "routing_bias", "topk_ids", "topk_weights")
# The layer's new tensors, keyword arguments of __call__, prepare and op.
SCALE_ARGUMENTS = ("w1_scale", "w2_scale", "w1_global_scale", "w2_global_scale",
                   "input_scale", "intermediate_scale", "w1_bias", "w2_bias")


def _weight_shape(fmt, l, n, k, n_name, k_name):
    """([L, N, K] of a weight in `fmt` (K/2 bytes packed fp4), its symbolic spelling)."""
    if fmt in _PACKED:
        return (l, n, k // 2), f"[L, {n_name}, {k_name}/2]"
    return (l, n, k), f"[L, {n_name}, {k_name}]"


def _scale_shape(fmt, l, n, k, n_name, k_name):
    """The block scales of a [L, N, K] weight in `fmt` and their symbolic spelling."""
    if fmt == "fp8-block":
        return ((l, -(-n // 128), -(-k // 128)),
                f"[L, ceil({n_name}/128), ceil({k_name}/128)]")
    block = 16 if fmt == "nvfp4" else 32
    return (l, n, k // block), f"[L, {n_name}, {k_name}/{block}]"


class MoeLayer:
    """The routed MoE layer. Options (keywords): num_experts E, top_k k, hidden H,
    intermediate I (w1 is [L, 2I, H] for gated activations, [L, I, H] otherwise; w2
    [L, H, I]), routing (one of ROUTING_METHODS), activation (GEMM1's), weights /
    activations (the format pair: bf16 x bf16, fp8 x fp8, fp8-block x fp8-block, mxfp4 x
    bf16, mxfp4 x mxfp8, nvfp4 x bf16, nvfp4 x nvfp4; the call then takes the pair's scales, see
    __call__), n_group / topk_group / routed_scaling_factor
    (deepseek_v3), apply_weight_on_input (llama4), logits ("fp32" or "bf16"),
    local_expert_offset / num_local_experts (expert parallelism: L local experts),
    max_chunk_tokens (bounds the workspace), finalize ("sum", or "none"), pdl;
    input_layout (one of INPUT_LAYOUTS) and max_m (expert_major_masked: rows per expert
    slot; top_k and the routing options stay unset); fuse_intermediate_quantization
    ("auto", "on" or "off": fp8 x fp8 only, whether GEMM1's epilogue writes GEMM2's fp8
    input instead of a separate quantize kernel - the same bytes either way; "auto" fuses
    where the manifest has the kernel, and fuses_intermediate_quantization says what it
    chose); nvfp4_gemm_inputs ("auto", "packed" or "decoded": nvfp4 x nvfp4 only, whether
    the GEMMs read nvfp4's bytes or their values written once as bf16 by the quantize
    kernels - the same products, faster GEMMs at prefill for 3.6x the input bytes; "auto"
    decides per batch size by the cost model, decodes_nvfp4_inputs(tokens) says what);
    fuse_gather ("auto", "on" or "off": bf16 x bf16 only, whether GEMM1 reads the token
    rows from the hidden states through the routing's row map itself instead of a gather
    kernel's copy - the same bits either way; "auto" fuses where the manifest has the
    kernel and GEMM1 is narrower than 8,192 columns (2 x intermediate when gated), where
    fusing measured faster, and fuses_gather says what it chose)."""

    _next_handle = 1

    def __init__(self, runtime, *, num_experts, hidden, intermediate, top_k=0,
                 routing="renormalize", activation="swiglu", weights="bf16",
                 activations="bf16", n_group=0, topk_group=0, routed_scaling_factor=1.0,
                 apply_weight_on_input=False, logits="fp32", local_expert_offset=0,
                 num_local_experts=0, max_chunk_tokens=0, finalize="sum", pdl=True,
                 input_layout="token_major", max_m=0, fuse_intermediate_quantization="auto",
                 nvfp4_gemm_inputs="auto", fuse_gather="auto"):
        from . import Runtime
        if not isinstance(runtime, Runtime):
            raise _bad("runtime", f"expected cubist.Runtime, got {type(runtime).__name__}")
        self.runtime = runtime
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.hidden, self.intermediate = int(hidden), int(intermediate)
        self.activation, self.logits = activation, logits
        self.weights, self.activations = weights, activations
        self.num_local_experts = int(num_local_experts) or self.num_experts
        self._gated = activation in ("swiglu", "geglu", "situ")
        self.input_layout, self.max_m = input_layout, int(max_m)
        self._native = _cubist.MoeLayer(
            runtime._native, weights, activations, activation, self.num_experts, self.top_k,
            self.hidden, self.intermediate, routing, int(n_group), int(topk_group),
            float(routed_scaling_factor), bool(apply_weight_on_input), logits,
            int(local_expert_offset), int(num_local_experts), int(max_chunk_tokens),
            finalize, bool(pdl), input_layout, self.max_m, fuse_intermediate_quantization,
            nvfp4_gemm_inputs, fuse_gather)
        self._workspace = None  # (tensor, max_tokens) grown on demand outside capture
        self.handle = MoeLayer._next_handle
        MoeLayer._next_handle += 1
        _live_layers[self.handle] = self

    @property
    def fuses_intermediate_quantization(self):
        """Whether GEMM1 writes GEMM2's fp8 input itself (no quantize kernel between)."""
        return self._native.fuses_intermediate_quantization

    @property
    def fuses_gather(self):
        """Whether GEMM1 reads the token rows through the row map itself (no gather kernel)."""
        return self._native.fuses_gather

    def decodes_nvfp4_inputs(self, tokens):
        """Whether a batch of `tokens` tokens runs the nvfp4 pair's GEMMs on decoded bf16
        inputs (nvfp4_gemm_inputs, "auto" resolved for its size; host only)."""
        return self._native.decodes_nvfp4_inputs(int(tokens))

    def workspace_size(self, max_tokens):
        """Bytes of workspace a batch of up to max_tokens tokens needs."""
        return self._native.workspace_size(int(max_tokens))

    def workspace_layout(self, max_tokens):
        """Byte offsets of the workspace's arrays (dispatch/moe_layer.h,
        MoeLayerWorkspace): topk_ids, topk_weights, offsets, dropped, expanded_to_permuted,
        permuted_to_expanded, rows (what finalize="none" leaves there), chunk_counts,
        gathered (GEMM1's input, the activation format), gathered_scale (its block
        scales), activated (GEMM1's bf16 output), quantized and quantized_scale (GEMM2's
        input for quantized activations), global_scales (fp32 [2]: nvfp4's rcp(g) of
        both inputs); chunk_tokens, row_capacity and bytes."""
        return self._native.workspace_layout(int(max_tokens))

    def _masked(self):
        return self.input_layout == "expert_major_masked"

    def _x_shape(self, x):
        """(T, x's shape) after checking x: [T, H], or [L, max_m, H] (T = L x max_m)."""
        ix = describe(x, "x")
        if self._masked():
            want = (self.num_local_experts, self.max_m, self.hidden)
            sym = f"[L, max_m, H] = {list(want)}"
        else:
            want, sym = (ix.shape[0] if ix.shape else 0, self.hidden), f"[T, H={self.hidden}]"
        if ix.dtype != "bfloat16" or tuple(ix.shape) != want:
            raise _bad("x", f"expected bfloat16 {sym}, got {ix.dtype} {list(ix.shape)}")
        return (_numel(want[:-1]), want)

    def _pointers(self, x, w1, w2, router_logits, routing_bias, topk_ids, topk_weights,
                  alpha, beta, limit, out, workspace, scales=None, masked_counts=None):
        device = self.runtime.device
        t, x_shape = self._x_shape(x)
        if self._masked():
            given = dict(router_logits=router_logits, routing_bias=routing_bias,
                         topk_ids=topk_ids, topk_weights=topk_weights)
            for name in _ROUTING_ARGUMENTS:
                if given[name] is not None:
                    raise _bad(name, "is given, but expert_major_masked input is routed "
                                     "already; pass masked_counts")
            if masked_counts is None:
                raise _bad("masked_counts", "expert_major_masked input needs int32 [L] "
                                            "per-expert row counts on the device")
        elif masked_counts is not None:
            raise _bad("masked_counts", "is for input_layout='expert_major_masked' only")
        h, inter = self.hidden, self.intermediate
        n1 = 2 * inter if self._gated else inter
        n1_name = "2I" if self._gated else "I"
        l = self.num_local_experts
        wf, af = self.weights, self.activations
        scales = scales or {}
        w1_shape, w1_sym = _weight_shape(wf, l, n1, h, n1_name, "H")
        w2_shape, w2_sym = _weight_shape(wf, l, h, inter, "H", "I")
        # The native run's pointer order (MoeLayerArgs'): hidden_states, router_logits,
        # routing_bias, topk_ids, topk_weights, w1, w2, w1_scale, w2_scale,
        # w1_global_scale, w2_global_scale, input_scale, intermediate_scale, w1_bias,
        # w2_bias, alpha, beta, limit, out, workspace.
        checks = [
            (x, "x", ("bfloat16",), x_shape, None),
            (router_logits, "router_logits",
             ("float32",) if self.logits == "fp32" else ("bfloat16",), (t, self.num_experts),
             None),
            (routing_bias, "routing_bias", ("float32",), (self.num_experts,), None),
            (topk_ids, "topk_ids", ("int32",), (t, self.top_k), None),
            (topk_weights, "topk_weights", ("float32",), (t, self.top_k), None),
            (w1, "w1", _ELEMENTS[wf], w1_shape, w1_sym),
            (w2, "w2", _ELEMENTS[wf], w2_shape, w2_sym),
        ]
        pair = f"{wf} x {af}"
        if wf in _BLOCK_SCALES:
            for name, w, n, k, nn, kn in (("w1_scale", "w1", n1, h, n1_name, "H"),
                                          ("w2_scale", "w2", h, inter, "H", "I")):
                shape, sym = _scale_shape(wf, l, n, k, nn, kn)
                checks.append((scales.get(name), name, _BLOCK_SCALES[wf], shape,
                               f"{wf} block scales {sym}", w))
        else:
            checks += [(scales.get(n), n, None, None, pair) for n in ("w1_scale", "w2_scale")]
        if wf in _GLOBAL:
            checks += [(scales.get(name), name, ("float32",), (l,),
                        f"{wf} per-expert dequantization scales [L]", w)
                       for name, w in (("w1_global_scale", "w1"), ("w2_global_scale", "w2"))]
        else:
            checks += [(scales.get(n), n, None, None, pair)
                       for n in ("w1_global_scale", "w2_global_scale")]
        what = ("fp8 dequantization scale s (x ~ q x s)" if af == "fp8" else
                "nvfp4 global quantization scale g = 448 x 6 / amax")
        if af in _GLOBAL:
            checks += [(scales.get(name), name, ("float32",), (1,), f"the {of}'s {what}", None)
                       for name, of in (("input_scale", "GEMM1 input"),
                                        ("intermediate_scale", "GEMM2 input"))]
        else:
            checks += [(scales.get(n), n, None, None, pair)
                       for n in ("input_scale", "intermediate_scale")]
        checks += [
            (scales.get("w1_bias"), "w1_bias", ("float32",), (l, n1), f"[L, {n1_name}]"),
            (scales.get("w2_bias"), "w2_bias", ("float32",), (l, h), "[L, H]"),
        ]
        checks += [
            (alpha, "alpha", ("float32",), (l,), None),
            (beta, "beta", ("float32",), (l,), None),
            (limit, "limit", ("float32",), (l,), None),
            (out, "out", ("bfloat16",), x_shape, None),
            (masked_counts, "masked_counts", ("int32",), (l,), None),
        ]
        ptrs = []
        for check in checks:
            value, name, dtypes, shape, what = check[:5]
            if dtypes is None:  # a scale this pair does not take
                if value is not None:
                    raise _bad(name, f"is given, but {what} takes no such scale; pass None")
                ptrs.append(0)
                continue
            if value is None:
                if len(check) > 5:  # a scale this pair needs
                    hint = (f" (cubist.quantize_weights({check[5]}, {wf!r}) returns it)"
                            if check[5] else "")
                    raise _bad(name, f"{pair} needs {what}: pass {' or '.join(dtypes)} "
                               f"{list(shape)}{hint}")
                ptrs.append(0)
                continue
            info = describe(value, name)
            if info.dtype not in dtypes or tuple(info.shape) != shape:
                raise _bad(name, f"expected {' or '.join(dtypes)} {list(shape)}"
                           f"{f' ({what})' if what else ''}, got {info.dtype} "
                           f"{list(info.shape)}")
            if info.device is not None and info.device != device:
                raise _bad(name, f"is on cuda:{info.device}; this runtime runs on "
                           f"cuda:{device}")
            ptrs.append(info.ptr)
        iw = describe(workspace, "workspace")
        ptrs.insert(len(ptrs) - 1, iw.ptr)  # the native order: ..., out, workspace, counts
        return t, ptrs, _numel(iw.shape) * _itemsize(iw.dtype)

    def _workspace_for(self, x, tokens):
        """The layer's own workspace, from torch's caching allocator, grown to `tokens`."""
        if self._workspace is None or self._workspace[1] < tokens:
            torch = sys.modules["torch"]
            size = self.workspace_size(max(tokens, 1))
            self._workspace = (torch.empty(size, dtype=torch.uint8, device=x.device), tokens)
        return self._workspace[0]

    def prepare(self, max_tokens, w1, w2, *, x=None, router_logits=None, routing_bias=None,
                topk_ids=None, topk_weights=None, w1_scale=None, w2_scale=None,
                w1_global_scale=None, w2_global_scale=None, input_scale=None,
                intermediate_scale=None, w1_bias=None, w2_bias=None, alpha=None, beta=None,
                limit=None, out=None, workspace=None, accumulate=False, stream=None,
                masked_counts=None):
        """Checks the arguments for every batch of up to max_tokens tokens and selects,
        fetches and loads every kernel they need: call it before CUDA-graph capture.
        Also sizes the layer's own workspace for max_tokens. Takes the call's keywords;
        x, router_logits, out and the activation scales (input_scale,
        intermediate_scale) default to placeholders (only the weights and their scales
        must be the ones the calls will pass); accumulate and stream are ignored."""
        del accumulate, stream  # the call's keywords; nothing runs here
        torch = sys.modules.get("torch")
        if x is None:
            shape = ((self.num_local_experts, self.max_m) if self._masked() else (1,))
            x = torch.empty(*shape, self.hidden, dtype=torch.bfloat16, device=w1.device)
        if self._masked():
            if masked_counts is None:
                masked_counts = torch.zeros(self.num_local_experts, dtype=torch.int32,
                                            device=x.device)
        elif router_logits is None and topk_ids is None:
            router_logits = torch.empty(
                x.shape[0], self.num_experts, device=x.device,
                dtype=torch.float32 if self.logits == "fp32" else torch.bfloat16)
        if workspace is None:
            workspace = self._workspace_for(x, max_tokens)
        if out is None:
            out = torch.empty_like(x)
        if self.activations in _GLOBAL:
            if input_scale is None:
                input_scale = torch.ones(1, dtype=torch.float32, device=x.device)
            if intermediate_scale is None:
                intermediate_scale = torch.ones(1, dtype=torch.float32, device=x.device)
        scales = dict(w1_scale=w1_scale, w2_scale=w2_scale, w1_global_scale=w1_global_scale,
                      w2_global_scale=w2_global_scale, input_scale=input_scale,
                      intermediate_scale=intermediate_scale, w1_bias=w1_bias, w2_bias=w2_bias)
        t, ptrs, ws_bytes = self._pointers(
            x, w1, w2, router_logits, routing_bias, topk_ids, topk_weights, alpha, beta,
            limit, out, workspace, scales, masked_counts)
        self._native.run(t, ptrs, ws_bytes, False, 0, int(max_tokens))

    def __call__(self, x, w1, w2, *, router_logits=None, routing_bias=None, topk_ids=None,
                 topk_weights=None, w1_scale=None, w2_scale=None, w1_global_scale=None,
                 w2_global_scale=None, input_scale=None, intermediate_scale=None, w1_bias=None,
                 w2_bias=None, alpha=None, beta=None, limit=None, out=None, accumulate=False,
                 workspace=None, stream=None, masked_counts=None):
        """The layer on x (bfloat16 [T, H]): routed from router_logits [T, E] (+ an fp32
        routing_bias [E] for deepseek_v3), or pre-routed by topk_ids int32 [T, k] and
        topk_weights fp32 [T, k]. Returns out (bfloat16 [T, H], allocated when None);
        accumulate=True adds into it.

        Quantized pairs: w1 [L, N1, H] and w2 [L, H, I] in the weight format (fp8:
        float8_e4m3fn; mxfp4, nvfp4: uint8 [.., K/2], two e2m1 per byte, low nibble
        first), w1_scale / w2_scale their block scales (fp8-block: float32
        [L, ceil(N/128), ceil(K/128)]; mxfp4: uint8 e8m0 [L, N, K/32]; nvfp4: float8_e4m3fn
        or uint8 [L, N, K/16]), w1_global_scale / w2_global_scale float32 [L] (fp8, nvfp4:
        each expert's dequantization scale), as cubist.quantize_weights returns them; for
        fp8 and nvfp4 activations input_scale and intermediate_scale, float32 [1] on the
        device: fp8's dequantization scale s (x ~ q x s), nvfp4's global quantization scale
        g = 448 x 6 / amax (FlashInfer's convention), of GEMM1's and GEMM2's input.

        Biases (gpt-oss): w1_bias float32 [L, N1] (w1's rows) added before the activation,
        w2_bias float32 [L, H] added to GEMM2's rows before the weighted sum.

        input_layout="expert_major_masked": x bfloat16 [L, max_m, H] and masked_counts
        int32 [L] (each expert's valid rows, clamped to 0..max_m on the device), no routing
        tensors and no accumulate; out is [L, max_m, H], its rows past a count untouched
        (torch.empty_like(x) when None: those rows are then uninitialized)."""
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
        scales = dict(w1_scale=w1_scale, w2_scale=w2_scale, w1_global_scale=w1_global_scale,
                      w2_global_scale=w2_global_scale, input_scale=input_scale,
                      intermediate_scale=intermediate_scale, w1_bias=w1_bias, w2_bias=w2_bias)
        t, ptrs, ws_bytes = self._pointers(x, w1, w2, router_logits, routing_bias, topk_ids,
                                           topk_weights, alpha, beta, limit, out, workspace,
                                           scales, masked_counts)
        if stream is None:
            stream = _current_stream(self.runtime.device)
        elif not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", None) or getattr(stream, "ptr", 0)
        self._native.run(t, ptrs, ws_bytes, bool(accumulate), stream, -1)
        return out

    def op(self, x, w1, w2, **kwargs):
        """The same call through torch.ops.cubist.moe (torch.compile-friendly); the same
        keywords as the call (out, accumulate, routing, the scales), without workspace
        and stream (the layer's own workspace, torch's current stream)."""
        if self._masked():
            raise _bad("input_layout", "torch.ops.cubist.moe serves token_major input; call "
                                       "the layer itself for expert_major_masked input")
        from . import ops  # noqa: F401 (registers the op)
        torch = sys.modules["torch"]
        out = kwargs.pop("out", None)
        if out is None:
            out = torch.empty_like(x)
        names = ("router_logits", "routing_bias", "topk_ids", "topk_weights", "alpha",
                 "beta", "limit")
        unknown = set(kwargs) - set(names) - set(SCALE_ARGUMENTS) - {"accumulate"}
        if unknown:
            raise _bad(sorted(unknown)[0], "is not an argument of MoeLayer.op")
        torch.ops.cubist.moe(self.handle, x, w1, w2, out,
                             *(kwargs.get(n) for n in names), bool(kwargs.get("accumulate")),
                             *(kwargs.get(n) for n in SCALE_ARGUMENTS))
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
    Everything indexed by GEMM1's rows moves the same way: the block scales [E, 2I, K/b]
    and the bias [E, 2I] (gpt-oss's gate_up_proj_bias) go through this function too.
    Returns a new contiguous tensor (the input when it is already in cubist's order and
    contiguous), so a layout never runs silently wrong."""
    if layout not in GATED_LAYOUTS:
        raise _bad("layout", f"{layout!r} is not one of {', '.join(GATED_LAYOUTS)}")
    if len(w.shape) not in (2, 3) or w.shape[1] % 2:
        raise _bad("w", f"expected [E, 2I, H] (weights, scales) or [E, 2I] (a bias) with an "
                        f"even row count, got {list(w.shape)}")
    torch = sys.modules["torch"]
    inter = w.shape[1] // 2
    if layout == "up_gate":
        return w.contiguous()
    if layout == "gate_up":
        return torch.cat((w[:, inter:], w[:, :inter]), dim=1).contiguous()
    return torch.cat((w[:, 1::2], w[:, 0::2]), dim=1).contiguous()
