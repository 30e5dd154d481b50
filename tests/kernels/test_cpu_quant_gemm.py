"""Quantized linears on the C++ ops (cpu_quant_gemv.cpp, cpu_quant_gemm.py) against the reference
(kernels/quantization.py: dequantize, then F.linear), the fallbacks, and builds for other CPU classes.

Tolerances, per output, with S = |x| @ |W|^T (the sum of the products' magnitudes): fp32 sums in
another order, 1e-5 S. bf16: the reference rounds each dequantized weight to bf16 (2^-9 relative),
the GEMV keeps it in fp32, and both round the output once (2^-8 relative), so 2^-8 S + 2^-7 |y|.
int8 codes times bf16 x on x86 take x as 16-bit integers in blocks of 32 (cpu_quant_gemv.cpp's
int16_x): each x value off by at most 2^-15 of its block's largest magnitude B, so + 2^-15 B @ |W|^T.
The AMX matmul (cpu_quant_gemv.cpp's amx) sums as the GEMV does (one scale a row: the codes exact
in bf16, the scale on the fp32 sum) or multiplies in the reference's bf16 weights (grouped scales):
within the same bounds. Dequantization into the buffer is the reference's arithmetic (code * scale
in fp32, rounded once): equal exactly, for every one of the 256 fp8 codes too.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.kernels import cpu_build, cpu_quant_gemm
from nanoserve.kernels.quantization import dequantize_weight, quantize_weight, quantized_linear

pytestmark = pytest.mark.skipif(not cpu_build.available(),
                                reason=f"C++ ops not built: {cpu_build.unavailable_reason()}")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def within(got, x, q, s, bias):
    want = quantized_linear(x, q, s, bias).float()
    S = x.float().abs() @ dequantize_weight(q, s).abs().T
    tol = 1e-5 * S + 1e-6 if x.dtype == torch.float32 else 2 ** -8 * S + 2 ** -7 * want.abs() + 1e-6
    if x.dtype == torch.bfloat16 and q.dtype == torch.int8 and x.shape[1] % 32 == 0:
        tol = tol + 2 ** -15 * block_largest(x) @ dequantize_weight(q, s).abs().T
    return bool(((got.float() - want).abs() <= tol).all()), (got.float() - want).abs().max().item()


def block_largest(x):
    """Each value's block's largest magnitude, blocks of 32 along a row."""
    b = x.float().abs().view(x.shape[0], -1, 32).amax(-1, keepdim=True)
    return b.expand(-1, -1, 32).reshape(x.shape)


def make(out, inp, method, group, dtype, bias, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * torch.rand(out, 1, generator=g)
    q, s = quantize_weight(w, method, group)
    b = torch.randn(out, generator=g).to(dtype) if bias else None
    return q, s, b


@settings(max_examples=40, deadline=None)
@given(rows=st.sampled_from([1, 2, 3, 5, 8, 9, 17]), inp=st.sampled_from([8, 40, 96, 264, 768]),
       out=st.sampled_from([1, 31, 129, 200]), method=st.sampled_from(["int8", "fp8"]),
       grouped=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       bias=st.booleans(), seed=st.integers(0, 999))
def test_matches_the_reference(rows, inp, out, method, grouped, dtype, bias, seed):
    group = 8 if grouped and inp % 32 else 32 if grouped else None
    q, s, b = make(out, inp, method, group, dtype, bias, seed)
    layer = cpu_quant_gemm.QuantizedCpuLinear(q, s, b, cpu_quant_gemm.DequantBuffer(q.numel()))
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    got = layer(x)
    assert got.dtype == dtype and got.shape == (rows, out)
    ok, err = within(got, x, q, s, b)
    assert ok, f"max error {err:.3g}"
    assert torch.equal(layer(x.view(1, rows, inp)).view(rows, out), got)  # 3-D input, same rows


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("group,inp", [(64, 192), (40, 200), (96, 288)])
def test_the_gemv_with_several_groups_a_row(method, group, inp):
    """Groups of whole steps of 32 codes, with a rest, or both, three or more a row: the GEMV sums
    a group's chains at two scales (its first three at 2^-24, cpu_quant_gemv.cpp's Int8Code::load32)
    and starts the next group's at zero."""
    q, s, b = make(37, inp, method, group, torch.float32, True, group)
    x = torch.randn(2, inp, generator=torch.Generator().manual_seed(inp))
    for rows in (1, 2):
        y = torch.empty(rows, 37)
        torch.ops.nanoserve_cpu.quant_gemv(y, x[:rows].contiguous(), q, s, b)
        ok, err = within(y, x[:rows], q, s, b)
        assert ok, f"max error {err:.3g}"


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_code_at_every_position_exactly(method, dtype):
    """x one-hot at each of 128 positions (8 rows a call) picks one code a row: every code (but
    e4m3's two NaN codes, which the quantizer never writes) at every position of two 64-value blocks
    comes out as its value times the (power-of-two) scale, exactly. Catches a wrong table entry, a
    lane order the staged x does not match, a sign mishandled."""
    codes = (torch.arange(256).view(256, 1) + torch.arange(128).view(1, 128)) % 256
    if method == "fp8":  # 0 in place of the NaN codes: a NaN weight times a zero x is NaN
        codes[(codes & 0x7F) == 0x7F] = 0
    q = codes.to(torch.uint8).view(torch.int8 if method == "int8" else torch.float8_e4m3fn)
    s = torch.full((256, 1), 0.25)
    want = dequantize_weight(q, s).T  # (128 positions, 256 rows)
    for j in range(0, 128, 8):
        x = torch.zeros(8, 128, dtype=dtype)
        x[torch.arange(8), j + torch.arange(8)] = 1
        y = torch.empty(8, 256, dtype=dtype)
        torch.ops.nanoserve_cpu.quant_gemv(y, x, q, s, None)
        w = want[j:j + 8].to(dtype).float()
        assert (y.float() == w).all(), j


