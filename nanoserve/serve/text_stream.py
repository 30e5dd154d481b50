"""Token ids to streamed text: incremental detokenization and stop strings (vLLM's detokenizer).

Each engine step adds a token or a few; `TextStream.update` turns them into the text to send
now. Decoding only the tail keeps a step O(tokens added): the tail starts a few tokens back
(`prefix_offset`) so that a tokenizer that writes a token differently at the start of a text
(SentencePiece's leading space) still gives the right delta, and a delta ending in U+FFFD (half
of a multi-byte character) waits for the next token (vLLM's `detokenize_incrementally`,
vllm/v1/engine/detokenizer.py). At the end the whole output is decoded once more, so the deltas
add up exactly to `tokenizer.decode(token_ids)`: the text `LLM.generate` returns.

Stop strings end a request in the text, not in the engine: the first occurrence cuts the text
(vLLM's default `include_stop_str_in_output=False`), and the caller aborts the request. While
running, the last len(longest stop) - 1 characters are held back, since they may be the start
of a stop string (vLLM's stop buffer).

A model without a tokenizer writes its ids as text, " ".join(ids), like `LLM.decode`, so every
token still reaches the client as a chunk.
"""

from __future__ import annotations

from collections.abc import Callable


def ids_as_text(ids: list[int]) -> str:
    return " ".join(map(str, ids))


class TextStream:
    """The text of one request's output, as it grows.

    decode: token ids -> text (the tokenizer's decode, or `ids_as_text`); stop: stop strings.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str] = (),
                 include_stop_str_in_output: bool = False):
        self.decode = decode
        self.stop = list(stop)
        self.include_stop = include_stop_str_in_output
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # chars that may start a stop
        self.token_ids: list[int] = []
        self.text = ""  # decoded so far (cut at a stop string once one is found)
        self.sent = 0  # characters of text already returned
        self.prefix_offset = 0  # decode window: tokens [prefix_offset, read_offset) already read
        self.read_offset = 0
        self.stop_reason: str | None = None  # the stop string found, if any

    def update(self, new_token_ids: list[int], finished: bool) -> str:
        """Add the step's tokens; -> the text to send now. After a stop string is found
        (`stop_reason` set) the request is over and later tokens are ignored."""
        if self.stop_reason is not None:
            return ""
        self.token_ids.extend(new_token_ids)
        start = len(self.text)
        if finished:
            self.text = self.decode(self.token_ids)  # exact, whatever the window gave
            start = min(start, len(self.text))
        else:
            self._read_tail()
        if self.stop:
            self._find_stop(start)
        end = len(self.text) if finished or self.stop_reason else max(self.sent,
                                                                       len(self.text) - self.hold)
        delta, self.sent = self.text[self.sent:end], end
        return delta

    def _read_tail(self) -> None:
        ids = self.token_ids
        prefix = self.decode(ids[self.prefix_offset:self.read_offset])
        tail = self.decode(ids[self.prefix_offset:])
        if len(tail) > len(prefix) and not tail.endswith("\ufffd"):
            self.text += tail[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(ids)

    def _find_stop(self, new_from: int) -> None:
        """First stop string that ends in the new text; cut the text there."""
        best = None
        for s in self.stop:
            i = self.text.find(s, max(0, new_from - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            i, s = best
            self.text = self.text[:i + len(s)] if self.include_stop else self.text[:i]
            self.sent = min(self.sent, len(self.text))
            self.stop_reason = s
