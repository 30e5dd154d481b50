"""Lessons 02-03: how many requests fit in a device's memory, and what a decode step at that
batch costs on the roofline (modelled: a formula over datasheet or measured numbers).

Memory left after the weights holds the KV cache; each request of context_len tokens needs
context_len x KV bytes per token, so memory sets the largest batch. A decode step at that batch
reads every weight once and every sequence's whole KV cache once (measure.roofline.step_cost),
so its floor is bytes / bandwidth unless its FLOPs / peak is larger: the split says which read
dominates and whether the step is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.course.table import Table
from nanoserve.engine.kv_cache import kv_bytes_per_token
from nanoserve.measure.roofline import decode_batch, step_cost

# Bytes per weight: the engine's dtypes and weight-only quantizations (int4 as GPTQ/AWQ store
# it, scales left out); per KV entry: the cache dtypes it can hold.
WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1, "fp8": 1, "int4": 0.5}
KV_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "fp8": "float8_e4m3fn"}


@dataclass
class KVCapacity:
    model: str
    context_len: int
    weight_dtype: str
    kv_dtype: str
    memory: float  # bytes given to weights and cache
    bandwidth: float  # bytes/s
    peak_flops: float  # FLOP/s
    weight_bytes: float
    kv_bytes_per_token: int
    max_batch: int  # requests of context_len tokens that fit
    weight_read_s: float  # a decode step at max_batch: the weights (and activations) read
    kv_read_s: float  # the KV cache read (and this step's K, V, Q and output)
    compute_s: float  # its FLOPs at the peak

    @property
    def kv_bytes_per_request(self) -> int:
        return self.kv_bytes_per_token * self.context_len

    @property
    def floor_s(self) -> float:
        """Roofline floor of the decode step at max_batch: max(bytes / bandwidth, FLOPs / peak)."""
        return max(self.weight_read_s + self.kv_read_s, self.compute_s)

    @property
    def tokens_per_s(self) -> float:
        return self.max_batch / self.floor_s if self.max_batch else 0.0

    def table(self) -> Table:
        rows = [{"weights GB": round(self.weight_bytes / 1e9, 2),
                 "KV KiB/token": self.kv_bytes_per_token / 1024,
                 f"KV MiB/request ({self.context_len})": self.kv_bytes_per_request / 2**20,
                 "max batch": self.max_batch,
                 "step floor ms": round(1e3 * self.floor_s, 2),
                 "weights ms": round(1e3 * self.weight_read_s, 2),
                 "KV ms": round(1e3 * self.kv_read_s, 2),
                 "compute ms": round(1e3 * self.compute_s, 2),
                 "tokens/s": round(self.tokens_per_s)}]
        return Table(rows, f"{self.model}, weights {self.weight_dtype}, KV {self.kv_dtype}, "
                           f"{self.memory / 1e9:.0f} GB (modelled, not measured)", ".3g")


def kv_capacity(cfg, model: str, context_len: int, memory: float, bandwidth: float,
                peak_flops: float, weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16") -> KVCapacity:
    """The largest batch of context_len-token requests that fits in `memory` bytes beside the
    weights, and the roofline of one decode step at that batch (modelled). Activations are
    counted at the weight width; FLOPs at the one `peak_flops` whatever the dtypes."""
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight_dtype={weight_dtype!r}; choose from {sorted(WEIGHT_BYTES)}")
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype={kv_dtype!r}; choose from {sorted(KV_DTYPES)}")
    if context_len < 1 or memory <= 0 or bandwidth <= 0 or peak_flops <= 0:
        raise ValueError(f"context_len={context_len}, memory={memory}, bandwidth={bandwidth}, "
                         f"peak_flops={peak_flops}: all must be positive")
    wb = WEIGHT_BYTES[weight_dtype]
    weights = cfg.num_params() * wb
    per_token = kv_bytes_per_token(cfg, KV_DTYPES[kv_dtype])
    batch = max(0, int((memory - weights) // (per_token * context_len)))
    kv_entry = per_token / (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim)
    cost = step_cost(cfg, decode_batch(max(batch, 1), context_len), wb, kv_entry)
    weight_read = (cost.bytes["linear"] + cost.bytes["lm_head"]) / bandwidth  # + activations
    kv_read = cost.bytes["attention"] / bandwidth if batch else 0.0  # K, V (+ Q and output)
    return KVCapacity(model, context_len, weight_dtype, kv_dtype, memory, bandwidth, peak_flops,
                      weights, per_token, batch, weight_read, kv_read,
                      cost.total_flops / peak_flops if batch else 0.0)


def datasheet_capacity(model: str = "llama-3-8b", context_len: int = 4096, device: str = "H100-SXM",
                       weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16",
                       utilization: float = 0.92, memory: float | None = None) -> KVCapacity:
    """kv_capacity on a datasheet GPU (nanoserve.sim.devices), `utilization` of its memory for
    weights and cache (vLLM's default gpu_memory_utilization), or `memory` bytes when given (a
    smaller share of the device, or another card of its bandwidth)."""
    from nanoserve.sim.devices import DEVICES, model_shape
    if device not in DEVICES:
        raise ValueError(f"device={device!r}; choose from {sorted(DEVICES)}")
    p = DEVICES[device]
    return kv_capacity(model_shape(model), model, context_len,
                       p.memory * utilization if memory is None else memory, p.bandwidth,
                       p.peak_flops, weight_dtype, kv_dtype)
