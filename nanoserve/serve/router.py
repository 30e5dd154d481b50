"""The router in front of a disaggregated deployment: each request is prefilled on the prefill
instance, then decoded on the decode instance, as vLLM's disaggregated-serving proxy does
(examples/online_serving/disaggregated_serving, tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py): the request goes to prefill with max_tokens=1, stream=false and
kv_transfer_params {"do_remote_decode": true}; the kv_transfer_params that come back go to decode
with the client's own request. Unlike vLLM's proxy, the first token's text from the prefill
instance reaches the client at once (the decode instance goes on after it, engine/kv_connector.py),
so TTFT is the prefill's, not prefill + transfer + a decode step.

Clients see one OpenAI server (/v1/completions, /v1/chat/completions, /v1/models, /health): a
stream's chunks all carry the router's id; a non-streamed answer is assembled from the decode
instance's stream (so a stalled decode instance is noticed the same way). A request the client
wants one token of never leaves the prefill instance.

Failures end that request, never the router: an instance's own error (400, 503, ...) is passed on
as it is; an instance that cannot be reached, dies, closes its stream early or sends no chunk for
`decode_timeout` seconds gets OpenAI's error body (502, 504) or, once streaming, one error chunk
and `data: [DONE]`. The hand-off is then released (engine/kv_connector.release_kv_transfer), so no
segment is left behind on either side, and closing the upstream connection makes the decode
instance abort the request and free its blocks. Every wait has a timeout and every loop a bound.

    python -m nanoserve.serve.router --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import weakref
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from nanoserve import cli
from nanoserve.engine.kv_connector import release_kv_transfer
from nanoserve.serve import protocol as p
from nanoserve.serve.app import AuthenticationMiddleware

log = logging.getLogger("nanoserve.router")
HEALTH_TIMEOUT = 2.0  # s for each instance's /health
CONNECT_TIMEOUT = 5.0  # s to open a connection to an instance


class UpstreamError(Exception):
    """An instance failed this request: `status` and `message` for the client's error body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Router:
    """Prefill then decode for each request (see the module docstring).

    prefill_timeout: s the prefill instance may take to answer; decode_timeout: s the decode
    instance may go without a chunk; request_timeout: s a whole request may take."""

    def __init__(self, prefill_url: str, decode_url: str, prefill_timeout: float = 600.0,
                 decode_timeout: float = 60.0, request_timeout: float = 3600.0):
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.prefill_timeout, self.decode_timeout = prefill_timeout, decode_timeout
        self.request_timeout = request_timeout
        self.client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=2048,
                                                            max_keepalive_connections=256))

    async def stop(self) -> None:
        await self.client.aclose()

    async def healthy(self) -> bool:
        async def ok(url):
            try:
                r = await self.client.get(url + "/health", timeout=HEALTH_TIMEOUT)
                return r.status_code == 200
            except httpx.HTTPError:
                return False
        return all(await asyncio.gather(ok(self.prefill_url), ok(self.decode_url)))

    async def models(self) -> Response:
        try:
            r = await self.client.get(self.decode_url + "/v1/models", timeout=HEALTH_TIMEOUT * 5)
        except httpx.HTTPError as e:
            return _error(502, f"the decode instance cannot be reached: {e!r}")
        return Response(r.content, r.status_code, media_type="application/json")

    # ---- one request ---------------------------------------------------------------------------
    async def handle(self, body, path: str, chat: bool) -> Response:
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        want = body.get("max_completion_tokens") if chat else None
        want = want if want is not None else body.get("max_tokens", None if chat else 16)
        hand_off = want is None or (type(want) is int and want > 1)
        ask = {**body, "stream": False}
        ask.pop("stream_options", None)
        if hand_off:  # else one token (or a bad max_tokens, which the instance refuses)
            ask.update(max_tokens=1, kv_transfer_params={"do_remote_decode": True})
            ask.pop("max_completion_tokens", None)
        try:
            r = await self.client.post(self.prefill_url + path, json=ask, timeout=httpx.Timeout(
                self.prefill_timeout, connect=CONNECT_TIMEOUT))
        except httpx.TimeoutException:
            return _error(504, f"the prefill instance did not answer within {self.prefill_timeout:g} s")
        except httpx.HTTPError as e:
            return _error(502, f"the prefill instance cannot be reached: {e!r}")
        if r.status_code != 200:  # its own OpenAI error: the client's to read
            return Response(r.content, r.status_code, media_type="application/json")
        first = r.json()
        handoff = first.pop("kv_transfer_params", None)
        if handoff is None:  # done at its first token (EOS, a stop), or one token asked for
            return _answer(first, body, chat)
        decode = {**body, "kv_transfer_params": handoff, "stream": True,
                  "stream_options": {"include_usage": True}}
        if body.get("stream"):
            events = self._stream(first, decode, handoff, body, chat)
            # a stream never started (the client left at once) runs no `finally`: on collection
            weakref.finalize(events, release_kv_transfer, handoff)
            return StreamingResponse(events, media_type="text/event-stream")
        return await self._collect(first, decode, handoff, chat)

    async def _decode_chunks(self, body: dict, path: str, max_chunks: int):
        """The decode instance's SSE chunks as dicts, until [DONE]; UpstreamError on a failure."""
        timeout = httpx.Timeout(self.decode_timeout, connect=CONNECT_TIMEOUT)
        try:
            async with self.client.stream("POST", self.decode_url + path, json=body,
                                          timeout=timeout) as resp:
                if resp.status_code != 200:
                    raise UpstreamError(resp.status_code, _message(await resp.aread()))
                lines = 0
                async for line in resp.aiter_lines():
                    lines += 1
                    if lines > 2 * max_chunks + 8:
                        raise UpstreamError(502, f"the decode instance sent more than {max_chunks} chunks")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        err = chunk["error"]
                        raise UpstreamError(err.get("code") or 500, err.get("message", str(err)))
                    yield chunk
        except httpx.TimeoutException:
            raise UpstreamError(504, f"the decode instance sent nothing for "
                                     f"{self.decode_timeout:g} s") from None
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            raise UpstreamError(502, f"the decode instance failed: {e!r}") from None
        raise UpstreamError(502, "the decode instance closed the stream before [DONE]")

    async def _events(self, decode: dict, handoff: dict, chat: bool):
        """_decode_chunks within request_timeout; the hand-off is released whatever happens."""
        path = "/v1/chat/completions" if chat else "/v1/completions"
        max_chunks = (decode.get("max_completion_tokens") or decode.get("max_tokens") or 1 << 20) + 4
        deadline = time.monotonic() + self.request_timeout
        chunks = self._decode_chunks(decode, path, max_chunks)
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.__anext__(), deadline - time.monotonic())
                except StopAsyncIteration:
                    return
                except asyncio.TimeoutError:
                    raise UpstreamError(504, f"the request took longer than "
                                             f"{self.request_timeout:g} s") from None
                yield chunk
        finally:
            await chunks.aclose()  # closes the connection: the decode instance aborts the request
            release_kv_transfer(handoff)  # gone already if the decode instance loaded it

    async def _stream(self, first: dict, decode: dict, handoff: dict, body: dict, chat: bool):
        rid, created, model = first["id"], first["created"], first["model"]
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:  # a client that leaves during the first chunks never reaches _events' release
            if chat:
                yield _data(p.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}))
                yield _data(p.chat_chunk(rid, created, model, {"content": _text(first, chat)}))
            else:
                yield _data(p.completion_chunk(rid, created, model, _text(first, chat)))
            async for chunk in self._events(decode, handoff, chat):
                if chunk.get("choices") or usage:
                    yield _data({**chunk, "id": rid, "created": created})
        except UpstreamError as e:
            yield _data(p.error_body(str(e), e.status))
        finally:
            release_kv_transfer(handoff)  # gone already if the decode instance loaded it
        yield "data: [DONE]\n\n"

    async def _collect(self, first: dict, decode: dict, handoff: dict, chat: bool) -> Response:
        parts, reason, stop_reason, use = [_text(first, chat)], None, None, None
        try:
            async for chunk in self._events(decode, handoff, chat):
                for c in chunk.get("choices") or ():
                    piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
                    parts.append(piece or "")
                    reason, stop_reason = c.get("finish_reason") or reason, c.get("stop_reason", stop_reason)
                use = chunk.get("usage") or use
        except UpstreamError as e:
            return _error(e.status, str(e))
        build = p.chat_response if chat else p.completion_response
        return JSONResponse(build(first["id"], first["created"], first["model"], "".join(parts),
                                  reason, stop_reason, use))


