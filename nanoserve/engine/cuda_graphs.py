"""CUDA graphs for decode-only steps (GPU path).

A decode step at small batch is hundreds of tiny kernel launches whose CPU cost can exceed
the GPU time. A CUDA graph records them once per batch size and replays them with one
launch. Graphs need static shapes and addresses, so inputs are copied into fixed buffers
and a batch is padded up to the next captured size (padding tokens write to slot -1,
which the cache kernel skips, and their outputs are dropped).

Only used with the Triton kernels: the reference attention reads lengths on the host,
which a graph cannot capture. Prefill and mixed steps run eagerly.
"""

from __future__ import annotations

import bisect

import torch

from nanoserve.kernels import AttentionMetadata, kernel_backend


class CudaGraphRunner:
    def __init__(self, runner, batch_sizes: list[int]):
        self.runner = runner
        self.sizes = sorted(b for b in batch_sizes if b <= runner.ecfg.max_num_seqs) or [1]
        self.enabled = kernel_backend(runner.device) == "triton"
        if not self.enabled:
            return
        dev, max_bs = runner.device, self.sizes[-1]
        max_len = runner.model.cfg.max_position_embeddings
        if runner.ecfg.max_model_len:
            max_len = min(max_len, runner.ecfg.max_model_len)
        self.max_blocks = -(-max_len // runner.block_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(max_bs, self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self._capture_all()

    def _metadata(self, bs: int) -> AttentionMetadata:
        # decode only: one query token per sequence, so the host offsets are fixed; seq_lens stay
        # on the device (a captured graph cannot read them back)
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bs + 1], seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs], slot_mapping=self.slot_mapping[:bs],
            query_start_loc_cpu=list(range(bs + 1)))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        model, kv = self.runner.model, self.runner.kv_caches
        for bs in reversed(self.sizes):  # largest first so smaller graphs reuse its memory pool
            attn = self._metadata(bs)
            model(self.input_ids[:bs], self.positions[:bs], kv, attn)  # warm-up (Triton JIT, allocator)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[bs] = model(self.input_ids[:bs], self.positions[:bs], kv, attn)
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, seqs) -> bool:
        return (self.enabled and len(seqs) <= self.sizes[-1]
                and all(s.is_decode and len(s.token_ids) == 1 for s in seqs)  # no drafts to check
                and max(len(s.block_ids) for s in seqs) <= self.max_blocks)

    def run(self, input_ids, positions, attn: AttentionMetadata) -> torch.Tensor:
        """Replay the graph of the next captured size >= batch. -> hidden (B, hidden)."""
        B = input_ids.shape[0]
        bs = self.sizes[bisect.bisect_left(self.sizes, B)]
        self.input_ids[:B].copy_(input_ids)
        self.positions[:B].copy_(positions)
        self.slot_mapping[:B].copy_(attn.slot_mapping)
        self.slot_mapping[B:bs].fill_(-1)  # padding writes nothing
        self.seq_lens[:B].copy_(attn.seq_lens)
        self.seq_lens[B:bs].fill_(1)
        width = attn.block_tables.shape[1]
        self.block_tables[:B, :width].copy_(attn.block_tables)
        self.graphs[bs].replay()
        return self.outputs[bs][:B]
