"""The price of 8-bit weights in quality: logits against bf16, perplexity, generations side by side.

    python benchmarks/quant_quality.py [--windows 3] [--window 128] [--ppl-tokens 4096]

- SmolLM2-135M (`smollm2-135m`): teacher-forced over `windows` spans of `window` tokens of real
  text (the demo model's held-out plays), int8 and fp8 weight-only codes (bf16 activations) and
  fp32 against bf16, and the codes under fp32 activations against fp32 (their own error, without
  bf16's): argmax agreement (the token greedy decoding would pick next), the logits' RMS error
  relative to their RMS, the largest error, and the mean KL divergence from the baseline.
- The demo model: perplexity on nanoserve/assets/demo-model/heldout.txt (512-token windows) for
  fp32, bf16, int8 and fp8, and each one's change against its unquantized dtype.
- Three greedy generations of SmolLM2 (chat prompts), bf16 / int8 / fp8 side by side.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.measure.quality import prompt_logits
from nanoserve.model import DEMO_MODEL_DIR

VARIANTS = {"bf16": ("bfloat16", None), "int8": ("bfloat16", "int8"), "fp8": ("bfloat16", "fp8"),
            "fp32": ("float32", None), "int8 (fp32 act.)": ("float32", "int8"),
            "fp8 (fp32 act.)": ("float32", "fp8")}
# (variant, its baseline): against bf16, the goals' measure; against fp32, the codes' own error alone
PAIRS = [("int8", "bf16"), ("fp8", "bf16"), ("fp32", "bf16"), ("int8 (fp32 act.)", "fp32"),
         ("fp8 (fp32 act.)", "fp32")]
CHATS = ["What is the capital of France?", "Name three colours of the rainbow.",
         "Explain in one sentence why the sky is blue."]


@torch.inference_mode()
def heldout(tokenizer) -> list[int]:
    with open(os.path.join(DEMO_MODEL_DIR, "heldout.txt")) as f:
        return tokenizer.encode(f.read())


def load(model: str, name: str, window: int) -> LLM:
    dtype, q = VARIANTS[name]
    config = EngineConfig(num_kv_blocks=window // 16 + 2, max_num_batched_tokens=max(512, window))
    return LLM(model, device="cpu", dtype=dtype, quantization=q, config=config)


def logit_table(windows: int, window: int, with_generations: bool) -> None:
    llms = {name: load("smollm2-135m", name, window) for name in VARIANTS}
    tokens = heldout(llms["bf16"].tokenizer)
    step = (len(tokens) - window) // windows
    spans = [tokens[i * step:i * step + window] for i in range(windows)]
    logits = {name: torch.cat([prompt_logits(llm, s) for s in spans]) for name, llm in llms.items()}
    print(f"\nsmollm2-135m, {windows} x {window} positions of heldout.txt")
    print("| weights (activations) | against | argmax agreement | RMS error / RMS logit | max abs error | "
          "mean KL (nats) |\n|---|---|---|---|---|---|")
    for name, baseline in PAIRS:
        b, g = logits[baseline], logits[name]
        agree = (b.argmax(-1) == g.argmax(-1)).float().mean().item()
        rms = ((g - b).square().mean().sqrt() / b.square().mean().sqrt()).item()
        kl = torch.nn.functional.kl_div(g.log_softmax(-1), b.log_softmax(-1), log_target=True,
                                        reduction="batchmean").item()
        label = name if "act." in name else f"{name} ({'fp32' if name == 'fp32' else 'bf16'} act.)"
        print(f"| {label} | {baseline} | {agree:.1%} ({int(round(agree * len(b)))}/{len(b)}) | {rms:.4f} | "
              f"{(g - b).abs().max().item():.3f} | {kl:.5f} |", flush=True)
    if with_generations:
        generations(llms)


def generations(llms) -> None:
    from nanoserve.engine.chat_template import load_chat_template
    from nanoserve.model import fetch
    template = load_chat_template(fetch.fetch_named("smollm2-135m"))
    params = SamplingParams(max_tokens=40, temperature=0)
    print("\nGreedy generations, smollm2-135m (chat template), 40 tokens")
    for chat in CHATS:
        prompt = template.render([{"role": "user", "content": chat}])
        print(f"\n**{chat}**\n")
        for name in ("bf16", "int8", "fp8"):
            text = llms[name].generate(prompt, params)[0].text.replace("\n", " ")
            print(f"- {name}: {text}")


def perplexity_table(ppl_tokens: int) -> None:
    window = 512
    print(f"\nDemo model, perplexity on heldout.txt ({ppl_tokens} tokens in {window}-token windows)")
    print("| weights | activations | perplexity | change vs its dtype unquantized |\n|---|---|---|---|")
    result = {}
    for name in ("fp32", "bf16", "int8", "fp8"):
        llm = load(DEMO_MODEL_DIR, name, window)
        tokens = heldout(llm.tokenizer)[:ppl_tokens + 1]
        nll, n = 0.0, 0
        for start in range(0, len(tokens) - 1, window):
            span = tokens[start:start + window + 1]
            logits = prompt_logits(llm, span[:-1])
            nll += torch.nn.functional.cross_entropy(logits, torch.tensor(span[1:]), reduction="sum").item()
            n += len(span) - 1
        result[name] = math.exp(nll / n)
        base = result["bf16"] if name in ("int8", "fp8") else result[name]
        act = "fp32" if name == "fp32" else "bf16"
        print(f"| {name} | {act} | {result[name]:.4f} | {result[name] / base - 1:+.2%} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--ppl-tokens", type=int, default=4096)
    ap.add_argument("--sections", default="perplexity,logits,generations",
                    help="which of perplexity, logits, generations to run")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    sections = args.sections.split(",")
    if "perplexity" in sections:
        perplexity_table(args.ppl_tokens)
    if "logits" in sections:
        logit_table(args.windows, args.window, "generations" in sections)
    print(f"\n({time.perf_counter() - start:.0f} s, torch {torch.__version__})")


if __name__ == "__main__":
    main()
