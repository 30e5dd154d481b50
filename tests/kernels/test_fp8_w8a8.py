"""The W8A8 fp8 linear (kernels/fp8_w8a8.py) against float64 arithmetic on the same codes.

Two checks per output. Against x rounded to e4m3 per token as specified (each row over its
largest |x| / 448, to nearest): only the sums' and the output's rounding, K 2^-24 S for K products
summed in fp32 (S = |x| @ |W|^T; the worst case, as the output's 2^-8 |y| is met with no slack at
the bottom of a binade) and 2^-8 |y|. On a GPU the fp8 tensor cores accumulate in fewer bits
(fp8_w8a8.py's docstring), so K 2^-16 S there: an H200's sums came within 60 K 2^-24 S of exact
in gpu_check's 40 cases (benchmarks/results/gpu-*). The per-token scales must be the true
quotient on every device, or the codes differ from the reference's.
Against x itself, the stated error: sum_i |w_i| (2^-4 |x_i| + 2^-10 s), s the row's scale.
torch._scaled_mm runs on a CPU too, so the arithmetic is checked here; on a CUDA card with fp8
tensor cores the same tests check the card's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.kernels import fp8_w8a8
from nanoserve.kernels.quantization import dequantize_weight, quantize_weight


@pytest.fixture(scope="module")
def w8a8_device(device) -> str:
    if device == "cuda" and not fp8_w8a8.has_fp8_tensor_cores(device):
        pytest.skip("this card has no fp8 tensor cores (compute capability below 8.9)")
    return device


def rows_of_any_magnitude(m: int, k: int, seed: int) -> torch.Tensor:
    """bf16 rows whose scales spread over 2^-20..2^20, some values far below their row's largest."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 2.0 ** torch.randint(-20, 21, (m, 1), generator=g).float()
    x = x * 2.0 ** -torch.randint(0, 16, (m, k), generator=g).float() ** (torch.rand(m, k, generator=g) < 0.2)
    return x.to(torch.bfloat16)


def x_as_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 per row, as the kernel is specified to, back in float64."""
    scale = x.float().abs().amax(-1, keepdim=True) / fp8_w8a8.FP8_MAX
    return (x.float() / scale).to(torch.float8_e4m3fn).double() * scale.double()


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 40), k16=st.integers(1, 12), n16=st.integers(1, 6), seed=st.integers(0, 2**16),
       with_bias=st.booleans())
def test_w8a8_is_within_its_stated_error(w8a8_device, m, k16, n16, seed, with_bias):
    k, n = 16 * k16, 16 * n16
    q, scale = quantize_weight(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), "fp8")
    x = rows_of_any_magnitude(m, k, seed)
    bias = torch.randn(n, dtype=torch.bfloat16) if with_bias else None
    got = fp8_w8a8.fp8_w8a8_linear(x.to(w8a8_device), q.to(w8a8_device), scale.to(w8a8_device),
                                   None if bias is None else bias.to(w8a8_device)).cpu()
    w = dequantize_weight(q, scale).double()
    b = 0 if bias is None else bias.double()
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    xa, wa = x.double().abs(), w.abs()
    S = xa @ wa.T
    accumulation = k * (2 ** -24 if w8a8_device == "cpu" else 2 ** -16) * S
    product = x_as_e4m3(x) @ w.T
    exact = product + b
    err = (got.double() - exact).abs()
    # the product is rounded to bf16, then its sum with the bias
    bound = accumulation + 2 ** -8 * exact.abs() + (0 if bias is None else 2 ** -8 * product.abs())
    assert (err <= bound).all(), f"past the rounding of x: worst excess {(err - bound).max().item():.3g}"
    # and x's own rounding within the module's stated error
    s = xa.amax(-1, keepdim=True) / fp8_w8a8.FP8_MAX
    stated = 2 ** -4 * S + 2 ** -10 * s * wa.sum(-1) + bound
    assert ((got.double() - (x.double() @ w.T + b)).abs() <= stated).all()


def test_the_scales_are_the_true_quotient(device):  # any card: the quantization is plain torch
    x = rows_of_any_magnitude(256, 64, seed=1)
    _, scale = fp8_w8a8.quantize_per_token(x.to(device))
    want = (x.double().abs().amax(-1, keepdim=True) / fp8_w8a8.FP8_MAX).float()  # rounded once
    assert torch.equal(scale.cpu(), want)


def test_each_row_keeps_its_largest_value_and_its_own_scale(w8a8_device):
    x = torch.tensor([[3.0, -1.5, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0], [1e-30, -2e-30, 0.0, 5e-31],
                      [-7e4, 2.0, 3e4, 1.0]], device=w8a8_device).to(torch.bfloat16)
    codes, scale = fp8_w8a8.quantize_per_token(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (4, 1)
    assert codes.float().abs().amax(-1).tolist()[0] == 448.0  # the largest value maps to e4m3's largest
    assert codes[1].float().abs().max() == 0
    back = codes.float() * scale
    xs = x.float()
    ok = (back - xs).abs() <= 2 ** -4 * xs.abs() + 2 ** -10 * scale
    assert ok.all()
    assert back[2].abs().max() > 0, "a row of tiny values keeps them: its scale is its own"


def test_a_row_with_inf_or_nan_comes_out_nan_and_no_other(w8a8_device):
    q, scale = quantize_weight(torch.randn(32, 16), "fp8")
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    x[1, 5] = float("inf")
    got = fp8_w8a8.fp8_w8a8_linear(x.to(w8a8_device), q.to(w8a8_device), scale.to(w8a8_device)).cpu()
    assert got[1].isnan().all() and got[[0, 2]].isfinite().all()


def test_only_per_channel_fp8_codes_on_fp8_tensor_cores_run_w8a8_when_asked(monkeypatch):
    fp8, _ = quantize_weight(torch.randn(32, 64), "fp8")
    s1, s2 = torch.ones(32, 1), torch.ones(32, 2)
    int8 = torch.zeros(32, 64, dtype=torch.int8)
    monkeypatch.setenv("NANOSERVE_FP8_W8A8", "1")
    assert not fp8_w8a8.runs_w8a8(fp8, s1)  # a CPU tensor: no fp8 tensor cores
    monkeypatch.setattr(fp8_w8a8, "has_fp8_tensor_cores", lambda device: True)
    assert fp8_w8a8.runs_w8a8(fp8, s1)
    monkeypatch.setenv("NANOSERVE_FP8_W8A8", "0")
    assert not fp8_w8a8.runs_w8a8(fp8, s1)  # weight-only unless asked
    monkeypatch.setenv("NANOSERVE_FP8_W8A8", "1")
    assert not fp8_w8a8.runs_w8a8(int8, s1)
    assert not fp8_w8a8.runs_w8a8(fp8, s2)  # grouped scales
    assert not fp8_w8a8.runs_w8a8(fp8[:24], s1[:24])  # 24 outputs: not a multiple of 16
    assert not fp8_w8a8.runs_w8a8(fp8[:, :40].contiguous(), s1)
