"""Exercise 2: the paged KV cache. Blocks, slot mapping, writing K/V and reading it back.

The cache of one layer is two tensors, k_cache and v_cache, each of shape
(num_blocks, block_size, num_kv_heads, head_dim): memory cut into blocks of block_size tokens.
A request owns a list of block ids, its *block table*, in token order: token p of the request
lives in block block_table[p // block_size], at offset p % block_size inside it. Numbering the
cache's rows 0 .. num_blocks * block_size - 1 gives each token a *slot*:

    slot = block_table[p // block_size] * block_size + p % block_size

Worked example, block_size 4, block table [7, 2]: positions 0..3 go to slots 28..31 (block 7),
positions 4..5 to slots 8..9 (block 2). Blocks need not be contiguous or in order; that is the
point: memory is handed out a block at a time, as a sequence grows, without fragmentation.

Every step the engine computes the slot of each new token, writes the tokens' K/V through
those slots (vLLM calls this op reshape_and_cache) and attention reads each request's context
back through its block table: these four functions are those pieces. Lesson 02 draws a block
table; `python -m nanoserve grade ex02` tries each function on random block tables and says
which slots or rows came out wrong. Work from this docstring and the lesson: nanoserve's own
kernels (nanoserve.kernels.reference, triton_*) are the answer key, and a module that imports
them scores 0.
"""

import torch


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks a sequence of num_tokens tokens occupies (the last one may be partly empty).

    Example: blocks_needed(9, 4) == 3, blocks_needed(8, 4) == 2, blocks_needed(0, 4) == 0.
    """
    raise NotImplementedError("ex02: write blocks_needed")


def slot_mapping(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slot of each position of one request.

    block_table: (num_blocks_of_request,) integer block ids; positions: (T,) integer positions,
    each < len(block_table) * block_size. Returns (T,) int64 slots (int64: index_copy_ needs it).
    Example: slot_mapping(tensor([7, 2]), tensor([0, 3, 4, 5]), 4) -> tensor([28, 31, 8, 9]).
    Hint: vectorise: index block_table with a tensor of block indices.
    """
    raise NotImplementedError("ex02: write slot_mapping")


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write this step's keys and values into the cache in place (vLLM's reshape_and_cache).

    k, v: (T, num_kv_heads, head_dim); k_cache, v_cache: (num_blocks, block_size, num_kv_heads,
    head_dim); slot_mapping: (T,) int64. Token t goes to slot slot_mapping[t]; a slot of -1 marks
    a padding token that must not be written. Every other slot of the cache keeps its value.
    Hint: view the cache as (num_blocks * block_size, num_kv_heads, head_dim): a view shares
    memory, so writing into it writes the cache. Careful: index -1 is a valid Python index.
    """
    raise NotImplementedError("ex02: write write_kv")


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of one request, in order: (length, num_kv_heads, head_dim).

    cache: (num_blocks, block_size, num_kv_heads, head_dim); block_table: (n,) block ids with
    n >= blocks_needed(length, block_size) (extra entries are padding and must be ignored).
    Example: block_size 4, block_table [7, 2], length 6: rows 0..3 of block 7 then rows 0..1 of
    block 2. Hint: index the cache with the block table, then flatten (blocks, block_size).
    """
    raise NotImplementedError("ex02: write gather_kv")
