"""The price of 8-bit weights in quality: logits against bf16, perplexity, generations side by side.

    python benchmarks/quant_quality.py [--windows 64] [--window 128] [--groups 64,32]
                                       [--ppl-tokens 4096]

- SmolLM2-135M (`smollm2-135m`): teacher-forced over `windows` spans of `window` tokens of real
  text (the demo model's held-out plays; 64 x 128 positions: a 95% interval narrow enough to tell
  96% from 97%, which a few hundred positions cannot), int8 and fp8 weight-only codes (bf16
  activations) with a scale per output channel and per group of each of `groups` input values
  against bf16, beside two yardsticks: bf16 on the reference kernels and fp32; the codes under fp32
  activations against fp32 (their own error, without bf16's). Per pair: argmax agreement (the token
  greedy decoding would pick next) with its 95% interval, the same over the positions where the
  baseline's top token leads the runner-up by more than MARGIN (a diagnostic of near-ties), the
  logits' RMS error relative to their RMS, the largest error, the mean KL divergence from the
  baseline, and each variant's perplexity on the windows' next tokens.
- The demo model: perplexity on nanoserve/assets/demo-model/heldout.txt (512-token windows) for
  fp32, bf16, int8 and fp8, and each one's change against its unquantized dtype.
- Three greedy generations of SmolLM2 (chat prompts), bf16 and the 8-bit variants side by side.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.nn.functional as F

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.measure.quality import prompt_logits
from nanoserve.model import DEMO_MODEL_DIR

METHODS = ("int8", "fp8")
# logits: several times the RMS change bf16's rounding makes to the top-1 - top-2 lead, so a lead
# above it is no near-tie
MARGIN = 0.5
CHATS = ["What is the capital of France?", "Name three colours of the rainbow.",
         "Explain in one sentence why the sky is blue."]


@dataclass(frozen=True)
class Variant:
    """Activations (and unquantized weights) in `dtype`; the linears' codes `method` with a scale
    per output channel (group None) or per `group` input values; `kernels` a NANOSERVE_KERNELS
    backend other than the default; `lm_head`: the lm_head as codes too."""

    dtype: str
    method: str | None = None
    group: int | None = None
    kernels: str | None = None
    lm_head: bool = False

    @property
    def name(self) -> str:
        act = "fp32" if self.dtype == "float32" else "bf16"
        if self.kernels:
            return f"{act}, {self.kernels} kernels"
        if self.method is None:
            return act
        scales = "per channel" if self.group is None else f"groups of {self.group}"
        return f"{self.method}, {scales}{', lm_head too' if self.lm_head else ''} ({act} act.)"


BF16, FP32 = Variant("bfloat16"), Variant("float32")


def pairs(groups: list[int]) -> list[tuple[Variant, Variant]]:
    """(variant, its baseline): against bf16, the goals' measure, with two yardsticks: the same bf16
    weights on the reference kernels (bf16's own rounding, placed otherwise: the agreement any
    change of the arithmetic gets) and fp32 (no rounding at all); against fp32, the codes' own error
    alone, per channel and at the smallest group. The lm_head as codes too: per channel and at
    the smallest group, against bf16."""
    out = [(Variant("bfloat16", kernels="reference"), BF16)]
    out += [(Variant("bfloat16", m, g), BF16) for m in METHODS for g in [None, *groups]]
    out += [(Variant("bfloat16", m, g, lm_head=True), BF16) for m in METHODS
            for g in dict.fromkeys([None, min(groups, default=None)])]
    out.append((FP32, BF16))
    fp32_groups = [None, min(groups)] if groups else [None]
    return out + [(Variant("float32", m, g), FP32) for m in METHODS for g in fp32_groups]


@dataclass
class Tally:
    """One variant against its baseline, summed over windows."""

    agree: int = 0
    positions: int = 0
    window_agreement: list[float] = field(default_factory=list)
    clear_agree: int = 0  # among positions the baseline leads by more than MARGIN
    clear: int = 0
    sq_error: float = 0.0
    sq_baseline: float = 0.0
    max_error: float = 0.0
    kl: float = 0.0

    def add(self, base: torch.Tensor, got: torch.Tensor) -> None:
        same = base.argmax(-1) == got.argmax(-1)
        top2 = base.topk(2, -1).values
        clear = top2[:, 0] - top2[:, 1] > MARGIN
        self.agree += int(same.sum())
        self.positions += len(same)
        self.window_agreement.append(same.float().mean().item())
        self.clear_agree += int((same & clear).sum())
        self.clear += int(clear.sum())
        self.sq_error += (got - base).square().sum().item()
        self.sq_baseline += base.square().sum().item()
        self.max_error = max(self.max_error, (got - base).abs().max().item())
        self.kl += F.kl_div(got.log_softmax(-1), base.log_softmax(-1), log_target=True,
                            reduction="sum").item()

    def interval(self) -> tuple[float, float]:
        """Wilson's 95% interval of the agreement, positions taken as independent."""
        n, p, z = self.positions, self.agree / self.positions, 1.96
        center = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return center - half, center + half

    def window_half_width(self) -> float:
        """The 95% half-width with windows as the independent unit (positions of one text window
        fail together, so the positions' interval may be too narrow)."""
        w = self.window_agreement
        mean = sum(w) / len(w)
        sd = math.sqrt(sum((a - mean) ** 2 for a in w) / max(len(w) - 1, 1))
        return 1.96 * sd / math.sqrt(len(w))


@torch.inference_mode()
def heldout(tokenizer) -> list[int]:
    with open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")) as f:
        return tokenizer.encode(f.read())


