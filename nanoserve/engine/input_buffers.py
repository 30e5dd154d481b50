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

Each buffer is written by one slice assignment, a decode step's values are computed in plain
Python, and the last view of each buffer is kept, so a decode step of the same size slices no
tensor. That is for the host's caches: a decode step's weights stream through them and evict the
host code, so each distinct numpy or torch operation then costs tens of microseconds, not one.
A step with a prompt's many tokens computes its positions and cache slots with numpy, where
Python's per-value work would cost more.
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
        self.views: dict[str, tuple] = {}  # name -> (shape, device view, host view) last handed out
        self.copied = torch.cuda.Event() if self.on_cuda else None

    def _write(self, name: str, values) -> np.ndarray:
        """values (a list or an array) into the host buffer of `name`, grown first if they do not
        fit. -> the values' part of the buffer."""
        n = len(values)
        if name not in self.np or len(self.np[name]) < n:
            size = max(16, 1 << (n - 1).bit_length())
            self.host[name] = torch.zeros(size, dtype=_FIELDS[name], pin_memory=self.on_cuda)
            self.np[name] = self.host[name].numpy()
            self.dev[name] = (torch.zeros(size, dtype=_FIELDS[name], device=self.device)
                              if self.on_cuda else self.host[name])
            self.views.pop(name, None)
        self.np[name][:n] = values
        return self.np[name][:n]

    def _send(self, name: str, *shape: int) -> torch.Tensor:
        """The first prod(shape) values of `name` on the device, in that shape (an asynchronous
        copy on CUDA)."""
        view = self.views.get(name)
        if view is None or view[0] != shape:
            n = shape[0] if len(shape) == 1 else shape[0] * shape[1]
            view = self.views[name] = (shape, self.dev[name][:n].view(shape), self.host[name][:n].view(shape))
        if self.on_cuda:
            view[1].copy_(view[2], non_blocking=True)
        return view[1]

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
        seq_lens = [s.start + n for s, n in zip(seqs, lens)]
        width = max(len(s.block_ids) for s in seqs)
        tables = []
        for s in seqs:
            tables += s.block_ids
            tables += [0] * (width - len(s.block_ids))  # padding: any valid block id
        tables = self._write("block_tables", tables)
        if T == B:  # decode: one token each, at its sequence's start
            positions = [s.start for s in seqs]
            slots = [s.block_ids[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        else:
            seq_idx = np.repeat(np.arange(B), lens)  # (T,) owner of each token
            starts = np.asarray([s.start for s in seqs], dtype=np.int64)
            positions = np.arange(T) - np.asarray(qsl[:-1])[seq_idx] + starts[seq_idx]
            slots = tables.reshape(B, width)[seq_idx, positions // bs].astype(np.int64) * bs + positions % bs
        sampled = [j for i, s in enumerate(seqs) if s.sample
                   for j in range(qsl[i + 1] - 1 - len(s.spec_token_ids), qsl[i + 1])]
        self._write("input_ids", list(itertools.chain.from_iterable(s.token_ids for s in seqs)))
        self._write("positions", positions)
        self._write("slot_mapping", slots)
        self._write("query_start_loc", qsl)
        self._write("seq_lens", seq_lens)
        self._write("logits_indices", sampled)

        attn = AttentionMetadata(
            query_start_loc=self._send("query_start_loc", B + 1), seq_lens=self._send("seq_lens", B),
            block_tables=self._send("block_tables", B, width), slot_mapping=self._send("slot_mapping", T),
            query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
            num_decodes=next((i for i, n in enumerate(lens) if n > 1), B))
        out = (self._send("input_ids", T), self._send("positions", T), attn,
               self._send("logits_indices", len(sampled)))
        if self.copied is not None:
            self.copied.record()
        return out
