"""GEMM operands with plausible bytes in every format of the family, and the L2-flushed
timing, for benchmarks that time kernels and check nothing against a reference
(bench/fp4_decode_floor.py, bench/kernel_ab.py, bench/moe_layer_bench.py's GEMMs-alone row).

Scales keep every value finite and in range: ue8m0 bytes 120 (2^-7), e4m3 block scales 1,
global and per-tensor scales 0.01, fp8-block scales 0.01. Nothing depends on the values but
the speed of the kernels that read them, which does not.
"""


def timing_operand(torch, fmt, rows, k, lead=None):
    """(data, block scales, global scale) of a [rows, k] operand in `fmt` on the GPU, or of
    [lead, rows, k] with `lead` (the experts of a weight: per-expert global scales
    [lead], fp8-block scales per 128 x 128 block). None where the format has no such
    part. Raises ValueError for a format the family does not have."""
    shp = (lead, rows, k) if lead else (rows, k)
    dev = "cuda"
    # Drawn in bf16, not fp32: DeepSeek-V3's bf16 weights are 15 GB, and an fp32 draw of
    # them (30 GB) beside the previous kernel's operands did not fit an 80 GB card.
    if fmt == "bf16":
        return torch.randn(shp, device=dev, dtype=torch.bfloat16) * 0.5, None, None
    if fmt in ("fp8", "fp8-block", "mxfp8"):
        data = torch.randn(shp, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        if fmt == "fp8":
            return data, None, torch.full((lead or 1,), 0.01, device=dev)
        if fmt == "fp8-block":
            block_rows = 128 if lead else 1  # weights 128 x 128 blocks, activations 1 x 128
            blocks = ((rows + block_rows - 1) // block_rows, (k + 127) // 128)
            return data, torch.full(shp[:-2] + blocks, 0.01, device=dev), None
        return data, torch.full(shp[:-1] + (k // 32,), 120, dtype=torch.uint8, device=dev), None
    if fmt in ("mxfp4", "nvfp4"):
        packed = torch.randint(0, 256, shp[:-1] + (k // 2,), dtype=torch.uint8, device=dev)
        if fmt == "mxfp4":
            return packed, torch.full(shp[:-1] + (k // 32,), 120, dtype=torch.uint8,
                                      device=dev), None
        scales = torch.ones(shp[:-1] + (k // 16,), device=dev).to(torch.float8_e4m3fn)
        return packed, scales, torch.full((lead or 1,), 0.01, device=dev)
    raise ValueError(f"format {fmt!r}: not one of bf16, fp8, fp8-block, mxfp8, mxfp4, nvfp4")


def flushed_us(torch, flush, fn):
    """One run of fn timed with CUDA events, in microseconds, after writing `flush` (a
    buffer larger than the L2, e.g. 256 MiB) so that fn starts with a cold L2."""
    flush.zero_()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000
