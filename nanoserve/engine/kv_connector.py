"""KV connectors: hand a request's KV cache from one engine to another (disaggregated prefill and
decode), behind vLLM's interface (KVConnectorBase_V1, vllm/distributed/kv_transfer/kv_connector/
v1/base.py), so that a student can read vLLM's NIXL or LMCache connectors next.

The flow, with vLLM's names. A prefill instance (kv_role "kv_producer") gets a request whose
kv_transfer_params are {"do_remote_decode": true}, with max_tokens=1: it prefills the prompt,
samples the first token and, in that same step, saves the prompt's KV (only the prompt's tokens)
outside its cache; `request_finished` then returns the kv_transfer_params a decode instance needs
({"do_remote_prefill": true, "kv_handle": ..., "output_token_ids": [first token], ...}) and the
request's blocks are freed at once (what was saved is a copy; the blocks stay in the prefix
cache). A decode instance (kv_role "kv_consumer") gets the same prompt with those params:
`on_new_request` checks them and appends the first token to the output; at admission the
scheduler asks `get_num_new_matched_tokens` how many tokens beyond its own prefix-cache hits arrive
by transfer, allocates blocks for them and counts them as computed; the runner loads them into
the paged cache (`start_load_kv`) before the forward of that very step, which computes the first
token's position and samples the second, as if this engine had prefilled.

Scheduler side (beside the Scheduler):            Worker side (in the ModelRunner):
  on_new_request(request)                           register_kv_caches(kv_caches)
  get_num_new_matched_tokens(request, computed)     bind_connector_metadata(metadata)
  update_state_after_alloc(request, blocks, n)      start_load_kv() / wait_for_layer_load(layer)
  build_connector_meta(scheduler_output)            save_kv_layer(layer, k, v) / wait_for_save()
  request_finished(request, block_ids)              clear_connector_metadata()
Both: shutdown(). The connector here is SharedMemoryConnector (shm_connector.py, which also has
make_kv_connector) over kv_transport.py.

Differences from vLLM, on purpose: loads and saves are synchronous and whole-request (vLLM can
load between steps and overlap with the forward layer by layer); request_finished returns only
the params (vLLM also returns whether to keep the blocks until a remote engine has read them: a
copy never needs that); a failed load fails its request (vLLM's kv_load_failure_policy "fail").
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

from nanoserve.config import config_from
from nanoserve.engine import kv_transport
from nanoserve.errors import InvalidRequest, as_real

ROLES = ("kv_producer", "kv_consumer", "kv_both")


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0  # beside the scheduler: decides what moves
    WORKER = 1  # in the model runner: moves the bytes


@dataclass
class KVTransferConfig:
    """vLLM's KVTransferConfig fields (`--kv-transfer-config '{"kv_connector": ..., "kv_role": ...}'`)."""

    kv_connector: str = "SharedMemoryConnector"
    kv_role: str = "kv_both"  # kv_producer (prefill instance) | kv_consumer (decode) | kv_both
    kv_buffer_device: str = "cpu"  # where a transfer waits: "cpu" shared memory | "cuda" (CUDA IPC)
    kv_buffer_size: float = 1e9  # bytes of saved KV a producer holds for decode instances at once
    # seconds saved KV waits for its decode instance before the producer drops it (vLLM's
    # VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s there)
    abort_request_timeout: float = 120.0
    engine_id: str | None = None  # names this instance in kv_transfer_params (None: random)

    def __post_init__(self):
        if self.kv_role not in ROLES:
            raise InvalidRequest("kv_role", f"kv_role={self.kv_role!r}; allowed: {', '.join(ROLES)}")
        if self.kv_buffer_device not in ("cpu", "cuda"):
            raise InvalidRequest("kv_buffer_device", f"kv_buffer_device={self.kv_buffer_device!r}; "
                                                     "allowed: 'cpu' (shared memory), 'cuda' (CUDA IPC)")
        for name in ("kv_buffer_size", "abort_request_timeout"):
            value = as_real(name, getattr(self, name))
            if value <= 0:
                raise InvalidRequest(name, f"{name}={value} must be > 0")
            setattr(self, name, value)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @classmethod
    def parse(cls, value) -> KVTransferConfig:
        """A KVTransferConfig, a dict of its fields, or their JSON (the command-line flag)."""
        return config_from(cls, value, "kv_transfer_config")


