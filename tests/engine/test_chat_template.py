"""Chat templates as HF and vLLM render them: the checkpoint's Jinja template from
tokenizer_config.json (or --chat-template), its errors as ValueErrors, the demo model's play format."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from nanoserve.engine.chat_template import load_chat_template

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
STRICT = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}"
          "{% endif %}{{ bos_token }}{{ messages | tojson }}")


def test_checkpoint_template_from_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    t = load_chat_template(str(tmp_path))
    msgs = [{"role": "user", "content": "hi"}]
    assert t.render(msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    assert t.bos_token == "<s>" and t.eos_token == "</s>"


def test_override_and_template_errors(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(STRICT)
    t = load_chat_template(None, str(path))
    assert t.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]'
    with pytest.raises(ValueError, match="first message must be user"):
        t.render([{"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="could not render"):
        load_chat_template(None, "{{ messages[5]['content'].upper() }}").render([])


def test_no_template_means_no_chat(tmp_path):
    assert load_chat_template(str(tmp_path)) is None
    assert load_chat_template(None) is None


def test_demo_template_writes_speeches(tmp_path):
    """The demo model's folder, which has no template of its own, gets DEMO_TEMPLATE (after its
    BOS token); a copy of its files elsewhere is another checkpoint and gets none."""
    from nanoserve.model import DEMO_MODEL_DIR
    t = load_chat_template(DEMO_MODEL_DIR)
    got = t.render([{"role": "user", "content": "Good morrow."},
                    {"role": "assistant", "content": "And to you."},
                    {"role": "user", "name": "Lady Macbeth", "content": "Out, spot!"}])
    assert got == ("<|endoftext|>USER.\nGood morrow.\n\nASSISTANT.\nAnd to you.\n\n"
                   "LADY MACBETH.\nOut, spot!\n\nASSISTANT.\n")
    for name in os.listdir(DEMO_MODEL_DIR):
        if name.endswith(".json"):
            shutil.copy(os.path.join(DEMO_MODEL_DIR, name), tmp_path)
    assert load_chat_template(str(tmp_path)) is None


def test_llm_chat_renders_the_demo_template_and_generates():
    """LLM.chat on the demo model: its play-format template, tokenized without special tokens
    (the template writes BOS), then generate; a list of conversations gives one output each; a
    model with no template and no tokenizer is refused by name."""
    from nanoserve import LLM, SamplingParams
    from nanoserve.errors import InvalidRequest
    from nanoserve.model import DEMO_MODEL_DIR
    llm = LLM()
    template = load_chat_template(DEMO_MODEL_DIR)
    chats = [[{"role": "user", "content": "Who art thou?"}],
             [{"role": "system", "content": "A street."},
              {"role": "user", "name": "Romeo", "content": "Peace!"}]]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    outs = llm.chat(chats, params)
    for c, o in zip(chats, outs):
        assert o.prompt_token_ids == llm.tokenizer.encode(template.render(c), add_special_tokens=False)
        assert o.token_ids == llm.generate([o.prompt_token_ids], params)[0].token_ids
    assert "ROMEO.\nPeace!" in llm.tokenizer.decode(outs[1].prompt_token_ids)
    assert len(llm.chat(chats[0], params)) == 1
    assert list(llm._chat_templates) == [None]  # the template was read once, for three calls
    with pytest.raises(InvalidRequest, match="chat_template"):
        LLM("preset:tiny").chat(chats[0], params)
