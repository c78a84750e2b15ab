"""cubist.quantize_weights on the CPU: each format's bytes for small inputs worked out by
hand from the formats' definitions (python/cubist/_quantize.py, dispatch/reference.cc's
Quantize). Needs torch (any build; the CPU is enough); skips without it. test_gpu.py
checks that the GPU gives the same bytes."""
import pytest

torch = pytest.importorskip("torch")

import cubist  # noqa: E402


def u8(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def f32(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_e4m3_rounds_to_nearest_even_and_saturates():
    q = cubist._quantize
    x = f32(0.0, -0.0, 1.0, 448.0, 500.0, -1000.0, float("inf"), float("nan"),
            2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875, 464.0, -0.0004)
    want = [0x00, 0x80, 0x38, 0x7E, 0x7E, 0xFE, 0x7E, 0x7F,
            0x01, 0x00, 0x02, 0x38, 0x3A, 0x7E, 0x80]
    # 2^-10: halfway between 0 and the smallest subnormal 2^-9 -> 0 (even); 3 x 2^-10:
    # between codes 1 and 2 -> 2; 1.0625 between 1 (0x38) and 1.125 (0x39) -> 0x38;
    # 1.1875 between 0x39 and 1.25 (0x3A) -> 0x3A; 464 between 448 and 480 -> 448
    # (even); -0.0004 (under 2^-10) rounds to -0.
    assert q.e4m3_codes(torch, x).tolist() == want
    back = q.e4m3_values(torch, torch.tensor(want, dtype=torch.uint8))
    assert back[2].item() == 1.0 and back[3].item() == 448.0 and back[8].item() == 2.0 ** -9
    assert torch.isnan(back[7])


def test_e2m1_rounds_to_nearest_even_and_saturates():
    q = cubist._quantize
    x = f32(0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 100.0, -0.75, -0.0,
            float("nan"), -6.0)
    want = [0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 0xA, 0x8, 0, 0xF]
    assert q.e2m1_codes(torch, x).tolist() == want
    assert q.e2m1_values(torch, torch.tensor(want, dtype=torch.uint8)).tolist() == [
        0, 0.5, 1, 1, 2, 2, 4, 4, 6, 6, -1, -0.0, 0, -6]


def test_fp8_per_expert_scale_is_amax_over_448():
    w = torch.zeros(2, 2, 2)
    w[0] = torch.tensor([[1.0, -2.0], [0.5, 4.0]])  # expert 1 stays zero: global 1
    data, scale, glob = cubist.quantize_weights(w, "fp8")
    assert scale is None
    assert torch.equal(glob, torch.stack((f32(4.0)[0] / f32(448.0)[0], f32(1.0)[0])))
    # w / (4/448): 112, -224, 56, 448 -> e4m3 0x6E, 0xF6, 0x66, 0x7E
    assert u8(data).tolist() == [[[0x6E, 0xF6], [0x66, 0x7E]], [[0, 0], [0, 0]]]
    if hasattr(torch, "float8_e4m3fn"):
        assert data.dtype == torch.float8_e4m3fn


def test_fp8_block_scales_are_per_128x128_block_with_partial_edges():
    w = torch.zeros(1, 130, 130)
    w[0, 0, 0] = 448.0     # block (0, 0): s = 1
    w[0, 5, 128] = -0.5    # block (0, 1): s = 0.5 / 448
    w[0, 129, 129] = 896.0  # block (1, 1), 2 x 2 elements: s = 2; block (1, 0): zeros, s = 1
    w[0, 129, 0] = 0.0
    data, scale, glob = cubist.quantize_weights(w, "fp8-block")
    assert glob is None and scale.dtype == torch.float32 and scale.shape == (1, 2, 2)
    assert torch.equal(scale[0], torch.stack((
        torch.stack((f32(1.0)[0], f32(0.5)[0] / f32(448.0)[0])),
        torch.stack((f32(1.0)[0], f32(2.0)[0])))))
    d = u8(data)[0]
    assert d.shape == (130, 130)
    assert (d[0, 0].item(), d[5, 128].item(), d[129, 129].item()) == (0x7E, 0xFE, 0x7E)
    assert int((d != 0).sum()) == 3


def test_mxfp4_shared_exponent_and_packing():
    w = torch.zeros(1, 2, 64)
    # Block 0: amax 6 -> floor(log2 6) - 2 = 0, scale byte 127; elements as they are.
    w[0, 0, :8] = f32(0.25, 0.75, -1.25, 6.0, 5.0, 3.5, 0.0, -0.0)
    # Block 1: amax 0.375 -> floor(log2 0.375) - 2 = -4, byte 123; elements x 16.
    w[0, 0, 32:35] = f32(0.375, 0.1, -0.03125)  # 6 -> 7, 1.6 -> 1.5 (3), -0.5 -> 0x9
    data, scale, glob = cubist.quantize_weights(w, "mxfp4")  # row 1: zeros, byte 127
    assert glob is None and data.dtype == torch.uint8 and scale.dtype == torch.uint8
    assert scale.tolist() == [[[127, 123], [127, 127]]]
    assert data.shape == (1, 2, 32)
    row = data[0, 0].tolist()  # element 2i in the low nibble, 2i + 1 in the high one
    assert row[:4] == [0x20, 0x7A, 0x66, 0x80] and row[16:18] == [0x37, 0x09]
    assert row[4:16] == [0] * 12 and row[18:] == [0] * 14 and data[0, 1].tolist() == [0] * 32
    back = cubist.dequantize_weights(data, scale, glob, "mxfp4")
    assert back[0, 0, :8].tolist() == [0.0, 1.0, -1.0, 6.0, 4.0, 4.0, 0.0, -0.0]
    assert back[0, 0, 32:35].tolist() == [0.375, 0.09375, -0.03125]


def test_mxfp4_tiny_blocks_clamp_the_exponent():
    w = torch.zeros(1, 1, 32)
    w[0, 0, 0] = 3 * 2.0 ** -128  # floor(log2) - 2 = -129 -> clamped to -127: byte 0
    data, scale, _ = cubist.quantize_weights(w, "mxfp4")
    assert scale.tolist() == [[[0]]]
    assert data[0, 0, 0].item() == 3  # 3 x 2^-128 x 2^127 = 1.5 (unclamped: 6, code 7)


def test_nvfp4_global_and_block_scales():
    w = torch.zeros(2, 1, 32)
    # Expert 0: amax 2688 = 448 x 6 -> global 1. Block 0: e4m3(2688 / 6) = 448 (0x7E),
    # elements / 448; block 1: amax 3 -> e4m3(0.5) = 0x30, elements / 0.5.
    w[0, 0, :4] = f32(2688.0, 448.0, -672.0, 224.0)      # 6, 1, -1.5, 0.5 -> 7, 2, 0xB, 1
    w[0, 0, 16:20] = f32(3.0, 1.0, -0.25, 0.3)         # 6, 2, -0.5, 0.6 -> 7, 4, 0x9, 1
    w[1] = w[0] / 16  # expert 1: global 168 / 2688 = 1/16, the same scales and elements
    data, scale, glob = cubist.quantize_weights(w, "nvfp4")
    assert glob.tolist() == [1.0, 0.0625]
    sc = u8(scale)
    assert sc.shape == (2, 1, 2) and sc[0].tolist() == [[0x7E, 0x30]] and torch.equal(sc[0], sc[1])
    if hasattr(torch, "float8_e4m3fn"):
        assert scale.dtype == torch.float8_e4m3fn
    assert data.dtype == torch.uint8 and data.shape == (2, 1, 16)
    row = data[0, 0].tolist()
    assert row[:2] == [0x27, 0x1B] and row[8:10] == [0x47, 0x19]
    assert row[2:8] == [0] * 6 and row[10:] == [0] * 6 and torch.equal(data[0], data[1])
    back = cubist.dequantize_weights(data, scale, glob, "nvfp4")
    assert back[0, 0, :4].tolist() == [2688.0, 448.0, -672.0, 224.0]
    assert back[1, 0, 16:20].tolist() == [3.0 / 16, 1.0 / 16, -0.25 / 16, 0.25 / 16]


def test_zero_experts_and_bf16():
    data, scale, glob = cubist.quantize_weights(torch.zeros(0, 16, 64), "nvfp4")
    assert data.shape == (0, 16, 32) and scale.shape == (0, 16, 4) and glob.shape == (0,)
    w = torch.randn(2, 4, 32)
    data, scale, glob = cubist.quantize_weights(w, "bf16")
    assert data.dtype == torch.bfloat16 and scale is None and glob is None


@pytest.mark.parametrize("fmt, tol", [("fp8", 0.04), ("fp8-block", 0.04), ("mxfp8", 0.04),
                                      ("mxfp4", 0.2), ("nvfp4", 0.15)])
def test_dequantized_weights_are_close(fmt, tol):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(3, 200, 256, generator=g) * 0.05).to(torch.bfloat16)
    back = cubist.dequantize_weights(*cubist.quantize_weights(w, fmt), fmt)
    assert back.dtype == torch.float32 and back.shape == w.shape
    assert ((back - w.float()).norm() / w.float().norm()).item() < tol


@pytest.mark.parametrize("w, fmt, error", [
    (torch.zeros(2, 4, 48), "mxfp4",
     r"^w: K = 48 must be a multiple of 32 for mxfp4 \(32-element blocks along K\)$"),
    (torch.zeros(2, 4, 24), "nvfp4", r"^w: K = 24 must be a multiple of 16 for nvfp4"),
    (torch.zeros(4, 32), "fp8", r"^w: expected a floating-point torch tensor \[L, N, K\], "
                                r"got torch.float32 \[4, 32\]$"),
    (torch.zeros(1, 4, 32, dtype=torch.int32), "fp8", r"^w: expected a floating-point"),
    (torch.zeros(1, 4, 32), "int4", r"^format: 'int4' is not one of bf16, fp8, fp8-block"),
])
def test_errors_name_the_argument(w, fmt, error):
    with pytest.raises(cubist.InvalidArgumentError, match=error):
        cubist.quantize_weights(w, fmt)
