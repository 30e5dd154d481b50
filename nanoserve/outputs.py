"""What the engine returns: RequestOutput and the per-request timestamps behind every metric."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Wall-clock timestamps (seconds, engine clock) of one request's life.

    TTFT = first_token_time - arrival_time = queue (first_scheduled_time - arrival_time)
    + prefill (first_token_time - first_scheduled_time). token_times has one entry per
    generated token, so ITLs are its consecutive differences.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None


@dataclass
class RequestOutput:
    """Cumulative state of one request after a step (as vLLM's RequestOutput)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finished: bool
    # "length" | "eos" | "stop" (a stop token) | "abort" | "error" (running it failed) | None
    finish_reason: str | None
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    text: str | None = None  # decoded token_ids when the model has a tokenizer
    new_token_ids: list[int] = field(default_factory=list)  # tokens added by this step
    error: str | None = None  # what failed, when finish_reason is "error"

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)
