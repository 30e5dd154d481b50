"""Weight-only quantization (model/quantization.py, kernels/quantization.py): the formats' error
bounds, the quantized linear against the float one within them, the API and its refusals, greedy
agreement with bf16 on the demo model, and GGUF Q8_0 codes loaded as they are.

Bounds: an int8 code is w / scale rounded to an integer, so |w - dequantized| <= scale / 2; an e4m3
code has 3 mantissa bits, so the error is at most 2^-4 of |w| / scale above the smallest normal
(2^-6), and half the subnormal step (2^-10) below it, both times the scale.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.kernels.quantization import CODE_MAX, dequantize_weight, quantize_weight
from nanoserve.model import DEMO_MODEL_DIR, load_model
from nanoserve.model.quantization import QuantizationConfig, QuantizedLinear, check_quantization
from tests.model.test_model import engine_logits

# SmolLM2-135M's argmax agreement floors (the slow test): each case's agreement over the test's 384
# positions (`benchmarks/quant_quality.py --windows 3` prints it) less two points. The goals
# against bf16 stay unmet whatever the scales: fp32 itself agrees with bf16 below them
INT8_VS_BF16, FP8_VS_BF16, INT8_VS_FP32, FP8_VS_FP32 = 0.93, 0.87, 0.94, 0.89
INT8_G32_VS_BF16, INT8_G32_VS_FP32 = 0.946, 0.954
INT8_HEAD_VS_BF16, INT8_G32_HEAD_VS_BF16 = 0.925, 0.949  # the lm_head as codes too


def error_bound(w: torch.Tensor, scale: torch.Tensor, method: str) -> torch.Tensor:
    """The largest |w - dequantize(quantize(w))| each element may have, (out, in)."""
    s = scale.repeat_interleave(w.shape[1] // scale.shape[1], dim=1)  # (out, in)
    if method == "int8":
        bound = s / 2
    else:
        bound = torch.maximum(w.abs() * 2 ** -4, s * 2 ** -10)
    return bound * (1 + 1e-5) + 1e-12  # fp32 rounding of w / scale and of code * scale


@settings(max_examples=40, deadline=None)
@given(out=st.integers(1, 40), groups=st.integers(1, 4), group=st.sampled_from([1, 7, 32, 33]),
       per_channel=st.booleans(), method=st.sampled_from(["int8", "fp8"]),
       magnitude=st.sampled_from([1e-6, 0.02, 3.0, 1e4]), seed=st.integers(0, 999))
def test_dequantized_codes_stay_within_the_formats_bound(out, groups, group, per_channel, method,
                                                         magnitude, seed):
    g = torch.Generator().manual_seed(seed)
    w = magnitude * torch.randn(out, groups * group, generator=g) * torch.rand(out, 1, generator=g)
    qweight, scale = quantize_weight(w, method, None if per_channel else group)
    assert qweight.shape == w.shape and scale.dtype == torch.float32
    assert scale.shape == (out, 1 if per_channel else groups)
    err = (dequantize_weight(qweight, scale) - w).abs()
    assert (err <= error_bound(w, scale, method)).all(), err.max()
    # each group's largest |w| becomes the largest code: the whole code range is used, nothing clips
    peak = qweight.float().abs().view(out, scale.shape[1], -1).amax(-1)
    assert torch.equal(peak, torch.full_like(peak, CODE_MAX[method]))


def test_an_all_zero_row_keeps_zero_codes_and_a_finite_scale():
    w = torch.zeros(3, 64)
    w[1] = torch.linspace(-1, 1, 64)
    for method in ("int8", "fp8"):
        q, s = quantize_weight(w, method)
        assert s[0].item() == 1.0 and s[2].item() == 1.0 and q[0].float().abs().sum() == 0
        assert torch.isfinite(dequantize_weight(q, s)).all()


@settings(max_examples=20, deadline=None)
@given(rows=st.sampled_from([1, 2, 3, 17]), inp=st.sampled_from([33, 64, 100, 256]),
       out=st.sampled_from([1, 31, 96, 129]), bias=st.booleans(),
       method=st.sampled_from(["int8", "fp8"]), seed=st.integers(0, 999))
def test_quantized_linear_is_the_float_linear_within_the_weights_error(rows, inp, out, bias, method, seed):
    """|x W_q^T - x W^T| <= |x| (bound of W)^T per output, in fp32 (products of the bound)."""
    torch.manual_seed(seed)
    dense = torch.nn.Linear(inp, out, bias=bias)
    layer = QuantizedLinear(inp, out, bias, QuantizationConfig(method))
    with torch.no_grad():
        layer.weight.copy_(dense.weight)
        if bias:
            layer.bias.copy_(dense.bias)
    layer.quant_method.process_weights_after_loading(layer)
    assert "weight" not in dict(layer.named_parameters()) and layer.qweight.dtype != torch.float32
    x = torch.randn(rows, inp)
    got, want = layer(x), dense(x).detach()
    bound = x.abs() @ error_bound(dense.weight.detach(), layer.weight_scale, method).T
    assert ((got - want).abs() <= bound + 1e-5).all()
    q_only = F.linear(x, dequantize_weight(layer.qweight, layer.weight_scale), layer.bias)
    torch.testing.assert_close(got, q_only)


def test_bf16_model_keeps_fp8_codes_and_fp32_scales():
    """model.to(bfloat16) converts floating buffers: the codes and scales must not follow."""
    net, cfg, _ = load_model("preset:tiny", "cpu", "bfloat16", quantization="fp8")
    layer = net.layers[0].mlp.down_proj
    assert layer.qweight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32
    before = layer.qweight.clone()
    net.to(torch.float32)
    assert torch.equal(layer.qweight.view(torch.uint8), before.view(torch.uint8))
    assert layer.weight_scale.dtype == torch.float32


@pytest.mark.parametrize("method,code", [("int8", torch.int8), ("fp8", torch.float8_e4m3fn)])
def test_llm_quantizes_every_decoder_linear_and_nothing_else(method, code):
    llm = LLM("preset:tiny", dtype="bfloat16", quantization=method,
              config=EngineConfig(num_kv_blocks=16))
    net = llm.engine.model
    quantized = [m for m in net.modules() if hasattr(m, "qweight")]
    assert len(quantized) == 4 * net.cfg.num_hidden_layers
    assert all(m.qweight.dtype == code and not hasattr(m, "weight") for m in quantized)
    assert net.embed_tokens.weight.dtype == torch.bfloat16 and net.lm_head.dtype == torch.bfloat16
    assert llm.engine.executor.kv_caches[0][0].dtype == torch.bfloat16  # KV keeps the model dtype
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(out.token_ids) == 4
    same = LLM("preset:tiny", dtype="bfloat16", config=EngineConfig(num_kv_blocks=16, quantization=method))
    again = same.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))[0]
    assert again.token_ids == out.token_ids


@pytest.mark.parametrize("bad", ["int4", "INT8", "", 8, "awq"])
def test_unknown_quantization_is_refused_naming_it_and_the_allowed_values(bad):
    for make in (lambda: EngineConfig(quantization=bad), lambda: check_quantization(bad),
                 lambda: LLM("preset:tiny", quantization=bad)):
        with pytest.raises(ValueError, match=repr(bad).replace("'", ".")) as info:
            make()
        assert "'int8', 'fp8'" in str(info.value)


@pytest.mark.parametrize("model,method", [("preset:tiny", "int8"), (DEMO_MODEL_DIR, "fp8")])
def test_quantization_lm_head_gives_the_lm_head_codes_and_computes_the_logits_with_them(model, method):
    """An untied preset and the tied demo model: the lm_head's codes are its weight as loaded (fp32,
    before the cast to bf16) quantized per vocabulary row, the embedding and the dense lm_head stay
    bf16 (the lookup needs them), and the logits are F.linear over the dequantized codes, not over
    the dense weight."""
    config = EngineConfig(num_kv_blocks=16, quantization=method, quantization_lm_head=True)
    llm = LLM(model, dtype="bfloat16", config=config)
    net = llm.engine.model
    head = net.lm_head_quant
    dense = net.lm_head_weight()
    assert dense.dtype == torch.bfloat16 and net.embed_tokens.weight.dtype == torch.bfloat16
    loaded = load_model(model, "cpu", "float32")[0].lm_head_weight().detach()
    codes, scale = quantize_weight(loaded, method)
    assert torch.equal(head.qweight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(head.weight_scale, scale)
    assert net.lm_head_linear is None  # no packed dense lm_head beside the codes
    hidden = torch.randn(3, dense.shape[1]).to(torch.bfloat16)
    want = F.linear(hidden.float(), dequantize_weight(codes, scale))
    got = net.compute_logits(hidden)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0.05 * want.abs().max().item(), rtol=0.02)
    unquantized = F.linear(hidden.float(), dense.float())
    assert not torch.allclose(got, unquantized, atol=1e-4, rtol=0)  # the codes computed them
    same = LLM(model, dtype="bfloat16", config=dataclasses.replace(config, quantization_lm_head=False))
    assert same.engine.model.lm_head_quant is None
    params = SamplingParams(max_tokens=4, temperature=0)
    assert len(llm.generate([[1, 2, 3]], params)[0].token_ids) == 4


def test_quantization_lm_head_is_refused_without_a_method_or_as_a_non_boolean():
    with pytest.raises(ValueError, match="quantization_lm_head=True"):
        EngineConfig(quantization_lm_head=True)
    with pytest.raises(ValueError, match="quantization_lm_head='yes'"):
        EngineConfig(quantization="int8", quantization_lm_head="yes")
    with pytest.raises(ValueError, match="needs a quantization method"):
        load_model("preset:tiny", quantization_lm_head=True)
    with pytest.raises(ValueError, match="lm_head=1"):
        QuantizationConfig("int8", lm_head=1)


def test_serve_takes_quantization():
    import argparse

    from nanoserve.serve.server import add_cli_args
    ap = add_cli_args(argparse.ArgumentParser())
    assert ap.parse_args(["--quantization", "fp8"]).quantization == "fp8"
    assert ap.parse_args([]).quantization is None
    grouped = ap.parse_args(["--quantization", "int8", "--quantization-group-size", "32"])
    assert grouped.quantization_group_size == 32
    assert ap.parse_args([]).quantization_group_size is None
    assert ap.parse_args(["--quantization", "int8", "--quantization-lm-head"]).quantization_lm_head is True
    assert ap.parse_args([]).quantization_lm_head is False
    with pytest.raises(SystemExit):
        ap.parse_args(["--quantization", "int4"])


@pytest.mark.parametrize("method", ["int8", "fp8"])
def test_a_group_size_gives_each_linear_a_scale_per_run_of_that_many_inputs(method):
    """quantization_group_size=16 on the demo model (16 divides its 256 and 688 inputs): each row's
    scales are its consecutive 16-value runs' largest |w| over the largest code, in order, and the
    engine's dequantized weights are the checkpoint's within those scales' bound (a scale applied to
    another run misses it by many steps)."""
    dense = dict(load_model(DEMO_MODEL_DIR, "cpu", "float32")[0].named_modules())
    llm = LLM(DEMO_MODEL_DIR, dtype="float32", config=EngineConfig(
        num_kv_blocks=16, quantization=method, quantization_group_size=16))
    layers = [(name, m) for name, m in llm.engine.model.named_modules() if hasattr(m, "qweight")]
    assert len(layers) == 4 * llm.engine.model_config.num_hidden_layers
    for name, layer in layers:
        w = dense[name].weight.detach()
        out, n = w.shape
        want = w.abs().view(out, n // 16, 16).amax(-1) / CODE_MAX[method]
        assert torch.equal(layer.weight_scale, want), name
        err = (dequantize_weight(layer.qweight, layer.weight_scale) - w).abs()
        assert (err <= error_bound(w, want, method)).all(), name


def test_a_group_size_is_refused_where_it_cannot_apply():
    for bad in (0, -8, "x", 2.5):
        with pytest.raises(ValueError, match="quantization_group_size"):
            EngineConfig(quantization="int8", quantization_group_size=bad)
    with pytest.raises(ValueError, match="group_size=32 must divide the weight's 688 input features"):
        LLM(DEMO_MODEL_DIR, quantization="int8", config=EngineConfig(quantization_group_size=32))


def heldout_tokens(llm, n: int) -> list[int]:
    with open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")) as f:
        return llm.tokenizer.encode(f.read()[:4 * n + 20_000])[:n]


@pytest.mark.parametrize("method,target", [("int8", 0.97), ("fp8", 0.95)])
def test_argmax_agrees_with_bf16_on_the_demo_model(method, target):
    """Teacher-forced over 300 positions of the held-out plays: the token greedy decoding would
    pick next, quantized against bf16 (the issue's agreement targets)."""
    config = EngineConfig(num_kv_blocks=40, max_num_batched_tokens=512)
    base = LLM(DEMO_MODEL_DIR, dtype="bfloat16", config=config)
    quant = LLM(DEMO_MODEL_DIR, dtype="bfloat16", config=config, quantization=method)
    tokens = heldout_tokens(base, 300)
    want = engine_logits(base.engine, tokens, len(tokens)).argmax(-1)
    got = engine_logits(quant.engine, tokens, len(tokens)).argmax(-1)
    agreement = (got == want).float().mean().item()
    assert agreement >= target, f"{method}: argmax agreement {agreement:.3f} < {target}"
    prompt = tokens[:40]  # and greedy generation starts out the same
    params = SamplingParams(max_tokens=8, temperature=0)
    first = [llm.generate([prompt], params)[0].token_ids[:4] for llm in (quant, base)]
    assert first[0] == first[1]


@pytest.mark.slow
@pytest.mark.parametrize("method,dtype,group,lm_head,target", [
    ("int8", "bfloat16", None, False, INT8_VS_BF16), ("fp8", "bfloat16", None, False, FP8_VS_BF16),
    ("int8", "float32", None, False, INT8_VS_FP32), ("fp8", "float32", None, False, FP8_VS_FP32),
    ("int8", "bfloat16", 32, False, INT8_G32_VS_BF16), ("int8", "float32", 32, False, INT8_G32_VS_FP32),
    ("int8", "bfloat16", None, True, INT8_HEAD_VS_BF16),
    ("int8", "bfloat16", 32, True, INT8_G32_HEAD_VS_BF16)])
def test_argmax_agreement_on_the_real_model(method, dtype, group, lm_head, target):
    """SmolLM2-135M, 384 teacher-forced positions of the held-out plays, quantized (a scale per
    channel, or per 32 inputs; the lm_head too or not) against the same dtype unquantized
    (benchmarks/quant_quality.py --windows 3 reads the same spans)."""
    config = EngineConfig(num_kv_blocks=30, max_num_batched_tokens=512)
    base = LLM("smollm2-135m", dtype=dtype, config=config)
    quant = LLM("smollm2-135m", dtype=dtype, config=dataclasses.replace(
        config, quantization=method, quantization_group_size=group, quantization_lm_head=lm_head))
    tokens = heldout_tokens(base, 10**6)  # all of it, as the benchmark reads it
    step = (len(tokens) - 128) // 3
    spans = [tokens[i * step:i * step + 128] for i in range(3)]
    want = torch.cat([engine_logits(base.engine, s, len(s)) for s in spans]).argmax(-1)
    got = torch.cat([engine_logits(quant.engine, s, len(s)) for s in spans]).argmax(-1)
    agreement = (got == want).float().mean().item()
    assert agreement >= target, \
        f"{method}, group {group}, lm_head {lm_head} ({dtype}): agreement {agreement:.3f} < {target}"
