"""cubist.quantize_weights: expert weights into the weight formats of the MoE kernels.

    w1q, w1_scale, w1_global = cubist.quantize_weights(w1, "nvfp4")   # w1 [L, N, K]
    w = cubist.dequantize_weights(w1q, w1_scale, w1_global, "nvfp4")  # float32 [L, N, K]

Runs with torch on the tensor's device (the GPU, or the CPU) and gives exactly the bytes
of the C++ reference quantizer (dispatch/reference.cc, `Quantize`, as
`QuantizeLayerWeights` applies it: each expert on its own, fp8-block in 128x128 blocks) in
the layout the moe_gemm kernels read (kernels/moe_gemm_abi.h): row-major, K contiguous,
fp4 two per byte low nibble first, block scales [L, N, K/block]. Every operation is one
fp32 operation rounded to nearest even (divisions are true divisions, never a multiply
by a reciprocal), so the CPU and the GPU agree bit for bit.

Formats (per expert e; amax = the largest |w| of the set named, NaN ignored):
    fp8        elements e4m3(w / g), g = amax_e / 448 (1 when amax_e = 0)   global [L]
    fp8-block  per 128x128 block b: s_b = amax_b / 448 (1 when 0),
               elements e4m3(w / s_b)                       scale fp32 [L, ceil(N/128), ceil(K/128)]
    mxfp4      per 32 elements of a row (OCP MX): shared exponent
               x = clamp(floor(log2 amax_b) - 2, -127, 127) (0 when amax_b = 0), scale byte
               x + 127 (e8m0), elements e2m1(w * 2^-x)      scale uint8 [L, N, K/32]
    mxfp8      the same with floor(log2 amax_b) - 8 and e4m3 elements
    nvfp4      g = amax_e / (448 x 6) (1 when 0), the dequantization scale (global [L]);
               per 16 elements of a row: scale e4m3(amax_b / 6 / g), s = scale x g,
               elements e2m1(w / s) (0 when s = 0)          scale float8_e4m3fn [L, N, K/16]
e4m3 rounds to nearest even and saturates at +-448 (NaN -> 0x7F); e2m1 (+-{0, 0.5, 1,
1.5, 2, 3, 4, 6}) rounds to nearest even and saturates at +-6 (NaN -> 0). A weight is
w ~ element x block scale x global scale.
"""
import sys

from ._errors import InvalidArgumentError

WEIGHT_FORMATS = ("bf16", "fp8", "fp8-block", "mxfp4", "mxfp8", "nvfp4")
_FLT_MAX = 3.4028234663852886e38
_CHUNK_ELEMENTS = 1 << 26  # experts are quantized in chunks of about this many weights


def _bad(name, what):
    return InvalidArgumentError(f"{name}: {what}")


def _torch():
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811 (the caller has tensors: torch is there)
    return torch


def _const(torch, ref, value):
    """`value` as a float32 tensor on ref's device: arithmetic with a device tensor, so
    that torch divides (a CPU scalar divisor becomes a multiply by its reciprocal on
    CUDA)."""
    return torch.tensor(value, dtype=torch.float32, device=ref.device)


def _pow2(torch, exponent):
    """2^exponent as float32 from an int32 tensor in [-126, 127], exactly (bit pattern)."""
    return ((exponent + 127) << 23).view(torch.float32)


def _abs_no_nan(torch, x):
    a = x.abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a)


def _encode_magnitude(torch, a, mbits, bias, max_code):
    """dispatch/reference.cc's EncodeMagnitude on a float32 tensor a >= 0 (no NaN): the
    round-to-nearest-even code of a small float format, saturating at max_code."""
    a = torch.clamp(a, max=_FLT_MAX)  # inf saturates like the largest float
    _, ex = torch.frexp(a)  # a = f x 2^ex, f in [0.5, 1)
    e = torch.clamp(ex - 1, min=1 - bias)
    q = torch.round(a * _pow2(torch, mbits - e))  # exact scaling; round: ties to even
    one = float(1 << mbits)
    code = (e + bias).float() * one + q - one
    code = torch.where(a == 0, torch.zeros_like(code), code)
    return torch.clamp(code, max=float(max_code)).to(torch.uint8)


def e4m3_codes(torch, x):
    """float32 -> e4m3 (OCP fn) bytes: nearest even, saturating at +-448, NaN -> 0x7F."""
    nan = torch.isnan(x)
    mag = _encode_magnitude(torch, _abs_no_nan(torch, x), 3, 7, 0x7E)
    code = mag | (torch.signbit(x).to(torch.uint8) << 7)
    return torch.where(nan, torch.full_like(code, 0x7F), code)


def e2m1_codes(torch, x):
    """float32 -> e2m1 nibbles (uint8 0..15): nearest even, saturating at +-6, NaN -> 0."""
    nan = torch.isnan(x)
    mag = _encode_magnitude(torch, _abs_no_nan(torch, x), 1, 1, 7)
    code = mag | (torch.signbit(x).to(torch.uint8) << 3)
    return torch.where(nan, torch.zeros_like(code), code)


