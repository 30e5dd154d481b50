"""roofline: FLOP/byte counts against a hand calculation, the roofline formulas, the
ceilings cache and the plot. Measurements run in quick mode (under a second)."""

import math

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from nanoserve.config import ModelConfig
from nanoserve.measure import roofline as rl

matplotlib.use("Agg")

# hidden 64, 2 layers, 4 heads x 16, 2 kv heads x 16, intermediate 128, vocab 256
SMALL = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16)
LLAMA_120M = ModelConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                         num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4)


def fake_ceilings(bw=25e9, fp32=200e9, bf16=500e9):
    return rl.DeviceCeilings(device="cpu", device_name="Test CPU 9000", num_threads=2,
                             torch_version=torch.__version__, date="2026-11-29T00:00:00",
                             quick=True, copy_bandwidth=30e9, weight_read_bandwidth=bw,
                             peak_flops={"float32": fp32, "bfloat16": bf16})


def test_step_cost_matches_hand_calculation():
    # A mixed step: a whole 4-token prompt, one decode at context 10, and a 3-token chunk
    # of a prompt with 4 tokens already computed that is not its last chunk (no logits).
    cost = rl.step_cost(SMALL, [(4, 4), (1, 10), (3, 7, False)], dtype_bytes=4)
    # By hand. q_dim = 4*16 = 64, kv_dim = 2*16 = 32.
    # Weights per layer: qkv 64*(64+2*32) = 8192, o 64*64 = 4096, gate_up 64*2*128 = 16384,
    #   down 128*64 = 8192; total 36864.
    # Activations per token per layer (in + out): 192 + 128 + 320 + 192 = 832.
    # Tokens 4 + 1 + 3 = 8; logits 2; context sum 4 + 10 + 7 = 21.
    # Causal query-key pairs: prompt 1+2+3+4 = 10; decode 10; chunk 5+6+7 = 18; total 38.
    assert cost.num_tokens == 8 and cost.num_logits == 2
    assert cost.flops == {
        "linear": 1_179_648,  # 2 layers * 2 * 8 tokens * 36864
        "attention": 19_456,  # 2 layers * 4 * 38 pairs * 64 (heads * head_dim)
        "lm_head": 65_536,  # 2 * 2 logits * 256 * 64
    }
    assert cost.bytes == {
        "linear": 348_160,  # 2 layers * (36864 * 4 + 8 * 832 * 4) = 2 * (147456 + 26624)
        # 2 layers * (KV read 2*21*32*4 + KV written 2*8*32*4 + Q in/out 2*8*64*4)
        #   = 2 * (5376 + 2048 + 4096)
        "attention": 23_040,
        "lm_head": 68_096,  # weight 256*64*4 = 65536 + 2 logits * (64 + 256) * 4 = 2560
    }
    assert cost.total_flops == 1_264_640 and cost.total_bytes == 439_296
    assert cost.intensity == pytest.approx(1_264_640 / 439_296)

    # bf16 weights and activations, 1-byte KV: only the byte counts change
    low = rl.step_cost(SMALL, [(4, 4), (1, 10), (3, 7, False)], dtype_bytes=2, kv_dtype_bytes=1)
    assert low.flops == cost.flops
    # 2 * (2*21*32*1 + 2*8*32*1 + 2*8*64*2) = 2 * (1344 + 512 + 2048)
    assert low.bytes["attention"] == 7_808
    assert low.bytes["linear"] == 348_160 // 2

    # 8-bit linear weights (codes + scales' share) under bf16 activations: the weights' term only
    w8 = rl.step_cost(SMALL, [(4, 4), (1, 10), (3, 7, False)], dtype_bytes=2, weight_dtype_bytes=1.25)
    assert w8.bytes["linear"] == 2 * (36864 * 1.25 + 8 * 832 * 2)
    assert w8.bytes["lm_head"] == low.bytes["lm_head"] and w8.flops == cost.flops
    # and the lm_head as codes too: only its weight's term changes
    head8 = rl.step_cost(SMALL, [(4, 4), (1, 10), (3, 7, False)], dtype_bytes=2, weight_dtype_bytes=1.25,
                         lm_head_dtype_bytes=1.25)
    vocab_hidden = SMALL.vocab_size * SMALL.hidden_size
    assert head8.bytes["lm_head"] == low.bytes["lm_head"] - vocab_hidden * (2 - 1.25)
    assert head8.bytes["linear"] == w8.bytes["linear"] and head8.flops == cost.flops


