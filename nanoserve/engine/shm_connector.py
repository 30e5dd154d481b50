"""SharedMemoryConnector: the KV connector between engines on one host (kv_connector.py has the
interface and the flow, kv_transport.py the segments), and make_kv_connector.

A hand-off is one segment holding the prompt's KV: the producer's worker side writes it in the
step that completes the prompt, the consumer's worker side reads it into its paged cache in the
step that admits the request, then unlinks it. Prefix caching works on both sides: the producer
saves from whatever blocks hold the prompt (its own prefix-cache hits included), the consumer
loads only the tokens past its own hits (a prompt it has cached whole loads nothing).

Who removes a segment (kv_transport.py says why nobody else does): the consumer once it has
loaded it or found it unusable (incomplete, of another model or prompt, corrupted); the
consumer's scheduler side when a request that never loaded it finishes (aborted, failed) or
needs none of it; the producer when a request ends without a hand-off (a stop token), when a
segment has waited abort_request_timeout seconds (checked whenever it saves), and at shutdown
(or garbage collection, or exit). A producer holds at most kv_buffer_size bytes of segments: a
save beyond that fails its request with an error saying so.
"""

from __future__ import annotations

import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from nanoserve.engine import kv_transport
from nanoserve.engine.executor import RequestFailed
from nanoserve.engine.kv_connector import (
    KVConnectorBase,
    KVConnectorMetadata,
    KVConnectorRole,
    KVTransferConfig,
    LoadSpec,
    SaveSpec,
)
from nanoserve.engine.kv_transport import KVLayout, SegmentReader, SegmentWriter, TransferError
from nanoserve.errors import InvalidRequest


@dataclass
class TransferStats:
    """What the worker side moved; `records` keeps the last 4096 transfers (kind, tokens, bytes, s)."""

    saves: int = 0
    loads: int = 0
    save_bytes: int = 0
    load_bytes: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    failed_saves: int = 0
    failed_loads: int = 0
    expired: int = 0  # saved KV nobody came for within abort_request_timeout
    records: deque = field(default_factory=lambda: deque(maxlen=4096))

    def add(self, kind: str, num_tokens: int, nbytes: int, seconds: float) -> None:
        setattr(self, f"{kind}s", getattr(self, f"{kind}s") + 1)
        setattr(self, f"{kind}_bytes", getattr(self, f"{kind}_bytes") + nbytes)
        setattr(self, f"{kind}_seconds", getattr(self, f"{kind}_seconds") + seconds)
        self.records.append((kind, num_tokens, nbytes, seconds))


@dataclass
class _Save:
    writer: SegmentWriter
    slots: torch.Tensor  # (prompt tokens,) where the prompt's KV is in the cache
    seconds: float = 0.0  # spent on it so far


