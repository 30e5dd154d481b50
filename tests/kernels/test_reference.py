"""The torch reference's small kernels against HF transformers' Llama code, bit for bit, and RoPE
rotating the fused qkv projection in place (no copies on the CPU's default path)."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from nanoserve.kernels import reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_is_hf_llama_rmsnorm_bit_for_bit(dtype, with_residual):
    """Same rounding as HF: fp32 mean of squares and scaling, cast, then the weight."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 96, generator=g).to(dtype)
    residual = torch.randn(37, 96, generator=g).to(dtype) if with_residual else None
    hf = LlamaRMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.rand(96, generator=g) + 0.5)
        h = x if residual is None else x + residual
        want = hf(h)
    got = reference.rms_norm(x, hf.weight.detach(), 1e-6, residual)
    if with_residual:
        got, summed = got
        assert torch.equal(summed, h)
    assert got.dtype == dtype and torch.equal(got, want)


def rope_inputs(T=9, heads=6, kv_heads=2, head_dim=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(T, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    q = qkv[:, :heads * head_dim].view(T, heads, head_dim)  # views, as the model passes them
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(T, kv_heads, head_dim)
    inv_freq = 10000.0 ** -(torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(64).float(), inv_freq)  # (64, head_dim/2)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # (max_pos, head_dim): [cos | sin]
    positions = torch.randint(0, 64, (T,), generator=g)
    return qkv, q, k, cache, positions


def test_rotary_is_hf_apply_rotary_pos_emb_bit_for_bit():
    qkv, q, k, cache, positions = rope_inputs()
    cos, sin = cache[positions].chunk(2, dim=-1)  # HF's cos/sin repeat the half: (T, head_dim)
    want_q, want_k = apply_rotary_pos_emb(q.clone(), k.clone(), torch.cat((cos, cos), -1),
                                          torch.cat((sin, sin), -1), unsqueeze_dim=1)
    got_q, got_k = reference.rotary_embedding(positions, q, k, cache)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rotates_the_qkv_projection_in_place(dtype):
    qkv, q, k, cache, positions = rope_inputs(dtype=dtype)
    before = qkv.clone()
    got_q, got_k = reference.rotary_embedding(positions, q, k, cache)
    assert got_q.data_ptr() == qkv.data_ptr() and got_k.data_ptr() == k.data_ptr()
    # the rotation in fp32, rounded once: what the out-of-place formula gives
    cos, sin = cache[positions].unsqueeze(1).chunk(2, dim=-1)
    for x, got in ((before[:, :q[0].numel()].view(q.shape), got_q),
                   (before[:, q[0].numel():q[0].numel() + k[0].numel()].view(k.shape), got_k)):
        x1, x2 = x.float().chunk(2, dim=-1)
        want = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)
        assert torch.equal(got, want)
    v_start = q[0].numel() + k[0].numel()
    assert torch.equal(qkv[:, v_start:], before[:, v_start:]), "v must be left alone"