def _e4m3_value(bits):
    s, e, m = bits >> 7, (bits >> 3) & 0xF, bits & 7
    if e == 0xF and m == 7:
        return float("nan")
    mag = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if s else mag


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _decode(torch, codes, table):
    return torch.tensor(table, dtype=torch.float32, device=codes.device)[codes.long()]


def e4m3_values(torch, codes):
    return _decode(torch, codes, [_e4m3_value(b) for b in range(256)])


def e2m1_values(torch, nibbles):
    return _decode(torch, nibbles, [(-1 if b & 8 else 1) * _E2M1_VALUES[b & 7]
                                    for b in range(16)])


def ue8m0_values(torch, codes):
    return _decode(torch, codes, [2.0 ** (b - 127) if b != 0xFF else float("nan")
                                  for b in range(256)])


def _pack(torch, nibbles):
    """[..., K] nibbles -> [..., K/2] bytes, element 2i in the low nibble."""
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).contiguous()


def _unpack(torch, data):
    b = _bytes(torch, data)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])


def _bytes(torch, t):
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _fp8_dtype(torch, codes):
    dt = getattr(torch, "float8_e4m3fn", None)  # torch 2.1 and newer
    return codes.view(dt) if dt is not None else codes


def _quantize_fp8(torch, x):
    amax = _abs_no_nan(torch, x).amax(dim=(1, 2))
    g = torch.where(amax > 0, amax / _const(torch, x, 448.0), torch.ones_like(amax))
    return _fp8_dtype(torch, e4m3_codes(torch, x / g[:, None, None])), None, g


def _quantize_fp8_block(torch, x):
    l, n, k = x.shape
    nb, kb = -(-n // 128), -(-k // 128)
    a = torch.zeros(l, nb * 128, kb * 128, dtype=torch.float32, device=x.device)
    a[:, :n, :k] = _abs_no_nan(torch, x)
    amax = a.view(l, nb, 128, kb, 128).amax(dim=(2, 4))
    s = torch.where(amax > 0, amax / _const(torch, x, 448.0), torch.ones_like(amax))
    full = s.repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)[:, :n, :k]
    return _fp8_dtype(torch, e4m3_codes(torch, x / full)), s.contiguous(), None


