"""Exercise 4's scheduler (and exercise 5's) driven on its own through exact scenarios, no model,
as the simulator drives it: rules that the engine's outputs can't show (which request is
preempted, whether a step that preempted still looks at the waiting queue) are checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve import EngineConfig, SamplingParams
from nanoserve.engine.kv_cache import KVCacheManager
from nanoserve.engine.request import Request, RequestStatus
from nanoserve.engine.scheduler import SchedulerOutput


class WatchedKV(KVCacheManager):
    """The KV manager, logging who asks it for a cached prefix or for slots, and in what state."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[str, str, RequestStatus]] = []  # (method, request id, its status then)

    def get_computed_blocks(self, request):
        self.log.append(("get_computed_blocks", request.request_id, request.status))
        return super().get_computed_blocks(request)

    def allocate_slots(self, request, num_new_tokens, new_computed_blocks=()):
        self.log.append(("allocate_slots", request.request_id, request.status))
        return super().allocate_slots(request, num_new_tokens, new_computed_blocks)


@dataclass
class Scenario:
    scheduler: object
    kv: WatchedKV
    out: SchedulerOutput | None = None  # the last step's
    error: Exception | None = None  # what the last schedule() raised

    def step(self, now: float) -> None:
        """schedule(now), then the engine's bookkeeping as if every sampling seq drew token 1."""
        self.kv.log.clear()
        try:
            self.out = self.scheduler.schedule(now)
        except NotImplementedError:
            raise
        except Exception as e:  # reported by the test, with the scenario
            self.out, self.error = None, e
            return
        self.scheduler.update_from_output(self.out, {s.request_id: 1 for s in self.out.seqs if s.sample}, now)


def scenario(scheduler_cls, prompts: dict[str, int], **config) -> Scenario:
    """A scheduler over a WatchedKV (no prefix caching), fed requests named by `prompts`
    (name -> prompt length, all arriving at 0, in this order)."""
    cfg = EngineConfig(**{**dict(block_size=4, max_num_batched_tokens=48, enable_chunked_prefill=False,
                                 enable_prefix_caching=False), **config})
    kv = WatchedKV(cfg.num_kv_blocks, cfg.block_size, enable_caching=False)
    sched = scheduler_cls(cfg, kv)
    for i, (name, n) in enumerate(prompts.items()):
        sched.add_request(Request(name, list(range(10 * i + 1, 10 * i + 1 + n)),
                                  SamplingParams(max_tokens=16, ignore_eos=True), 0.0, max_len=64))
    return Scenario(sched, kv)


def out_of_blocks(scheduler_cls, **config) -> Scenario:
    """A, B, C admitted (4-token prompts, one block of 4 each), D waits for a seat, 1 block is
    free; every decode of the next step needs a new block. -> the Scenario after that step."""
    s = scenario(scheduler_cls, {"A": 4, "B": 4, "C": 4, "D": 2}, num_kv_blocks=4, max_num_seqs=3, **config)
    s.step(0)
    if s.error is not None:
        raise s.error
    admitted = [q.request_id for q in s.out.seqs]
    assert admitted == ["A", "B", "C"], f"step 0 of the scenario admitted {admitted}, expected A, B, C"
    s.step(1)
    return s


def served_preempted(s: Scenario) -> list[str]:
    """Requests the step asked blocks for as running requests after preempting them (rule 4)."""
    return [r for m, r, st in s.kv.log if m == "allocate_slots" and st == RequestStatus.PREEMPTED
            and ("get_computed_blocks", r, st) not in s.kv.log]


def assert_rule_4_held(s: Scenario) -> None:
    served = served_preempted(s)
    assert not served, (
        f"rule 4: the step asked for blocks for {served[0]}, which it had just preempted: a "
        f"preempted request is still in your copy of running; skip it")
    assert s.error is None, f"rule 4: schedule raised {s.error!r} (A, B, C each need a block, 1 free)"


def assert_preempts_the_newest(s: Scenario) -> None:
    """Rule 4 of exercise 4 on out_of_blocks: A, B served, C (the newest) preempted and not served."""
    assert_rule_4_held(s)
    served = [q.request_id for q in s.out.seqs]
    assert (served, s.out.preempted) == (["A", "B"], ["C"]), (
        f"rule 4: served {served}, preempted {s.out.preempted}; expected A, B served and C (the newest) "
        f"preempted (A, B, C each need a block, 1 is free)")


def assert_no_admission_after_preemption(s: Scenario) -> None:
    """Rule 5 of exercise 4 on out_of_blocks: once C is preempted, nobody waiting is looked at
    (a rule-4 slip, serving the request just preempted, is reported as rule 4)."""
    assert_rule_4_held(s)
    asked = [r for m, r, st in s.kv.log if st != RequestStatus.RUNNING
             and (m, r, st) != ("allocate_slots", r, RequestStatus.PREEMPTED)] if s.out.preempted else []
    assert not asked, (f"rule 5: the step preempted {s.out.preempted}, then tried to admit {asked[0]} "
                       f"(asked the KV cache for it): admit only when out.preempted is empty")
