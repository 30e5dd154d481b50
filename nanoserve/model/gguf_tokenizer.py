"""A GGUF file's tokenizer as a `tokenizers` Tokenizer (what tokenizer.json holds), and its config.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`), the
BPE merges, each token's type (3 = control, 4 = user-defined) and the special token ids as
metadata, and names the pre-tokenizer (`tokenizer.ggml.pre`), the regexes that split text before
the merges apply (llama.cpp's llama-vocab.cpp). This rebuilds byte-level BPE (`tokenizer.ggml.model
== "gpt2"`: GPT-2, SmolLM, Llama 3, Qwen) as HF transformers' GGUF conversion does
(transformers/integrations/gguf/gguf_tokenizer_mapping.py), except that the pre-tokenizer follows
llama.cpp's name, so "smollm" splits digits one by one as SmolLM2 was trained. Sentencepiece
vocabularies (`"llama"`) and pre-tokenizers not listed below are refused by name: a tokenizer
that splits text differently from the model's would be wrong without any error.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = ("default", "gpt2", "mpt", "olmo", "jais")  # llama.cpp: GPT-2's regex alone
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_LLAMA3 = ("llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe", "dbrx")
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters, in which byte-level vocabularies are spelled."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _pre_tokenizer(pre: str):
    if pre in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in _LLAMA3:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    known = sorted(_GPT2 + _DIGITS_THEN_GPT2 + _LLAMA3)
    raise ValueError(f"GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} is not supported; supported: {known}")


def build_tokenizer(meta: dict) -> Tokenizer:
    """meta: the GGUF's metadata (key -> value). -> the byte-level BPE tokenizer it describes."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer tokenizer.ggml.model={kind!r} is not supported; supported: "
                         "['gpt2'] (byte-level BPE)")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    alphabet = set(_bytes_to_unicode().values())
    spell = _bytes_to_unicode()
    # a token written outside the byte alphabet (some converters store raw text) is respelled
    vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B",
            special_tokens=[(tokens[bos], bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config(meta: dict) -> dict:
    """tokenizer_config.json: the special tokens by text, the chat template, whether BOS is added."""
    tokens = meta["tokenizer.ggml.tokens"]
    out = {"tokenizer_class": "PreTrainedTokenizerFast",
           "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
           "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
           "clean_up_tokenization_spaces": False}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and 0 <= i < len(tokens):
            out[name] = tokens[i]
    if "tokenizer.chat_template" in meta:
        out["chat_template"] = meta["tokenizer.chat_template"]
    return out
