"""Shared fixtures: tiny HF checkpoints (random weights saved with transformers) as oracles."""

import os
import shutil
import zlib

# Before anything imports triton: without a GPU its kernels only run in the interpreter.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("NANOSERVE_QUICK", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from nanoserve import ModelConfig  # noqa: E402
from nanoserve.engine import Executor, RequestFailed  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: more OpenMP threads than cores makes small ops many times slower
    torch.set_num_threads(1)

ARCHS = {
    "llama": dict(cls="LlamaForCausalLM", cfg="LlamaConfig", extra=dict(tie_word_embeddings=False)),
    "llama3-scaled": dict(cls="LlamaForCausalLM", cfg="LlamaConfig", extra=dict(
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen2": dict(cls="Qwen2ForCausalLM", cfg="Qwen2Config", extra=dict(tie_word_embeddings=True)),
    "qwen3": dict(cls="Qwen3ForCausalLM", cfg="Qwen3Config", extra=dict(head_dim=32,
                                                                        tie_word_embeddings=False)),
}


@pytest.fixture(scope="session")
def cpu_ops() -> bool:
    """The C++ CPU kernels built (or loaded from their cache folder) before the test starts, so that
    no time limit of a test (a server's start-up, a timed step) includes the one-off build; pytest
    workers wait for one build, not two. Tests that start servers or time the engine use it; the
    others build on first use, if they run the engine at all. -> whether the ops are available."""
    from nanoserve.kernels import cpu_build
    return cpu_build.available()


def pytest_addoption(parser):
    # here, at the tests root, so `pytest tests --impl=exercises` works as well as `pytest tests/exercises`
    parser.addoption("--impl", default=None, choices=("solutions", "exercises"),
                     help="package the graded exercise tests check (default: solutions)")
    parser.addoption("--regen-tables", action="store_true",
                     help="rewrite tests/course/data/lesson_tables.json from the current code")


def make_hf_model(arch: str, folder: str, seed: int = 0):
    import transformers
    spec = ARCHS[arch]
    cfg = getattr(transformers, spec["cfg"])(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=None, bos_token_id=None, **spec["extra"])
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(cfg).eval()
    with torch.no_grad():  # HF initialises biases and norms trivially; randomise them to test them
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """arch -> (HF model, checkpoint folder), built lazily once per session."""
    cache = {}

    def get(arch):
        if arch not in cache:
            folder = str(tmp_path_factory.mktemp(arch))
            cache[arch] = (make_hf_model(arch, folder), folder)
        return cache[arch]
    return get


class FakeExecutor(Executor):
    """A model-free executor: the real scheduler and KV manager run; the token sampled at
    position p of a request is a hash of (request id, p) (never EOS id 0), so a request's tokens
    do not depend on how it was scheduled. Keeps every SchedulerOutput it ran, and the ids it
    was told to forget.

    With block_size it also plays the KV cache: every computed position writes a fingerprint of
    the tokens up to it into its slot, then every position a sequence attends to must hold the
    fingerprint of its own prefix; a wrong read (a block served to another prefix, or never
    written) is recorded in `kv_errors`.

    Drafts (speculative decoding) are checked as a model would: draft j is accepted while it is
    the token of its position, and the token after the accepted run is returned with them. With
    `period`, the token of position p is that of p % period, so output repeats and prompt lookup
    guesses right.

    Failures to inject: fail[request_id] = "before" raises RequestFailed for that request before
    the step runs (nothing written), "sample" after it ran (the others' tokens come with it);
    fail_step = True makes the next step raise an error tied to nobody, after writing the KV of
    half its sequences."""

    def __init__(self, vocab_size: int = 2000, block_size: int | None = None,
                 period: int | None = None):
        self.model_config = ModelConfig(vocab_size=vocab_size, hidden_size=8, intermediate_size=8,
                                        num_hidden_layers=1, num_attention_heads=1,
                                        max_position_embeddings=4096, eos_token_id=0)
        self.steps, self.finished = [], []
        self.block_size, self.kv, self.kv_errors = block_size, {}, []
        self.fingerprints: dict[str, list[int]] = {}
        self.fail: dict[str, str] = {}
        self.fail_step = False
        self.period = period

    def token(self, request_id: str, position: int) -> int:
        if self.period:
            position %= self.period
        return 1 + zlib.crc32(f"{request_id}:{position}".encode()) % 99

    def verify(self, seq) -> int | list[int]:
        """The token after the sequence's known tokens, or its agreed drafts and the next one."""
        p = seq.start + len(seq.token_ids) - len(seq.spec_token_ids)  # the first sampled position
        if not seq.spec_token_ids:
            return self.token(seq.request_id, p)
        out = []
        for d in seq.spec_token_ids:
            if d != self.token(seq.request_id, p + len(out)):
                break
            out.append(d)
        return out + [self.token(seq.request_id, p + len(out))]

    def execute_model(self, out):
        self.steps.append(out)
        seqs = list(zip(out.seqs, out.requests))
        before = {s.request_id: "injected failure" for s, _ in seqs
                  if self.fail.get(s.request_id) == "before"}
        if before:
            for rid in before:
                del self.fail[rid]
            raise RequestFailed(before)
        if self.fail_step:
            self.fail_step = False
            self._run_kv(seqs[:len(seqs) // 2])
            raise RuntimeError("injected failure of the whole step")
        self._run_kv(seqs)
        sampled = {s.request_id: self.verify(s) for s, _ in seqs if s.sample}
        after = {rid for rid in sampled if self.fail.get(rid) == "sample"}
        if after:
            for rid in after:
                del self.fail[rid]
            raise RequestFailed(dict.fromkeys(after, "injected sampling failure"),
                                {r: t for r, t in sampled.items() if r not in after})
        return sampled

    def _run_kv(self, seqs) -> None:
        """Write the new positions' KV, then read every position each sequence attends to."""
        if self.block_size is None:
            return
        bs = self.block_size
        fps = {s.request_id: self._fingerprints(req, s.spec_token_ids) for s, req in seqs}
        for s, req in seqs:
            fp = fps[s.request_id]
            for p in range(s.start, s.start + len(s.token_ids)):
                self.kv[s.block_ids[p // bs], p % bs] = fp[p]
        for s, req in seqs:
            fp = fps[s.request_id]
            for p in range(s.start + len(s.token_ids)):
                if self.kv.get((s.block_ids[p // bs], p % bs)) != fp[p]:
                    self.kv_errors.append(f"request {s.request_id} read wrong KV at position {p}")
                    break

    def _fingerprints(self, req, drafts=()) -> list[int]:
        """fp[p]: a hash of the request's tokens 0..p (equal prefixes, equal fingerprints), the
        drafts it checks this step counted as tokens."""
        fp, tokens = self.fingerprints.setdefault(req.request_id, []), req.all_token_ids
        for p in range(len(fp), len(tokens)):
            fp.append(hash((fp[-1] if fp else 0, tokens[p])))
        if drafts:
            fp = list(fp)
            for d in drafts:
                fp.append(hash((fp[-1], d)))
        return fp

    def finish_requests(self, request_ids):
        self.finished.extend(request_ids)


def assert_no_leaks(engine):
    """Every KV block is back in the pool and the bookkeeping is consistent."""
    kv = engine.kv_manager
    kv.check_invariants()
    assert not kv.req_to_blocks, f"requests still hold blocks: {list(kv.req_to_blocks)}"
    assert kv.num_free_blocks == engine.num_kv_blocks
