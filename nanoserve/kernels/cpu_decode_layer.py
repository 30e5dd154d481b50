"""A decoder layer's step of a few tokens in one C++ call on a CPU (cpu_decode_layer.cpp).

At batch 1 on a CPU, the Python between a layer's small ops (module calls, the kernels' wrappers,
dispatch) costs about as much as the weight read of a thin layer: lesson 11 measures it, and on a
30-layer model it is what a runtime that runs its whole graph natively saves
(benchmarks/batch1_host_work.py). Where a step and a layer allow it, `decode_layer` runs the
layer's ops from C++ instead: the same ops, in the order and on the shapes DecoderLayer.forward
gives them, so the output is the op-by-op path's, bit for bit. That covers a step of up to
MAX_ROWS tokens: decodes of up to that many sequences, and a speculative verify's rows, which
attention takes a row at a time with their causal lengths (cpu_attention.query_rows).
It returns None, and the layer runs op by op, for anything else:
- a step of more than MAX_ROWS tokens (a prefill chunk, a large batch): its linears take a
  matmul and attention SDPA;
- a layer whose linears would not run a GEMV (`gemv_operands` of cpu_gemm.PackedLinear and
  cpu_quant_gemm.QuantizedCpuLinear) at these rows, or with RMSNorm on q and k (Qwen3).
An fp8 cache is written and read by the same ops as op by op, with the layer's scales.
Only the CPU backend's kernel namespace holds it (kernels.get_ops): a namespace with a kernel of
the learner's (kernel_ops, use_kernels) has none, so their kernel always runs.
"""

from __future__ import annotations

import weakref

import torch

from nanoserve.kernels.cpu_attention import MULTI_QUERY_ROWS, query_rows
from nanoserve.kernels.cpu_gemm import GEMV_ROWS

MAX_ROWS = min(GEMV_ROWS, MULTI_QUERY_ROWS)  # tokens a step: each linear a GEMV, each row one attention row

# layer -> {(activation dtype, rows): its four linears' tensors as the op takes them, or None}
_linears: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _linear(m, dtype: torch.dtype, rows: int) -> list[torch.Tensor] | None:
    """A linear's tensors for the op ([weight(, bias)] or [codes, scales(, bias)]), if the module
    runs its GEMV on `rows` rows of `dtype` activations (the module says); else None."""
    operands = m.gemv_operands(dtype, rows) if hasattr(m, "gemv_operands") else None
    return None if operands is None else [t for t in operands if t is not None]


def _layer_linears(layer, dtype: torch.dtype, rows: int):
    known = _linears.setdefault(layer, {})
    if (dtype, rows) not in known:
        attn, mlp = layer.self_attn, layer.mlp
        parts = [_linear(m, dtype, rows)
                 for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        known[dtype, rows] = None if None in parts or hasattr(attn, "q_norm") or attn.head_dim % 8 else parts
    return known[dtype, rows]


def _step_inputs(attn, positions: torch.Tensor):
    """This step's positions and slots, and each token's block table and causal length (the
    attention row it is), as the ops take them; None where the step has no cache slots. Once per
    step, for every layer."""
    if "decode_layer" not in attn.derived:
        qsl, lens = attn.host_offsets()
        seq, row_lens = query_rows(qsl, lens, range(len(lens)))
        # one token each (a decode step): the rows are the sequences, their tables as they are
        tables = attn.block_tables if len(seq) == len(lens) else attn.block_tables[torch.tensor(seq)]
        attn.derived["decode_layer"] = (
            positions.long().contiguous(), attn.slot_mapping.long().contiguous(), tables.int().contiguous(),
            torch.tensor(row_lens, dtype=torch.int32, device=positions.device),
        ) if attn.slot_mapping is not None else None
    return attn.derived["decode_layer"]


def decode_layer(layer, positions, x, residual, kv_cache, attn, cos_sin):
    """DecoderLayer.forward's (output, residual) in one call, or None (run the layer op by op)."""
    k_cache, v_cache = kv_cache
    if (x.shape[0] > MAX_ROWS or x.dim() != 2 or k_cache.dtype not in (x.dtype, torch.float8_e4m3fn)
            or not k_cache.is_contiguous() or not x.is_contiguous() or cos_sin.dtype != torch.float32):
        return None
    linears = _layer_linears(layer, x.dtype, x.shape[0])
    step = _step_inputs(attn, positions) if linears is not None else None
    if step is None:
        return None
    pos, slots, row_tables, row_lens = step
    a = layer.self_attn
    return torch.ops.nanoserve_cpu.decode_layer(
        x, residual, layer.input_layernorm, layer.post_attention_layernorm, layer.eps, *linears,
        a.num_heads, a.num_kv_heads, pos, cos_sin, k_cache, v_cache, slots, row_tables, row_lens, a.scale,
        a.k_scale, a.v_scale)