def _quantize_mx(torch, x, fp4):
    l, n, k = x.shape
    xb = x.reshape(l, n, k // 32, 32)
    amax = _abs_no_nan(torch, xb).amax(dim=3)
    _, ex = torch.frexp(amax)
    se = torch.clamp(ex - 1 - (2 if fp4 else 8), min=-127, max=127)
    se = torch.where(amax > 0, se, torch.zeros_like(se))
    # 2^-se: se <= 125 for any finite amax, so -se is in [-125, 127].
    q = (xb * _pow2(torch, -se)[..., None]).reshape(l, n, k)
    scale = (se + 127).to(torch.uint8).contiguous()
    if fp4:
        return _pack(torch, e2m1_codes(torch, q)), scale, None
    return _fp8_dtype(torch, e4m3_codes(torch, q)), scale, None


def _quantize_nvfp4(torch, x):
    l, n, k = x.shape
    a = _abs_no_nan(torch, x)
    amax = a.amax(dim=(1, 2))
    g = torch.where(amax > 0, amax / _const(torch, x, 448.0 * 6.0), torch.ones_like(amax))
    bmax = a.reshape(l, n, k // 16, 16).amax(dim=3)
    sc = e4m3_codes(torch, bmax / _const(torch, x, 6.0) / g[:, None, None])
    s = (e4m3_values(torch, sc) * g[:, None, None])[..., None]
    xb = x.reshape(l, n, k // 16, 16)
    q = torch.where(s > 0, xb / s, torch.zeros_like(xb)).reshape(l, n, k)
    return _pack(torch, e2m1_codes(torch, q)), _fp8_dtype(torch, sc), g


def quantize_weights(w, format):
    """Quantizes expert weights w ([L, N, K], bfloat16 or float32, any device torch
    runs on) into `format`, each expert on its own, exactly as cubist's reference
    quantizer does (see this module's docstring for each format's rule).

    Returns (data, scale, global_scale), on w's device, as MoeLayer / MoeGemm take them:
      bf16       bfloat16 [L, N, K], None, None
      fp8        float8_e4m3fn [L, N, K], None, float32 [L] (dequantization scale)
      fp8-block  float8_e4m3fn [L, N, K], float32 [L, ceil(N/128), ceil(K/128)], None
      mxfp4      uint8 [L, N, K/2], uint8 (e8m0) [L, N, K/32], None
      mxfp8      float8_e4m3fn [L, N, K], uint8 (e8m0) [L, N, K/32], None
      nvfp4      uint8 [L, N, K/2], float8_e4m3fn [L, N, K/16], float32 [L]
    (uint8 stands in for float8_e4m3fn on a torch without it.) For the MoE layer, w1
    and w2 are quantized apart: quantize_weights(w1, f) and quantize_weights(w2, f)."""
    torch = _torch()
    if format not in WEIGHT_FORMATS:
        raise _bad("format", f"{format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or not w.is_floating_point():
        what = (f"{w.dtype} {list(w.shape)}" if isinstance(w, torch.Tensor)
                else type(w).__name__)
        raise _bad("w", f"expected a floating-point torch tensor [L, N, K], got {what}")
    l, n, k = w.shape
    block = {"mxfp4": 32, "mxfp8": 32, "nvfp4": 16}.get(format)
    if block and k % block:
        raise _bad("w", f"K = {k} must be a multiple of {block} for {format} ({block}-element "
                   f"blocks along K)")
    if format == "bf16":
        return w.to(torch.bfloat16).contiguous(), None, None
    quantize = {"fp8": _quantize_fp8, "fp8-block": _quantize_fp8_block,
                "mxfp4": lambda t, x: _quantize_mx(t, x, True),
                "mxfp8": lambda t, x: _quantize_mx(t, x, False),
                "nvfp4": _quantize_nvfp4}[format]
    if l == 0:
        data, scale, glob = quantize(torch, torch.zeros(1, n, k, device=w.device))
        return tuple(None if v is None else v[:0] for v in (data, scale, glob))
    per = max(1, _CHUNK_ELEMENTS // max(1, n * k))
    parts = [quantize(torch, w[e:e + per].float()) for e in range(0, l, per)]
    return tuple(None if parts[0][i] is None else
                 torch.cat([p[i] for p in parts]) if len(parts) > 1 else parts[0][i]
                 for i in range(3))


def dequantize_weights(data, scale, global_scale, format):
    """The weights quantize_weights returned, decoded: float32 [L, N, K] on their
    device, element x block scale x global scale (what the kernels multiply with)."""
    torch = _torch()
    if format not in WEIGHT_FORMATS:
        raise _bad("format", f"{format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if format == "bf16":
        return data.float()
    if format in ("mxfp4", "nvfp4"):
        v = e2m1_values(torch, _unpack(torch, data))
    else:
        v = e4m3_values(torch, _bytes(torch, data))
    l, n, k = v.shape
    if format == "fp8-block":
        s = scale.float().repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
        v = v * s[:, :n, :k]
    elif format in ("mxfp4", "mxfp8"):
        v = (v.reshape(l, n, k // 32, 32) * ue8m0_values(torch, _bytes(torch, scale))[..., None])
    elif format == "nvfp4":
        v = v.reshape(l, n, k // 16, 16) * e4m3_values(torch, _bytes(torch, scale))[..., None]
    v = v.reshape(l, n, k)
    if format in ("fp8", "nvfp4"):
        v = v * global_scale.float()[:, None, None]
    return v


def _quantize_activations(x, format, scale=1.0):
    """GEMM inputs as the layer's moe_quantize kernels make them
    (dispatch/moe_quantize_reference.cc, QuantizeActivations): float32 rows x [R, K] ->
    the values the GEMM multiplies with (float32 [R, K]: element x block scale x global).
    `scale`: fp8's dequantization scale s, nvfp4's global quantization scale g."""
    torch = _torch()
    x = x.float()
    r, k = x.shape
    one = _const(torch, x, 1.0)
    if format == "bf16":
        return x
    if format == "fp8":
        s = _const(torch, x, float(scale))
        return e4m3_values(torch, e4m3_codes(torch, x * (one / s))) * s
    block = {"fp8-block": 128, "mxfp8": 32, "nvfp4": 16}[format]
    nb = -(-k // block)
    xp = torch.zeros(r, nb * block, dtype=torch.float32, device=x.device)
    xp[:, :k] = x
    xb = xp.view(r, nb, block)
    amax = _abs_no_nan(torch, xb).amax(dim=2)
    if format == "fp8-block":
        s = torch.clamp(amax, min=1e-4) / _const(torch, x, 448.0)
        q = e4m3_values(torch, e4m3_codes(torch, xb * (one / s)[..., None]))
        return (q * s[..., None]).reshape(r, nb * block)[:, :k]
    if format == "mxfp8":
        biased = (amax.view(torch.int32) >> 23) & 0xFF
        byte = torch.where(biased > 8, biased - 8, torch.zeros_like(biased))
        q = e4m3_values(torch, e4m3_codes(torch, xb * _pow2(torch, 127 - byte)[..., None]))
        s = ue8m0_values(torch, byte)  # 2^(byte - 127), down to 2^-127 (subnormal)
        return (q * s[..., None]).reshape(r, nb * block)[:, :k]
    # nvfp4
    g = _const(torch, x, float(scale))
    inv_g = one / g
    sf = e4m3_values(torch, e4m3_codes(torch, g * (amax * (one / _const(torch, x, 6.0)))))
    f = torch.where(sf != 0, one / (sf * inv_g), torch.zeros_like(sf))
    q = e2m1_values(torch, e2m1_codes(torch, xb * f[..., None]))
    return (q * sf[..., None] * inv_g).reshape(r, nb * block)[:, :k]
