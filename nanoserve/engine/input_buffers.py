"""The step's input tensors, prepared into persistent buffers (vLLM's persistent batch idea).

Each step the model runner needs a handful of small integer tensors: the flattened token ids and
their positions, the cache slot of each new token, where each request's tokens start, its
context length and block table, and which rows to sample. Building them as fresh tensors costs
allocations and, on CUDA, one blocking copy each. Here they are written with numpy into host
buffers kept from step to step (pinned memory on CUDA) and sent with one asynchronous copy per
tensor into device buffers also kept; nothing waits for them on the host. On a CPU the device
buffers are the host ones: no copy at all.

A buffer grows (to the next power of two) when a step needs more; the tensors handed out are
views, valid until the next `prepare`. Before the host buffers are written again, the copies of
the previous step out of them must have run: an event recorded after them is waited on.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from nanoserve.kernels import AttentionMetadata

# name -> dtype; block_tables is (rows, width) flattened
_FIELDS = {"input_ids": torch.long, "positions": torch.long, "slot_mapping": torch.long,
           "logits_indices": torch.long, "query_start_loc": torch.int32, "seq_lens": torch.int32,
           "block_tables": torch.int32}


class InputBuffers:
    def __init__(self, device, block_size: int):
        self.device, self.block_size = torch.device(device), block_size
        self.on_cuda = self.device.type == "cuda"
        self.host: dict[str, torch.Tensor] = {}
        self.np: dict[str, np.ndarray] = {}
        self.dev: dict[str, torch.Tensor] = {}
        self.copied = torch.cuda.Event() if self.on_cuda else None

    def _room(self, name: str, n: int) -> np.ndarray:
        """The host buffer of `name` with room for n values (as numpy)."""
        if name not in self.host or self.host[name].numel() < n:
            size = max(16, 1 << (n - 1).bit_length())
            self.host[name] = torch.zeros(size, dtype=_FIELDS[name], pin_memory=self.on_cuda)
            self.np[name] = self.host[name].numpy()
            self.dev[name] = (torch.zeros(size, dtype=_FIELDS[name], device=self.device)
                              if self.on_cuda else self.host[name])
        return self.np[name]

    def _send(self, name: str, n: int) -> torch.Tensor:
        """The first n values of `name` on the device (an asynchronous copy on CUDA)."""
        dev = self.dev[name][:n]
        if self.on_cuda:
            dev.copy_(self.host[name][:n], non_blocking=True)
        return dev

    def prepare(self, seqs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """seqs: ScheduledSeq, single-token queries first. -> input_ids (T,), positions (T,),
        AttentionMetadata, logits_indices (S + drafts,): per sampling sequence its last row, and
        before it one row per draft it checks."""
        if self.copied is not None:
            self.copied.synchronize()  # the last step's copies out of the host buffers are done
        B, bs = len(seqs), self.block_size
        lens = [len(s.token_ids) for s in seqs]
        qsl = [0, *itertools.accumulate(lens)]
        T = qsl[-1]
        starts = [s.start for s in seqs]
        seq_lens = [a + n for a, n in zip(starts, lens)]
        width = max(len(s.block_ids) for s in seqs)

        ids = self._room("input_ids", T)
        ids[:T] = list(itertools.chain.from_iterable(s.token_ids for s in seqs))
        tables = self._room("block_tables", B * width)[:B * width].reshape(B, width)
        for row, s in zip(tables, seqs):
            row[:len(s.block_ids)] = s.block_ids
            row[len(s.block_ids):] = 0  # padding: any valid block id
        starts_np = np.asarray(starts, dtype=np.int64)
        if T == B:  # one token each (decode): each is its own sequence's
            seq_idx, pos = np.arange(B), starts_np
        else:
            seq_idx = np.repeat(np.arange(B), lens)  # (T,) owner of each token
            pos = np.arange(T) - np.asarray(qsl[:-1])[seq_idx] + starts_np[seq_idx]  # (T,)
        self._room("positions", T)[:T] = pos
        self._room("slot_mapping", T)[:T] = tables[seq_idx, pos // bs].astype(np.int64) * bs + pos % bs
        self._room("query_start_loc", B + 1)[:B + 1] = qsl
        self._room("seq_lens", B)[:B] = seq_lens
        sampled = [j for i, s in enumerate(seqs) if s.sample
                   for j in range(qsl[i + 1] - 1 - len(s.spec_token_ids), qsl[i + 1])]
        self._room("logits_indices", len(sampled))[:len(sampled)] = sampled

        attn = AttentionMetadata(
            query_start_loc=self._send("query_start_loc", B + 1), seq_lens=self._send("seq_lens", B),
            block_tables=self._send("block_tables", B * width).view(B, width),
            slot_mapping=self._send("slot_mapping", T), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
            num_decodes=next((i for i, n in enumerate(lens) if n > 1), B))
        out = (self._send("input_ids", T), self._send("positions", T), attn,
               self._send("logits_indices", len(sampled)))
        if self.copied is not None:
            self.copied.record()
        return out
