"""What one KV transfer costs on this host: the SharedMemoryConnector's save (prefill side: gather
the prompt's KV from the paged cache into a new shared-memory segment, checksum, header) and load
(decode side: open, check, scatter into the paged cache, unlink), timed for several prompt
lengths with the connectors' own worker-side code over caches of the engine's shape, dtype and
device (fresh ones: the engine's prefix cache is left alone). Both ends run in this process; a
segment is the same kernel memory whichever process maps it, so what a process boundary adds is
only the page-table work of a second mapping, which the load's timing includes.

`fit_transfer` fits time = latency + bytes / bandwidth: the simulator's link model
(sim/devices.py Link) has the bandwidth term only, so its error on short prompts is the latency.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nanoserve.engine.kv_cache import allocate_kv_cache
from nanoserve.engine.kv_connector import (
    KVConnectorMetadata,
    KVConnectorRole,
    KVTransferConfig,
    LoadSpec,
    SaveSpec,
)
from nanoserve.engine.kv_transport import KVLayout, new_name
from nanoserve.engine.shm_connector import make_kv_connector
from nanoserve.measure.fit import nonneg_lstsq


@dataclass
class TransferPoint:
    """Medians over repeats for one prompt length (seconds, bytes of K and V moved)."""

    num_tokens: int
    num_blocks: int
    nbytes: int
    save: float
    load: float

    @property
    def total(self) -> float:
        return self.save + self.load

    @property
    def per_block(self) -> float:
        return self.total / self.num_blocks

    @property
    def bandwidth(self) -> float:
        """Bytes per second, end to end (save + load)."""
        return self.nbytes / self.total


@dataclass
class TransferFit:
    latency: float  # s per transfer
    bandwidth: float  # bytes/s

    def predict(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


def measure_transfers(engine, prompt_lens: Sequence[int] = (16, 64, 256, 1024), reps: int = 5,
                      kv_buffer_device: str = "cpu") -> list[TransferPoint]:
    """Save and load a prompt's KV `reps` times per length through a producer and a consumer
    connector (worker sides) over a fresh cache of `engine`'s shape. -> one point per length."""
    ex, bs = engine.executor, engine.config.block_size
    most = max(-(-n // bs) for n in prompt_lens)
    caches = allocate_kv_cache(ex.model_config, 2 * most, bs, engine.kv_cache_dtype, ex.device)
    for k, v in caches:  # values do not change the timing; make a wrong copy visible
        for x in (k, v):  # through fp32: torch has no fp8 normal_
            x.copy_(torch.randn(x.shape, device=x.device))
    layout, vocab = KVLayout.of(caches), ex.model_config.vocab_size
    ends = {}
    for role in ("kv_producer", "kv_consumer"):
        config = KVTransferConfig(kv_role=role, kv_buffer_device=kv_buffer_device, engine_id="measure")
        ends[role] = make_kv_connector(config, KVConnectorRole.WORKER, layout, bs, vocab)
        ends[role].register_kv_caches(caches)
    producer, consumer = ends["kv_producer"], ends["kv_consumer"]
    points = []
    try:
        for n in prompt_lens:
            nb, tokens = -(-n // bs), list(range(n))
            src, dst = list(range(nb)), list(range(most, most + nb))
            for _ in range(reps + 1):  # the first is a warm-up
                handle = new_name()
                save = SaveSpec("r", handle, src, tokens)
                producer.bind_connector_metadata(KVConnectorMetadata(saves=[save]))
                for i, (k, v) in enumerate(caches):
                    producer.save_kv_layer(i, k, v)
                failed = producer.wait_for_save()
                producer.clear_connector_metadata()
                if failed:
                    raise RuntimeError(failed["r"])
                load = LoadSpec("r", handle, dst, 0, n, tokens)
                consumer.bind_connector_metadata(KVConnectorMetadata(loads=[load]))
                consumer.start_load_kv()
                consumer.clear_connector_metadata()
            _check_copy(caches, src, dst, n, bs)
            saves = [r[3] for r in list(producer.stats.records)[-reps:]]
            loads = [r[3] for r in list(consumer.stats.records)[-reps:]]
            points.append(TransferPoint(n, nb, layout.nbytes(n), statistics.median(saves),
                                        statistics.median(loads)))
    finally:
        producer.shutdown()
        consumer.shutdown()
    return points


def _check_copy(caches, src, dst, n, bs) -> None:
    """The loaded KV is the saved KV, bit for bit (a timing of a wrong copy means nothing)."""
    for k, v in caches:
        for cache in (k, v):
            a, b = cache[src].flatten(0, 1)[:n], cache[dst].flatten(0, 1)[:n]
            if not bool((a == b).all()):
                raise AssertionError("a measured transfer did not copy the KV exactly")


def fit_transfer(points: Sequence[TransferPoint]) -> TransferFit:
    """Least squares (coefficients >= 0) of total time on bytes: latency + bytes / bandwidth."""
    a = np.asarray([[1.0, p.nbytes] for p in points])
    t = np.asarray([p.total for p in points])
    latency, per_byte = nonneg_lstsq(a, t)
    return TransferFit(float(latency), float(1 / per_byte) if per_byte > 0 else float("inf"))
