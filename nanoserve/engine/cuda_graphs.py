"""CUDA graphs for decode-only steps (GPU path).

A decode step at small batch is hundreds of tiny kernel launches whose CPU cost can exceed
the GPU time. A CUDA graph records them once per batch size and replays them with one
launch. Graphs need static shapes and addresses, so inputs are copied into fixed buffers
and a batch is padded up to the next captured size (padding tokens write to slot -1,
which the cache kernel skips, and their outputs are dropped).

Which sizes: by default vLLM's list up to the engine's max_num_seqs (`capture_sizes`), so every
decode batch the engine can run replays a graph; an explicit `cuda_graph_batch_sizes` is captured
as given and larger batches run eagerly. An engine built later over the same runner with a larger
max_num_seqs (`compile_or_warm_up_model`) captures the missing sizes before its first step.

Only used with the Triton kernels: the reference attention reads lengths on the host,
which a graph cannot capture. Prefill and mixed steps run eagerly.
"""

from __future__ import annotations

import bisect

import torch

from nanoserve.kernels import AttentionMetadata, kernel_backend


def capture_sizes(max_num_seqs: int, sizes: list[int] | None = None) -> list[int]:
    """The batch sizes to capture for an engine of `max_num_seqs`, ascending.

    sizes=None: vLLM's default list, [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)
    (VllmConfig._set_cudagraph_sizes, vllm/config/vllm.py; vLLM caps it at min(2 *
    max_num_seqs, 512)). Either list is cut after its first size >= max_num_seqs: it covers
    every batch (an explicit list may stop short: larger batches run eagerly) and no more.
    """
    if sizes is not None:
        ordered = sorted(set(sizes))
        return ordered[:bisect.bisect_left(ordered, max_num_seqs) + 1]
    out, b = [], 1
    while True:
        out.append(b)
        if b >= max_num_seqs:
            return out
        b = b * 2 if b < 8 else b + (8 if b < 256 else 16)


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The smallest captured size >= batch (sizes ascending), None if the batch is larger."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


class CudaGraphRunner:
    def __init__(self, runner, batch_sizes: list[int] | None, max_num_seqs: int):
        self.runner, self.user_sizes = runner, batch_sizes
        self.sizes: list[int] = []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.enabled = kernel_backend(runner.device) == "triton"
        if not self.enabled:
            return
        max_len = runner.model.cfg.max_position_embeddings
        if runner.ecfg.max_model_len:
            max_len = min(max_len, runner.ecfg.max_model_len)
        self.max_blocks = -(-max_len // runner.block_size)
        self.ensure(max_num_seqs)

    def ensure(self, max_num_seqs: int) -> None:
        """Capture what an engine of `max_num_seqs` needs and is not captured yet. A larger
        largest size needs larger input buffers, at new addresses: every graph is captured again."""
        if not self.enabled:
            return
        wanted = set(capture_sizes(max_num_seqs, self.user_sizes))
        if wanted <= set(self.graphs):
            return
        self.sizes = sorted(wanted | set(self.sizes))
        self._allocate(self.sizes[-1])
        self._capture_all()

    def _allocate(self, max_bs: int) -> None:
        dev = self.runner.device
        self.graphs, self.outputs = {}, {}
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(max_bs, self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.pool = torch.cuda.graph_pool_handle()

    def _metadata(self, bs: int) -> AttentionMetadata:
        # decode only: one query token per sequence, so the host offsets are fixed; seq_lens stay
        # on the device (a captured graph cannot read them back)
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bs + 1], seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs], slot_mapping=self.slot_mapping[:bs],
            query_start_loc_cpu=list(range(bs + 1)), num_decodes=bs)

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
        return (self.enabled and bool(self.sizes) and len(seqs) <= self.sizes[-1]
                and all(s.is_decode and len(s.token_ids) == 1 for s in seqs)  # no drafts to check
                and max(len(s.block_ids) for s in seqs) <= self.max_blocks)

    def run(self, input_ids, positions, attn: AttentionMetadata) -> torch.Tensor:
        """Replay the graph of the next captured size >= batch. -> hidden (B, hidden)."""
        B = input_ids.shape[0]
        bs = padded_size(self.sizes, B)
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
