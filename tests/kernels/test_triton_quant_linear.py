"""The Triton W8A16 linear against the reference (dequantize, then F.linear), on the interpreter's
small shapes, through each of its three paths (the GEMV for a few rows, the tl.dot tiles, cuBLAS
on a dequantized copy from DEQUANT_ROWS); outputs from NaN-poisoned allocations, so an unwritten
element fails."""

import pytest
import torch
from paged_cases import TOL
from torch import nn

from nanoserve.kernels import quantization

# (rows, in, out, group_size): per-channel scales (None) and GGUF-sized groups, row counts on
# both sides of a tile, widths that leave partial tiles in every dimension
SHAPES = [(1, 64, 48, None), (5, 96, 40, None), (3, 64, 32, 32), (17, 128, 72, 32), (2, 48, 24, 16),
          (2, 1100, 40, None), (300, 64, 48, None), (256, 96, 40, 32)]


@pytest.fixture(scope="module")
def triton_quant(in_process):
    if not in_process:
        pytest.skip("triton was imported before TRITON_INTERPRET was set; see the fresh-process test")
    from nanoserve.kernels import triton_quant_linear
    return triton_quant_linear


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a16_matches_the_reference(triton_quant, device, poisoned, shape, method, dtype, with_bias):
    rows, k, n, group = shape
    q, scale = quantization.quantize_weight(torch.randn(n, k), method, group)
    q, scale = q.to(device), scale.to(device)
    x = torch.randn(rows, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype) if with_bias else None
    got = triton_quant.quantized_linear(x, q, scale, bias)
    want = quantization.quantized_linear(x, q, scale, bias)
    assert got.dtype == dtype and got.shape == (rows, n)
    # the reference rounds each weight to x's dtype before its matmul; the kernel scales fp32 sums
    tol = TOL[dtype] if dtype == torch.float32 else dict(atol=8 * TOL[dtype]["atol"], rtol=TOL[dtype]["rtol"])
    torch.testing.assert_close(got, want, **tol)


def test_w8a16_keeps_leading_dimensions_and_falls_back_where_it_cannot_tile(triton_quant, device):
    q, scale = quantization.quantize_weight(torch.randn(16, 72), "int8", 8)  # groups of 8 < tl.dot's 16
    q, scale = q.to(device), scale.to(device)
    x = torch.randn(2, 3, 72, device=device)
    torch.testing.assert_close(triton_quant.quantized_linear(x, q, scale),
                               quantization.quantized_linear(x, q, scale))
    q, scale = quantization.quantize_weight(torch.randn(16, 64), "int8")
    x = torch.randn(2, 3, 64, device=device)
    got = triton_quant.quantized_linear(x, q.to(device), scale.to(device))
    assert got.shape == (2, 3, 16)
    torch.testing.assert_close(got, quantization.quantized_linear(x, q.to(device), scale.to(device)),
                               **TOL[torch.float32])


def test_pack_quantized_swaps_every_quantized_linear(triton_quant, device):
    class Holder(nn.Module):  # what model/quantization.py's QuantizedLinear holds after loading
        def __init__(self):
            super().__init__()
            q, s = quantization.quantize_weight(torch.randn(32, 64), "fp8")
            self.register_buffer("qweight", q)
            self.register_buffer("weight_scale", s)
            self.bias = None

        def forward(self, x):
            return quantization.quantized_linear(x, self.qweight, self.weight_scale, self.bias)

    model = nn.Sequential(Holder(), nn.ReLU(), nn.Linear(32, 8)).to(device)
    x = torch.randn(4, 64, device=device)
    want = model(x)
    triton_quant.pack_quantized(model)
    assert isinstance(model[0], triton_quant.QuantizedTritonLinear) and isinstance(model[2], nn.Linear)
    torch.testing.assert_close(model(x), want, **TOL[torch.float32])