def _text(response: dict, chat: bool) -> str:
    choice = response["choices"][0]
    return (choice["message"]["content"] or "") if chat else choice["text"]


def _answer(first: dict, body: dict, chat: bool) -> Response:
    """A request the prefill instance finished alone, in the shape the client asked for."""
    first["kv_transfer_params"] = None
    if not body.get("stream"):
        return JSONResponse(first)
    rid, created, model = first["id"], first["created"], first["model"]
    choice = first["choices"][0]
    end = choice["finish_reason"], choice["stop_reason"]
    if chat:
        events = [p.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}),
                  p.chat_chunk(rid, created, model, {"content": _text(first, chat)}, *end)]
    else:
        events = [p.completion_chunk(rid, created, model, _text(first, chat), *end)]
    if (body.get("stream_options") or {}).get("include_usage"):
        obj = "chat.completion.chunk" if chat else "text_completion"
        events.append(p.usage_chunk(rid, created, model, obj, first["usage"]))
    return StreamingResponse(iter([*map(_data, events), "data: [DONE]\n\n"]),
                             media_type="text/event-stream")


def _data(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _message(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")[:500]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(p.error_body(message, status), status)


def build_router_app(router: Router, api_key: str | None = None, on_stop=None) -> FastAPI:
    """The router's app; `on_stop()` runs when the server shuts down (stopping the instances)."""
    @asynccontextmanager
    async def lifespan(_app):
        await router.start()
        yield
        await router.stop()
        if on_stop is not None:
            on_stop()

    app = FastAPI(title="nanoserve router", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    if api_key:
        app.add_middleware(AuthenticationMiddleware, api_key=api_key)

    async def forward(raw: Request, path: str, chat: bool):
        try:
            body = json.loads(await raw.body())
        except ValueError as e:
            return _error(400, f"the request body is not valid JSON: {e}")
        return await router.handle(body, path, chat=chat)

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await forward(raw, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await forward(raw, "/v1/chat/completions", chat=True)

    @app.get("/v1/models")
    async def models():
        return await router.models()

    @app.get("/health")
    async def health():
        return Response(status_code=200 if await router.healthy() else 503)

    return app


def add_router_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("--prefill-timeout", type=float, default=600.0,
                    help="seconds the prefill instance may take to answer")
    ap.add_argument("--decode-timeout", type=float, default=60.0,
                    help="seconds the decode instance may go without sending a token")
    ap.add_argument("--request-timeout", type=float, default=3600.0,
                    help="seconds a whole request may take")
    return ap


def build_parser() -> argparse.ArgumentParser:
    ap = cli.parser("python -m nanoserve.serve.router", __doc__)
    ap.add_argument("--prefill", required=True, help="base URL of the prefill instance")
    ap.add_argument("--decode", required=True, help="base URL of the decode instance")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on")
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    ap.add_argument("--uvicorn-log-level", default="info", help="uvicorn's log level")
    return add_router_args(ap)


def main(argv: list[str] | None = None) -> int:
    """`python -m nanoserve.serve.router --prefill URL --decode URL [--host H --port P]`."""
    import uvicorn

    args = build_parser().parse_args(argv)
    router = Router(args.prefill, args.decode, args.prefill_timeout, args.decode_timeout,
                    args.request_timeout)
    uvicorn.run(build_router_app(router, args.api_key), host=args.host, port=args.port,
                log_level=args.uvicorn_log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
