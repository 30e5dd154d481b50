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
