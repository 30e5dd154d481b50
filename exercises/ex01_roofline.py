"""Exercise 1: roofline arithmetic. Why decode is memory-bound and prefill is not.

A step can't run faster than the bytes it must move divided by the memory bandwidth, nor
faster than the FLOPs it must do divided by the peak FLOP/s. Arithmetic intensity (FLOPs per
byte) says which of the two binds: below the device's *ridge point* (peak / bandwidth) work is
memory-bound, above it compute-bound. These functions count the FLOPs and bytes of a linear layer
and of attention, add them up over a whole model step, then turn the counts into a floor. Write
them from these definitions: a module that imports nanoserve's roofline module scores 0.

Plain numbers in, plain numbers out (decode_step_floor also takes the model's shape, a
ModelConfig), SI units: bytes, FLOPs, seconds, bytes/s, FLOP/s.
A "token" is one row of activations; `dtype_bytes` is 4 for fp32, 2 for bf16/fp16.

Orientation (llama-120m in fp32 on a laptop CPU at 24.5 GB/s): of its 124.7M parameters a decode
step reads 100.1M, the 12 layers' projections and lm_head. The other 24.6M are the input embedding,
and a step gathers one row of it per token instead of reading the matrix. 100.1M x 4 bytes = 400 MB,
so a step takes at least 400e6 / 24.5e9 = 16.3 ms. The weights are read once per step however
many sequences share it, but each sequence reads its own KV cache (24,576 bytes per token of
context here): at batch 16 and 2048 tokens of context that is 805 MB more, twice the weights, and
the floor is 49.7 ms. Batching amortises the weights, never the KV cache.
"""


def linear_flops(num_tokens: int, in_features: int, out_features: int) -> int:
    """FLOPs of y = x @ W.T for x of shape (num_tokens, in_features), W (out_features, in_features).

    Each output element is a dot product of length in_features: one multiply and one add per
    term, so 2 * in_features FLOPs, for num_tokens * out_features outputs.

    Example: linear_flops(1, 768, 768) == 2 * 1 * 768 * 768 == 1_179_648.
    """
    raise NotImplementedError("ex01: write linear_flops")


def linear_bytes(num_tokens: int, in_features: int, out_features: int, dtype_bytes: int) -> int:
    """Compulsory bytes of the same linear layer: the weight read once, x read, y written.

    Elements moved: in_features * out_features (weight) + num_tokens * in_features (x)
    + num_tokens * out_features (y), times dtype_bytes. No bias.

    Example: linear_bytes(1, 768, 768, 4) == (768 * 768 + 768 + 768) * 4 == 2_365_440.
    Hint: at num_tokens=1 the weight is almost all of it; that is why decode is memory-bound.
    """
    raise NotImplementedError("ex01: write linear_bytes")


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved.

    Example: a batch-1 linear layer in fp32 does about 2 FLOPs per 4-byte weight: ~0.5.
    """
    raise NotImplementedError("ex01: write arithmetic_intensity")


def attention_flops(query_len: int, context_len: int, num_heads: int, head_dim: int) -> int:
    """Useful FLOPs of causal attention for one sequence in one layer.

    The step computes query_len new tokens; context_len counts every key they may attend to,
    *including* themselves (so decode is (1, ctx) and a whole prompt of P tokens is (P, P)).
    Query i of the chunk (0-based) sits at position context_len - query_len + i and attends to
    that many + 1 keys. Each (query, key) pair costs 2 * head_dim FLOPs for the score q.k and
    2 * head_dim for adding p * v to the output, in every query head.

    Pairs: query_len * (context_len - query_len) + query_len * (query_len + 1) / 2.
    Example: attention_flops(4, 4, 2, 8): pairs 0 + 10, FLOPs 10 * 4 * 2 * 8 == 640.
    Hint: masked pairs above the diagonal are not counted (a kernel may compute them anyway).
    """
    raise NotImplementedError("ex01: write attention_flops")


def attention_bytes(query_len: int, context_len: int, num_heads: int, num_kv_heads: int,
                    head_dim: int, dtype_bytes: int) -> int:
    """Compulsory bytes of the same attention: read K and V of the whole context once, write
    this step's new K and V into the cache, read Q, write the output.

    Elements: 2 * context_len * kv_dim + 2 * query_len * kv_dim + 2 * query_len * q_dim,
    with kv_dim = num_kv_heads * head_dim and q_dim = num_heads * head_dim; times dtype_bytes.

    Example: attention_bytes(1, 100, 4, 2, 8, 2) == (2*100*16 + 2*1*16 + 2*1*32) * 2 == 6592.
    """
    raise NotImplementedError("ex01: write attention_bytes")


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the bandwidth slope meets the compute roof.

    Example: an H100 SXM, 989e12 bf16 FLOP/s over 3.35e12 B/s: about 295 FLOP/byte.
    """
    raise NotImplementedError("ex01: write ridge_point")


def critical_batch_size(peak_flops: float, bandwidth: float, dtype_bytes: int) -> float:
    """Decode batch size at which the linear layers reach the ridge point.

    A decode step over B sequences does 2 * B FLOPs per weight element and reads each weight's
    dtype_bytes once (activations are negligible): intensity 2 * B / dtype_bytes. Solve for the
    B where that equals the ridge point.

    Example: critical_batch_size(989e12, 3.35e12, 2) is about 295.
    Hint: below this batch size a bigger batch costs almost nothing per step.
    """
    raise NotImplementedError("ex01: write critical_batch_size")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of KV cache one token occupies: a K and a V vector per kv head, in every layer.

    Example: llama-120m (12 layers, 4 kv heads, head_dim 64) in fp32: 2*12*4*64*4 == 24_576.
    """
    raise NotImplementedError("ex01: write kv_bytes_per_token")


def decode_step_floor(cfg, batch_size: int, context_len: int, dtype_bytes: int, bandwidth: float,
                      peak_flops: float) -> float:
    """Roofline floor, in seconds, of one decode step: batch_size sequences each computing one
    token that attends to context_len tokens (itself included).

    cfg is the model's shape, a `nanoserve.config.ModelConfig` (hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size; no bias).
    Add up the pieces above:
    - each layer's four projections, batch_size tokens through each: q/k/v fused (hidden_size ->
      q_dim + 2 * kv_dim), o (q_dim -> hidden_size), gate/up fused (hidden_size ->
      2 * intermediate_size), down (intermediate_size -> hidden_size), with
      q_dim = num_attention_heads * head_dim and kv_dim = num_key_value_heads * head_dim;
    - each layer's attention, once per sequence: one query over context_len keys;
    - lm_head, a linear layer hidden_size -> vocab_size over batch_size tokens.
    The input embedding is left out: a step gathers batch_size rows of it, it doesn't read the
    matrix. So the weights count once per step, whatever batch_size, while every sequence
    reads its own K and V: those bytes grow with batch_size * context_len.
    The floor is the larger of bytes / bandwidth and FLOPs / peak_flops.

    Example: llama-120m (vocab 32000, hidden 768, intermediate 2048, 12 layers, 12 heads, 4 kv
    heads), fp32, at 24.5e9 B/s and 195e9 FLOP/s: batch 1 at context 512 about 0.0169 s; batch 16
    at context 2048 about 0.0497 s (memory-bound both: the KV cache is most of the second).
    """
    raise NotImplementedError("ex01: write decode_step_floor")
