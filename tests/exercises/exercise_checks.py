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
import re
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

# The answer key: the package's own implementation of what each exercise grades. A module that
# imports any of it (whatever the form of the import, re-exports included), or that calls its
# parent class's version of a graded method, scores 0 on that exercise.
KERNELS = ("nanoserve.kernels.reference", "nanoserve.kernels.triton_", "nanoserve.kernels.get_ops",
           "nanoserve.kernels.kernel_ops")  # get_ops and kernel_ops hand the kernels out
SCHEDULER = ("nanoserve.engine.scheduler.Scheduler",)  # the full policy; SchedulerBase is allowed
ANSWER_KEY = {
    "ex01": ("nanoserve.measure.roofline",),  # step_cost, decode_step_floor, critical_batch_size
    "ex02": KERNELS, "ex03": KERNELS, "ex08": KERNELS,
    "ex04": SCHEDULER, "ex05": SCHEDULER,
    "ex06": ("nanoserve.engine.kv_cache",),  # BlockPool, KVCacheManager, hash_block
    "ex07": ("nanoserve.measure.metrics",),
    "ex09": ("nanoserve.measure.cost",),
    "ex10": ("nanoserve.measure.metrics", "nanoserve.measure.http_result"),
    "ex11": ("nanoserve.engine.spec_decode", "nanoserve.engine.rejection_sampler"),
}
ANSWER_KEY_ALL = tuple(sorted({k for keys in ANSWER_KEY.values() for k in keys}))
# methods whose parent-class version is the answer: super().schedule(...), Scheduler.schedule(self, ...)
PARENT_METHODS = {"ex04": ("schedule", "schedule_running", "schedule_waiting"),
                  "ex05": ("schedule", "schedule_running", "schedule_waiting")}


def _resolved(path: str) -> list[str]:
    """`path` and, when it names something importable, the dotted name of what it is
    (`nanoserve.engine.KVCacheManager` -> `nanoserve.engine.kv_cache.KVCacheManager`)."""
    import importlib
    names, parts = [path], path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 (not a module: try the shorter prefix)
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        if isinstance(obj, types.ModuleType):
            names.append(obj.__name__)
        elif getattr(obj, "__module__", None) and getattr(obj, "__qualname__", None):
            names.append(f"{obj.__module__}.{obj.__qualname__}")
        break
    return names


def answer_key_imports(source: str, keys: tuple[str, ...] = ANSWER_KEY_ALL,
                       parent_methods: tuple[str, ...] = ()) -> list[str]:
    """'line N: <code>' for each place the module reaches the answer `keys`, whatever the import's
    form (`from nanoserve.kernels import reference`, `import nanoserve.kernels.reference as r`,
    `from nanoserve.kernels.reference import gather_kv`, `kernels.reference.x` after
    `from nanoserve import kernels`, a package's re-export), and each call of a parent's
    `parent_methods` (`super().schedule(now)`, `Scheduler.schedule(self, now)`); importlib is not
    looked at. Relative imports (exercise 5's `.ex04_scheduler`) are the student's own."""
    def banned(path: str) -> bool:
        return any(name == k or name.startswith(k if k.endswith("_") else k + ".")
                   for name in _resolved(path) for k in keys)

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
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in parent_methods:
            via_super = isinstance(node.func.value, ast.Call) and ast.unparse(node.func.value.func) == "super"
            unbound = bool(node.args) and ast.unparse(node.args[0]) == "self" \
                and ast.unparse(node.func.value) != "self"
            if via_super or unbound:
                lines.add(node.lineno)
    text = source.splitlines()
    return [f"line {n}: {text[n - 1].strip()}" for n in sorted(lines)]


def answer_key_hits(ex_id: str, source: str) -> list[str]:
    """answer_key_imports with exercise `ex_id`'s own answer key and parent methods."""
    return answer_key_imports(source, ANSWER_KEY.get(ex_id, ()), PARENT_METHODS.get(ex_id, ()))


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
                     scheduler_cls=checked(scheduler_cls) if scheduler_cls else None, clock=TickClock())


class ScheduleBroke(AssertionError):
    """A step a student's scheduler returned breaks a rule before it reaches the model."""


def checked(scheduler_cls):
    """`scheduler_cls` with every step it returns checked against the rules the runner relies on
    (the budget, the seats, no more tokens than a request has), so a broken step fails naming the
    rule instead of deep in the model as a shape error."""
    if getattr(scheduler_cls, "_checked", False):
        return scheduler_cls

    def schedule(self, now):
        out = scheduler_cls.schedule(self, now)
        cfg, step = self.config, getattr(self, "_step", 0)
        self._step = step + 1
        total = sum(len(q.token_ids) for q in out.seqs)
        if total > cfg.max_num_batched_tokens:
            parts = ", ".join(f"{q.request_id}:{len(q.token_ids)}" for q in out.seqs)
            raise ScheduleBroke(f"rule 1 (token budget): step {step} scheduled {total} tokens [{parts}], "
                                f"over max_num_batched_tokens={cfg.max_num_batched_tokens}; subtract each "
                                f"request's n from the budget left")
        if len(self.running) > cfg.max_num_seqs:
            raise ScheduleBroke(f"rule 2 (seats): after step {step}, {len(self.running)} requests were "
                                f"running, over max_num_seqs={cfg.max_num_seqs}")
        for q, req in zip(out.seqs, out.requests):
            if not q.token_ids or q.start + len(q.token_ids) > req.num_tokens:
                raise ScheduleBroke(
                    f"rule 3: step {step} gave request {q.request_id} n={len(q.token_ids) or 0} tokens from "
                    f"position {q.start}, but it has {req.num_tokens} tokens: n must be between 1 and "
                    f"req.num_tokens - req.num_computed_tokens")
        return out
    return type(scheduler_cls.__name__, (scheduler_cls,), {"schedule": schedule, "_checked": True})


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
    assert not missing, stalled(engine, missing, max_steps)
    failed = [final[i] for i in ids if final[i].finish_reason == "error"]
    if failed:  # the model's own error (a shape) would not say which rule the step broke
        kind = re.search(r"\w+(Error|Exception)", failed[0].error or "")
        raise AssertionError(
            f"request {failed[0].request_id} failed while its step ran "
            f"({kind.group(0) if kind else 'an error'}): "
            f"the step the scheduler returned could not run; check rule 3 (n = tokens still needed) and "
            f"rule 4 (slots reserved with allocate_slots before add/admit)")
    return [final[i] for i in ids]


def stalled(engine: LLMEngine, missing: list[str], max_steps: int) -> str:
    """Why requests never finished, naming the rule: a running request left unserved (rule 3) or a
    waiting one never admitted (rules 6 and 8)."""
    sched = engine.scheduler
    running = [r.request_id for r in sched.running if r.request_id in missing]
    if running:
        last = {rid: i for i, r in enumerate(engine.trace) for rid, *_ in r.entries}
        rid = running[0]
        since = f"since step {last[rid]}" if rid in last else "ever"
        return (f"rule 3: running request {rid} got no tokens {since} and never finished ({max_steps} "
                f"steps): serve every running request, in order, each step while the budget lasts")
    waiting = [r.request_id for r in sched.waiting if r.request_id in missing]
    return (f"rules 6 and 8: waiting request {waiting[0] if waiting else missing[0]} was never admitted "
            f"within {max_steps} steps, with {len(sched.running)} running of {engine.config.max_num_seqs} "
            f"seats: admit the head of the queue whenever a seat and the budget allow")


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

