"""A decode step's decoder layers in one C++ call on a CPU (cpu_decode_layer.cpp).

At batch 1 on a CPU, the Python between a layer's small ops (module calls, the kernels' wrappers,
dispatch) costs about as much as the weight read of a thin layer: lesson 11 measures it, and on a
30-layer model it is what a runtime that runs its whole graph natively saves
(benchmarks/batch1_host_work.py). Where a step and the layers allow it, `decode_layers` runs every
layer's ops from C++ instead, one call for the stack, as a CUDA graph replays a GPU's forward: the
same ops, in the order and on the shapes DecoderLayer.forward gives them, so the output is the
op-by-op path's, bit for bit. That covers a step of up to MAX_ROWS tokens: decodes of up to that
many sequences, and a speculative verify's rows, which attention takes a row at a time with their
causal lengths (cpu_attention.query_rows).
It returns None, and the layers run op by op, for anything else:
- a step of more than MAX_ROWS tokens (a prefill chunk, a large batch): its linears take a
  matmul and attention SDPA;
- layers whose linears would not run a GEMV (`gemv_operands` of cpu_gemm.PackedLinear and
  cpu_quant_gemm.QuantizedCpuLinear) at these rows, or with RMSNorm on q and k (Qwen3).
An fp8 cache is written and read by the same ops as op by op, with each layer's scales.
Only the CPU backend's kernel namespace holds it (kernels.get_ops): a namespace with a kernel of
the learner's (kernel_ops, use_kernels) has none, so their kernel always runs.
"""

from __future__ import annotations

import weakref

import torch

from nanoserve.kernels.cpu_attention import MULTI_QUERY_ROWS, query_rows
from nanoserve.kernels.cpu_gemm import GEMV_ROWS

MAX_ROWS = min(GEMV_ROWS, MULTI_QUERY_ROWS)  # tokens a step: each linear a GEMV, each row one attention row

# layers -> {(activation dtype, rows): their norms, linears' tensors and how many each linear
# has, as the op takes them, and their attention modules (whose KV scales are read each call);
# or None}. Kept for the model's life: its weights are fixed once packed (weights_frozen).
_stacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _linear(m, dtype: torch.dtype, rows: int) -> list[torch.Tensor] | None:
    """A linear's tensors for the op ([weight(, bias)] or [codes, scales(, bias)]), if the module
    runs its GEMV on `rows` rows of `dtype` activations (the module says); else None."""
    operands = m.gemv_operands(dtype, rows) if hasattr(m, "gemv_operands") else None
    return None if operands is None else [t for t in operands if t is not None]


def _stack(layers, dtype: torch.dtype, rows: int):
    known = _stacks.setdefault(layers, {})
    if (dtype, rows) not in known:
        norms, linears, arity, attns = [], [], [], []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            parts = [_linear(m, dtype, rows)
                     for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            if None in parts or hasattr(attn, "q_norm") or attn.head_dim % 8:
                known[dtype, rows] = None
                break
            norms += [layer.input_layernorm, layer.post_attention_layernorm]
            linears += [t for part in parts for t in part]
            arity += [len(part) for part in parts]
            attns.append(attn)
        else:
            known[dtype, rows] = norms, linears, arity, attns
    return known[dtype, rows]


def _step_inputs(attn, positions: torch.Tensor):
    """This step's positions and slots, and each token's block table and causal length (the
    attention row it is), as the ops take them; None where the step has no cache slots."""
    if attn.slot_mapping is None:
        return None
    qsl, lens = attn.host_offsets()
    seq, row_lens = query_rows(qsl, lens, range(len(lens)))
    # one token each (a decode step): the rows are the sequences, their tables as they are
    tables = attn.block_tables if len(seq) == len(lens) else attn.block_tables[torch.tensor(seq)]
    return (positions.long().contiguous(), attn.slot_mapping.long().contiguous(), tables.int().contiguous(),
            torch.tensor(row_lens, dtype=torch.int32, device=positions.device))


def decode_layers(layers, positions, x, kv_caches, attn, cos_sin):
    """The layers' DecoderLayer.forward in turn, from the first's input with no residual yet:
    (output, residual) in one call, or None (run the layers op by op)."""
    k_cache = kv_caches[0][0]
    if (x.shape[0] > MAX_ROWS or x.dim() != 2 or k_cache.dtype not in (x.dtype, torch.float8_e4m3fn)
            or not k_cache.is_contiguous() or not x.is_contiguous() or cos_sin.dtype != torch.float32):
        return None
    stack = _stack(layers, x.dtype, x.shape[0])
    step = _step_inputs(attn, positions) if stack is not None else None
    if step is None:
        return None
    norms, linears, arity, attns = stack
    pos, slots, row_tables, row_lens = step
    first = attns[0]
    return torch.ops.nanoserve_cpu.decode_layers(
        x, norms, layers[0].eps, linears, arity, first.num_heads, first.num_kv_heads, pos, cos_sin,
        [k for k, _ in kv_caches], [v for _, v in kv_caches], slots, row_tables, row_lens, first.scale,
        [a.k_scale for a in attns], [a.v_scale for a in attns])