def load(model: str, variant: Variant, window: int) -> LLM:
    config = EngineConfig(num_kv_blocks=window // 16 + 2, max_num_batched_tokens=max(512, window),
                          quantization=variant.method, quantization_group_size=variant.group,
                          quantization_lm_head=variant.lm_head)
    with mock.patch.dict(os.environ, {"NANOSERVE_KERNELS": variant.kernels} if variant.kernels else {}):
        return LLM(model, device="cpu", dtype=variant.dtype, config=config)


def nll(logits: torch.Tensor, targets: list[int]) -> float:
    """Summed negative log-likelihood of each target under its row of logits."""
    return F.cross_entropy(logits, torch.tensor(targets), reduction="sum").item()


def logit_table(windows: int, window: int, groups: list[int], with_generations: bool) -> None:
    todo = pairs(groups)
    variants = list(dict.fromkeys([BF16, FP32] + [v for v, _ in todo]))
    llms = {v: load("smollm2-135m", v, window) for v in variants}
    tokens = heldout(llms[BF16].tokenizer)
    step = (len(tokens) - window) // windows
    spans = [tokens[i * step:i * step + window] for i in range(windows)]
    tallies = {pair: Tally() for pair in todo}
    nlls = dict.fromkeys(variants, 0.0)
    for span in spans:  # a window's logits of every variant at once: all windows' would not fit
        logits = {v: prompt_logits(llm, span) for v, llm in llms.items()}
        for v in variants:
            nlls[v] += nll(logits[v][:-1], span[1:])
        for (v, base), tally in tallies.items():
            tally.add(logits[base], logits[v])
    predicted = windows * (window - 1)
    ppl = {v: math.exp(s / predicted) for v, s in nlls.items()}
    print(f"\nsmollm2-135m, {windows} x {window} positions of heldout.txt ({windows * window}); "
          f"perplexity over their {predicted} next tokens: bf16 {ppl[BF16]:.3f}, fp32 {ppl[FP32]:.3f}")
    print(f"| weights (activations) | against | argmax agreement [95% CI] | agreement where the baseline's "
          f"top-1 leads by > {MARGIN} (positions) | RMS error / RMS logit | max abs error | mean KL (nats) | "
          f"perplexity (change) |\n|---|---|---|---|---|---|---|---|")
    for (v, base), t in tallies.items():
        lo, hi = t.interval()
        print(f"| {v.name} | {base.name} | {t.agree / t.positions:.1%} ({t.agree}/{t.positions}) "
              f"[{lo:.1%}, {hi:.1%}] | {t.clear_agree / t.clear:.1%} ({t.clear}) | "
              f"{math.sqrt(t.sq_error / t.sq_baseline):.4f} | {t.max_error:.3f} | "
              f"{t.kl / t.positions:.5f} | {ppl[v]:.3f} ({ppl[v] / ppl[base] - 1:+.2%}) |")
    print("\n95% half-widths with the window as the unit (a window's positions are not independent), "
          "points: " + ", ".join(f"{v.name} {100 * t.window_half_width():.1f}"
                                 for (v, _), t in tallies.items()), flush=True)
    if with_generations:
        generations({v: llm for v, llm in llms.items() if v.dtype == "bfloat16" and not v.kernels})


def generations(llms: dict[Variant, LLM]) -> None:
    from nanoserve.engine.chat_template import load_chat_template
    from nanoserve.model import fetch
    template = load_chat_template(fetch.fetch_named("smollm2-135m"))
    params = SamplingParams(max_tokens=40, temperature=0)
    print("\nGreedy generations, smollm2-135m (chat template), 40 tokens")
    for chat in CHATS:
        prompt = template.render([{"role": "user", "content": chat}])
        print(f"\n**{chat}**\n")
        for v, llm in llms.items():
            text = llm.generate(prompt, params)[0].text.replace("\n", " ")
            print(f"- {v.name}: {text}")


def perplexity_table(ppl_tokens: int) -> None:
    window = 512
    print(f"\nDemo model, perplexity on heldout.txt ({ppl_tokens} tokens in {window}-token windows)")
    print("| weights | activations | perplexity | change vs its dtype unquantized |\n|---|---|---|---|")
    result = {}
    for v in (FP32, BF16, *(Variant("bfloat16", m, lm_head=h) for m in METHODS for h in (False, True))):
        llm = load(DEMO_MODEL_DIR, v, window)
        tokens = heldout(llm.tokenizer)[:ppl_tokens + 1]
        total, n = 0.0, 0
        for start in range(0, len(tokens) - 1, window):
            span = tokens[start:start + window + 1]
            total += nll(prompt_logits(llm, span[:-1]), span[1:])
            n += len(span) - 1
        result[v] = math.exp(total / n)
        base = BF16 if v.method else v
        label = (v.method or v.name) + (", lm_head too" if v.lm_head else "")
        print(f"| {label} | {BF16.name if v.method else v.name} | {result[v]:.4f} | "
              f"{result[v] / result[base] - 1:+.2%} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--groups", default="64,32",
                    help="scale group sizes besides per channel ('' none); each must divide 576 and 1536")
    ap.add_argument("--ppl-tokens", type=int, default=4096)
    ap.add_argument("--sections", default="perplexity,logits,generations",
                    help="which of perplexity, logits, generations to run")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    sections = args.sections.split(",")
    if "perplexity" in sections:
        perplexity_table(args.ppl_tokens)
    if "logits" in sections:
        groups = [int(g) for g in args.groups.split(",") if g]
        logit_table(args.windows, args.window, groups, "generations" in sections)
    print(f"\n({time.perf_counter() - start:.0f} s, torch {torch.__version__})")


if __name__ == "__main__":
    main()
