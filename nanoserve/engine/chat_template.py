"""Chat messages to a prompt: the checkpoint's Jinja chat template, rendered as HF and vLLM do.

A checkpoint's template is `chat_template` in tokenizer_config.json (or a chat_template.jinja
file beside it); `--chat-template` overrides it. It is rendered in a sandboxed Jinja environment
with transformers' settings (trim_blocks, lstrip_blocks, `raise_exception`, `tojson`) and the
variables templates expect (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`), then
tokenized without adding special tokens (the template writes them), as vLLM does. `LLM.chat` and
the server's /v1/chat/completions both render with it.

The embedded demo model was trained on plays, not chats, so it gets DEMO_TEMPLATE: each message
is written the way the plays write a speech (`SPEAKER.` on its own line, then the words, then a
blank line; the speaker is the message's `name`, else USER or ASSISTANT) and a system message is
a stage direction in brackets; the generation prompt is `ASSISTANT.`.
"""

from __future__ import annotations

import json
import os

DEMO_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m.role in ('system', 'developer') %}[{{ m.content }}]\n\n"
    "{% else %}{{ (m.name or ('USER' if m.role == 'user' else 'ASSISTANT')) | upper }}.\n"
    "{{ m.content }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT.\n{% endif %}")


def _token_text(tok) -> str:
    """tokenizer_config.json writes special tokens as a string or {"content": ...}."""
    return tok.get("content", "") if isinstance(tok, dict) else (tok or "")


class ChatTemplate:
    """A compiled template and the special tokens it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        import jinja2.sandbox

        def raise_exception(message):
            raise jinja2.TemplateError(message)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(source)
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """messages: [{"role", "content" (a string), "name"?}]. A template error is a ValueError
        (the server's 400 naming `messages`)."""
        import jinja2
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template could not render these messages: {e}") from e


def load_chat_template(folder: str | None, override: str | None = None) -> ChatTemplate | None:
    """The template for a checkpoint folder: `override` (a file path or the template itself),
    else the checkpoint's, else DEMO_TEMPLATE for the demo model's folder, else None (no chat)."""
    from nanoserve.model import DEMO_MODEL_DIR
    demo = folder is not None and os.path.realpath(folder) == os.path.realpath(DEMO_MODEL_DIR)
    config = {}
    if folder and os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            config = json.load(f)
    source = override
    if source is not None and os.path.isfile(source):
        with open(source) as f:
            source = f.read()
    if source is None and folder and os.path.isfile(os.path.join(folder, "chat_template.jinja")):
        with open(os.path.join(folder, "chat_template.jinja")) as f:
            source = f.read()
    source = source or config.get("chat_template") or (DEMO_TEMPLATE if demo else None)
    if isinstance(source, list):  # several named templates: HF picks "default"
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    if not source:
        return None
    return ChatTemplate(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))
