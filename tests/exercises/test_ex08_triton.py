"""Exercise 8 (Triton kernels), against the torch reference; on a CPU under TRITON_INTERPRET=1
(the conftest sets it before the exercise module is imported). Tiny shapes: the interpreter
costs time per program instance.
"""

import pytest
import torch
from exercise_checks import drive, make_engine, workload

from nanoserve.kernels import AttentionMetadata, reference, use_kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=3e-3, rtol=3e-3)}


@pytest.fixture(scope="module")
def ex(load):
    return load("ex08_triton")


def close(got, want, dtype, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert not got.isnan().any(), f"{what}: NaN in the output (an element never written, or 0/0)"
    err = (got.float() - want.float()).abs().max().item()
    assert torch.allclose(got.float(), want.float(), **TOL[dtype]), f"{what}: off by up to {err:.3g}"


@pytest.mark.parametrize("shape", [(1, 16), (5, 48), (2, 3, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm(ex, shape, dtype):
    x = torch.randn(shape, device=DEVICE).to(dtype)
    w = torch.randn(shape[-1], device=DEVICE).to(dtype)
    close(ex.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), dtype, f"rms_norm of {shape} {dtype}")


@pytest.mark.parametrize("shape", [(1, 16), (5, 48), (2, 3, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_with_residual(ex, shape, dtype):
    x, r = torch.randn(shape, device=DEVICE).to(dtype), torch.randn(shape, device=DEVICE).to(dtype)
    w = torch.randn(shape[-1], device=DEVICE).to(dtype)
    got = ex.rms_norm(x, w, 1e-6, r)
    want = reference.rms_norm(x, w, 1e-6, r)
    assert isinstance(got, tuple) and len(got) == 2, "with a residual, return (out, x + residual)"
    close(got[1], want[1], dtype, f"the new residual x + residual, {shape} {dtype}")
    close(got[0], want[0], dtype, f"rms_norm(x + residual), {shape} {dtype}")


def test_rms_norm_known_answer(ex):
    x = torch.full((2, 24), 3.0, device=DEVICE)
    w = torch.arange(24.0, device=DEVICE)
    out = ex.rms_norm(x, w, 0.0)
    assert torch.allclose(out, w.expand(2, 24)), "a constant row normalises to ones: out should be the weight"


def test_engine_runs_with_your_rms_norm(ex):
    reqs = workload(1, num_requests=2, prompt_lens=(3, 9), max_tokens=(2, 3))
    want = [o.token_ids for o in drive(make_engine(device=DEVICE), reqs)]
    engine = make_engine(device=DEVICE)
    use_kernels(engine, rms_norm=ex.rms_norm)
    got = [o.token_ids for o in drive(engine, reqs)]
    assert got == want, f"with your rms_norm the engine generated {got}, with the reference {want}"


def decode_batch(lens, num_heads, num_kv_heads, head_dim=16, block_size=4, num_blocks=24,
                 dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(lens))
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(DEVICE, dtype)
    width = max(-(-n // block_size) for n in lens)
    tables = torch.randperm(num_blocks, generator=g)[:len(lens) * width].view(len(lens), width)
    q = torch.randn(len(lens), num_heads, head_dim, generator=g).to(DEVICE, dtype)
    return (q, k_cache, v_cache, tables.to(DEVICE, torch.int32),
            torch.tensor(lens, dtype=torch.int32, device=DEVICE), head_dim ** -0.5)


@pytest.mark.parametrize("lens, num_heads, num_kv_heads", [
    ([5], 2, 2), ([1, 9, 16], 4, 2), ([3, 12], 4, 1)])
def test_decode_attention(ex, lens, num_heads, num_kv_heads):
    q, k_cache, v_cache, tables, seq_lens, scale = decode_batch(lens, num_heads, num_kv_heads)
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32, device=DEVICE)
    want = reference.paged_attention(q, k_cache, v_cache, AttentionMetadata(qsl, seq_lens, tables), scale)
    got = ex.decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    close(got, want, torch.float32, f"decode attention over contexts {lens}, {num_heads} heads / "
                                    f"{num_kv_heads} kv heads")


def test_decode_attention_fp16(ex):
    q, k_cache, v_cache, tables, seq_lens, scale = decode_batch([6, 11], 4, 2, dtype=torch.float16)
    qsl = torch.arange(3, dtype=torch.int32, device=DEVICE)
    want = reference.paged_attention(q, k_cache, v_cache, AttentionMetadata(qsl, seq_lens, tables), scale)
    close(ex.decode_attention(q, k_cache, v_cache, tables, seq_lens, scale), want, torch.float16,
          "decode attention in fp16")
