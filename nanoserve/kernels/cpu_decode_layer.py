"""A decoder layer's decode step in one C++ call on a CPU (cpu_decode_layer.cpp).

At batch 1 on a CPU, the Python between a layer's small ops (module calls, the kernels' wrappers,
dispatch) costs about as much as the weight read of a thin layer: lesson 11 measures it, and on a
30-layer model it is what a runtime that runs its whole graph natively saves
(benchmarks/batch1_host_work.py). Where a step and a layer allow it, `decode_layer` runs the
layer's ops from C++ instead: the same ops, in the order and on the shapes DecoderLayer.forward
gives them, so the output is the op-by-op path's, bit for bit. It returns None, and the layer
runs op by op, for anything else:
- a step with more than MAX_ROWS tokens, or any query of more than one token (a prefill chunk, a
  speculative verify): their linears and attention take other kernels;
- a layer whose linears would not run the CPU GEMVs at these rows (`gemv_operands` of
  cpu_gemm.PackedLinear and cpu_quant_gemm.QuantizedCpuLinear says), with RMSNorm on q and k
  (Qwen3), or a cache in another dtype than the activations (fp8: the write quantizes in the
  reference's way).
Only the CPU backend's kernel namespace holds it (kernels.get_ops): a namespace with a kernel of
the learner's (kernel_ops, use_kernels) has none, so their kernel always runs.
"""

from __future__ import annotations

import weakref

import torch

MAX_ROWS = 2  # every linear kind runs its GEMV up to two rows (cpu_gemm, cpu_quant_gemm)

# layer -> {activation dtype: its four linears' tensors as the op takes them, or None}
_linears: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _linear(m, dtype: torch.dtype) -> list[torch.Tensor] | None:
    """A linear's tensors for the op ([weight(, bias)] or [codes, scales(, bias)]), if the module
    runs its GEMV on `dtype` activations of up to MAX_ROWS rows (the module says); else None."""
    operands = m.gemv_operands(dtype, MAX_ROWS) if hasattr(m, "gemv_operands") else None
    return None if operands is None else [t for t in operands if t is not None]


def _layer_linears(layer, dtype: torch.dtype):
    known = _linears.setdefault(layer, {})
    if dtype not in known:
        attn, mlp = layer.self_attn, layer.mlp
        parts = [_linear(m, dtype) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        known[dtype] = None if None in parts or hasattr(attn, "q_norm") or attn.head_dim % 8 else parts
    return known[dtype]


def _step_inputs(attn, positions: torch.Tensor, tokens: int):
    """This step's positions, slots, block tables and lengths as the ops take them, when every
    token is its own sequence's one query; else None. Once per step, for every layer."""
    if "decode_layer" not in attn.derived:
        qsl, _ = attn.host_offsets()
        one_each = len(qsl) - 1 == tokens and attn.decode_count(qsl) == tokens
        attn.derived["decode_layer"] = (
            positions.long().contiguous(), attn.slot_mapping.long().contiguous(),
            attn.block_tables.int().contiguous(), attn.seq_lens.int().contiguous(),
        ) if one_each and attn.slot_mapping is not None else None
    return attn.derived["decode_layer"]


def decode_layer(layer, positions, x, residual, kv_cache, attn, cos_sin):
    """DecoderLayer.forward's (output, residual) in one call, or None (run the layer op by op)."""
    k_cache, v_cache = kv_cache
    if (x.shape[0] > MAX_ROWS or x.dim() != 2 or k_cache.dtype != x.dtype or not k_cache.is_contiguous()
            or not x.is_contiguous() or cos_sin.dtype != torch.float32):
        return None
    linears = _layer_linears(layer, x.dtype)
    step = _step_inputs(attn, positions, x.shape[0]) if linears is not None else None
    if step is None:
        return None
    pos, slots, tables, lens = step
    a = layer.self_attn
    return torch.ops.nanoserve_cpu.decode_layer(
        x, residual, layer.input_layernorm, layer.post_attention_layernorm, layer.eps, *linears,
        a.num_heads, a.num_kv_heads, pos, cos_sin, k_cache, v_cache, slots, tables, lens, a.scale)
