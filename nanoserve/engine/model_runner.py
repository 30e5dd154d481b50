"""The model runner: turns a SchedulerOutput into tensors, runs the model, samples.

All scheduled tokens of all requests form one flattened batch (num_tokens,); per request
we pass where its tokens start (query_start_loc), how long its context is (seq_lens) and
its block table, and per token the cache slot its new K/V goes to (slot_mapping).
Only rows whose chunk reaches the end of the known tokens get logits and a sample; a decode that
checks drafted tokens (speculative decoding) gets logits at each of them too, and the rejection
sampler keeps the drafts the model agrees with.
On CUDA, decode-only steps replay CUDA graphs (see cuda_graphs.py).
With a KV connector (disaggregated prefill/decode), arriving KV is loaded into the cache before
the forward and the prompts handed off this step are saved after it (kv_connector.py).
"""

from __future__ import annotations

import itertools
import os
import time

import torch

from nanoserve.config import EngineConfig, ModelConfig, default_device
from nanoserve.engine.executor import Executor, RequestFailed
from nanoserve.engine.input_buffers import InputBuffers
from nanoserve.engine.kv_cache import (
    allocate_kv_cache,
    kv_bytes_per_block,
    kv_cache_torch_dtype,
    num_blocks_in,
)
from nanoserve.engine.kv_connector import KVConnectorRole
from nanoserve.engine.kv_transport import KVLayout
from nanoserve.engine.rejection_sampler import RejectionSampler
from nanoserve.engine.sampler import Sampler
from nanoserve.engine.scheduler import ScheduledSeq, SchedulerOutput
from nanoserve.engine.shm_connector import make_kv_connector
from nanoserve.engine.tokenizer import load_tokenizer
from nanoserve.errors import InvalidRequest, as_int
from nanoserve.kernels import reference, use_kernels