@pytest.mark.parametrize("group", [None, 32, 64])
def test_int8_with_bf16_x_of_any_magnitude(group):
    """bf16 x from subnormal to near bf16's largest, blocks of 32 spread over 2^-8..2^8 with values
    far below their block's largest, an all-zero block, against float64: within 2^-15 of each
    block's largest (its 16-bit integers), the sums' fp32 rounding and the output's bf16 rounding;
    1-5 rows, per channel and grouped. A block holding inf or NaN makes its row NaN. (Past 2^110 a
    row's sum before its scale per channel overflows fp32: the kernel's stated range.)"""
    g = torch.Generator().manual_seed(7)
    q, s, _ = make(40, 448, "int8", group, torch.bfloat16, False, 11)
    w = q.double() * s.double().repeat_interleave(448 // s.shape[1], 1)
    for e in (-140, -130, -126, -120, -60, -1, 0, 7, 60, 100):
        spread = torch.pow(2.0, torch.randint(-8, 9, (5, 14, 1), generator=g).double())
        x = (torch.randn(5, 14, 32, generator=g, dtype=torch.float64) * spread * 2.0 ** e).view(5, 448)
        x[:, 64:96] = 0  # an all-zero block
        x[:, ::7] *= 2.0 ** -12  # values far below their block's largest
        x = x.to(torch.bfloat16)
        for rows in range(1, 6):
            y = torch.empty(rows, 40, dtype=torch.bfloat16)
            torch.ops.nanoserve_cpu.quant_gemv(y, x[:rows].contiguous(), q, s, None)
            want = x[:rows].double() @ w.T
            tol = 2 ** -15 * block_largest(x[:rows]).double() @ w.abs().T \
                + 2 ** -20 * x[:rows].double().abs() @ w.abs().T + 2 ** -8 * want.abs() + 2.0 ** -133
            assert ((y.double() - want).abs() <= tol).all(), (e, rows)
    bad = torch.randn(3, 448).to(torch.bfloat16)
    bad[1, 5], bad[2, 300] = float("inf"), float("nan")
    y = torch.empty(3, 40, dtype=torch.bfloat16)
    torch.ops.nanoserve_cpu.quant_gemv(y, bad, q, s, None)
    assert y[0].isfinite().all() and y[1:].isnan().all()


@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_is_the_reference_exactly(method, dtype):
    q, s, _ = make(70, 96, method, 32, dtype, False, 0)
    out = torch.empty(70, 96, dtype=dtype)
    torch.ops.nanoserve_cpu.quant_dequantize(out, q, s)
    assert torch.equal(out, dequantize_weight(q, s, dtype))
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).view(8, 32)
    every = torch.empty(8, 32)
    torch.ops.nanoserve_cpu.quant_dequantize(every, codes, torch.full((8, 1), 3.0))
    want = codes.float() * 3.0
    assert ((every == want) | want.isnan()).all()  # 0x7f/0xff are NaN; the quantizer never writes them