@dataclass
class LoadSpec:
    """Copy tokens start .. start+num_tokens-1 of segment `handle` into the request's blocks."""

    request_id: str
    handle: str
    block_ids: list[int]
    start: int  # a block boundary: the tokens before it are this engine's own prefix-cache hits
    num_tokens: int
    prompt_token_ids: list[int]  # what the segment must hold the KV of


@dataclass
class SaveSpec:
    """Copy the KV of the request's prompt (all of it, from its blocks) into segment `handle`."""

    request_id: str
    handle: str
    block_ids: list[int]
    prompt_token_ids: list[int]


@dataclass
class KVConnectorMetadata:
    """What the scheduler side tells the worker side for one step (vLLM's KVConnectorMetadata)."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)

    def without(self, request_ids) -> KVConnectorMetadata:
        """The step minus requests a failure took out of it (SchedulerOutput.without)."""
        return KVConnectorMetadata([s for s in self.loads if s.request_id not in request_ids],
                                   [s for s in self.saves if s.request_id not in request_ids])


class KVConnectorBase(abc.ABC):
    """vLLM's KVConnectorBase_V1, the methods nanoserve uses (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole):
        self.config, self.role = config, role

    # ---- scheduler side ----------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        """A request arrives; raise InvalidRequest if its kv_transfer_params cannot be served."""

    @abc.abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """-> (tokens beyond num_computed_tokens that arrive by transfer, load asynchronously?).
        Side-effect free: the scheduler may ask again in a later step."""

    @abc.abstractmethod
    def update_state_after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        """Blocks for the request are reserved (its own hits first, then the transferred tokens)."""

    @abc.abstractmethod
    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        """This step's loads and saves; resets the per-step state."""

    def request_finished(self, request, block_ids: list[int]) -> dict | None:
        """A request finished (or was aborted); its blocks are freed right after. -> the
        kv_transfer_params to return with it, or None."""
        return None

    # ---- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        """The engine's cache: per layer (k_cache, v_cache), each (blocks, block_size, H, D)."""

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    @abc.abstractmethod
    def start_load_kv(self) -> None:
        """Load this step's arriving KV into the paged cache (before the forward). Raises
        engine.executor.RequestFailed naming the requests whose load failed."""

    def wait_for_layer_load(self, layer: int) -> None:
        """Block until layer `layer` is loaded (layer-by-layer pipelining; loads here are whole)."""

    @abc.abstractmethod
    def save_kv_layer(self, layer: int, k_cache, v_cache) -> None:
        """Save layer `layer` of this step's hand-offs (after the forward wrote it)."""

    @abc.abstractmethod
    def wait_for_save(self) -> dict[str, str]:
        """Finish this step's saves. -> {request_id: error} of those that failed."""

    def shutdown(self) -> None:
        """Release everything this connector still holds (idempotent)."""


class NullKVConnector:
    """The scheduler side of an engine without a KV connector: nothing arrives, nothing is saved.

    It refuses requests whose kv_transfer_params ask for a hand-off, since no peer would serve it.
    """

    config = None

    def on_new_request(self, request) -> None:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode") or params.get("do_remote_prefill"):
            raise InvalidRequest("kv_transfer_params", "this engine has no KV connector: start it "
                                                       "with a kv_transfer_config (--kv-transfer-config)")

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output) -> None:
        return None  # the runner has no worker side to bind it to

    def request_finished(self, request, block_ids: list[int]) -> None:
        return None

    def shutdown(self) -> None:
        pass


def release_kv_transfer(kv_transfer_params) -> bool:
    """Drop what a hand-off left behind when its request will not reach a decode instance (the
    router after a failure, a server that ended the request at a stop string). -> whether
    something was removed. Bad or missing params are ignored."""
    handle = (kv_transfer_params or {}).get("kv_handle") if isinstance(kv_transfer_params, dict) else None
    try:
        return kv_transport.unlink(handle) if handle is not None else False
    except kv_transport.TransferError:
        return False
