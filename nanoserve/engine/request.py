"""A request's life inside the engine: its tokens, progress, blocks and timestamps; and the
checks a prompt passes on its way in."""

from __future__ import annotations

import enum

from nanoserve.errors import InvalidRequest, as_int
from nanoserve.outputs import RequestMetrics, RequestOutput
from nanoserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not yet admitted (or not yet arrived)
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks taken back; waits to be recomputed
    FINISHED = "finished"


class Request:
    """Mutable engine-side state; the scheduler and KV cache manager read and advance it."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival_time: float, max_len: int, eos_token_ids=frozenset(),
                 kv_transfer_params: dict | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.status = RequestStatus.WAITING
        self.max_len = max_len  # prompt + output never exceeds this (max_model_len)
        self.eos_token_ids = eos_token_ids
        # tokens whose KV is in the cache; the next step computes from here
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hits at first admission (-1: not yet admitted)
        self.block_hashes: list[bytes] = []  # chained hashes of this request's full blocks
        # speculative decoding: tokens a proposer guessed to follow the known ones, checked by
        # the next step that runs this request (never part of all_token_ids until accepted)
        self.spec_token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.error: str | None = None  # what failed, when finish_reason is "error"
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.num_preemptions = 0
        self.emitted = 0  # output tokens already reported (for streaming deltas)
        # disaggregated prefill/decode: what the KV connector is asked to do (kv_connector.py)
        self.kv_transfer_params = kv_transfer_params

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, n: int) -> list[int]:
        """Tokens start..start+n-1 of prompt + output, without concatenating the whole list."""
        p = len(self.prompt_token_ids)
        if start + n <= p:
            return self.prompt_token_ids[start:start + n]
        if start >= p:
            return self.output_token_ids[start - p:start - p + n]
        return self.prompt_token_ids[start:] + self.output_token_ids[:start + n - p]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """Still computing tokens it already knows (the prompt, or everything after a preemption)."""
        return self.num_computed_tokens < self.num_tokens - 1

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)
        p = self.params
        if token_id in p.stop_token_ids:
            self.finish_reason = "stop"
        elif not p.ignore_eos and token_id in self.eos_token_ids:
            self.finish_reason = "eos"
        elif len(self.output_token_ids) >= p.max_tokens or self.num_tokens >= self.max_len:
            self.finish_reason = "length"

    def to_output(self, text: str | None = None) -> RequestOutput:
        new = self.output_token_ids[self.emitted:]
        self.emitted = len(self.output_token_ids)
        return RequestOutput(
            request_id=self.request_id, prompt_token_ids=self.prompt_token_ids,
            token_ids=list(self.output_token_ids), finished=self.is_finished,
            finish_reason=self.finish_reason, metrics=self.metrics,
            num_cached_tokens=max(self.num_cached_tokens, 0), text=text, new_token_ids=new,
            error=self.error)


def check_prompt(prompt, vocab_size: int, max_model_len: int) -> list[int]:
    """A prompt as a list of Python ints: a list or tuple of ints (NumPy/torch integer scalars
    converted), or a 1-D integer array or tensor; checked as vLLM 0.32's input processor does
    (vllm/v1/engine/input_processor.py, _validate_prompt_len and _validate_model_input: not
    empty, in the vocabulary, shorter than max_model_len). InvalidRequest("prompt", ...) if not."""
    if isinstance(prompt, str):
        raise InvalidRequest("prompt", "add_request takes token ids; encode text first "
                                       "(engine.encode(text) with a model that has a tokenizer)")
    if hasattr(prompt, "tolist"):  # a NumPy array or a torch tensor: Python scalars
        prompt = prompt.tolist()
    try:
        ids = list(prompt)
    except TypeError:
        raise InvalidRequest("prompt", f"prompt={prompt!r} must be a list of token ids") from None
    if not ids:
        raise InvalidRequest("prompt", "prompt is empty: a request needs at least one prompt token")
    if not all(type(t) is int for t in ids):
        ids = [as_int("prompt", t, f"prompt token id {t!r} (position {i})") for i, t in enumerate(ids)]
    lo, hi = min(ids), max(ids)
    if lo < 0 or hi >= vocab_size:
        raise InvalidRequest("prompt", f"prompt token id {lo if lo < 0 else hi} is outside the "
                                       f"vocabulary [0, {vocab_size})")
    if len(ids) > max_model_len:
        raise InvalidRequest("prompt", f"prompt of {len(ids)} tokens is longer than "
                                       f"max_model_len={max_model_len}")
    if len(ids) == max_model_len:  # vLLM refuses it too: no room for one output token
        raise InvalidRequest("prompt", f"prompt of {len(ids)} tokens leaves no room for an output "
                                       f"token within max_model_len={max_model_len}")
    return ids
