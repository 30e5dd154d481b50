"""Exercise 3: attention over a flattened batch and the paged cache.

Every step the engine sends *one* batch through the model: the tokens of all scheduled
requests concatenated, prefill chunks and single decode tokens alike. Attention is the only
layer that must know where one request ends and the next begins. Lesson 03 draws such a batch
(`nanoserve.course.exercise_figures.plot_flattened_batch()`); you get:

    q:                    (T, num_heads, head_dim)  the step's queries, requests one after another
    k_cache, v_cache:     (num_blocks, block_size, num_kv_heads, head_dim), this step's K/V
                          already written (exercise 2)
    attn: AttentionMetadata, built once per step by the model runner, read by every layer:
      attn.query_start_loc: (B+1,) int32  request b owns rows query_start_loc[b] .. [b+1]-1
      attn.seq_lens:        (B,) int32    request b's context length *including* this step
      attn.block_tables:    (B, max_blocks) int32  request b's block table, padded with any id
      attn.host_offsets():  (query_start_loc, seq_lens) as Python lists, for a loop
    scale:                multiply q.k by this (head_dim ** -0.5)

Request b has q_len = query_start_loc[b+1] - query_start_loc[b] new tokens; its j-th new token
sits at position seq_lens[b] - q_len + j and attends to the keys at positions 0 .. its own
position (causal, offset by the tokens already cached before this step). Grouped-query
attention (GQA): there are fewer kv heads than query heads, and query head h reads kv head
h // (num_heads // num_kv_heads): with 4 query heads over 2 kv heads, heads 0, 1 read kv head 0
and heads 2, 3 kv head 1.

Worked example: one decode token of a request with 5 cached tokens (q_len 1, seq_len 6) sees
keys 0..5; a chunk of 3 tokens after 4 cached ones (q_len 3, seq_len 7) has positions 4, 5, 6,
and its first token sees keys 0..4, its last keys 0..6.

Two tasks, graded one by one: `attend_one_request` (one request, its context already
gathered), then `paged_attention`, a loop over the batch's requests that gathers each one's
context through its block table and calls it. The signature of `paged_attention` is the one
the engine's kernels take, so yours can replace them:
`nanoserve.kernels.use_kernels(llm, paged_attention=paged_attention)`.
`python -m nanoserve grade ex03` reports the first token that differs, by how much, and which
query heads. Stretch: vectorise paged_attention (no Python loop over requests).
"""

import torch

from nanoserve.kernels import AttentionMetadata


def attend_one_request(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of one request's new tokens over its whole context.

    q: (q_len, num_heads, head_dim), this step's queries of the request; k, v: (seq_len,
    num_kv_heads, head_dim), its keys and values at positions 0 .. seq_len-1, this step's tokens
    included (they are the last q_len). Query j sits at position seq_len - q_len + j and sees
    keys 0 .. that position. Returns (q_len, num_heads, head_dim) in q's dtype; compute in fp32.
    Hint: give each query head its kv head (GQA, see the module docstring), scores
    (num_heads, q_len, seq_len) = q.k * scale, -inf where a key is past the query's position
    (torch.ones(q_len, seq_len).tril(seq_len - q_len) is True where it may look), softmax, @ v.
    """
    raise NotImplementedError("ex03: write attend_one_request")


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    attn: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal attention of every token of the batch over its own request's paged context.

    Returns (T, num_heads, head_dim) in q's dtype. Loop over the requests: take request b's
    rows of q, gather its seq_lens[b] keys and values through its block table (exercise 2's
    gather_kv does it: `from .ex02_paged_kv import gather_kv`), and attend_one_request.
    """
    raise NotImplementedError("ex03: write paged_attention")
