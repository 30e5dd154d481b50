"""The FastAPI app: vLLM's OpenAI-compatible routes, its API-key check and its error bodies.

Routes (vllm 0.32 entrypoints/openai/api_server.py and entrypoints/serve/): GET /health (200 while
the engine thread runs, else 503), GET /v1/models, POST /v1/completions, POST
/v1/chat/completions, POST /tokenize, POST /detokenize, GET /metrics (Prometheus text).

Every error is OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 for anything wrong
in a request (malformed JSON and pydantic's type errors included, `param` naming the field),
404 for an unknown model, route or 405 for a wrong method, 401 for a missing or wrong API key,
503 with Retry-After when too many requests are in flight. Nothing a client sends can cause a 500.

With an API key (vLLM's AuthenticationMiddleware, entrypoints/serve/middleware/authenticate.py),
every /v1 request needs `Authorization: Bearer KEY`; /health, /metrics and /tokenize stay open,
as in vLLM. The key is compared by SHA-256 digest in constant time.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanoserve.serve import protocol as p
from nanoserve.serve.serving import OpenAIServing, respond

log = logging.getLogger("nanoserve.serve")
# each POST route's request model, for naming its required fields when the body is missing
BODIES = {"/v1/completions": p.CompletionRequest, "/v1/chat/completions": p.ChatCompletionRequest,
          "/tokenize": p.TokenizeRequest, "/detokenize": p.DetokenizeRequest}


class AuthenticationMiddleware:
    """Pure ASGI middleware: /v1 requests need `Authorization: Bearer <api key>`."""

    def __init__(self, app, api_key: str):
        self.app, self.digest = app, hashlib.sha256(api_key.encode()).digest()

    def ok(self, headers: dict) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        given = hashlib.sha256(token.encode()).digest()
        return scheme.lower() == "bearer" and secrets.compare_digest(given, self.digest)

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and scope["path"].startswith("/v1") and not self.ok(dict(scope["headers"]))):
            body = p.error_body("missing or wrong API key: send 'Authorization: Bearer <key>'", 401)
            return await JSONResponse(body, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        return await self.app(scope, receive, send)


def build_app(serving: OpenAIServing, metrics, api_key: str | None = None, lifespan=None) -> FastAPI:
    """The app over `serving`; `metrics` is the ServerMetrics /metrics renders; `lifespan` stops
    the engine thread when the server stops."""
    app = FastAPI(title="nanoserve", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.state.serving = serving
    if api_key:
        app.add_middleware(AuthenticationMiddleware, api_key=api_key)

    @app.exception_handler(p.APIError)
    async def api_error(_, e: p.APIError):
        return JSONResponse(e.body(), e.status, e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        errors = e.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(p.error_body(f"the request body is not valid JSON: "
                                             f"{first.get('ctx', {}).get('error', '')}", 400), 400)
        if tuple(first.get("loc", ())) == ("body",):  # no body, or not a JSON object: name the fields
            model = BODIES.get(request.url.path)
            need = [n for n, f in model.model_fields.items() if f.is_required()] if model else []
            what = "missing" if first.get("type") == "missing" else "not a JSON object"
            return JSONResponse(p.error_body(
                f"the request body is {what}: send a JSON object with "
                f"{', '.join(f'`{n}`' for n in need) or 'the request fields'}", 400,
                need[0] if need else None), 400)
        lines = [f"{'.'.join(str(x) for x in err.get('loc', ()) if x != 'body')}: {err.get('msg')}"
                 for err in errors[:5]]
        return JSONResponse(p.error_body("; ".join(lines) or "invalid request", 400,
                                         p.validation_param(tuple(first.get("loc", ())))), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):  # unknown route 404, wrong method 405, ...
        return JSONResponse(p.error_body(str(e.detail), e.status_code), e.status_code, e.headers)

    @app.exception_handler(Exception)
    async def crash(_, e: Exception):  # a bug, not bad input: say so without the traceback
        log.exception("unhandled error")
        return JSONResponse(p.error_body(f"internal error: {type(e).__name__}", 500), 500)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if serving.engine.alive else 503)

    @app.get("/v1/models")
    async def models():
        return p.model_list(serving.model_name, serving.model_root, serving.max_model_len)

    @app.post("/v1/completions")
    async def completions(req: p.CompletionRequest, raw: Request):
        serving.check_model(req.model)
        ids = serving.prompt_ids(req.prompt)
        return await respond(serving, raw, req, ids, req.max_tokens, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: p.ChatCompletionRequest, raw: Request):
        serving.check_model(req.model)
        ids = serving.chat_ids(req.messages, req.add_generation_prompt)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await respond(serving, raw, req, ids, max_tokens, chat=True)

    @app.post("/tokenize")
    async def tokenize(req: p.TokenizeRequest):
        serving.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise p.APIError(400, "send either `prompt` or `messages`", "prompt")
        ids = (serving.prompt_ids(req.prompt) if req.prompt is not None
               else serving.chat_ids(req.messages, req.add_generation_prompt))
        return {"count": len(ids), "max_model_len": serving.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(req: p.DetokenizeRequest):
        serving.check_model(req.model)
        vocab = serving.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise p.APIError(400, f"tokens: token id {bad[0]} is outside the vocabulary [0, {vocab})",
                             "tokens")
        return {"prompt": serving.decode(req.tokens)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
