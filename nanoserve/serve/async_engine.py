"""AsyncEngine: the LLMEngine in one background thread, driven from asyncio.

The engine is single-threaded, so one thread owns it: it takes requests and aborts from a
thread-safe inbox (queue.Queue), calls `step()`, and hands each request's outputs to that
request's asyncio.Queue with `loop.call_soon_threadsafe` (the only safe way to wake an event loop
from another thread). The event loop never calls the engine and never waits on the model; the
engine thread never touches asyncio objects directly. vLLM splits the same two sides across
processes (AsyncLLM and EngineCore, vllm/v1/engine/); a thread is enough here because torch
releases the GIL inside its kernels.

The engine thread also builds the engine (loads and warms the model): every torch op of the
server runs on that one thread. With torch's OpenMP (libgomp), each thread that runs a parallel
region gets a team of worker threads of its own; a second team puts more OpenMP threads than
cores in the process, and libgomp then lets idle workers spin only briefly before they sleep, so
every parallel region pays a futex wake-up (measured in benchmarks/results/, the one-thread
HTTP run).

Every wait is bounded: the idle thread sleeps on its inbox for at most IDLE_WAIT seconds at a
time (no busy loop; it wakes at once when a request arrives), a request's acceptance is awaited
for at most ACCEPT_TIMEOUT, and `stop()` joins the thread with a timeout.

Requests are validated by the engine itself (`add_request`), so the HTTP layer shares its one set
of checks: the thread answers each submission with ACCEPTED or the ValueError, before any token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nanoserve.outputs import RequestOutput

log = logging.getLogger("nanoserve.serve")

IDLE_WAIT = 0.5  # s: the idle engine thread re-checks for shutdown this often
STALL_WAIT = 0.005  # s: when a step could run nothing, wait this long for news before retrying
ACCEPT_TIMEOUT = 60.0  # s: a submission not answered by then (the thread is stuck) fails
OUTPUT_TIMEOUT = 600.0  # s: a request with no new token for this long is given up
ACCEPTED = "accepted"


class ServerBusy(Exception):
    """More requests in flight than the server takes (vLLM's QueueOverflowError: HTTP 503)."""


class EngineStopped(Exception):
    """The engine is shutting down or has failed; in-flight requests end with this error."""


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: object
    sink: _Sink
    kv_transfer_params: dict | None = None


@dataclass
class _Abort:
    request_id: str


class _Sink:
    """One request's asyncio.Queue, fed from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue = loop, asyncio.Queue()
        self.kv_transfer_params = None  # a finished hand-off's (set before its last output)

    def put(self, item) -> None:
        _deliver([(self, item)])


def _deliver(items: list[tuple[_Sink, object]]) -> None:
    """Hand items to their requests' queues: one wake-up of each event loop for a whole step's
    outputs (each call_soon_threadsafe writes to the loop's self-pipe)."""
    by_loop: dict = {}
    for sink, item in items:
        by_loop.setdefault(sink.loop, []).append((sink.queue, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the event loop is already closed: nobody is listening
            pass


def _put_all(batch) -> None:
    for q, item in batch:
        q.put_nowait(item)


class RequestStream:
    """One request's outputs, as an async iterator. `close()` (idempotent; call it in a finally)
    aborts the request if it has not finished: a client that goes away frees its blocks at once."""

    def __init__(self, engine: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop):
        self.engine, self.request_id, self.sink = engine, request_id, _Sink(loop)
        self.finished = self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if sys.version_info >= (3, 11):  # a deadline without wait_for's task per call
            async with asyncio.timeout(OUTPUT_TIMEOUT):
                item = await self.sink.queue.get()
        else:
            item = await asyncio.wait_for(self.sink.queue.get(), OUTPUT_TIMEOUT)
        if isinstance(item, Exception):
            self.finished = True  # the engine thread has already dropped it
            raise item
        self.finished = item.finished
        return item

    @property
    def kv_transfer_params(self) -> dict | None:
        """What a prefill instance returns for a hand-off, once the request has finished."""
        return self.sink.kv_transfer_params

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.engine.num_in_flight -= 1
            if not self.finished:
                self.engine.abort(self.request_id)


class AsyncEngine:
    """Owns an LLMEngine in a thread. `start` builds it there (make_engine: a callable that loads
    and warms it up) and returns once it is ready; `generate` (a coroutine) submits a request and
    returns its RequestStream; `abort` stops one; `stop` shuts everything down.

    max_num_queued_reqs: most requests in flight (waiting + running) before new ones get
    ServerBusy (vLLM's --max-num-queued-reqs); None: no bound. metrics: a ServerMetrics or None.
    """

    def __init__(self, make_engine: Callable, max_num_queued_reqs: int | None = None, metrics=None):
        self.make_engine, self.engine, self.metrics = make_engine, None, metrics
        self.max_num_queued_reqs = max_num_queued_reqs
        self.num_in_flight = 0  # requests submitted and not yet closed (event-loop side only)
        self._inbox: queue.Queue = queue.Queue()
        self._sinks: dict[str, _Sink] = {}  # engine-thread side only
        self._stopping, self._ready = threading.Event(), threading.Event()
        self._build_error: BaseException | None = None
        self.error: str | None = None  # why the engine thread died, if it did
        self._thread = threading.Thread(target=self._run, name="nanoserve-engine", daemon=True)
        self._ids = 0

    # ---- event-loop side ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread; return once it has built the engine, or raise what building
        it raised (an unknown model, too few KV blocks)."""
        self._thread.start()
        self._ready.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    async def generate(self, prompt_token_ids: list[int], params, request_id: str | None = None,
                       kv_transfer_params: dict | None = None):
        """Submit a request; -> its RequestStream of outputs (each with `new_token_ids`; the
        last one finished; the caller closes it). Raises the engine's ValueError for a bad request, ServerBusy
        when too many are in flight, EngineStopped when shutting down."""
        if not self.alive:
            raise EngineStopped("the server is shutting down" if self.error is None else self.error)
        if self.max_num_queued_reqs is not None and self.num_in_flight + 1 > self.max_num_queued_reqs:
            if self.metrics is not None:
                self.metrics.rejected.inc()
            raise ServerBusy(f"the server is busy ({self.num_in_flight} requests in flight, "
                             f"--max-num-queued-reqs {self.max_num_queued_reqs}); retry later")
        if request_id is None:
            self._ids += 1
            request_id = f"req-{self._ids}"
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        self.num_in_flight += 1
        try:
            self._inbox.put(_Add(request_id, prompt_token_ids, params, stream.sink, kv_transfer_params))
            first = await asyncio.wait_for(stream.sink.queue.get(), ACCEPT_TIMEOUT)
            if isinstance(first, Exception):
                stream.finished = True  # refused: the engine holds nothing of it
                raise first
        except BaseException:
            stream.close()
            raise
        return stream

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def begin_shutdown(self) -> None:
        """Thread-safe and idempotent: refuse new requests; the engine thread ends every
        in-flight one with EngineStopped (the server sends them an error chunk) and exits."""
        self._stopping.set()
        self._inbox.put(None)  # wake the thread if it sleeps on the inbox

    def stop(self, timeout: float = 10.0) -> None:
        self.begin_shutdown()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine-thread side ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.engine = self.make_engine()
            self._record([])  # the metrics' baseline: counters start from the engine's state now
        except BaseException as e:
            self._build_error = e
            return
        finally:
            self._ready.set()
        try:
            while not self._stopping.is_set():
                self._drain(block=not self.engine.has_unfinished())
                if self.engine.has_unfinished() and not self._stopping.is_set():
                    self._step()
            reason = "the server is shutting down"
        except Exception as e:  # a bug: fail every request rather than leave them hanging
            log.exception("engine thread failed")
            reason = self.error = f"the engine failed: {e!r}"
            self._stopping.set()
        self._fail_all(reason)
        self.engine.shutdown()  # what a KV connector holds

    def _drain(self, block: bool, wait: float = IDLE_WAIT) -> None:
        """Apply what the inbox holds; if `block`, first wait up to `wait` s for something."""
        try:
            msg = self._inbox.get(timeout=wait) if block else self._inbox.get_nowait()
            while True:
                self._apply(msg)
                msg = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _apply(self, msg) -> None:
        if isinstance(msg, _Add):
            try:
                self.engine.add_request(msg.prompt_token_ids, msg.params, request_id=msg.request_id,
                                        kv_transfer_params=msg.kv_transfer_params)
            except ValueError as e:  # a bad request: refused before it touched anything
                msg.sink.put(e)
                return
            self._sinks[msg.request_id] = msg.sink
            msg.sink.put(ACCEPTED)
        elif isinstance(msg, _Abort):
            out = self.engine.abort(msg.request_id)
            sink = self._sinks.pop(msg.request_id, None)
            if out is not None:
                self._finished(out)
                if sink is not None:
                    sink.put(out)
            self._record([])

    def _step(self) -> None:
        steps = self.engine.num_steps
        outs: list[RequestOutput] = self.engine.step()
        deliveries = []
        for o in outs:
            sink = self._sinks.get(o.request_id)
            if o.finished:
                self._sinks.pop(o.request_id, None)
                self._finished(o)
                if sink is not None:
                    sink.kv_transfer_params = self.engine.finished_kv_transfer_params.get(o.request_id)
            if sink is not None:
                deliveries.append((sink, o))
        _deliver(deliveries)
        self._record(outs)
        if self.engine.num_steps == steps and not outs:
            self._drain(block=True, wait=STALL_WAIT)  # nothing could run: don't spin

    def _record(self, outs) -> None:
        if self.metrics is not None:
            self.metrics.record_step(self.engine, outs)

    def _finished(self, o: RequestOutput) -> None:
        if self.metrics is not None:
            self.metrics.record_finished(o)

    def _fail_all(self, reason: str) -> None:
        """Abort every request the engine holds (freeing its blocks) and tell its client why."""
        try:
            while True:
                msg = self._inbox.get_nowait()
                if isinstance(msg, _Add):
                    msg.sink.put(EngineStopped(reason))
        except queue.Empty:
            pass
        for rid, sink in list(self._sinks.items()):
            try:
                self.engine.abort(rid)
            finally:
                sink.put(EngineStopped(reason))
        self._sinks.clear()
        try:
            self._record([])
        except Exception:  # the metrics are not worth a hang at exit
            log.exception("recording metrics at shutdown failed")
