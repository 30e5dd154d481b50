"""SamplingParams: how to pick each next token, with vLLM's names and meanings.

Every field is checked when the object is built (and again when the engine takes a copy), as
vLLM 0.32's `SamplingParams._verify_args` does (vllm/sampling_params.py): a bad value raises
nanoserve.errors.InvalidRequest naming the field, never an error from inside a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nanoserve.errors import InvalidRequest, as_bool, as_int, as_real

MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: smaller positive temperatures overflow the logits
MAX_TEMPERATURE = 2.0  # vLLM >= 0.24 (PR #44965) and the OpenAI API: temperature in [0, 2]
INT64 = (-2**63, 2**63 - 1)  # vLLM's OpenAI protocol: seed in int64


@dataclass
class SamplingParams:
    """Per-request decoding settings (vLLM's meanings).

    max_tokens: tokens to generate at most (>= 1).
    temperature: in [0, 2]; 0 is greedy; a positive value below 0.01 is raised to 0.01, as vLLM
        does, because logits / 1e-6 overflow.
    top_p: in (0, 1]; keep the smallest set of most likely tokens whose probability reaches top_p
        (1 keeps all).
    top_k: keep the k most likely tokens (ties with the k-th kept too); 0 or -1 keeps all tokens,
        as in vLLM (0 is vLLM's default, -1 its older spelling); k above the vocabulary keeps all.
        top_k is applied first, then top_p on the renormalised probabilities (vLLM's order).
    seed: an integer makes the request's samples reproducible whatever shares its batch;
        None (or -1, as in vLLM) draws from the engine's generator.
    ignore_eos: keep generating after the model's EOS token.
    stop_token_ids: a list of token ids that end the request (the stop token is kept in the output).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.max_tokens = as_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise InvalidRequest("max_tokens", f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        self.temperature = as_real("temperature", self.temperature)
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidRequest("temperature", f"temperature={self.temperature!r} must be in "
                                                f"[0, {MAX_TEMPERATURE:g}] (0 = greedy)")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        self.top_p = as_real("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p", f"top_p={self.top_p!r} must be in (0, 1]")
        self.top_k = as_int("top_k", self.top_k)
        if self.top_k < -1:
            raise InvalidRequest("top_k", f"top_k={self.top_k!r} must be 0 or -1 (all tokens) or an "
                                          "integer >= 1")
        if self.seed is not None:
            self.seed = as_int("seed", self.seed)
            if not INT64[0] <= self.seed <= INT64[1]:
                raise InvalidRequest("seed", f"seed={self.seed!r} must fit in 64 bits (int64)")
            if self.seed == -1:
                self.seed = None
        self.ignore_eos = as_bool("ignore_eos", self.ignore_eos)
        self.stop_token_ids = self._check_stop_token_ids(self.stop_token_ids)

    @staticmethod
    def _check_stop_token_ids(ids) -> list[int]:
        if ids is None:
            return []
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__") \
                or getattr(ids, "ndim", 1) != 1:
            raise InvalidRequest("stop_token_ids", f"stop_token_ids={ids!r} must be a list of "
                                                   "token ids")
        ids = [as_int("stop_token_ids", t, f"stop_token_ids entry {t!r}") for t in ids]
        bad = [t for t in ids if t < 0]
        if bad:
            raise InvalidRequest("stop_token_ids", f"stop_token_ids entry {bad[0]} is negative")
        return list(dict.fromkeys(ids))  # duplicates dropped, order kept (as vLLM)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
