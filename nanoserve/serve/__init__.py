"""Serving over HTTP: an OpenAI-compatible server over the engine, as vLLM's.

    server.py        `python -m nanoserve serve`: flags with vLLM's names, uvicorn, clean shutdown
    app.py           the FastAPI routes, the API-key check, OpenAI's error bodies
    serving.py       completions and chat completions: submit, stream as SSE or collect
    async_engine.py  the engine in one thread; requests and tokens cross through queues
    protocol.py      request models and response shapes (vLLM's field names)
    text_stream.py   incremental detokenization and stop strings
    chat_template.py chat messages to a prompt (the checkpoint's Jinja template)
    metrics.py       /metrics in Prometheus text with vLLM's metric names
    launch.py        start `nanoserve serve` as a subprocess and stop it (tests, lessons, benchmarks)

It may import measure/ and below, never course/ (lint-imports checks); measure/loadgen.py, the
client that measures any OpenAI-compatible server, does not import it.
"""