def slot_mapping(block_ids: list[int], start: int, num_tokens: int, block_size: int) -> torch.Tensor:
    """Cache slots of tokens start .. start+num_tokens-1 of a request holding these blocks. (n,)"""
    pos = torch.arange(start, start + num_tokens)
    return torch.tensor(block_ids, dtype=torch.long)[pos // block_size] * block_size + pos % block_size


def _flat(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, *cache.shape[2:])  # (blocks * block_size, H, D)


def _gather(cache: torch.Tensor, slots: torch.Tensor, dst: torch.Tensor) -> None:
    if dst.device == cache.device:
        torch.index_select(_flat(cache), 0, slots, out=dst)  # straight into the segment
    else:
        dst.copy_(_flat(cache).index_select(0, slots))  # a GPU cache staged through the host


def _scatter(cache: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> None:
    dst, src = _flat(cache), src.to(cache.device)
    if dst.element_size() == 1:  # an fp8 cache: torch has no fp8 index_copy_ on a CPU, bytes do
        dst, src = dst.view(torch.uint8), src.view(torch.uint8)
    dst.index_copy_(0, slots, src)


def _unlink_all(live: dict, pending: dict) -> None:
    for name in list(live):
        kv_transport.unlink(name)
    for handle, _ in list(pending.values()):
        kv_transport.unlink(handle)
    live.clear()
    pending.clear()


class SharedMemoryConnector(KVConnectorBase):
    """One role of the connector (see the module docstring). layout: the KV of one token;
    vocab_size: to check the first tokens a decode instance is handed."""

    def __init__(self, config: KVTransferConfig, role: KVConnectorRole, layout: KVLayout,
                 block_size: int, vocab_size: int):
        super().__init__(config, role)
        if os.name != "posix":
            raise InvalidRequest("kv_connector", "SharedMemoryConnector needs POSIX shared memory "
                                                 "(Linux, macOS)")
        self.layout, self.block_size, self.vocab_size = layout, block_size, vocab_size
        self.engine_id = config.engine_id
        self.stats = TransferStats()
        self._remote_decode: set[str] = set()  # producer: requests to hand off
        self._saves: dict[str, str] = {}  # producer: request -> its segment, once scheduled
        self._pending: dict[str, tuple[str, int]] = {}  # consumer: request -> (segment, tokens)
        self._loads: list[LoadSpec] = []  # consumer: planned in this step's schedule
        self._planned: set[str] = set()  # consumer: requests whose load was planned once
        self._connector_metadata: KVConnectorMetadata | None = None
        self._kv_caches, self._device = None, None
        self._saving: dict[str, _Save] = {}  # this step's saves
        self._save_errors: dict[str, str] = {}
        self._live: dict[str, tuple] = {}  # producer: segment -> (deadline, bytes, device buffer)
        if role is KVConnectorRole.WORKER and config.is_kv_producer:
            kv_transport.remove_orphans()
        self._finalizer = weakref.finalize(self, _unlink_all, self._live, self._pending)

    # ---- scheduler side ----------------------------------------------------------------------
    def on_new_request(self, request) -> None:
        params, rid = request.kv_transfer_params or {}, request.request_id
        if params.get("do_remote_decode"):
            if not self.config.is_kv_producer:
                raise InvalidRequest("kv_transfer_params", f"do_remote_decode: this instance is "
                                                           f"{self.config.kv_role}, not a KV producer")
            if request.params.max_tokens != 1:
                raise InvalidRequest("max_tokens", "a request with kv_transfer_params.do_remote_decode "
                                                   "ends at its first token: send max_tokens=1")
            self._remote_decode.add(rid)
        elif params.get("do_remote_prefill"):
            if not self.config.is_kv_consumer:
                raise InvalidRequest("kv_transfer_params", f"do_remote_prefill: this instance is "
                                                           f"{self.config.kv_role}, not a KV consumer")
            first = self._first_tokens(request, params.get("output_token_ids"))
            try:
                reader = SegmentReader(params.get("kv_handle"), self.layout)
                tokens = reader.token_ids
                reader.close()
            except TransferError as e:
                raise InvalidRequest("kv_transfer_params", str(e)) from None
            if tokens != request.prompt_token_ids:
                raise InvalidRequest("kv_transfer_params", f"KV segment {reader.name} holds the KV of "
                                     f"another prompt ({len(tokens)} tokens; this one has "
                                     f"{request.num_prompt_tokens}): send both instances the same prompt")
            for t in first:  # the prefill instance sampled them: this request goes on from there
                request.append_token(t, request.metrics.arrival_time)
            request.emitted = len(first)  # the router already sent them
            self._pending[rid] = (reader.name, len(tokens))

    def _first_tokens(self, request, ids) -> list[int]:
        """The prefill instance's output token ids, checked: they must leave something to decode."""
        if not isinstance(ids, list) or not ids or not all(
                type(t) is int and 0 <= t < self.vocab_size for t in ids):
            raise InvalidRequest("kv_transfer_params", f"output_token_ids={ids!r} must be a non-empty "
                                                       f"list of token ids in [0, {self.vocab_size})")
        p = request.params
        if len(ids) >= p.max_tokens:
            raise InvalidRequest("max_tokens", f"max_tokens={p.max_tokens} leaves nothing to decode "
                                               f"after the {len(ids)} token(s) of the prefill instance")
        ends = set(p.stop_token_ids) | (set() if p.ignore_eos else set(request.eos_token_ids))
        if ends.intersection(ids) or request.num_tokens + len(ids) >= request.max_len:
            raise InvalidRequest("kv_transfer_params", "the prefill instance's tokens already end "
                                                       "this request: there is nothing to decode")
        return ids

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        entry = self._pending.get(rid)
        if entry is None or entry[1] <= num_computed_tokens:
            return 0, False  # nothing sent, or all of it cached here
        if rid in self._planned and not kv_transport.exists(entry[0]):
            return 0, False  # loaded once, then preempted: recomputed like any preempted request
        return entry[1] - num_computed_tokens, False  # (a load the engine dropped is planned again)

    def update_state_after_alloc(self, request, block_ids: list[int], num_external_tokens: int) -> None:
        rid = request.request_id
        if rid not in self._pending:
            return
        handle, num_tokens = self._pending[rid]
        if num_external_tokens == 0:  # this engine's prefix cache had it all
            del self._pending[rid]
            kv_transport.unlink(handle)
            return
        self._planned.add(rid)
        self._loads.append(LoadSpec(rid, handle, block_ids, num_tokens - num_external_tokens,
                                    num_external_tokens, request.prompt_token_ids))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta, self._loads = KVConnectorMetadata(loads=self._loads), []
        for seq, req in zip(scheduler_output.seqs, scheduler_output.requests):
            if (req.request_id in self._remote_decode and seq.sample
                    and seq.start + len(seq.token_ids) == req.num_prompt_tokens):
                handle = self._saves[req.request_id] = kv_transport.new_name()
                meta.saves.append(SaveSpec(req.request_id, handle, seq.block_ids, req.prompt_token_ids))
        return meta

    def request_finished(self, request, block_ids: list[int]) -> dict | None:
        rid = request.request_id
        self._remote_decode.discard(rid)
        self._planned.discard(rid)
        if rid in self._pending:  # loaded (then gone already) or never loaded: not needed now
            kv_transport.unlink(self._pending.pop(rid)[0])
        handle = self._saves.pop(rid, None)
        if handle is None:
            return None
        if request.finish_reason != "length":  # ended at its first token (EOS, a stop token) or failed
            kv_transport.unlink(handle)
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.engine_id, "remote_request_id": rid, "kv_handle": handle,
                "num_tokens": request.num_prompt_tokens,
                "output_token_ids": list(request.output_token_ids)}

    # ---- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        self._kv_caches, self._device = kv_caches, kv_caches[0][0].device
        if self.config.kv_buffer_device == "cuda" and self._device.type != "cuda":
            raise InvalidRequest("kv_buffer_device", "kv_buffer_device='cuda' (CUDA IPC) needs the "
                                                     f"KV cache on a GPU; this one is on {self._device}")

    def start_load_kv(self) -> None:
        """Check every load of the step first (segment, prompt, checksum), so that a failure
        fails its request before anything is written and the engine can rerun the step."""
        ready, errors, invalid, bs = [], {}, set(), self.block_size
        for spec in self._connector_metadata.loads:
            t0 = time.perf_counter()
            try:
                ready.append((spec, self._open_load(spec), time.perf_counter() - t0))
            except TransferError as e:
                errors[spec.request_id] = f"KV transfer failed: {e}"
                invalid.update(spec.block_ids[spec.start // bs:-(-(spec.start + spec.num_tokens) // bs)])
        if errors:
            for _, reader, _ in ready:
                reader.close()  # still there for the rerun
            self.stats.failed_loads += len(errors)
            raise RequestFailed(errors, None, invalid)
        for spec, reader, opened in ready:
            t0 = time.perf_counter() - opened  # the time to open and check it counts too
            end = spec.start + spec.num_tokens
            slots = slot_mapping(spec.block_ids, spec.start, spec.num_tokens, bs).to(self._device)
            try:
                for i, (k, v) in enumerate(self._kv_caches):
                    ks, vs = reader.layer(i)  # (segment tokens, H, D)
                    _scatter(k, slots, ks[spec.start:end])
                    _scatter(v, slots, vs[spec.start:end])
                del ks, vs
            finally:
                reader.close()
                reader.unlink()
            self.stats.add("load", spec.num_tokens, self.layout.nbytes(spec.num_tokens),
                           time.perf_counter() - t0)

    def _open_load(self, spec: LoadSpec) -> SegmentReader:
        reader = SegmentReader(spec.handle, self.layout)
        try:
            if reader.token_ids != spec.prompt_token_ids:
                raise TransferError(f"KV segment {spec.handle} holds another prompt's KV")
            reader.verify()
        except TransferError:
            reader.close()
            reader.unlink()  # unusable for anyone
            raise
        return reader

    def save_kv_layer(self, layer: int, k_cache, v_cache) -> None:
        for spec in self._connector_metadata.saves:
            if spec.request_id in self._save_errors:
                continue
            try:
                t0 = time.perf_counter()
                if spec.request_id not in self._saving:
                    self._saving[spec.request_id] = self._open_save(spec)
                save = self._saving[spec.request_id]
                k_dst, v_dst = save.writer.layer(layer)  # (prompt tokens, H, D)
                _gather(k_cache, save.slots, k_dst)
                _gather(v_cache, save.slots, v_dst)
                save.seconds += time.perf_counter() - t0
            except (OSError, TransferError) as e:  # /dev/shm full, the buffer limit
                self._fail_save(spec.request_id, e)

    def _open_save(self, spec: SaveSpec) -> _Save:
        n = len(spec.prompt_token_ids)
        self._sweep()
        held, need = sum(entry[1] for entry in self._live.values()), self.layout.nbytes(n)
        if held + need > self.config.kv_buffer_size:
            raise TransferError(f"the KV transfer buffer is full: {len(self._live)} prompts' KV "
                                f"({held} bytes) wait for decode instances and this one needs {need} "
                                f"more (kv_buffer_size={self.config.kv_buffer_size:.0f})")
        kind = "host" if self.config.kv_buffer_device == "cpu" else "cuda_ipc"
        writer = SegmentWriter(spec.handle, self.layout, spec.prompt_token_ids, kind, self._device)
        return _Save(writer, slot_mapping(spec.block_ids, 0, n, self.block_size).to(self._device))

    def wait_for_save(self) -> dict[str, str]:
        for rid, save in list(self._saving.items()):
            t0, writer = time.perf_counter(), save.writer
            try:
                nbytes = writer.commit()
            except (OSError, TransferError) as e:
                self._fail_save(rid, e)
                continue
            deadline = time.monotonic() + self.config.abort_request_timeout
            self._live[writer.name] = (deadline, nbytes, writer.device_buffer)
            self.stats.add("save", len(writer.token_ids), nbytes,
                           save.seconds + time.perf_counter() - t0)
        self._saving.clear()
        errors, self._save_errors = self._save_errors, {}
        return errors

    def _fail_save(self, request_id: str, exc: Exception) -> None:
        save = self._saving.pop(request_id, None)
        if save is not None:
            save.writer.discard()
        self._save_errors[request_id] = f"saving the KV for a decode instance failed: {exc}"
        self.stats.failed_saves += 1

    def clear_connector_metadata(self) -> None:
        for save in self._saving.values():  # a step that failed half-way
            save.writer.discard()
        self._saving.clear()
        self._save_errors.clear()
        self._connector_metadata = None

    def _sweep(self) -> None:
        """Forget segments their consumer took; drop those nobody came for in time."""
        now = time.monotonic()
        for name, (deadline, _, _) in list(self._live.items()):
            if not kv_transport.exists(name):
                del self._live[name]
            elif now > deadline:
                kv_transport.unlink(name)
                del self._live[name]
                self.stats.expired += 1

    def shutdown(self) -> None:
        self._finalizer()


CONNECTORS = {"SharedMemoryConnector": SharedMemoryConnector}


def make_kv_connector(config, role: KVConnectorRole, layout: KVLayout, block_size: int,
                      vocab_size: int) -> KVConnectorBase:
    """The connector `config.kv_connector` names (vLLM's KVConnectorFactory), for `role`."""
    config = KVTransferConfig.parse(config)
    if config.kv_connector not in CONNECTORS:
        raise InvalidRequest("kv_connector", f"kv_connector={config.kv_connector!r}; available: "
                                             f"{sorted(CONNECTORS)}")
    return CONNECTORS[config.kv_connector](config, role, layout, block_size, vocab_size)
