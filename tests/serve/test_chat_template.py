"""Chat templates as HF and vLLM render them: the checkpoint's Jinja template from
tokenizer_config.json (or --chat-template), its errors as ValueErrors, the demo model's play format."""

from __future__ import annotations

import json

import pytest

from nanoserve.serve.chat_template import load_chat_template

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


def test_demo_template_writes_speeches():
    t = load_chat_template(None, demo=True)
    got = t.render([{"role": "user", "content": "Good morrow."},
                    {"role": "assistant", "content": "And to you."},
                    {"role": "user", "name": "Lady Macbeth", "content": "Out, spot!"}])
    assert got == ("USER.\nGood morrow.\n\nASSISTANT.\nAnd to you.\n\nLADY MACBETH.\nOut, spot!\n\n"
                   "ASSISTANT.\n")
