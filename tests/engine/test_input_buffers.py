"""InputBuffers: the step's tensors from persistent buffers equal the same tensors built afresh,
and the buffers are reused from step to step (grown only when a step needs more)."""

import random

import torch

from nanoserve.engine.input_buffers import InputBuffers
from nanoserve.engine.scheduler import ScheduledSeq
from nanoserve.sampling_params import SamplingParams


def fresh(seqs, block_size):
    """The tensors written out plainly, one sequence at a time."""
    ids, pos, slots, qsl, lens, rows = [], [], [], [0], [], []
    width = max(len(s.block_ids) for s in seqs)
    for s in seqs:
        for j, t in enumerate(s.token_ids):
            p = s.start + j
            ids.append(t)
            pos.append(p)
            slots.append(s.block_ids[p // block_size] * block_size + p % block_size)
        qsl.append(qsl[-1] + len(s.token_ids))
        lens.append(s.start + len(s.token_ids))
        rows.append(s.block_ids + [0] * (width - len(s.block_ids)))
    sampled = [qsl[i + 1] - 1 for i, s in enumerate(seqs) if s.sample]
    return ids, pos, slots, qsl, lens, rows, sampled


def random_step(rng, block_size, num_blocks=64):
    decodes = [(rng.randint(0, 60), 1) for _ in range(rng.randint(0, 5))]
    chunks = [(rng.randint(0, 40), rng.randint(2, 30)) for _ in range(rng.randint(0, 3))]
    seqs = []
    for i, (start, n) in enumerate(decodes + chunks or [(0, 1)]):
        blocks = rng.sample(range(num_blocks), -(-(start + n) // block_size))
        seqs.append(ScheduledSeq(f"r{i}", [rng.randint(1, 99) for _ in range(n)], start, blocks,
                                 rng.random() < 0.7, SamplingParams(), n == 1))
    return seqs


def test_prepared_tensors_equal_fresh_ones_and_buffers_are_reused():
    rng = random.Random(0)
    bufs = InputBuffers("cpu", block_size=4)
    ptrs = None
    for step in range(40):
        seqs = random_step(rng, 4)
        ids, pos, attn, sampled = bufs.prepare(seqs)
        want = fresh(seqs, 4)
        assert ids.tolist() == want[0] and pos.tolist() == want[1]
        assert attn.slot_mapping.tolist() == want[2]
        assert attn.query_start_loc.tolist() == want[3] == attn.query_start_loc_cpu
        assert attn.seq_lens.tolist() == want[4] == attn.seq_lens_cpu
        assert attn.block_tables.tolist() == want[5] and sampled.tolist() == want[6]
        assert attn.num_decodes == next((i for i, s in enumerate(seqs) if len(s.token_ids) > 1),
                                        len(seqs))
        assert ids.dtype == pos.dtype == attn.slot_mapping.dtype == sampled.dtype == torch.long
        assert attn.block_tables.dtype == attn.seq_lens.dtype == torch.int32
        if step >= 20:  # grown to what these steps need by then: the same memory every step
            now = {k: t.data_ptr() for k, t in bufs.dev.items()}
            assert ptrs is None or now == ptrs
            ptrs = now


def test_a_steady_decode_reads_each_steps_values_from_the_views_it_keeps():
    # the same shapes step after step, as a steady decode makes: the views kept from the step
    # before must show this step's values, and a sequence's new block widens the tables
    rng = random.Random(1)
    bufs = InputBuffers("cpu", block_size=4)
    starts, blocks = [5, 11, 2], [rng.sample(range(64), 16) for _ in range(3)]
    for step in range(12):
        seqs = [ScheduledSeq(f"r{i}", [rng.randint(1, 99)], s + step, b[:(s + step) // 4 + 1], True,
                             SamplingParams(), True) for i, (s, b) in enumerate(zip(starts, blocks))]
        ids, pos, attn, sampled = bufs.prepare(seqs)
        want = fresh(seqs, 4)
        assert ids.tolist() == want[0] and pos.tolist() == want[1], step
        assert attn.slot_mapping.tolist() == want[2] and attn.seq_lens.tolist() == want[4], step
        assert attn.block_tables.tolist() == want[5] and sampled.tolist() == want[6], step
