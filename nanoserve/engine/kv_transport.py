"""Moving one request's KV cache between two engines on one host: a shared-memory segment per
transfer (multiprocessing.shared_memory), and a CUDA IPC variant for caches on a GPU.

A segment holds a 64-byte header, the token ids the KV belongs to (int64, so the consumer can
check they are its prompt's), then the payload, 64-byte aligned:
  host      the KV itself, (num_layers, 2, num_tokens, num_kv_heads, head_dim) in the cache dtype
            (2: K then V); a GPU cache is staged through it (device -> host -> device)
  cuda_ipc  a pickled CUDA IPC handle of a device tensor of that shape (torch.multiprocessing's
            reduce_tensor, as vLLM's RLHF examples share weights between processes). The producer
            keeps the tensor alive until the consumer has copied it and unlinked the segment.
            UNTESTED: written for when a GPU is lent (tests/engine/test_cuda_ipc.py runs it there);
            nothing CUDA is imported unless it is chosen.
The header: magic, format version, dtype, payload kind, shape, the CRC-32 of ids + payload (the
host payload: a corrupted byte fails the load instead of changing a token), payload bytes. The
magic is written last, so a half-written segment never reads as complete.

Lifetime: Python < 3.13 registers every SharedMemory it opens with its resource tracker, which
unlinks it when *that* process exits; a transfer outlives its creator's interest, so segments are
opened untracked here and unlinked by whoever is done with them: the consumer after loading (or
failing to), the producer when nobody came for it in time and at shutdown, the router when a
request dies between the two instances; a new producer removes segments whose creating process is
gone (Linux). Names are short (macOS allows 31 characters): "nskv" + pid + counter + random bits.
POSIX only: Windows destroys a mapping when its creator closes it.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import struct
import sys
import zlib
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import torch

MAGIC, VERSION = b"NSKV", 1
HEADER = struct.Struct("<4sHHIIIIIIQ")  # magic, version, dtype, kind, L, H, D, tokens, crc, bytes
HEADER_SIZE = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)  # the header's codes
KINDS = ("host", "cuda_ipc")
NAME = re.compile(r"^nskv([0-9a-f]{1,8})_[0-9a-f]{1,8}_[0-9a-f]{6}$")
_counter = itertools.count()


class TransferError(Exception):
    """A segment that cannot be used: missing, incomplete, of another model or prompt, corrupted."""


@dataclass(frozen=True)
class KVLayout:
    """What both ends must agree on: the KV of one token (all layers) and its dtype."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, kv_caches) -> KVLayout:
        """The layout of an engine's cache: per layer (k, v), each (blocks, block_size, H, D)."""
        k = kv_caches[0][0]
        return cls(len(kv_caches), k.shape[2], k.shape[3], k.dtype)

    def shape(self, num_tokens: int) -> tuple:
        return (self.num_layers, 2, num_tokens, self.num_kv_heads, self.head_dim)

    def nbytes(self, num_tokens: int) -> int:
        return 2 * self.num_layers * num_tokens * self.num_kv_heads * self.head_dim * self.dtype.itemsize


def new_name() -> str:
    return f"nskv{os.getpid():x}_{next(_counter) & 0xFFFFFFFF:x}_{secrets.token_hex(3)}"


def check_name(name) -> str:
    """A segment name this module made, else TransferError (nothing else is ever opened)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise TransferError(f"kv_handle {name!r} is not a nanoserve KV segment name")
    return name


def _open(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """A segment, not tracked by this process's resource tracker (see the module docstring)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, create, size, track=False)
    shm = shared_memory.SharedMemory(name, create, size)
    resource_tracker.unregister(shm._name, "shared_memory")
    return shm


def _unlink(shm: shared_memory.SharedMemory) -> None:
    if sys.version_info < (3, 13):  # unlink() also unregisters: register first to keep it balanced
        resource_tracker.register(shm._name, "shared_memory")
    shm.unlink()


def _close(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.close()
    except BufferError:  # a view of it is still alive (a traceback holds it): unmapped with it
        pass


def exists(name: str) -> bool:
    try:
        _close(_open(name))
        return True
    except FileNotFoundError:
        return False


def unlink(name: str) -> bool:
    """Remove segment `name`. -> False if it was already gone."""
    try:
        shm = _open(check_name(name))
    except FileNotFoundError:
        return False
    try:
        _unlink(shm)
    except FileNotFoundError:  # someone else was quicker
        return False
    finally:
        _close(shm)
    return True


def remove_orphans() -> list[str]:
    """Unlink segments whose creating process is gone (Linux, /dev/shm). -> their names."""
    if not os.path.isdir("/dev/shm"):
        return []
    gone = []
    for name in os.listdir("/dev/shm"):
        m = NAME.match(name)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1), 16), 0)
        except ProcessLookupError:
            if unlink(name):
                gone.append(name)
        except PermissionError:  # alive, another user's
            pass
    return gone


def _checksum(buf, ranges) -> int:
    crc = 0
    for start, n in ranges:
        with buf[start:start + n] as view:
            crc = zlib.crc32(view, crc)
    return crc


