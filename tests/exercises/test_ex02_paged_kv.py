"""Exercise 2 (paged KV cache), checked against nanoserve's KV manager and reference kernels."""

import pytest
import torch
from exercise_checks import graded
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.kernels import reference


@pytest.fixture(scope="module")
def ex(load):
    return load("ex02_paged_kv")


@graded(30)
@given(num_tokens=st.integers(0, 1000), block_size=st.integers(1, 64))
def test_blocks_needed(ex, num_tokens, block_size):
    want = KVCacheManager(1, block_size).blocks_needed(num_tokens)
    got = ex.blocks_needed(num_tokens, block_size)
    assert got == want, f"blocks_needed({num_tokens}, {block_size}) returned {got}, expected {want}"


def test_slot_mapping_worked_example(ex):
    got = ex.slot_mapping(torch.tensor([7, 2]), torch.tensor([0, 3, 4, 5]), 4)
    assert got.tolist() == [28, 31, 8, 9], \
        f"table [7, 2], block_size 4, positions [0, 3, 4, 5]: got {got.tolist()}, expected [28, 31, 8, 9]"


@graded(30)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(1, 8))
def test_slot_mapping_follows_the_block_table(ex, data, block_size, num_blocks):
    table = data.draw(st.permutations(range(32)))[:num_blocks]
    positions = data.draw(st.lists(st.integers(0, num_blocks * block_size - 1), min_size=1, max_size=20))
    slots_in_order = [b * block_size + o for b in table for o in range(block_size)]  # the request's slots
    want = [slots_in_order[p] for p in positions]
    got = ex.slot_mapping(torch.tensor(table, dtype=torch.int32), torch.tensor(positions), block_size)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64, \
        f"slot_mapping should return an int64 tensor, got {getattr(got, 'dtype', type(got))}"
    assert got.tolist() == want, (
        f"block table {table}, block_size {block_size}, positions {positions}: slots {got.tolist()}, "
        f"expected {want}")


def random_cache(num_blocks=6, block_size=4, kv_heads=2, head_dim=8, dtype=torch.float32):
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_reshape_and_cache(ex, dtype):
    k_cache, v_cache = random_cache(dtype=dtype)
    T = 9
    k, v = torch.randn(T, 2, 8), torch.randn(T, 2, 8)
    slots = torch.randperm(24)[:T]
    slots[[2, 5]] = -1  # padding tokens
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.reshape_and_cache(k, v, want_k, want_v, slots)
    ex.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), (
        "the cache after write_kv differs from reshape_and_cache's: each token goes to its slot, "
        "slot -1 is skipped, every other slot keeps its value")


def test_write_kv_skips_padding(ex):
    k_cache, v_cache = random_cache()
    before_k, before_v = k_cache.clone(), v_cache.clone()
    ex.write_kv(torch.randn(3, 2, 8), torch.randn(3, 2, 8), k_cache, v_cache, torch.tensor([-1, -1, -1]))
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v), \
        "slot -1 marks padding: nothing may be written (k_cache[-1] is a real slot)"


@graded(30)
@given(data=st.data(), block_size=st.sampled_from([1, 2, 4, 8]))
def test_gather_kv_matches_reference(ex, data, block_size):
    cache = torch.randn(10, block_size, 2, 4)
    length = data.draw(st.integers(0, 4 * block_size))
    table = torch.tensor(data.draw(st.permutations(range(10)))[:5], dtype=torch.int32)  # extra = padding
    want = reference.gather_kv(cache, table, length)
    got = ex.gather_kv(cache, table, length)
    assert got.shape == want.shape, \
        f"gather_kv(length={length}) has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert torch.equal(got, want), \
        f"gather_kv(length={length}, block table {table.tolist()}) returned other rows"


@graded(30)
@given(data=st.data(), block_size=st.sampled_from([2, 4, 8]), length=st.integers(1, 40))
def test_write_then_gather_round_trip(ex, data, block_size, length):
    """A request's K written token by token through its slots is read back in order."""
    nb = -(-length // block_size)
    table = torch.tensor(data.draw(st.permutations(range(24)))[:nb])
    k_cache, v_cache = random_cache(num_blocks=24, block_size=block_size)
    k, v = torch.randn(length, 2, 8), torch.randn(length, 2, 8)
    chunk = data.draw(st.integers(1, length))
    for start in range(0, length, chunk):  # written step by step, as prefill chunks and decodes
        pos = torch.arange(start, min(start + chunk, length))
        ex.write_kv(k[pos], v[pos], k_cache, v_cache, ex.slot_mapping(table, pos, block_size))
    assert torch.equal(ex.gather_kv(k_cache, table, length), k), \
        f"K of a {length}-token request written in chunks of {chunk} did not read back in order"
    assert torch.equal(ex.gather_kv(v_cache, table, length), v), "V did not read back in order"
