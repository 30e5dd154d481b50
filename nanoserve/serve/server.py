"""`python -m nanoserve serve [MODEL]`: the OpenAI-compatible server, with `vllm serve`'s flags.

Flags keep vLLM's names (vllm/engine/arg_utils.py, entrypoints/openai/cli_args.py): --host (here
127.0.0.1 by default: nothing leaves this machine unless asked), --port, --dtype, --seed,
--max-model-len, --max-num-seqs, --max-num-batched-tokens, --block-size,
--kv-cache-memory-bytes, --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill,
--served-model-name, --api-key, --chat-template, --max-num-queued-reqs (503 beyond it),
--uvicorn-log-level, --kv-transfer-config (one half of a disaggregated pair, engine/kv_connector.py),
--speculative-config (JSON of vLLM's SpeculativeConfig fields, e.g. ngram), --quantization
(int8 or fp8 weight-only codes), --kv-cache-dtype (auto | fp8 | fp8_e4m3: an e4m3 KV cache holds
twice the tokens of bf16).
nanoserve's own: --device, --num-kv-blocks, --quantization-group-size (a scale per that many
input values instead of per channel), --quantization-lm-head (the lm_head as codes too),
--cpu-omp-threads-bind (vLLM's environment variable VLLM_CPU_OMP_THREADS_BIND as a flag: the CPUs
this instance runs on, one torch thread each), and --disaggregated: a prefill instance, a decode
instance and the router in front (serve/disagg.py).

The engine thread starts, loads the model and warms it up (one short request, so the first
client does not pay for first-touch allocation), then uvicorn serves. SIGTERM or Ctrl-C: uvicorn
stops accepting connections, every in-flight request ends with an error chunk (the engine thread
aborts them and frees their blocks), open connections get up to --shutdown-timeout seconds to
close, the engine thread is joined and the port is released.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import asynccontextmanager

from nanoserve import cli
from nanoserve.config import KV_CACHE_DTYPES, QUANTIZATION_METHODS, EngineConfig
from nanoserve.engine import LLMEngine
from nanoserve.engine.chat_template import load_chat_template
from nanoserve.engine.model_runner import default_model
from nanoserve.model import DEMO_MODEL_DIR, DEMO_MODEL_NAME
from nanoserve.model.fetch import is_fetchable
from nanoserve.model.loader import resolve_model_path
from nanoserve.sampling_params import SamplingParams
from nanoserve.serve.app import build_app
from nanoserve.serve.async_engine import AsyncEngine
from nanoserve.serve.launch import bind_cpus, is_loopback
from nanoserve.serve.metrics import ServerMetrics
from nanoserve.serve.serving import OpenAIServing

log = logging.getLogger("nanoserve.serve")


def add_cli_args(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    ap.add_argument("model", nargs="?", default=None,
                    help="checkpoint folder, hub id, preset:NAME, a .gguf file or smollm2-135m "
                         "(default: the demo model)")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (loopback: this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help="weights and KV cache; auto: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--quantization", default=None, choices=list(QUANTIZATION_METHODS),
                    help="the decoder layers' linear weights as 8-bit codes, per-channel scales "
                    "(weight-only; activations and KV cache keep --dtype)")
    ap.add_argument("--quantization-group-size", type=int, default=None,
                    help="a scale per this many input values instead of per channel (e.g. 32, GGUF "
                    "Q8_0's blocks; it must divide every linear's input size)")
    ap.add_argument("--quantization-lm-head", action="store_true",
                    help="with --quantization: the lm_head as 8-bit codes too (as a GGUF Q8_0 file holds it)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed of requests without one")
    ap.add_argument("--served-model-name", default=None,
                    help=f"the name clients send as `model` (default: MODEL as given, or {DEMO_MODEL_NAME} "
                    "without MODEL)")
    ap.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens of a "
                    "request at most (default: the model's max_position_embeddings)")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="requests running at once")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="tokens one step computes at most")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    ap.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks (default: sized "
                    "from --kv-cache-memory-bytes, else from memory as EngineConfig says)")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="bytes of KV cache "
                    "(default: a share of the device's memory)")
    ap.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                    help="reuse the KV blocks of a prompt prefix seen before")
    ap.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                    help="split long prompts' prefill across steps, beside running decodes")
    ap.add_argument("--max-num-queued-reqs", type=int, default=None, help="requests in flight "
                    "(waiting + running) beyond which new ones get 503 + Retry-After")
    ap.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    ap.add_argument("--chat-template", default=None, help="a Jinja template or a file holding one")
    ap.add_argument("--shutdown-timeout", type=float, default=10.0,
                    help="seconds open connections get to close after SIGTERM")
    ap.add_argument("--uvicorn-log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug", "trace"],
                    help="uvicorn's log level (a line per request at info)")
    ap.add_argument("--kv-transfer-config", default=None, help="JSON of vLLM's KVTransferConfig, "
                    'e.g. \'{"kv_connector": "SharedMemoryConnector", "kv_role": "kv_producer"}\'')
    ap.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                    help="what the KV cache stores: the model's dtype (auto) or e4m3 (fp8)")
    ap.add_argument("--speculative-config", default=None, help="JSON of vLLM's SpeculativeConfig, "
                    'e.g. \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'')
    ap.add_argument("--cpu-omp-threads-bind", default=None, help="CPUs to run on, e.g. 0 or 0-3 or "
                    "0,2: one torch thread each, pinned where the OS allows (default: all)")
    ap.add_argument("--disaggregated", action="store_true", help="start a prefill and a decode "
                    "instance of MODEL and serve the router in front of them; `serve --disaggregated "
                    "--help` lists its own flags")
    return ap


def build(args):
    """-> (FastAPI app, AsyncEngine) for parsed args, the engine loaded and its thread running."""
    bind_cpus(args.cpu_omp_threads_bind)
    config = EngineConfig(
        block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory=args.kv_cache_memory_bytes, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        speculative_config=args.speculative_config, quantization=args.quantization,
        quantization_group_size=args.quantization_group_size,
        quantization_lm_head=args.quantization_lm_head, kv_cache_dtype=args.kv_cache_dtype,
        record_trace=False)  # a server runs for days: no per-step trace
    dtype = None if args.dtype == "auto" else args.dtype

    def make_engine() -> LLMEngine:
        engine = LLMEngine(args.model, args.device, dtype, args.seed, config,
                           kv_transfer_config=args.kv_transfer_config)
        _warm_up(engine)
        return engine

    folder = args.model if args.model and os.path.isdir(args.model) else None
    if args.model and folder is None and is_fetchable(args.model):
        folder = resolve_model_path(args.model)  # downloaded or converted once, before the engine loads
    if args.model is None and os.path.isfile(os.path.join(DEMO_MODEL_DIR, "config.json")):
        folder = DEMO_MODEL_DIR  # what LLMEngine loads by default
    name = args.served_model_name or args.model or DEMO_MODEL_NAME
    metrics = ServerMetrics(name, config.num_speculative_tokens)
    async_engine = AsyncEngine(make_engine, args.max_num_queued_reqs, metrics)
    async_engine.start()  # loads the model on the engine thread, where every step will run
    serving = OpenAIServing(async_engine, name, folder or name,
                            load_chat_template(folder, args.chat_template))
    return build_app(serving, metrics, args.api_key, _lifespan(async_engine)), async_engine


def _warm_up(engine: LLMEngine) -> None:
    vocab = engine.model_config.vocab_size
    engine.add_request([min(10, vocab - 1)] * 4, SamplingParams(max_tokens=2, temperature=0.0,
                                                                 ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def _lifespan(async_engine: AsyncEngine):
    @asynccontextmanager
    async def lifespan(_app):
        yield
        async_engine.stop()
    return lifespan


def main(argv: list[str] | None = None) -> int:
    """`python -m nanoserve serve ...`"""
    import uvicorn

    argv = sys.argv[1:] if argv is None else list(argv)
    if "--disaggregated" in argv:
        from nanoserve.serve.disagg import main as disaggregated_main
        return disaggregated_main(argv)
    args = add_cli_args(cli.parser("nanoserve serve", __doc__)).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not is_loopback(args.host) and not args.api_key:
        log.warning("serving on %s without --api-key: anyone who can reach this address can use "
                    "the model. Pass --api-key KEY (clients send 'Authorization: Bearer KEY').",
                    args.host)
    app, async_engine = build(args)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # SIGTERM / Ctrl-C: end in-flight streams now
            async_engine.begin_shutdown()
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:  # the port is bound: say what is served where
                url = f"http://{args.host}:{args.port}"
                log.info("serving %s as model %r at %s (OpenAI API at %s/v1)",
                         args.model or default_model(), app.state.serving.model_name, url, url)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                                   timeout_graceful_shutdown=args.shutdown_timeout))
    try:
        server.run()
    finally:
        async_engine.stop()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
