"""AttentionMetadata: where each request's tokens and KV sit, built once per step (vLLM's idea).

The model runner builds one per step from the SchedulerOutput; every attention layer reads the
same object: `reshape_and_cache` its slot_mapping, `paged_attention` the rest. The *_cpu lists
are the same offsets as Python ints: the runner has them already, and a kernel that needs them
on the host (the reference's per-request loop) saves a device-to-host copy. CUDA graphs leave
them None: a captured graph cannot read tensors back to the host.

As vLLM's attention backends do, the runner puts the single-token queries (decodes) first and
says how many there are (`num_decodes`): a kernel then takes them as the first rows, without
finding them again in every layer. Metadata built elsewhere may leave it None (no order known).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32: request b owns tokens [qsl[b], qsl[b+1])
    seq_lens: torch.Tensor  # (num_seqs,) int32: context length including this step's tokens
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32, padded with any valid block id
    slot_mapping: torch.Tensor | None = None  # (num_tokens,) int64 cache slot per new token, -1: skip
    query_start_loc_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    num_decodes: int | None = None  # sequences 0..num_decodes-1 have one query token each
    # what a kernel derives from this step's metadata, kept for the step's other layers
    derived: dict = field(default_factory=dict, repr=False, compare=False)

    def decode_count(self, qsl: list[int]) -> int:
        """How many leading sequences have one query token (num_decodes, or counted from qsl)."""
        if self.num_decodes is not None:
            return self.num_decodes
        n = 0
        while n + 1 < len(qsl) and qsl[n + 1] - qsl[n] == 1:
            n += 1
        return n

    def host_offsets(self) -> tuple[list[int], list[int]]:
        """(query_start_loc, seq_lens) as Python lists, copied from the device if not given."""
        qsl = self.query_start_loc_cpu
        lens = self.seq_lens_cpu
        return (qsl if qsl is not None else self.query_start_loc.tolist(),
                lens if lens is not None else self.seq_lens.tolist())
