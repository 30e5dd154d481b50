"""A Llama-family decoder over a flattened token batch and a paged KV cache.

Covers Llama 2/3 (RoPE with Llama-3 scaling, GQA, SwiGLU, tied or untied embeddings),
Qwen2 (bias on q/k/v) and Qwen3 (RMSNorm on each q/k head). Parameter names follow HF
except that q/k/v and gate/up are fused into `qkv_proj` and `gate_up_proj` (as vLLM
does): one matmul instead of three reads the activations once and launches fewer ops.

The forward pass takes all scheduled tokens of all requests as one batch of shape
(num_tokens,), with per-token positions and an AttentionMetadata saying where each
request's tokens start and which cache blocks hold its context. Left out: sliding
window attention, MoE, tensor parallelism.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.config import ModelConfig
from nanoserve.kernels import AttentionMetadata, get_ops, process_weights_after_loading
from nanoserve.model.quantization import QuantizationConfig, make_linear


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Rotary frequencies (head_dim/2,), with Llama-3 or linear scaling when configured."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    rs = cfg.rope_scaling
    if not rs:
        return inv_freq
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3)")
    # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_len = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    ramp = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
    return torch.where(medium, ramp, scaled)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ops, quant_config: QuantizationConfig | None = None):
        super().__init__()
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = \
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.eps = cfg.rms_norm_eps
        self.qkv_proj = make_linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                                    cfg.attention_bias, quant_config)
        self.o_proj = make_linear(self.q_size, cfg.hidden_size, False, quant_config)
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(self.head_dim))
            self.k_norm = nn.Parameter(torch.ones(self.head_dim))
        # an fp8 KV cache stores K / k_scale and V / v_scale; 1.0 is vLLM's default when the
        # checkpoint carries none (engine/kv_cache.py says why it suffices here)
        self.k_scale = self.v_scale = 1.0

    def forward(self, positions, x, kv_cache, attn: AttentionMetadata, cos_sin):
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)  # (T, num_heads, head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)  # (T, num_kv_heads, head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q = self.ops.rms_norm(q, self.q_norm, self.eps)
            k = self.ops.rms_norm(k, self.k_norm, self.eps)
        q, k = self.ops.rotary_embedding(positions, q, k, cos_sin)
        k_cache, v_cache = kv_cache
        # the scales go to the kernels only for a 1-byte cache, so a float cache calls a
        # student's kernel without them as before
        scales = {"k_scale": self.k_scale, "v_scale": self.v_scale} if k_cache.element_size() == 1 else {}
        self.ops.reshape_and_cache(k, v, k_cache, v_cache, attn.slot_mapping, **scales)
        o = self.ops.paged_attention(q, k_cache, v_cache, attn, self.scale, **scales)  # (T, heads, hd)
        return self.o_proj(o.reshape(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops, quant_config: QuantizationConfig | None = None):
        super().__init__()
        self.ops = ops
        self.gate_up_proj = make_linear(cfg.hidden_size, 2 * cfg.intermediate_size, False, quant_config)
        self.down_proj = make_linear(cfg.intermediate_size, cfg.hidden_size, False, quant_config)

    def forward(self, x):
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))  # (T, 2 * intermediate)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, ops, quant_config: QuantizationConfig | None = None):
        super().__init__()
        self.ops, self.eps = ops, cfg.rms_norm_eps
        self.self_attn = Attention(cfg, ops, quant_config)
        self.mlp = MLP(cfg, ops, quant_config)
        self.input_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward(self, positions, x, residual, kv_cache, attn, cos_sin):
        # the residual stream is carried separately so each norm fuses the add before it
        if residual is None:
            residual, x = x, self.ops.rms_norm(x, self.input_layernorm, self.eps)
        else:
            x, residual = self.ops.rms_norm(x, self.input_layernorm, self.eps, residual)
        x = self.self_attn(positions, x, kv_cache, attn, cos_sin)
        x, residual = self.ops.rms_norm(x, self.post_attention_layernorm, self.eps, residual)
        return self.mlp(x), residual


def run_layers(layers, positions, x, kv_caches, attn, cos_sin):
    """The decoder layers in turn, each op called from Python. -> (output, residual stream)."""
    residual = None
    for layer, kv_cache in zip(layers, kv_caches):
        x, residual = layer(positions, x, residual, kv_cache, attn, cos_sin)
    return x, residual


class LlamaForCausalLM(nn.Module):
    """Llama/Qwen2/Qwen3 causal LM. forward() -> hidden states; compute_logits() -> logits.

    quant_config: the decoder layers' linears hold 8-bit codes (model/quantization.py); the
    embedding stays in the model's dtype, and so does the lm_head unless quant_config.lm_head
    (then `lm_head_quant`, a quantized linear, computes the logits)."""

    def __init__(self, cfg: ModelConfig, device="cpu", quant_config: QuantizationConfig | None = None):
        super().__init__()
        self.cfg, self.quant_config = cfg, quant_config
        self.ops = get_ops(device)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.ops, quant_config)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.register_module("lm_head_quant", None)  # set after loading (quantize_after_loading)
        pos = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, rope_inv_freq(cfg))  # (max_pos, head_dim/2)
        self.register_buffer("cos_sin_cache", torch.cat((freqs.cos(), freqs.sin()), -1),
                             persistent=False)  # (max_pos, head_dim), kept fp32

    def set_ops(self, ops) -> None:
        """Swap the kernel namespace everywhere (plug point for a student's kernels)."""
        for m in self.modules():
            if "ops" in vars(m):
                m.ops = ops

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head

    lm_head_linear = None  # a kernel backend's x -> x @ lm_head.T, set by process_weights_after_loading
    weights_frozen = False  # set by process_weights_after_loading: load_weights refuses the model

    def process_weights_after_loading(self) -> None:
        """Called once by the model runner after loading (vLLM's hook): the kernel backend may
        repack the weights for its matmuls (kernels.process_weights_after_loading); from then on
        load_weights refuses the model."""
        process_weights_after_loading(self)
        self.weights_frozen = True

    def forward(self, input_ids, positions, kv_caches, attn: AttentionMetadata):
        """input_ids, positions: (T,); kv_caches: per layer (k_cache, v_cache). -> (T, hidden)."""
        x = self.embed_tokens(input_ids)  # (T, hidden)
        # a backend may run a decode step's layers in one call, the same kernels in this order
        # (the CPU's: there the Python between small ops costs as much as they do)
        fused = getattr(self.ops, "decode_layers", None)
        out = None if fused is None else fused(self.layers, positions, x, kv_caches, attn, self.cos_sin_cache)
        if out is None:
            out = run_layers(self.layers, positions, x, kv_caches, attn, self.cos_sin_cache)
        x, residual = out
        x, _ = self.ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (N, hidden) -> (N, vocab) in fp32."""
        if self.lm_head_quant is not None:
            return self.lm_head_quant(hidden).float()
        if self.lm_head_linear is not None:
            return self.lm_head_linear(hidden).float()
        return F.linear(hidden, self.lm_head_weight()).float()

    def init_random_weights(self, seed: int = 0, std: float = 0.02):
        """Random weights of the right shape (timing depends on shapes, not values).

        Drawn on the parameters' device: a CPU draws about 1e8 numbers/s, so an 8B-parameter
        preset would take minutes to build for a GPU (values then differ between CPU and GPU)."""
        device = next(self.parameters()).device
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm") or "layernorm" in name or name.endswith("_norm"):
                    p.fill_(1.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g, device=device) * std)