@pytest.mark.parametrize("q,ctx", [(1, 1), (1, 9), (5, 5), (3, 11), (16, 40)])
def test_attention_pairs_equal_the_causal_mask(q, ctx):
    # the closed form counts exactly the unmasked entries of the (q, ctx) causal mask
    unmasked = int(torch.ones(q, ctx).tril(ctx - q).sum())
    cost = rl.step_cost(SMALL, [(q, ctx)])
    assert cost.flops["attention"] == SMALL.num_hidden_layers * 4 * unmasked * 64


def test_decode_intensity_is_about_batch_and_prefill_intensity_grows():
    for dtype, nbytes in (("float32", 4), ("bfloat16", 2)):
        for b in (1, 2, 4, 8):
            cost = rl.step_cost(LLAMA_120M, rl.decode_batch(b, 64), rl.dtype_bytes(dtype))
            assert cost.intensity_of("linear") == pytest.approx(2 * b / nbytes, rel=0.03)
    one, eight = (rl.step_cost(LLAMA_120M, rl.decode_batch(b, 64)).intensity for b in (1, 8))
    assert 6 < eight / one < 8.5
    prefill = [rl.step_cost(LLAMA_120M, rl.prefill_batch(p)).intensity for p in (16, 64, 256, 1024)]
    assert prefill == sorted(prefill) and prefill[-1] > 20 * prefill[0]


def test_bad_batch_and_dtype_are_rejected():
    with pytest.raises(ValueError, match=r"\(5, 3\)"):
        rl.step_cost(SMALL, [(5, 3)])
    with pytest.raises(ValueError, match="fp33"):
        rl.dtype_bytes("fp33")
    with pytest.raises(ValueError, match="float16"):
        fake_ceilings().peak("float16")
    assert rl.dtype_bytes(torch.bfloat16) == rl.dtype_bytes("bf16") == 2


def test_ridge_critical_batch_floor_and_utilisation():
    c = fake_ceilings(bw=25e9, fp32=200e9, bf16=500e9)
    assert rl.ridge_point(c, "float32") == pytest.approx(8.0)  # 200e9 / 25e9
    assert rl.ridge_point(c, "bfloat16") == pytest.approx(20.0)  # 500e9 / 25e9
    assert rl.critical_batch_size(c, "float32") == pytest.approx(16.0)  # 8 * 4 / 2
    assert rl.critical_batch_size(c, "bfloat16") == pytest.approx(20.0)  # 20 * 2 / 2
    # at the critical batch, decode's linear layers sit at the ridge
    cost = rl.step_cost(LLAMA_120M, rl.decode_batch(16, 64), 4)
    assert cost.intensity_of("linear") == pytest.approx(8.0, rel=0.05)

    one = rl.step_cost(LLAMA_120M, rl.decode_batch(1, 64), 4)
    floor = rl.decode_step_floor(LLAMA_120M, 1, 64, c, "float32")
    assert floor == pytest.approx(one.total_bytes / 25e9)  # batch 1: memory-bound
    # 499 MB of fp32 params less the 98 MB embedding table (a decode step gathers one row of
    # it): ~401 MB at 25 GB/s
    assert 0.0158 < floor < 0.0164
    big = rl.step_cost(LLAMA_120M, rl.prefill_batch(1024), 4)
    assert rl.roofline_time(big, c, "float32") == pytest.approx(big.total_flops / 200e9)
    assert rl.mbu(one, 2 * floor, c) == pytest.approx(0.5)
    assert rl.mfu(big, big.total_flops / 50e9, c, "float32") == pytest.approx(0.25)


