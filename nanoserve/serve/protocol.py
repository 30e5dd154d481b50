"""The OpenAI API's shapes, as vLLM's server speaks them: request models, response bodies, errors.

Requests are pydantic models with vLLM's field names and defaults (vllm 0.32:
entrypoints/openai/completion/protocol.py, chat_completion/protocol.py); unknown fields are
accepted and ignored, as vLLM and OpenAI do. Responses are plain dicts built by the functions
below, in the shapes of vLLM's CompletionResponse / CompletionStreamResponse /
ChatCompletionResponse / ChatCompletionStreamResponse (`id`, `object`, `created`, `model`,
`choices`, `usage`, and `kv_transfer_params`, null unless a prefill instance hands a request
off; a stream's usage chunk has `choices: []`). Errors are OpenAI's
`{"error": {"message", "type", "param", "code"}}` with vLLM's types (serve/engine/protocol.py
ErrorInfo: `code` is the HTTP status). Range checks of sampling fields are not here: they are
SamplingParams' (one place, nanoserve.errors.InvalidRequest naming the field).

Deliberately left out: logprobs, echo, suffix, tools, n > 1 (refused), multimodal content.
"""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# JSON numbers only: NaN and Infinity (which Python's json module accepts) fail validation here
Real = Annotated[float, Field(allow_inf_nan=False)]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")  # as vLLM: extra fields are accepted and ignored


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False


class SamplingRequest(OpenAIBaseModel):
    """Fields /v1/completions and /v1/chat/completions share (vLLM's names and defaults)."""

    model: str | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Real | None = None  # None: 1.0, the OpenAI and vLLM default
    top_p: Real | None = None
    # vLLM's extensions of the OpenAI API
    top_k: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    # disaggregated prefill/decode (vLLM's field): {"do_remote_decode": true} asks a prefill
    # instance for a hand-off; the params it returns make a decode instance go on from there
    kv_transfer_params: dict | None = None

    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stop if s]  # an empty string can never be found: ignore it


class CompletionRequest(SamplingRequest):
    # one prompt: a string or token ids (a one-element list of either is unwrapped)
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None  # a string, or parts [{"type": "text", "text": ...}]
    name: str | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None  # None: up to max_model_len, as vLLM
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    add_generation_prompt: bool = True


class TokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None  # vLLM's TokenizeChatRequest
    add_generation_prompt: bool = True


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


# ---- responses ------------------------------------------------------------------------------

def request_id(prefix: str) -> str:
    """vLLM's ids: "cmpl-..." for completions, "chatcmpl-..." for chat."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason=None,
                     stop_reason=None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": stop_reason}]}


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish_reason=None,
               stop_reason=None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": stop_reason}]}


def usage_chunk(rid: str, created: int, model: str, obj: str, use: dict) -> dict:
    """The last chunk of a stream asked for usage: no choices (vLLM's final_usage_chunk)."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": use}


def completion_response(rid: str, created: int, model: str, text: str, finish_reason: str,
                        stop_reason, use: dict, kv_transfer_params: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason, "stop_reason": stop_reason}],
            "usage": use, "kv_transfer_params": kv_transfer_params}


def chat_response(rid: str, created: int, model: str, text: str, finish_reason: str,
                  stop_reason, use: dict, kv_transfer_params: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason,
                         "stop_reason": stop_reason}],
            "usage": use, "kv_transfer_params": kv_transfer_params}


def model_list(name: str, root: str, max_model_len: int) -> dict:
    """GET /v1/models: vLLM's ModelList with one ModelCard."""
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "nanoserve", "root": root, "parent": None,
                                        "max_model_len": max_model_len, "permission": []}]}


# ---- errors ---------------------------------------------------------------------------------

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError"}  # vLLM's; else the status phrase


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI's error shape, with vLLM's types (code = the HTTP status, as vLLM's ErrorInfo)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, HTTPStatus(status).phrase),
                      "param": param, "code": status}}


class APIError(Exception):
    """A request the server refuses: the status, OpenAI's error body, extra headers."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.headers = status, param, headers or {}

    @classmethod
    def invalid(cls, exc: ValueError, param: str | None = None) -> APIError:
        """400 for a ValueError; InvalidRequest names the field in `.param`."""
        return cls(400, str(exc), getattr(exc, "param", None) or param)

    def body(self) -> dict:
        return error_body(str(self), self.status, self.param)


def validation_param(loc: tuple) -> str | None:
    """The field a pydantic error points at: ("body", "messages", 0, "role") -> "messages".

    vLLM reports the whole dotted path ("body.messages.0.role"); OpenAI names the request field,
    which is what a client can act on, so that is what `param` holds here."""
    parts = [p for p in loc if p != "body" and isinstance(p, str)]
    return parts[0] if parts else None
