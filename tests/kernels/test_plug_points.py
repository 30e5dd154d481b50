"""The kernel plug points: a namespace with some kernels replaced, installed in a loaded model."""

import pytest

from nanoserve import EngineConfig, LLMEngine
from nanoserve.kernels import kernel_ops, reference, use_kernels


def test_kernel_ops_replaces_only_what_is_named():
    def mine(*args, **kwargs):
        return None
    ops = kernel_ops(paged_attention=mine)
    assert ops.paged_attention is mine and ops.rms_norm is reference.rms_norm
    with pytest.raises(ValueError, match="attention"):
        kernel_ops(attention=mine)


def test_use_kernels_reaches_every_layer():
    engine = LLMEngine("preset:tiny", config=EngineConfig(num_kv_blocks=32))
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return reference.paged_attention(*args, **kwargs)
    ops = use_kernels(engine, paged_attention=counting)
    holders = [m for m in engine.model.modules() if "ops" in vars(m)]
    assert holders and all(m.ops is ops for m in holders)
    engine.add_request([1, 2, 3])
    engine.step()
    assert len(calls) == engine.model_config.num_hidden_layers


def test_every_mlp_calls_the_namespace_silu_and_mul():
    """The MLP's activation is a plug point too; a namespace built before it existed (four
    kernels) still makes a whole namespace, with the reference's silu_and_mul."""
    from types import SimpleNamespace
    engine = LLMEngine("preset:tiny", config=EngineConfig(num_kv_blocks=32))
    calls = []

    def counting(x):
        calls.append(x.shape)
        return reference.silu_and_mul(x)
    use_kernels(engine, silu_and_mul=counting)
    engine.add_request([1, 2, 3])
    engine.step()
    cfg = engine.model_config
    assert calls == [(3, 2 * cfg.intermediate_size)] * cfg.num_hidden_layers
    old = SimpleNamespace(**{k: getattr(reference, k) for k in
                             ("rms_norm", "rotary_embedding", "reshape_and_cache", "paged_attention")})
    assert kernel_ops(old).silu_and_mul is reference.silu_and_mul