def test_quick_ceilings_are_finite_and_round_trip_through_the_cache(tmp_path, monkeypatch):
    from nanoserve.measure import ceilings  # where the measuring lives (roofline re-exports it)
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    c = rl.load_or_measure_ceilings("cpu", quick=True)
    numbers = [c.copy_bandwidth, c.weight_read_bandwidth, *c.peak_flops.values()]
    assert all(math.isfinite(x) and x > 0 for x in numbers)
    assert set(c.peak_flops) == {"float32", "bfloat16"} and c.quick
    assert c.num_threads == torch.get_num_threads() and c.device == "cpu"
    path = rl.ceilings_cache_path("cpu")
    assert path.startswith(str(tmp_path)) and path.endswith(".json")

    def no_measuring(*args, **kwargs):
        raise AssertionError("should have come from the cache")

    monkeypatch.setattr(ceilings, "measure_ceilings", no_measuring)
    assert rl.load_or_measure_ceilings("cpu", quick=True) == c
    # a quick cache does not answer a full request; refresh always measures
    full = fake_ceilings()
    full.quick = False
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda device, quick=False: full)
    assert rl.load_or_measure_ceilings("cpu") == full
    monkeypatch.setattr(ceilings, "measure_ceilings", no_measuring)
    assert rl.load_or_measure_ceilings("cpu", quick=True) == full
    text = rl.format_ceilings(c)
    assert c.device_name in text and "GB/s" in text and "bfloat16" in text


def test_plot_names_the_device_and_places_points():
    c = fake_ceilings()
    point = rl.roofline_point("decode B=1", rl.step_cost(LLAMA_120M, rl.decode_batch(1, 64)), 0.03)
    fig = rl.plot_roofline(c, "float32", points=[point, ("prefill 512", 90.0, 150e9)])
    ax = fig.axes[0]
    assert "Test CPU 9000" in ax.get_title() and "float32" in ax.get_title()
    assert "FLOP/byte" in ax.get_xlabel() and "GFLOP/s" in ax.get_ylabel()
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = {t.get_text() for t in ax.texts}
    assert {"decode B=1", "prefill 512"} <= labels
    assert any("ridge" in t.get_text() for t in ax.get_legend().get_texts())
    plt.close(fig)


def test_quantized_weight_bytes_counts_codes_and_scales():
    from torch import nn

    from nanoserve.kernels.quantization import quantize_weight

    class Codes(nn.Module):
        def __init__(self, out, n, group):
            super().__init__()
            q, s = quantize_weight(torch.randn(out, n), "int8", group)
            self.register_buffer("qweight", q)
            self.register_buffer("weight_scale", s)

    assert rl.quantized_weight_bytes(nn.Linear(4, 4)) is None
    per_channel = nn.Sequential(Codes(8, 64, None), nn.Linear(64, 8))  # the float linear is not counted
    assert rl.quantized_weight_bytes(per_channel) == 1 + 4 / 64
    assert rl.quantized_weight_bytes(nn.Sequential(Codes(8, 64, 32), Codes(4, 32, None))) == \
        (8 * 64 + 8 * 2 * 4 + 4 * 32 + 4 * 4) / (8 * 64 + 4 * 32)
    # a quantized lm_head (model.lm_head_quant) is counted apart: the decoder linears' average keeps
    # without it
    assert rl.lm_head_weight_bytes(per_channel) is None
    per_channel.lm_head_quant = Codes(16, 64, 32)
    assert rl.quantized_weight_bytes(per_channel) == 1 + 4 / 64
    assert rl.lm_head_weight_bytes(per_channel) == 1 + 2 * 4 / 64