def num_kv_blocks_for(ecfg: EngineConfig, mcfg: ModelConfig, dtype, device, max_model_len: int) -> int:
    """Blocks from num_kv_blocks, or a byte budget: kv_cache_memory, else on CUDA
    gpu_memory_utilization of total memory minus what is already in use, on a CPU
    `cpu_kv_cache_budget` capped by what max_num_seqs requests of max_model_len tokens can use.
    `dtype` is the cache's (kv_cache_torch_dtype): an fp8 block is half a bf16 one."""
    if ecfg.num_kv_blocks is not None:
        return ecfg.num_kv_blocks
    budget, most_needed = ecfg.kv_cache_memory, None
    if budget is None and str(device).startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        activations = 2**30  # headroom for a step's activations and CUDA graphs
        budget = int(total * ecfg.gpu_memory_utilization) - (total - free) - activations
    elif budget is None:
        budget = cpu_kv_cache_budget(ecfg.gpu_memory_utilization)
        # a cap, so a small model on a big machine does not take gigabytes it can never use
        most_needed = ecfg.max_num_seqs * -(-max_model_len // ecfg.block_size)
    block = kv_bytes_per_block(mcfg, ecfg.block_size, dtype)
    blocks = num_blocks_in(max(budget, 0), mcfg, dtype, ecfg.block_size)
    if blocks < 1:
        raise ValueError(f"the KV cache gets {max(budget, 0) / 2**20:.0f} MiB, less than one block "
                         f"({block} bytes): {_memory_held(device)}; pass num_kv_blocks=N (N blocks of "
                         f"{ecfg.block_size} tokens, {block} bytes each) or kv_cache_memory=BYTES, or free "
                         "an engine first (del llm; gc.collect())")
    return blocks if most_needed is None else min(blocks, most_needed)


# On a CPU the default KV cache is at most CPU_KV_CACHE_SPACE bytes (vLLM's CPU backend documents
# a fixed VLLM_CPU_KVCACHE_SPACE of 4 GiB by default) and half of the memory available when the
# engine starts, so that a notebook can build the next engine it compares.
CPU_KV_CACHE_SPACE = 4 * 2**30
CPU_KV_SHARE_OF_AVAILABLE = 0.5


def cpu_kv_cache_budget(utilization: float) -> int:
    """Bytes for the KV cache on a CPU, as vLLM 0.32's CPU worker sizes it (CPUWorker in
    vllm/v1/worker/cpu_worker.py): `utilization` of the machine's memory minus what this process
    holds once the model is loaded (its resident memory). vLLM refuses to start when the memory
    available now is short of that share; a laptop runs other programs, so here the budget is
    cut instead, to keep (1 - utilization) of the machine's memory available; and it is capped
    as above (CPU_KV_CACHE_SPACE, CPU_KV_SHARE_OF_AVAILABLE). kv_cache_memory sets it outright."""
    import psutil
    mem = psutil.virtual_memory()
    held = psutil.Process().memory_info().rss
    return int(min(mem.total * utilization - held, mem.available - mem.total * (1 - utilization),
                   mem.available * CPU_KV_SHARE_OF_AVAILABLE, CPU_KV_CACHE_SPACE))


def _memory_held(device) -> str:
    """What holds the memory now, for the error that says none is left."""
    gib = 2**30
    if str(device).startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return f"{(total - free) / gib:.1f} of the device's {total / gib:.1f} GiB are in use"
    import psutil
    mem = psutil.virtual_memory()
    return (f"this process already holds {psutil.Process().memory_info().rss / gib:.1f} GiB "
            f"(models, other engines' KV caches) and {mem.available / gib:.1f} of the machine's "
            f"{mem.total / gib:.1f} GiB are available")


def check_device(device) -> str:
    """'cpu', 'cuda' or 'cuda:N' as a string; InvalidRequest naming anything else."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InvalidRequest("device", f"device={device!r} is not a torch device "
                                       "(e.g. 'cpu', 'cuda', 'cuda:1')") from None
    if dev.type not in ("cpu", "cuda"):
        raise InvalidRequest("device", f"device={device!r}: nanoserve runs on 'cpu' or 'cuda'")
    if dev.type == "cuda" and (not torch.cuda.is_available()
                               or (dev.index or 0) >= torch.cuda.device_count()):
        raise InvalidRequest("device", f"device={device!r} but torch sees "
                                       f"{torch.cuda.device_count()} CUDA device(s)")
    return str(dev)


class ModelRunner(Executor):
    """Runs a real model: owns the KV cache tensors, the sampler and (on CUDA) the decode graphs.

    `execute_model(scheduler_output)` builds the step's flattened batch and AttentionMetadata
    (`prepare`), runs the model, computes logits only where a token is sampled, and samples.
    """

    def __init__(self, model, mcfg: ModelConfig, ecfg: EngineConfig, device, dtype,
                 num_blocks: int, seed: int = 0, tokenizer=None):
        self.model, self.model_config, self.ecfg = model, mcfg, ecfg
        self.tokenizer = tokenizer
        if ecfg.compile:
            # inductor traces plain torch and generates its own fused kernels; the hand-written
            # ops are opaque calls it cannot fuse (and the C++ ones have no fake-tensor rule)
            model.set_ops(reference)
            self.forward = torch.compile(model, dynamic=True)
        else:
            model.process_weights_after_loading()  # the kernel backend's weight layout
            if ecfg.enforce_eager:  # every kernel called one by one: no fused decode layers (CPU)
                use_kernels(model)
            self.forward = model
        self.device, self.dtype = torch.device(device), dtype
        self.kv_cache_dtype = kv_cache_torch_dtype(ecfg.kv_cache_dtype, dtype)  # what the cache stores
        self.block_size = ecfg.block_size
        self.kv_caches = allocate_kv_cache(mcfg, num_blocks, ecfg.block_size, self.kv_cache_dtype,
                                           device)
        self.sampler = Sampler(device, seed)
        self.inputs = InputBuffers(device, ecfg.block_size)
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.graphs = None
        if self.device.type == "cuda" and not ecfg.enforce_eager:
            from nanoserve.engine.cuda_graphs import CudaGraphRunner
            self.graphs = CudaGraphRunner(self, ecfg.cuda_graph_batch_sizes, ecfg.max_num_seqs)

    def prepare(self, seqs: list[ScheduledSeq]):
        """-> input_ids (T,), positions (T,), AttentionMetadata, logits_indices (S + drafts,): views
        of persistent buffers, valid until the next step (input_buffers.py); per sampling sequence
        its last row, and before it one row per draft it checks."""
        return self.inputs.prepare(seqs)

    @classmethod
    def load(cls, model: str | ModelConfig | None, device: str | None, dtype: str | None,
             seed: int, config: EngineConfig) -> ModelRunner:
        """Load `model` (default: the demo model) on `device` (default: CUDA if present) in
        `dtype` (default: bf16 on CUDA, fp32 on CPU), with its tokenizer and a KV cache."""
        from nanoserve.model import load_model
        from nanoserve.model.loader import resolve_dtype
        if model is not None and not isinstance(model, (str, ModelConfig)):
            raise InvalidRequest("model", f"model={model!r} must be a checkpoint folder, a hub id, "
                                          "'preset:NAME' or a ModelConfig")
        device = check_device(device or default_device())
        seed = as_int("seed", seed)
        try:
            dtype = resolve_dtype(dtype or ("bfloat16" if device.startswith("cuda") else "float32"))
        except (TypeError, ValueError) as exc:
            raise InvalidRequest("dtype", str(exc) if isinstance(exc, ValueError)
                                 else f"dtype={dtype!r} is not a dtype name") from None
        torch.manual_seed(seed)
        model = model if model is not None else default_model()
        net, mcfg, folder = load_model(model, device, dtype, seed, config.quantization,
                                       config.quantization_group_size, config.quantization_lm_head)
        tokenizer = load_tokenizer(folder) if folder is not None else None
        num_blocks = num_kv_blocks_for(config, mcfg, kv_cache_torch_dtype(config.kv_cache_dtype, dtype),
                                       device, config.max_model_len_for(mcfg))
        runner = cls(net, mcfg, config, device, dtype, num_blocks, seed, tokenizer)
        if isinstance(model, str):
            runner.model_name = os.path.basename(os.path.normpath(model)) if folder else model
        runner.model_path = folder
        return runner

    def compile_or_warm_up_model(self, config: EngineConfig) -> None:
        if self.graphs is not None:
            self.graphs.ensure(config.max_num_seqs)  # an engine of more max_num_seqs: more graphs

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_caches[0][0].shape[0]

    def finish_requests(self, request_ids) -> None:
        for rid in request_ids:
            self.sampler.forget(rid)

    def init_kv_connector(self, kv_transfer_config) -> None:
        self.kv_connector = make_kv_connector(kv_transfer_config, KVConnectorRole.WORKER,
                                              KVLayout.of(self.kv_caches), self.block_size,
                                              self.model_config.vocab_size)
        self.kv_connector.register_kv_caches(self.kv_caches)

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> dict[str, int]:
        """Run one step. -> {request_id: sampled token} for requests that reached a new token.
        A KV transfer that fails raises RequestFailed for its request (executor.py)."""
        connector, meta = self.kv_connector, out.kv_connector_metadata
        if connector is None or meta is None:
            return self._run(out.seqs)
        connector.bind_connector_metadata(meta)
        try:
            if meta.loads:
                connector.start_load_kv()
            sampled = self._run(out.seqs)
            if meta.saves:
                for i, (k_cache, v_cache) in enumerate(self.kv_caches):
                    connector.save_kv_layer(i, k_cache, v_cache)
                failed = connector.wait_for_save()
                if failed:
                    raise RequestFailed(failed, {r: t for r, t in sampled.items() if r not in failed})
            return sampled
        finally:
            connector.clear_connector_metadata()

    def _run(self, seqs) -> dict[str, int | list[int]]:
        # single-token queries first, as vLLM orders a batch: the attention kernels take them
        # as one block of rows (AttentionMetadata.num_decodes)
        seqs = sorted(seqs, key=lambda s: len(s.token_ids) > 1)
        t = time.perf_counter()
        input_ids, positions, attn, logits_indices = self.prepare(seqs)
        self.prepare_time = time.perf_counter() - t  # seconds, read by measure/bench.py
        if self.graphs is not None and self.graphs.can_run(seqs):
            hidden = self.graphs.run(input_ids, positions, attn)
        else:
            hidden = self.forward(input_ids, positions, self.kv_caches, attn)  # (T, hidden)
        n = logits_indices.numel()
        if not n:
            return {}
        # the indices rise, so as many as the rows are every row: a decode step gathers nothing
        logits = self.model.compute_logits(hidden if n == len(hidden) else hidden[logits_indices])
        sampling = [s for s in seqs if s.sample]
        return self._sample(logits, sampling)

    def _sample(self, logits: torch.Tensor, sampling: list[ScheduledSeq]) -> dict[str, int | list[int]]:
        """logits: each sampling sequence's rows in order (1, or 1 + its drafts). -> {request_id:
        the sampled token}, or for a sequence that checked drafts, the accepted ones and the next."""
        ends = list(itertools.accumulate(1 + len(s.spec_token_ids) for s in sampling))
        out, errors = {}, {}
        for verify in (False, True):
            idx = [i for i, s in enumerate(sampling) if bool(s.spec_token_ids) == verify]
            if not idx:
                continue
            seqs = [sampling[i] for i in idx]
            ids, params = [s.request_id for s in seqs], [s.params for s in seqs]
            rows = logits if len(idx) == len(sampling) else logits[
                [j for i in idx for j in range(ends[i] - 1 - len(sampling[i].spec_token_ids), ends[i])]]
            try:
                out.update(zip(ids, self.rejection_sampler(rows, [s.spec_token_ids for s in seqs],
                                                           params, ids) if verify
                               else self.sampler(rows, params, ids)))
            except RequestFailed as exc:  # the other group still samples; fail them together
                errors.update(exc.errors)
                out.update(exc.sampled)
        if errors:
            raise RequestFailed(errors, out)
        return out


def default_model() -> str:
    """The embedded demo model when it is installed, else a tiny random preset."""
    from nanoserve.model import DEMO_MODEL_DIR
    return DEMO_MODEL_DIR if os.path.isfile(os.path.join(DEMO_MODEL_DIR, "config.json")) else "preset:tiny"
