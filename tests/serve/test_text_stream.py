"""Streamed text: the deltas add up to the tokenizer's decode of all tokens (what LLM.generate
returns), a multi-byte character is never split, and a stop string cuts the text wherever the
token boundaries fall."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.engine.tokenizer import load_tokenizer
from nanoserve.model import DEMO_MODEL_DIR
from nanoserve.serve.text_stream import TextStream, ids_as_text

TOK = load_tokenizer(DEMO_MODEL_DIR)


def stream(ids, chunks, stop=(), include=False):
    ts, out, bounds = TextStream(TOK.decode, list(stop), include), [], [0, *chunks, len(ids)]
    for a, b in zip(bounds, bounds[1:]):
        out.append(ts.update(ids[a:b], finished=b == len(ids)))
        if ts.stop_reason is not None:
            break
    return "".join(out), ts


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4095), min_size=1, max_size=40), st.data())
def test_deltas_add_up_to_the_whole_decode(ids, data):
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids)))))
    text, _ = stream(ids, [c for c in cuts if 0 < c < len(ids)])
    assert text == TOK.decode(ids)


def test_a_multibyte_character_is_never_sent_in_halves():
    ids = TOK.encode("Ünïcödé — “quoted” ✓ done")
    ts = TextStream(TOK.decode)
    pieces = [ts.update([t], finished=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(pieces) == TOK.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries(include):
    text = "My lord, the king is come. Welcome, good friends."
    ids = TOK.encode(text)
    for stop in ["king is", "e. W", "friends."]:
        for step in (1, 2, 5):
            got, ts = stream(ids, list(range(step, len(ids), step)), [stop, "never there"], include)
            cut = text.index(stop) + (len(stop) if include else 0)
            assert got == text[:cut] and ts.stop_reason == stop


def test_held_back_text_is_sent_at_the_end():
    ids = TOK.encode("To be, or not to be")
    ts = TextStream(TOK.decode, ["zzzzzz"])  # may start anywhere: hold 5 characters back
    sent = [ts.update([t], finished=False) for t in ids]
    assert "".join(sent) == TOK.decode(ids)[:-5]
    assert "".join(sent) + ts.update([], finished=True) == TOK.decode(ids)


def test_without_a_tokenizer_ids_are_the_text():
    ts = TextStream(ids_as_text)
    assert ts.update([5], False) + ts.update([6, 7], False) + ts.update([8], True) == "5 6 7 8"
