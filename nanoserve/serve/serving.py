"""/v1/completions and /v1/chat/completions over the AsyncEngine (vLLM's serving_completion.py and
serving_chat.py, vllm 0.32: entrypoints/openai/{completion,chat_completion}/serving.py).

A request becomes prompt token ids and SamplingParams, is submitted (refused with 400/503 before
any byte of the response if the engine rejects it), then either streams as Server-Sent Events
(`data: {chunk}` per engine output, a usage chunk when `stream_options.include_usage`, then
`data: [DONE]`) or is collected into one response. A request that fails once streaming has
begun (shutdown, a failing step) gets one `data: {"error": ...}` chunk and `data: [DONE]`, as
vLLM sends them. Finish reasons are OpenAI's: "length", or "stop" for EOS, a stop token (whose id
is `stop_reason`) or a stop string (`stop_reason` = the string, the request aborted in the engine).

Disaggregated prefill/decode (vLLM's kv_transfer_params, engine/kv_connector.py): a request with
{"do_remote_decode": true} (stream=false, max_tokens=1: what the router sends a prefill instance)
answers with its first token's text, held back where the text may still change (half a
character, the start of a stop string) since the request goes on elsewhere, and the
kv_transfer_params a decode instance needs. A request with those params continues on a decode
instance: its text and chunks start after the prefill instance's token (the router sent that one),
a chat stream without a second role chunk; usage counts every output token.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from nanoserve.engine.kv_connector import release_kv_transfer
from nanoserve.sampling_params import SamplingParams
from nanoserve.serve import protocol as p
from nanoserve.serve.async_engine import AsyncEngine, EngineStopped, ServerBusy
from nanoserve.serve.text_stream import TextStream, ids_as_text


class RequestError(Exception):
    """A request failed after it was accepted (the engine marked it "error" or aborted it)."""


class OpenAIServing:
    """The served model: its name, tokenizer and chat template, and the AsyncEngine behind it."""

    def __init__(self, engine: AsyncEngine, model_name: str, model_root: str, chat_template=None):
        self.engine, self.model_name, self.model_root = engine, model_name, model_root
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len = engine.engine.max_model_len
        self.vocab_size = engine.engine.model_config.vocab_size
        self.chat_template = chat_template

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise p.APIError(404, f"The model `{name}` does not exist. Valid aliases: "
                                  f"{self.model_name}.", "model")

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ids_as_text(ids)

    def encode(self, text: str, param: str, special: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise p.APIError(400, f"this model has no tokenizer: send {param} as token ids", param)
        return self.tokenizer.tok.encode(text, add_special_tokens=special).ids

    def prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise p.APIError(400, f"got {len(prompt)} prompts; this server takes one prompt per "
                                      "request", "prompt")
            prompt = prompt[0]
        return self.encode(prompt, "prompt") if isinstance(prompt, str) else list(prompt)

    def chat_ids(self, messages, add_generation_prompt: bool = True) -> list[int]:
        if self.chat_template is None:
            raise p.APIError(400, "this model has no chat template; use /v1/completions or start "
                                  "the server with --chat-template", "messages")
        try:
            text = self.chat_template.render(message_dicts(messages), add_generation_prompt)
        except ValueError as e:
            raise p.APIError.invalid(e, "messages") from e
        return self.encode(text, "messages", special=False)  # the template wrote them

    def sampling_params(self, req: p.SamplingRequest, max_tokens: int | None,
                        num_prompt_tokens: int) -> SamplingParams:
        if req.n != 1:
            raise p.APIError(400, f"n={req.n}: this server returns one choice per request (n=1)", "n")
        if req.stream_options is not None and not req.stream:
            raise p.APIError(400, "Stream options can only be defined when `stream=True`.",
                             "stream_options")
        limit, n = self.max_model_len, num_prompt_tokens
        if n >= limit:  # vLLM's words (entrypoints/openai/serving_engine.py, _validate_input)
            raise p.APIError(400, f"This model's maximum context length is {limit} tokens. However, "
                                  f"your request has {n} input tokens. Please reduce the length of the "
                                  "input messages.", "messages" if hasattr(req, "messages") else "prompt")
        if max_tokens is None:  # vLLM: whatever room max_model_len leaves
            max_tokens = limit - n
        elif isinstance(max_tokens, int) and max_tokens > limit - n:  # vLLM refuses, never cuts
            raise p.APIError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. "
                                  f"This model's maximum context length is {limit} tokens and your "
                                  f"request has {n} input tokens ({max_tokens} > {limit} - {n}).",
                             "max_completion_tokens" if getattr(req, "max_completion_tokens", None)
                             is not None else "max_tokens")
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k is None else req.top_k, seed=req.seed,
                ignore_eos=req.ignore_eos, stop_token_ids=req.stop_token_ids)
        except ValueError as e:
            raise p.APIError.invalid(e) from e

    async def submit(self, ids: list[int], params: SamplingParams, kv_transfer_params=None):
        try:
            return await self.engine.generate(ids, params, kv_transfer_params=kv_transfer_params)
        except ValueError as e:
            raise p.APIError.invalid(e, "prompt") from e
        except ServerBusy as e:
            raise p.APIError(503, str(e), headers={"Retry-After": "1"}) from e
        except asyncio.TimeoutError as e:  # overloaded, as OpenAI's "engine is overloaded": 503, not 429
            raise p.APIError(503, "the engine did not accept the request in time; retry later",
                             headers={"Retry-After": "1"}) from e
        except EngineStopped as e:
            raise p.APIError(503, str(e) or "the server is shutting down") from e

    async def events(self, stream, text: TextStream):
        """-> (delta text, OpenAI finish reason or None, stop reason, output tokens) per output."""
        async for o in stream:
            if o.finish_reason in ("error", "abort"):
                raise RequestError(getattr(o, "error", None) or f"the request was {o.finish_reason}ed")
            # a hand-off goes on elsewhere: hold back what the next tokens may still change
            delta = text.update(o.new_token_ids, o.finished and stream.kv_transfer_params is None)
            if text.stop_reason is not None:  # a stop string: done here, free the engine's blocks
                stream.close()
                yield delta, "stop", text.stop_reason, len(o.token_ids)
                return
            reason = stop_reason = None
            if o.finished:
                reason = "length" if o.finish_reason == "length" else "stop"
                stop_reason = o.token_ids[-1] if o.finish_reason == "stop" else None
            yield delta, reason, stop_reason, len(o.token_ids)


async def _until_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(raw: Request, coro):
    """Run `coro`, cancelling it if the client disconnects first (vLLM's @with_cancellation):
    a non-streaming request whose client left stops using the engine."""
    work, gone = asyncio.ensure_future(coro), asyncio.ensure_future(_until_disconnect(raw))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    return await work if not work.cancelled() else None


async def respond(serving: OpenAIServing, raw: Request, req: p.SamplingRequest, ids: list[int],
                  max_tokens: int | None, chat: bool):
    """Validate, submit, then stream or collect. Raises APIError before any byte is sent."""
    kv = req.kv_transfer_params or {}
    if kv.get("do_remote_decode") and req.stream:
        raise p.APIError(400, "kv_transfer_params.do_remote_decode needs stream=false: the hand-off "
                              "comes back in the response", "stream")
    params = serving.sampling_params(req, max_tokens, len(ids))
    stream = await serving.submit(ids, params, req.kv_transfer_params)
    rid, created, model = p.request_id("chatcmpl" if chat else "cmpl"), int(time.time()), serving.model_name
    text = TextStream(serving.decode, req.stop_strings(), req.include_stop_str_in_output)
    if kv.get("do_remote_prefill"):  # the engine accepted them: the router sent their text
        text.update(kv["output_token_ids"], False)
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        body = _sse(serving, stream, text, rid, created, model, len(ids), chat, usage,
                    role_chunk=not kv.get("do_remote_prefill"))
        # a generator never started (the client left at once) runs no `finally`: close on collection
        weakref.finalize(body, stream.close)
        return StreamingResponse(body, media_type="text/event-stream")
    result = await _unless_disconnected(raw, _collect(serving, stream, text))
    handoff = stream.kv_transfer_params
    if result is None or (handoff is not None and result[1] != "length"):
        release_kv_transfer(handoff)  # nobody will decode it (client gone, a stop string)
        handoff = None
    if result is None:  # the client is gone; nobody reads this
        return JSONResponse(p.error_body("client disconnected", 400), 400)
    parts, reason, stop_reason, n_out = result
    build = p.chat_response if chat else p.completion_response
    return JSONResponse(build(rid, created, model, "".join(parts), reason, stop_reason,
                              p.usage(len(ids), n_out), handoff))


async def _collect(serving, stream, text):
    parts, last = [], (None, None, 0)
    try:
        async for delta, reason, stop_reason, n_out in serving.events(stream, text):
            parts.append(delta)
            last = (reason, stop_reason, n_out)
    except (RequestError, EngineStopped, asyncio.TimeoutError) as e:
        raise p.APIError(500 if isinstance(e, RequestError) else 503, str(e) or "timed out") from e
    finally:
        stream.close()
    return (parts, *last)


def _data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _sse(serving, stream, text, rid, created, model, n_prompt, chat, include_usage,
               role_chunk=True):
    n_out, first = 0, role_chunk
    try:
        async for delta, reason, stop_reason, n_out in serving.events(stream, text):
            if chat:
                if first:  # vLLM's first chat chunk names the role
                    yield _data(p.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}))
                    first = False
                yield _data(p.chat_chunk(rid, created, model, {"content": delta}, reason, stop_reason))
            else:
                yield _data(p.completion_chunk(rid, created, model, delta, reason, stop_reason))
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            yield _data(p.usage_chunk(rid, created, model, obj, p.usage(n_prompt, n_out)))
    except (RequestError, EngineStopped, asyncio.TimeoutError) as e:
        yield _data(p.error_body(str(e) or "no token in time", 500 if isinstance(e, RequestError)
                                 else 503))
    finally:
        stream.close()
    yield "data: [DONE]\n\n"


def message_dicts(messages) -> list[dict]:
    """ChatMessage models -> the dicts a template reads; content parts are joined (text only)."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            kinds = {p.get("type") for p in content}
            if kinds - {"text"}:
                raise ValueError(f"messages[{i}].content has parts of type {sorted(kinds - {'text'})}; "
                                 "this server reads text only")
            content = "".join(p.get("text", "") for p in content)
        d = {"role": m.role, "content": content or ""}
        if m.name:
            d["name"] = m.name
        out.append(d)
    return out
