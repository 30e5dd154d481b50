"""Real chats with the course's real model, SmolLM2-135M-Instruct (`LLM("smollm2-135m")`).

Lesson 06 sends chat requests that share one system prompt, rendered by the model's own chat
template, so the prefix the cache shares is a real one; lesson 07 asks the model real questions
and replays the prompt and answer lengths it saw on the timing model; lesson 10 chats with it
over HTTP, through a server of its own (`real_model_server`) and a streamed
/v1/chat/completions (`chat_over_http`), timed on the client's clock. Without network or a cached
copy the demo model stands in (with the error that says how to fetch the real one), so a lesson
still runs offline.

Deliberately left out: timing on the real model (the random-weight presets keep the shapes the
timing lessons need) and sampling (greedy answers, so a run repeats).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.config import EngineConfig
from nanoserve.course.scenarios.prefix import shared_prompt_demo
from nanoserve.course.setup import Table, engine_of, quick_mode
from nanoserve.engine import LLM
from nanoserve.engine.chat_template import ChatTemplate, load_chat_template
from nanoserve.measure.workload import (
    Workload,
    WorkloadRequest,
    greedy_params,
    poisson_arrivals,
    random_tokens,
)
from nanoserve.model import DEMO_MODEL_DIR
from nanoserve.model.loader import resolve_model_path
from nanoserve.sampling_params import SamplingParams
from nanoserve.serve.launch import ServerProcess

REAL_MODEL = "smollm2-135m"
SYSTEM_PROMPT = (
    "You are the teaching assistant of a hands-on workshop on serving large language models. "
    "Answer in plain English, in one or two short sentences, for a reader who knows Python but "
    "not machine learning. When a question is about speed, say what would be measured and on "
    "which device. If you do not know the answer, say so instead of guessing.")
QUESTIONS = [
    "What is the capital of France?",
    "What does a GPU do that a CPU does not?",
    "Why do people cache things in computer programs?",
    "Explain in one sentence what a web server does.",
    "Name three colours of the rainbow.",
    "What is the difference between latency and throughput?",
    "Give me one tip for writing readable Python code.",
    "How many minutes are there in a day?",
    "What is a queue, in everyday life?",
    "Why is the sky blue?",
    "What is a good name for a pet goldfish?",
    "Summarise what a recipe is, in one sentence.",
]


@dataclass
class ChatModel:
    """An engine over a chat model and its chat template (the model's own, from its folder)."""

    llm: LLM
    template: ChatTemplate
    name: str

    def prompt(self, question: str, system: str | None = SYSTEM_PROMPT) -> str:
        """The text the model sees for one user question after `system` (None: the template's default)."""
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": question}]
        return self.template.render(messages, add_generation_prompt=True)


def real_model_folder() -> str | None:
    """The real model's converted folder, fetched and converted once (what `python -m nanoserve
    fetch smollm2-135m` does), or None with a line saying why when it cannot be had."""
    try:
        return resolve_model_path(REAL_MODEL)
    except (OSError, ValueError) as e:
        print(f"{REAL_MODEL} is not available here, so the demo model stands in: {e}")
        return None


def load_chat_model(**config) -> ChatModel:
    """The real model (fetched and converted once), or the demo model when it cannot be had.
    config: EngineConfig fields (default: a small engine, 4 sequences of up to 1024 tokens)."""
    config = {"max_model_len": 1024, "max_num_seqs": 4, **config}
    if quick_mode():
        import torch
        torch.set_num_threads(1)  # as setup.load_llm: CI runs two notebooks on two cores
    folder = real_model_folder()
    if folder is None:
        llm = LLM(None, config=EngineConfig(**config))
        return ChatModel(llm, load_chat_template(DEMO_MODEL_DIR), "demo-model")
    return ChatModel(LLM(REAL_MODEL, config=EngineConfig(**config)), load_chat_template(folder), REAL_MODEL)


def shared_system_prompt_demo(chat: ChatModel, questions: Sequence[str], system: str = SYSTEM_PROMPT,
                              max_tokens: int = 24) -> Table:
    """Chat requests that share `system`, one after another (shared_prompt_demo's table): the
    rendered text before the first question (the system turn, the user turn's opening) is the
    shared opening; each question and what the template adds after it, a request's own text."""
    prompts = [chat.prompt(q, system) for q in questions]
    shared = prompts[0][:prompts[0].index(questions[0])]
    if not all(p.startswith(shared) for p in prompts):
        raise ValueError("the chat template renders the system turn differently for these questions")
    return shared_prompt_demo(chat.llm, shared, [p[len(shared):] for p in prompts], max_tokens)


def real_chat_lengths(chat: ChatModel, questions: Sequence[str] = QUESTIONS, system: str = SYSTEM_PROMPT,
                      max_tokens: int = 96) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of each question as the model answers it (greedy, to its
    end of turn or max_tokens)."""
    outs = chat.llm.generate([chat.prompt(q, system) for q in questions],
                             SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [(o.num_prompt_tokens, o.num_output_tokens) for o in outs]


def lengths_table(lengths: Sequence[tuple[int, int]]) -> Table:
    ins, outs = np.array([i for i, _ in lengths]), np.array([o for _, o in lengths])
    rows = [{"": name, "median": float(np.median(x)), "min": int(x.min()), "max": int(x.max())}
            for name, x in (("prompt tokens", ins), ("answer tokens", outs))]
    return Table(rows, f"{len(lengths)} real chats: their lengths", ".0f")


def replay_maker(engine_or_llm, lengths: Sequence[tuple[int, int]], num_requests: int, seed: int = 3):
    """make_workload(rate) for sweeps and dashboards: `num_requests` requests with the real chats'
    (prompt, answer) lengths in turn, random token ids (timing needs lengths, not text)."""
    vocab = engine_of(engine_or_llm).model_config.vocab_size

    def make(rate: float) -> Workload:
        rng = np.random.default_rng(seed)
        times = poisson_arrivals(num_requests, rate, rng)
        reqs = [WorkloadRequest(random_tokens(lengths[i % len(lengths)][0], rng, vocab),
                                greedy_params(lengths[i % len(lengths)][1]), float(t))
                for i, t in enumerate(times)]
        return Workload("real chat lengths", f"{num_requests} requests with {len(lengths)} real chats' "
                                             f"lengths, Poisson at {rate:.2f} req/s", reqs)
    return make


def real_model_server(max_model_len: int = 1024, startup_timeout: float = 180.0) -> ServerProcess:
    """`nanoserve serve smollm2-135m --max-model-len N` (the demo model when the real one cannot be
    had), not started yet: use it in a `with` block, which starts it and stops it at the end."""
    model = REAL_MODEL if real_model_folder() is not None else None
    return ServerProcess(model, "--max-model-len", str(max_model_len), "--max-num-seqs", "4",
                         startup_timeout=startup_timeout)


@dataclass
class ChatReply:
    """One streamed chat answer as the client saw it."""

    question: str
    text: str
    sent: float  # perf_counter at the request's send
    chunk_times: list[float] = field(default_factory=list)  # perf_counter at each content chunk
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def itl(self) -> float:
        """Mean gap between chunks (s): the TPOT the client saw."""
        t = self.chunk_times
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")

    def row(self) -> dict:
        return {"question": textwrap.shorten(self.question, 40, placeholder=" …"),
                "prompt tokens": self.prompt_tokens,
                "answer tokens": self.completion_tokens, "finish": self.finish_reason,
                "TTFT (ms)": 1e3 * self.ttft, "ITL mean (ms)": 1e3 * self.itl}


def _print_now(piece: str) -> None:
    print(piece, end="", flush=True)


def chat_over_http(server: ServerProcess, question: str, max_tokens: int, system: str = SYSTEM_PROMPT,
                   on_text: Callable[[str], None] | None = _print_now, timeout: float = 60.0) -> ChatReply:
    """POST /v1/chat/completions with stream=True (greedy, at most max_tokens): the server renders
    the messages with the model's chat template. Each content chunk goes to `on_text` as it arrives
    (printed, by default) and is stamped on the client's clock. timeout: seconds any one connect or
    read may wait."""
    import httpx
    name = httpx.get(server.base_url + "/v1/models", timeout=timeout).json()["data"][0]["id"]
    body = {"model": name, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    reply, pieces = ChatReply(question, "", time.perf_counter()), []
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code} from {server.base_url}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                reply.prompt_tokens = chunk["usage"].get("prompt_tokens")
                reply.completion_tokens = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    reply.chunk_times.append(time.perf_counter())
                    pieces.append(piece)
                    if on_text is not None:
                        on_text(piece)
                reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
    if on_text is _print_now:
        sys.stdout.write("\n")
    reply.text = "".join(pieces)
    if not reply.chunk_times:
        raise RuntimeError(f"the server at {server.base_url} streamed no text for {question!r}")
    return reply


def replies_table(replies: Sequence[ChatReply]) -> Table:
    return Table([r.row() for r in replies], "Chats over HTTP, timed on the client's clock (measured)", ".1f")