def test_dequantize_to_bf16_rounds_as_torch_rounds():
    """Every int8 code times scales whose products land between two bf16 values, on ties (1 + 2^-8
    times a power of two), under fp32's smallest normal, past bf16's largest value, and NaN, rounded
    as torch rounds fp32 to bf16."""
    codes = torch.arange(-128, 128, dtype=torch.int8).repeat(6, 1)
    scales = torch.tensor([[1 + 2**-8], [1 + 3 * 2**-9], [0.1], [2**-130], [3.0e36], [float("nan")]])
    out = torch.empty(6, 256, dtype=torch.bfloat16)
    torch.ops.nanoserve_cpu.quant_dequantize(out, codes, scales)
    want = (codes.float() * scales).bfloat16()
    assert torch.equal(out[:5].view(torch.int16), want[:5].view(torch.int16))
    assert out[5].isnan().all()  # a NaN's payload is not specified


def test_one_buffer_serves_layers_of_any_size_in_turn():
    buffer = cpu_quant_gemm.DequantBuffer(64 * 96)
    layers = [cpu_quant_gemm.QuantizedCpuLinear(*make(o, i, "fp8", None, torch.float32, False, o)[:2],
                                                None, buffer) for o, i in ((64, 96), (40, 32))]
    n = cpu_quant_gemm.GEMV_ROWS + 1  # rows past the GEMV: the dequantized layer
    x = [torch.randn(n, 96), torch.randn(n, 32)]
    first = layers[0](x[0]).clone()
    layers[1](x[1])  # overwrites the buffer
    assert torch.equal(layers[0](x[0]), first)
    assert len(buffer.buffers) == 1 and buffer.buffers[torch.float32].numel() == 64 * 96


def test_the_gemv_refuses_what_it_cannot_read():
    q, s, _ = make(16, 40, "int8", None, torch.float32, False, 0)
    y = torch.empty(1, 16)
    with pytest.raises(RuntimeError, match="groups of a multiple of 8"):
        torch.ops.nanoserve_cpu.quant_gemv(y, torch.randn(1, 40), q, torch.ones(16, 3), None)
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.nanoserve_cpu.quant_gemv(y, torch.randn(1, 40).half(), q, s, None)


