"""LLM: offline batch inference over an LLMEngine (`generate`, `stream`, `chat`), as vLLM's LLM class."""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator

from nanoserve.config import EngineConfig, ModelConfig
from nanoserve.engine.llm_engine import LLMEngine
from nanoserve.errors import InvalidRequest
from nanoserve.outputs import RequestOutput
from nanoserve.sampling_params import SamplingParams


class LLM:
    """Offline batch inference over an LLMEngine: `generate`, `stream` and `chat`."""

    def __init__(self, model: str | ModelConfig | None = None, device: str | None = None,
                 dtype: str | None = None, seed: int = 0, config: EngineConfig | None = None,
                 scheduler=None, **kwargs):
        self.engine = LLMEngine(model, device, dtype, seed, config, scheduler_cls=scheduler, **kwargs)
        self._chat_templates: dict = {}  # chat_template= -> its loaded template: read once

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def _add(self, prompts, params) -> list[str]:
        """Queue every prompt, or none: a bad one raises and the ones added before it go."""
        if isinstance(prompts, str) or (len(prompts) and _is_token_id(prompts[0])):
            prompts = [prompts]  # one prompt: text, or token ids
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise InvalidRequest("sampling_params", f"got {len(params_list)} SamplingParams for "
                                                    f"{len(prompts)} prompts")
        token_lists = [self.engine.encode(p) for p in prompts]
        ids: list[str] = []
        try:
            for t, p in zip(token_lists, params_list):
                ids.append(self.engine.add_request(t, p))
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return ids

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion. -> outputs in prompt order."""
        ids = self._add(prompts, params)
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="generate", unit="req")
        while len(final) < len(ids):
            steps = self.engine.num_steps
            outs = self.engine.step()
            if self.engine.num_steps == steps and not outs:
                self._check_progress()
            for o in outs:
                if o.finished:
                    final[o.request_id] = o
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids]

    def chat(self, messages, params: SamplingParams | list[SamplingParams] | None = None,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             use_tqdm: bool = False) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} dicts) or a list of
        them, each rendered with the model's chat template (or `chat_template`: a file or the
        template's text) and tokenized without special tokens (the template writes them), as the
        server's /v1/chat/completions does; then `generate`. -> one output per conversation."""
        from nanoserve.engine.chat_template import load_chat_template
        if chat_template not in self._chat_templates:
            self._chat_templates[chat_template] = load_chat_template(self.engine.model_path, chat_template)
        template, tokenizer = self._chat_templates[chat_template], self.tokenizer
        if template is None or tokenizer is None:
            raise InvalidRequest("chat_template", f"model {self.engine.model_name!r} has no chat "
                                                  "template and tokenizer; pass chat_template= or "
                                                  "use generate()")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [tokenizer.encode(template.render(list(c), add_generation_prompt), add_special_tokens=False)
                   for c in conversations]
        return self.generate(prompts, params, use_tqdm)

    def _check_progress(self) -> None:
        """A step that scheduled nothing while arrived requests wait can only repeat forever."""
        nxt = self.engine.next_arrival()
        if nxt is None or nxt <= self.engine.clock():
            stuck = self.engine.waiting_request_ids()
            raise RuntimeError(f"the scheduler scheduled nothing while requests {stuck[:5]} wait "
                               "(is a prompt larger than max_num_batched_tokens without chunking?)")

    def stream(self, prompts, params: SamplingParams | list[SamplingParams] | None = None
               ) -> Iterator[RequestOutput]:
        """Yield an output each time a request gets tokens; `new_token_ids` holds the delta and
        `metrics.token_times[-len(new_token_ids):]` their timestamps. Closing the iterator
        aborts what is left."""
        ids = set(self._add(prompts, params))
        try:
            while ids:
                steps = self.engine.num_steps
                outs = self.engine.step()
                if self.engine.num_steps == steps and not outs:
                    self._check_progress()
                for o in outs:
                    if o.request_id in ids:
                        if o.finished:
                            ids.discard(o.request_id)
                        yield o
        finally:
            for rid in ids:
                self.engine.abort(rid)

    def decode(self, token_ids: Iterable[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, token_ids))
        return self.tokenizer.decode(list(token_ids))


def engine_of(x) -> LLMEngine:
    """The LLMEngine of an LLM (its `engine`), or `x` itself: helpers that take either call this."""
    return getattr(x, "engine", x)


def _is_token_id(x) -> bool:
    """A number (Python, NumPy) or a 0-d tensor: what a single prompt's first element is."""
    return isinstance(x, numbers.Number) or getattr(x, "ndim", None) == 0
