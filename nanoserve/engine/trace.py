"""The step trace: one StepRecord per engine step, enough to time, plot, cost and calibrate it.

Each entry says which request ran how many tokens from which position and whether it sampled,
so `StepRecord.batch()` is the (query_len, context_len, samples) list that
measure.roofline.step_cost counts: bench's MBU/MFU and the simulator's calibration read it
instead of rebuilding it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class TraceEntry(NamedTuple):
    request_id: str
    kind: str  # "prefill" (a prompt chunk or a recomputation) | "decode" (one new token)
    num_tokens: int  # tokens computed this step
    start: int  # num_computed_tokens before the step: the chunk's first position
    sample: bool  # reached the end of the known tokens: a token was sampled
    num_draft_tokens: int = 0  # speculative decoding: drafts checked (among num_tokens)
    num_accepted_tokens: int = 0  # drafts the target agreed with


@dataclass
class StepRecord:
    """One step of the trace: when it ran and what it computed."""

    step: int
    start: float
    end: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_usage: float
    preempted: list[str]
    entries: list[TraceEntry] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    def batch(self) -> list[tuple[int, int, bool]]:
        """(tokens computed, context length, samples) per sequence, as step_cost takes it."""
        return [(e.num_tokens, e.start + e.num_tokens, e.sample) for e in self.entries]
