"""Exercise 3: attention over the flattened mixed batch, reading the paged cache.

Every step the engine sends *one* batch through the model: the tokens of all scheduled
requests concatenated, prefill chunks and single decode tokens alike. Attention is the only
layer that must know where one request ends and the next begins. You get:

    q:                    (T, num_heads, head_dim)  the step's queries, requests one after another
    k_cache, v_cache:     (num_blocks, block_size, num_kv_heads, head_dim), this step's K/V
                          already written (exercise 2)
    attn: AttentionMetadata, built once per step by the model runner, read by every layer:
      attn.query_start_loc: (B+1,) int32  request b owns rows query_start_loc[b] .. [b+1]-1
      attn.seq_lens:        (B,) int32    request b's context length *including* this step
      attn.block_tables:    (B, max_blocks) int32  request b's block table, padded with any id
      attn.query_start_loc_cpu, attn.seq_lens_cpu: the same numbers as Python lists, or None
    scale:                multiply q.k by this (head_dim ** -0.5)

Request b has q_len = query_start_loc[b+1] - query_start_loc[b] new tokens; its j-th new token
sits at position seq_lens[b] - q_len + j and attends to the keys at positions 0 .. its own
position (causal, offset by the tokens already cached before this step). Grouped-query
attention: query head h reads kv head h // (num_heads // num_kv_heads).

Worked example: one decode token of a request with 5 cached tokens (q_len 1, seq_len 6) sees
keys 0..5; a chunk of 3 tokens after 4 cached ones (q_len 3, seq_len 7) has positions 4, 5, 6,
and its first token sees keys 0..4, its last keys 0..6.

The signature is `nanoserve.kernels.reference.paged_attention`'s, so yours can replace it
in the engine: `nanoserve.kernels.use_kernels(llm, paged_attention=paged_attention)`.
Aim for vectorised torch (no Python loop over tokens); compute softmax in fp32.
"""

import torch

from nanoserve.kernels import AttentionMetadata


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of every token of the batch over its own request's paged context.

    Returns (T, num_heads, head_dim) in q's dtype. The *_cpu lists, when not None, save reading
    tensors back from a GPU; ignoring them is fine.
    Hint: give every token its request index and position (torch.repeat_interleave), gather
    each request's keys with its block table, mask key_pos > query_pos with -inf, softmax.
    """
    T, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    dev = q.device
    qsl, lens = attn.query_start_loc.long(), attn.seq_lens.long()
    q_lens = qsl[1:] - qsl[:-1]  # (B,)
    seq_idx = torch.repeat_interleave(torch.arange(len(lens), device=dev), q_lens, output_size=T)  # (T,)
    q_pos = torch.arange(T, device=dev) - qsl[seq_idx] + (lens - q_lens)[seq_idx]  # (T,)

    max_len = max(attn.seq_lens_cpu) if attn.seq_lens_cpu is not None else int(lens.max())
    nb = -(-max_len // block_size)
    tables = attn.block_tables[:, :nb].long()  # (B, nb)
    k = k_cache[tables].flatten(1, 2)[:, :max_len]  # (B, L, num_kv_heads, head_dim)
    v = v_cache[tables].flatten(1, 2)[:, :max_len]

    qg = q.view(T, num_kv_heads, group, head_dim).float()  # (T, kvh, g, hd)
    scores = torch.einsum("tkgd,tlkd->tkgl", qg, k[seq_idx].float()) * scale  # (T, kvh, g, L)
    future = torch.arange(max_len, device=dev)[None, :] > q_pos[:, None]  # (T, L)
    scores.masked_fill_(future[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1)
    out = torch.einsum("tkgl,tlkd->tkgd", probs, v[seq_idx].float())  # (T, kvh, g, hd)
    return out.reshape(T, num_heads, head_dim).to(q.dtype)