class SegmentWriter:
    """One transfer being written: `layer(i)` -> (k, v) destinations of shape (tokens, H, D) to
    fill, then `commit()` (-> bytes moved) or `discard()`."""

    def __init__(self, name: str, layout: KVLayout, token_ids: list[int], kind: str = "host",
                 device: torch.device | str = "cpu"):
        self.name, self.layout, self.kind = name, layout, kind
        self.token_ids, n = list(token_ids), len(token_ids)
        self.ids_at, self.payload_at = HEADER_SIZE, -(-(HEADER_SIZE + 8 * n) // 64) * 64
        numel = layout.nbytes(n) // layout.dtype.itemsize
        self.device_buffer, self.shm = None, None
        if kind == "host":
            self.shm = _open(name, create=True, size=self.payload_at + layout.nbytes(n))
            self.data = torch.frombuffer(self.shm.buf, dtype=layout.dtype, count=numel,
                                         offset=self.payload_at).view(layout.shape(n))
        else:  # cuda_ipc: the KV stays on the device; the segment gets a handle at commit
            self.device_buffer = self.data = torch.empty(layout.shape(n), dtype=layout.dtype,
                                                         device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

    def commit(self) -> int:
        """Write ids, checksum and header (magic last). -> KV bytes in the segment."""
        payload = b""
        if self.kind == "cuda_ipc":
            import pickle

            from torch.multiprocessing.reductions import reduce_tensor
            torch.cuda.synchronize(self.device_buffer.device)  # the gathers have landed
            payload = pickle.dumps(reduce_tensor(self.device_buffer))
            self.shm = _open(self.name, create=True, size=self.payload_at + len(payload))
            self.shm.buf[self.payload_at:self.payload_at + len(payload)] = payload
        self.data = None  # drop the view of the mapping
        n, lay = len(self.token_ids), self.layout
        ids = torch.frombuffer(self.shm.buf, dtype=torch.int64, count=n, offset=self.ids_at)
        ids.copy_(torch.tensor(self.token_ids, dtype=torch.int64))
        del ids
        nbytes = lay.nbytes(n) if self.kind == "host" else len(payload)
        crc = _checksum(self.shm.buf, [(self.ids_at, 8 * n), (self.payload_at, nbytes)])
        head = HEADER.pack(MAGIC, VERSION, DTYPES.index(lay.dtype), KINDS.index(self.kind),
                           lay.num_layers, lay.num_kv_heads, lay.head_dim, n, crc, nbytes)
        self.shm.buf[4:len(head)] = head[4:]
        self.shm.buf[:4] = MAGIC
        _close(self.shm)
        return lay.nbytes(n)

    def discard(self) -> None:
        self.data = self.device_buffer = None
        if self.shm is not None:
            try:
                _unlink(self.shm)
            except FileNotFoundError:
                pass
            _close(self.shm)


class SegmentReader:
    """A complete segment of `layout`: the header checked on open (TransferError if anything
    differs), `token_ids`, `verify()` the checksum, `layer(i)` -> (k, v) sources (tokens, H, D),
    then `close()` and, once used, `unlink()`."""

    def __init__(self, name: str, layout: KVLayout):
        try:
            self.shm = _open(check_name(name))
        except FileNotFoundError:
            raise TransferError(f"KV segment {name} not found: it expired, was already used, or "
                                "its prefill instance stopped") from None
        self.name, self.data = name, None
        try:
            self._read_header(layout)
        except BaseException:
            _close(self.shm)
            raise

    def _read_header(self, layout: KVLayout) -> None:
        buf = self.shm.buf
        if len(buf) < HEADER_SIZE:
            raise TransferError(f"KV segment {self.name} is truncated ({len(buf)} bytes)")
        magic, version, dtype, kind, L, H, D, n, self.crc, self.nbytes = HEADER.unpack_from(buf)
        if magic != MAGIC or version != VERSION:
            raise TransferError(f"KV segment {self.name} is incomplete or not nanoserve's "
                                f"(magic {magic!r}, version {version})")
        got = (L, H, D, DTYPES[dtype] if dtype < len(DTYPES) else dtype)
        want = (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype)
        if got != want:
            raise TransferError(f"KV segment {self.name} holds KV of (layers, kv heads, head_dim, "
                                f"dtype) = {got}, this engine's cache is {want}: serve the same "
                                "model and dtype on both instances")
        self.layout, self.kind, self.num_tokens = layout, KINDS[kind], n
        self.ids_at, self.payload_at = HEADER_SIZE, -(-(HEADER_SIZE + 8 * n) // 64) * 64
        if len(buf) < self.payload_at + self.nbytes:
            raise TransferError(f"KV segment {self.name} is truncated")
        self.token_ids = torch.frombuffer(buf, dtype=torch.int64, count=n, offset=self.ids_at).tolist()

    def verify(self) -> None:
        crc = _checksum(self.shm.buf, [(self.ids_at, 8 * self.num_tokens), (self.payload_at, self.nbytes)])
        if crc != self.crc:
            raise TransferError(f"KV segment {self.name} is corrupted (CRC-32 {crc:08x}, "
                                f"written {self.crc:08x})")

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.data is None:
            shape = self.layout.shape(self.num_tokens)
            if self.kind == "host":
                self.data = torch.frombuffer(self.shm.buf, dtype=self.layout.dtype,
                                             count=self.nbytes // self.layout.dtype.itemsize,
                                             offset=self.payload_at).view(shape)
            else:
                self.data = _rebuild_cuda(bytes(self.shm.buf[self.payload_at:self.payload_at + self.nbytes]))
                if tuple(self.data.shape) != shape:
                    raise TransferError(f"KV segment {self.name}: device tensor of shape "
                                        f"{tuple(self.data.shape)}, expected {shape}")
        return self.data[i, 0], self.data[i, 1]

    def close(self) -> None:
        if self.data is not None and self.data.is_cuda:
            torch.cuda.synchronize(self.data.device)  # our copies are done before the producer frees it
        self.data = None
        _close(self.shm)

    def unlink(self) -> None:
        try:
            _unlink(self.shm)
        except FileNotFoundError:
            pass


def _rebuild_cuda(blob: bytes) -> torch.Tensor:
    """The producer's device tensor, mapped into this process (UNTESTED here, see the docstring)."""
    import pickle
    rebuild, args = pickle.loads(blob)  # our own segment: trusted as the rest of kv_transfer_params
    return rebuild(*args)