@pytest.mark.parametrize("method,group", [("int8", None), ("fp8", None), ("int8", 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gemv_row_does_not_depend_on_the_rows_beside_it(method, group, dtype):
    """Row i of an M-row call equals the same row alone, bit for bit, for M up to GEMV_ROWS (over
    many 64 KB tiles of 4,096-byte code rows), as in the float GEMV."""
    q, s, b = make(300, 4096, method, group, dtype, True, 3)
    n = cpu_quant_gemm.GEMV_ROWS
    x = torch.randn(n, 4096).to(dtype)
    alone = torch.empty(n, 300, dtype=dtype)
    for i in range(n):
        torch.ops.nanoserve_cpu.quant_gemv(alone[i:i + 1], x[i:i + 1].contiguous(), q, s, b)
    for m in range(2, n + 1):
        y = torch.empty(m, 300, dtype=dtype)
        torch.ops.nanoserve_cpu.quant_gemv(y, x[:m].contiguous(), q, s, b)
        assert torch.equal(y, alone[:m]), m


def amx(x, q, s, b=None):
    y = torch.empty(x.shape[0], q.shape[0], dtype=x.dtype)
    torch.ops.nanoserve_cpu.quant_amx_linear(y, x, q, s, b)
    return y


needs_amx = pytest.mark.skipif(not cpu_build.available() or not cpu_quant_gemm.amx_available(),
                               reason="no AMX tiles on this CPU (or in this build)")


@needs_amx
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 64), inp=st.sampled_from([32, 64, 96, 576]), out=st.sampled_from([1, 16, 31, 129]),
       method=st.sampled_from(["int8", "fp8"]), group=st.sampled_from([None, 16, 32]), bias=st.booleans(),
       seed=st.integers(0, 999))
def test_the_amx_matmul_matches_the_reference(rows, inp, out, method, group, bias, seed):
    """Partial tiles of x rows and of output rows; per-channel codes looked up as bf16 (inputs a
    multiple of 64) or dequantized as the reference does (else, and every grouped case)."""
    q, s, b = make(out, inp, method, group, torch.bfloat16, bias, seed)
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    ok, err = within(amx(x, q, s, b), x, q, s, b)
    assert ok, f"max error {err:.3g}"


@needs_amx
@pytest.mark.parametrize("method", ["int8", "fp8"])
@pytest.mark.parametrize("group", [None, 32])
def test_an_amx_row_does_not_depend_on_the_rows_beside_it(method, group):
    q, s, b = make(300, 576, method, group, torch.bfloat16, True, 3)
    x = torch.randn(64, 576).bfloat16()
    full = amx(x, q, s, b)
    for m in (1, 9, 16, 17, 40):
        assert torch.equal(amx(x[:m].contiguous(), q, s, b), full[:m]), m


def test_an_int8_code_of_minus_128_keeps_its_layer_off_the_tiles():
    """quantize_weight never writes -128; codes from elsewhere may, and the tiles' lookup cannot
    hold it, so such a layer runs another path, and right."""
    q, s, _ = make(48, 64, "int8", None, torch.bfloat16, False, 1)
    q[3, 5] = -128
    layer = cpu_quant_gemm.QuantizedCpuLinear(q, s, None, cpu_quant_gemm.DequantBuffer(q.numel()))
    assert not layer.amx
    x = torch.randn(16, 64).bfloat16()
    ok, err = within(layer(x), x, q, s, None)
    assert ok, err


def test_the_amx_matmul_refuses_what_it_cannot_take():
    q, s, _ = make(48, 64, "int8", None, torch.bfloat16, False, 1)
    x = torch.randn(9, 64).bfloat16()
    if not cpu_quant_gemm.amx_available():
        with pytest.raises(RuntimeError, match="no AMX tiles"):
            amx(x, q, s)
        return
    with pytest.raises(RuntimeError, match="1 <= rows <= 64"):
        amx(torch.randn(65, 64).bfloat16(), q, s)
    with pytest.raises(RuntimeError, match="contiguous bf16"):
        amx(x.float(), q, s)
    q8, s8, _ = make(48, 64, "int8", 8, torch.bfloat16, False, 1)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        amx(x, q8, s8)
    q48, s48, _ = make(48, 48, "fp8", None, torch.bfloat16, False, 1)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        amx(torch.randn(9, 48).bfloat16(), q48, s48)


@pytest.mark.parametrize("dtype,rows,want", [
    (torch.bfloat16, 1, "gemv"), (torch.bfloat16, 3, "gemv"), (torch.bfloat16, 8, "gemv"),
    (torch.bfloat16, 9, "int8pack"), (torch.bfloat16, 64, "int8pack"), (torch.bfloat16, 65, "dequantize"),
    (torch.float32, 1, "gemv"), (torch.float32, 8, "gemv"), (torch.float32, 9, "dequantize")])
def test_each_batch_goes_to_its_kernel(dtype, rows, want, monkeypatch):
    """int8 per channel: the GEMV up to GEMV_ROWS (a verify's rows as decode's); then, for bf16
    activations, the AMX matmul up to AMX_ROWS where the CPU has AMX, else torch's int8 matmul (its
    fp32 kernel is slow) up to INT8PACK_ROWS; else dequantized."""
    if want == "int8pack" and cpu_quant_gemm.amx_available():
        want = "amx"
    q, s, _ = make(48, 64, "int8", None, dtype, False, 1)
    layer = cpu_quant_gemm.QuantizedCpuLinear(q, s, None, cpu_quant_gemm.DequantBuffer(q.numel()))
    calls = []
    for name, op in (("gemv", "quant_gemv"), ("dequantize", "quant_dequantize"), ("amx", "quant_amx_linear")):
        ns = torch.ops.nanoserve_cpu
        real = getattr(ns, op)
        monkeypatch.setattr(ns, op, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    real_mm = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *a: calls.append("int8pack") or real_mm(*a))
    x = torch.randn(rows, 64).to(dtype)
    ok, err = within(layer(x), x, q, s, None)
    assert calls == [want] and ok, (calls, err)


def engine_layers(llm):
    return [m for m in llm.engine.model.modules() if hasattr(m, "qweight")]


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_engine_runs_its_quantized_linears_on_the_c_ops_and_falls_back(method, monkeypatch):
    """On the CPU backend every decoder linear whose input size is a multiple of 8 runs on the C++
    ops (the demo model's 688-wide down_proj does: 688 = 86 * 8); under NANOSERVE_KERNELS=reference
    they stay the reference's, and greedy output is the same."""
    from nanoserve import LLM, EngineConfig, SamplingParams
    from nanoserve.model import DEMO_MODEL_DIR
    from nanoserve.model.quantization import QuantizedLinear
    config = EngineConfig(num_kv_blocks=32)
    prompts = [[5, 17, 42, 99, 3], list(range(40, 61))]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    fast = LLM(DEMO_MODEL_DIR, dtype="float32", quantization=method, config=config)
    assert all(isinstance(m, cpu_quant_gemm.QuantizedCpuLinear) for m in engine_layers(fast))
    assert len(engine_layers(fast)) == 4 * fast.engine.model_config.num_hidden_layers
    state = fast.engine.model.state_dict()
    assert "layers.0.mlp.down_proj.qweight" in state and "layers.0.mlp.down_proj.weight" not in state
    got = [o.token_ids for o in fast.generate(prompts, params)]  # batch 2: the GEMV; prefill: matmul
    monkeypatch.setenv("NANOSERVE_KERNELS", "reference")
    ref = LLM(DEMO_MODEL_DIR, dtype="float32", quantization=method, config=config)
    assert all(type(m) is QuantizedLinear for m in engine_layers(ref))
    assert [o.token_ids for o in ref.generate(prompts, params)] == got


CHECK = """
import os, shutil, sys
import torch
from nanoserve.kernels import cpu_build
from nanoserve.kernels.quantization import dequantize_weight, quantize_weight, quantized_linear
out = os.path.join(sys.argv[1], "quant.so")
cpu_build._build(shutil.which("c++") or shutil.which("g++"), out,
                 [os.path.join(cpu_build.HERE, "cpu_quant_gemv.cpp")])
torch.ops.load_library(out)
for method in ("int8", "fp8"):
    for group in (None, 32):
        w = torch.randn(96, 256)
        q, s = quantize_weight(w, method, group)
        for rows in (1, 2, 5):
            x = torch.randn(rows, 256)
            y = torch.empty(rows, 96)
            torch.ops.nanoserve_cpu.quant_gemv(y, x, q, s, None)
            torch.testing.assert_close(y, quantized_linear(x, q, s), rtol=1e-5, atol=1e-4)
            xb, yb = x.bfloat16(), y.bfloat16()  # int8: int16_x's products without VNNI on x86-64-v3
            torch.ops.nanoserve_cpu.quant_gemv(yb, xb, q, s, None)
            torch.testing.assert_close(yb.float(), quantized_linear(xb.float(), q, s), rtol=2e-2, atol=2e-2)
        d = torch.empty(96, 256)
        torch.ops.nanoserve_cpu.quant_dequantize(d, q, s)
        assert torch.equal(d, dequantize_weight(q, s))
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 -march levels")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v2"])
def test_builds_for_other_cpu_classes(march, tmp_path):
    """x86-64-v3 is an AVX2 CPU without AVX-512 (the intrinsics' path); x86-64-v2 has neither AVX
    nor F16C (the portable path, its fp8 widening by bits). cpu_quant_gemv.cpp alone, built and
    checked in a fresh process."""
    env = dict(os.environ, NANOSERVE_CPU_MARCH=march, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
