"""Shared pieces of the graded tests: hypothesis settings, driving the real engine, mutants made
from a solution, and spotting an exercise that imports the answers (scheduler_scenarios.py drives a
scheduler on its own).

The engine (preset:tiny, fp32, CPU) runs on a fake clock (one tick per call), so arrival times
are in ticks and every run is deterministic. Checks read only public behaviour: outputs,
`engine.trace` (StepRecords) and the KV manager's block accounting.
"""

from __future__ import annotations

import ast
import functools
import random
import signal
import threading
import types
from contextlib import contextmanager
from itertools import count
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings

from nanoserve import EngineConfig, LLMEngine, SamplingParams

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
MODEL = "preset:tiny"  # vocab 4096, 4 layers, hidden 128, 4 query heads over 2 kv heads

# nanoserve's own kernels, the answer key of exercises 2, 3 and 8 (get_ops and kernel_ops hand
# them out); an exercise module that imports them scores 0
ANSWER_KEY = ("nanoserve.kernels.reference", "nanoserve.kernels.triton_", "nanoserve.kernels.get_ops",
              "nanoserve.kernels.kernel_ops")


def answer_key_imports(source: str) -> list[str]:
    """'line N: <code>' for each place the module reaches ANSWER_KEY, whatever the import's form
    (`from nanoserve.kernels import reference`, `import nanoserve.kernels.reference as r`,
    `from nanoserve.kernels.reference import gather_kv`, `kernels.reference.x` after
    `from nanoserve import kernels`); importlib is not looked at."""
    def banned(path: str) -> bool:
        return any(path == k or path.startswith(k if k.endswith("_") else k + ".") for k in ANSWER_KEY)

    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the dotted path it stands for
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if banned(a.name):
                    lines.add(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if banned(f"{node.module}.{a.name}"):
                    lines.add(node.lineno)
    for node in ast.walk(tree):  # attribute chains on an alias: kernels.reference.gather_kv
        parts, base = [], node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        if parts and isinstance(base, ast.Name) and base.id in aliases \
                and banned(".".join([aliases[base.id], *reversed(parts)])):
            lines.add(node.lineno)
    text = source.splitlines()
    return [f"line {n}: {text[n - 1].strip()}" for n in sorted(lines)]


def graded(max_examples: int):
    """Hypothesis settings of a graded test: reproducible examples, one failure reported (its
    message is what `nanoserve grade` prints), shrunk but not "explained" (slow)."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    report_multiple_bugs=False, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow])


def solution_with(name: str, *edits: tuple[str, str]) -> types.ModuleType:
    """solutions/<name>.py with each (old, new) text edit made, as a new module: a mutant that
    differs from the answer in exactly those lines (an edit that no longer matches fails loudly)."""
    source = (SOLUTIONS / f"{name}.py").read_text()
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"mutant edit {old!r} matches solutions/{name}.py {source.count(old)} times, "
                             f"not once")
        source = source.replace(old, new)
    module = types.ModuleType(f"mutant_of_{name}")
    module.__package__ = "solutions"  # its relative imports (ex05's .ex04_scheduler) still resolve
    exec(compile(source, f"<mutant of solutions/{name}.py>", "exec"), module.__dict__)
    return module


class TickClock:
    """A clock that advances by 1.0 each time it is read."""

    def __init__(self):
        self._ticks = count()

    def __call__(self) -> float:
        return float(next(self._ticks))


@contextmanager
def time_limit(seconds: float, what: str):
    """Raise TimeoutError if the block runs longer than `seconds` (main thread, POSIX only)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{what} took more than {seconds:g} s: an endless loop?")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def make_engine(scheduler_cls=None, device: str = "cpu", model=MODEL, **config) -> LLMEngine:
    cfg = dict(block_size=8, num_kv_blocks=64, max_num_seqs=4, max_num_batched_tokens=48,
               enable_chunked_prefill=False, enable_prefix_caching=True,
               enforce_eager=True)  # no CUDA graphs: kernels swapped by use_kernels take effect
    cfg.update(config)
    return LLMEngine(model, device=device, dtype="float32", seed=0, config=EngineConfig(**cfg),
                     scheduler_cls=scheduler_cls, clock=TickClock())


def workload(seed: int, num_requests: int, prompt_lens: tuple[int, int], max_tokens: tuple[int, int],
             arrival_gap: int = 3, shared_prefix: int = 16) -> tuple:
    """Requests as (prompt, max_tokens, arrival tick); every third shares a common prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, 4096) for _ in range(shared_prefix)]
    reqs, t = [], 0
    for i in range(num_requests):
        n = rng.randint(*prompt_lens)
        prompt = [rng.randrange(1, 4096) for _ in range(n)]
        if i % 3 == 1 and n > shared_prefix:
            prompt[:shared_prefix] = prefix
        reqs.append((tuple(prompt), rng.randint(*max_tokens), t))
        t += rng.randint(0, arrival_gap)
    return tuple(reqs)


def drive(engine: LLMEngine, requests, max_steps: int = 3000, seconds: float = 120):
    """Add the requests, step until all finish. -> final RequestOutputs in request order."""
    ids = [engine.add_request(list(p), SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True),
                              arrival_time=float(a)) for p, m, a in requests]
    final = {}
    with time_limit(seconds, "the engine run"):
        for _ in range(max_steps):
            if not engine.has_unfinished():
                break
            for o in engine.step():
                if o.finished:
                    final[o.request_id] = o
    missing = [i for i in ids if i not in final]
    assert not missing, (f"requests {missing} never finished within {max_steps} steps: the scheduler "
                         f"stopped scheduling them")
    failed = [final[i] for i in ids if final[i].finish_reason == "error"]
    assert not failed, f"running request {failed[0].request_id} failed: {failed[0].error}"
    return [final[i] for i in ids]


@functools.lru_cache(maxsize=None)
def reference_token_ids(requests) -> tuple:
    """Greedy output ids of nanoserve's own scheduler (they depend on the prompt alone)."""
    engine = make_engine(max_num_batched_tokens=512, max_num_seqs=16, num_kv_blocks=256)
    return tuple(tuple(o.token_ids) for o in drive(engine, requests))


def assert_same_outputs(outs, requests) -> None:
    want = reference_token_ids(requests)
    for i, (o, w) in enumerate(zip(outs, want)):
        assert tuple(o.token_ids) == w, (
            f"request {i} (prompt of {len(requests[i][0])} tokens) generated {list(o.token_ids)[:8]}..., "
            f"expected {list(w)[:8]}...: greedy output must not depend on scheduling")


def assert_limits(engine: LLMEngine, rules: tuple[str, str] = ("", "")) -> None:
    """The token budget and the seats held every step; rules: prefixes naming the exercise's rules."""
    cfg = engine.config
    for r in engine.trace:
        assert r.num_tokens <= cfg.max_num_batched_tokens, (
            f"{rules[0]}step {r.step} scheduled {r.num_tokens} tokens, over max_num_batched_tokens="
            f"{cfg.max_num_batched_tokens}")
        assert len(r.entries) <= cfg.max_num_seqs, (
            f"{rules[1]}step {r.step} ran {len(r.entries)} requests, over max_num_seqs={cfg.max_num_seqs}")
        assert r.num_running <= cfg.max_num_seqs, (
            f"{rules[1]}after step {r.step}, {r.num_running} requests were running, over max_num_seqs="
            f"{cfg.max_num_seqs}")


def assert_no_leaks(engine: LLMEngine) -> None:
    kv = engine.kv_manager
    assert not kv.req_to_blocks, f"finished requests still hold KV blocks: {sorted(kv.req_to_blocks)}"
    assert kv.num_free_blocks == engine.num_kv_blocks, (
        f"{engine.num_kv_blocks - kv.num_free_blocks} KV blocks never came back to the pool")
    kv.check_invariants()


def appearances(engine: LLMEngine) -> dict[str, list[tuple[int, str, int]]]:
    """request id -> [(trace index, "prefill"|"decode", tokens), ...] in step order."""
    seen: dict[str, list] = {}
    for i, r in enumerate(engine.trace):
        for rid, kind, n, *_ in r.entries:
            seen.setdefault(rid, []).append((i, kind, n))
    return seen


def preempted_at(engine: LLMEngine) -> dict[str, list[int]]:
    """request id -> trace indices of the steps that preempted it."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(engine.trace):
        for rid in r.preempted:
            out.setdefault(rid, []).append(i)
    return out