def test_fp8_codes_take_w8a8_for_bf16_when_asked_where_the_card_multiplies_fp8(triton_quant, device,
                                                                              monkeypatch):
    from nanoserve.kernels import fp8_w8a8
    q, s = quantization.quantize_weight(torch.randn(32, 64), "fp8")
    q, s = q.to(device), s.to(device)
    monkeypatch.setattr(fp8_w8a8, "has_fp8_tensor_cores", lambda device: True)
    monkeypatch.setenv("NANOSERVE_FP8_W8A8", "0")
    assert not triton_quant.QuantizedTritonLinear(q, s, None).w8a8  # weight-only unless asked
    monkeypatch.setenv("NANOSERVE_FP8_W8A8", "1")
    fp8 = triton_quant.QuantizedTritonLinear(q, s, None)
    int8 = triton_quant.QuantizedTritonLinear(*quantization.quantize_weight(torch.randn(32, 64).to(device),
                                                                            "int8"), None)
    assert fp8.w8a8 and not int8.w8a8
    rows = triton_quant.GEMV_ROWS
    x = torch.randn(rows + 1, 64, device=device)
    assert torch.equal(fp8(x.bfloat16()), fp8_w8a8.fp8_w8a8_linear(x.bfloat16(), q, s))
    assert torch.equal(fp8(x), triton_quant.quantized_linear(x, q, s))  # fp32 activations: W8A16
    # a decode's few rows stream the codes through the GEMV: a byte a weight, no per-token scales
    assert torch.equal(fp8(x[:rows].bfloat16()), triton_quant.quantized_linear(x[:rows].bfloat16(), q, s))


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("group", [None, 32])
@pytest.mark.parametrize("rows", [1, 3])
def test_the_gemv_sums_the_same_whatever_its_tile_and_split(triton_quant, device, poisoned, method, group,
                                                           rows):
    q, scale = quantization.quantize_weight(torch.randn(40, 544), method, group)
    q, scale = q.to(device), scale.to(device)
    x = torch.randn(rows, 544, device=device)
    want = quantization.quantized_linear(x, q, scale)
    for block_n, block_k, split_k in [(16, 512, 1), (8, 64, 3), (32, 128, 5), (16, 256, None)]:
        got = triton_quant.gemv(x, q, scale, None, block_n=block_n, block_k=block_k, split_k=split_k)
        torch.testing.assert_close(got, want, **TOL[torch.float32], msg=f"{block_n, block_k, split_k}")


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("group", [None, 32])
@pytest.mark.parametrize("with_bias", [False, True])
# a partial tile of rows in bf16 (each orientation's other masks), and two tiles of rows
@pytest.mark.parametrize("rows,dtype", [(5, torch.float32), (40, torch.bfloat16), (70, torch.float32)])
def test_the_tiles_sum_the_same_whatever_their_shape_split_and_orientation(triton_quant, device, poisoned,
                                                                            method, group, with_bias, rows,
                                                                            dtype):
    q, scale = quantization.quantize_weight(torch.randn(72, 544), method, group)
    q, scale = q.to(device), scale.to(device)
    x = torch.randn(rows, 544, device=device).to(dtype)
    bias = torch.randn(72, device=device).to(dtype) if with_bias else None
    w = quantization.dequantize_weight(q, scale).double()
    want = x.double() @ w.T + (0 if bias is None else bias.double())
    bound = 544 * 2 ** -24 * (x.double().abs() @ w.abs().T) + 2 ** -24 * want.abs()  # fp32 sums, any order
    if dtype == torch.bfloat16:
        bound += 2 ** -7 * want.abs()  # the fp32 sum stored once in bf16 (the interpreter truncates)
    for block_n, block_k, split_k, swap_ab in [(32, 64, 1, False), (16, 128, 3, False), (64, 256, 5, False),
                                               (32, 64, None, False), (64, 128, 1, True), (16, 64, 3, True)]:
        got = triton_quant.tiled(x, q, scale, bias, block_k=block_k, block_n=block_n, split_k=split_k,
                                 swap_ab=swap_ab)
        assert got.dtype == dtype and got.shape == (rows, 72)
        assert ((got.double() - want).abs() <= bound).all(), (block_n, block_k, split_k, swap_ab)


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_the_references_every_code(triton_quant, device, poisoned, method, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8)
    codes[codes.view(torch.uint8) & 0x7F == 0x7F] = 0  # e4m3's NaNs: the quantizer never writes them
    q = codes.view(quantization.CODE_DTYPES[method]).repeat(3, 2)  # (3, 512): every code, 3 rows
    scale = torch.tensor([[0.5, 3.0, 1e-3, 7.0], [1.0, 2.0 ** -20, 2.0 ** 10, 0.1], [1.5, 1.5, 1.5, 1.5]])
    q, scale = q.to(device), scale.to(device)
    got = triton_quant.dequantize(q, scale, dtype).float()
    want = quantization.dequantize_weight(q, scale, dtype).float()
    if dtype == torch.bfloat16 and device == "cpu":  # the interpreter's bf16 rounding is not torch's
        torch.testing.assert_close(got, want, atol=0, rtol=2 ** -7)  # an ulp
    else:  # code * scale in fp32, rounded once
        assert torch.equal(got, want)


def test_each_batch_goes_to_its_path(triton_quant, device, monkeypatch):
    q, s = quantization.quantize_weight(torch.randn(16, 64), "int8")
    q, s = q.to(device), s.to(device)
    taken = []
    for name in ("gemv", "tiled", "dequantize"):
        real = getattr(triton_quant, name)
        monkeypatch.setattr(triton_quant, name, lambda *a, _real=real, _name=name, **kw: (
            taken.append(_name), _real(*a, **kw))[1])
    g, d = triton_quant.GEMV_ROWS, triton_quant.DEQUANT_ROWS
    for rows in (1, g, g + 1, d - 1, d):
        triton_quant.quantized_linear(torch.randn(rows, 64, device=device), q, s)
    assert taken == ["gemv", "gemv", "tiled", "tiled", "dequantize"]


def test_no_rows_give_no_rows(triton_quant, device):
    q, s = quantization.quantize_weight(torch.randn(16, 64), "int8")
    got = triton_quant.quantized_linear(torch.empty(0, 64, device=device), q.to(device), s.to(device))
    assert got.shape == (0, 16)
