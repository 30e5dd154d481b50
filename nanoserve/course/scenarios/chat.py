"""Real chats with the course's real model, SmolLM2-135M-Instruct (`LLM("smollm2-135m")`).

Lesson 06 sends chat requests that share one system prompt, rendered by the model's own chat
template, so the prefix the cache shares is a real one; lesson 07 asks the model real questions
and replays the prompt and answer lengths it saw on the timing model. Without network or a cached
copy the demo model stands in (with the error that says how to fetch the real one), so a lesson
still runs offline.

Deliberately left out: timing on the real model (the random-weight presets keep the shapes the
timing lessons need) and sampling (greedy answers, so a run repeats).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nanoserve.config import EngineConfig
from nanoserve.course.scenarios.prefix import shared_prompt_demo
from nanoserve.course.setup import Table, engine_of, quick_mode
from nanoserve.engine import LLM
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
from nanoserve.serve.chat_template import ChatTemplate, load_chat_template

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


def load_chat_model(**config) -> ChatModel:
    """The real model (fetched and converted once), or the demo model when it cannot be had.
    config: EngineConfig fields (default: a small engine, 4 sequences of up to 1024 tokens)."""
    config = {"max_model_len": 1024, "max_num_seqs": 4, **config}
    if quick_mode():
        import torch
        torch.set_num_threads(1)  # as setup.load_llm: CI runs two notebooks on two cores
    try:
        folder = resolve_model_path(REAL_MODEL)
    except (OSError, ValueError) as e:
        print(f"{REAL_MODEL} is not available here, so the demo model stands in: {e}")
        llm = LLM(None, config=EngineConfig(**config))
        return ChatModel(llm, load_chat_template(DEMO_MODEL_DIR, demo=True), "demo-model")
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
