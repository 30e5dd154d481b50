"""The tokenizer of a checkpoint: a thin wrapper over HF `tokenizers`' tokenizer.json."""

from __future__ import annotations

import os


class Tokenizer:
    """A thin wrapper over a `tokenizers` tokenizer.json (what HF fast tokenizers save)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as HFTokenizer
        self.tok = HFTokenizer.from_file(path)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """add_special_tokens=False for text that writes its own (a rendered chat template)."""
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(folder: str) -> Tokenizer | None:
    path = os.path.join(folder, "tokenizer.json")
    return Tokenizer(path) if os.path.isfile(path) else None
