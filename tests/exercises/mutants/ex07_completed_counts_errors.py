"""Counts a request that finished with an error as completed (only aborts left out)."""
from solutions.ex07_metrics import *  # noqa: F401,F403
from solutions.ex07_metrics import e2e, tpot, ttft  # noqa: F401


def is_completed(output):
    m = output.metrics
    return bool(output.finished and output.finish_reason != "abort" and len(output.token_ids) > 0
                and m.first_token_time is not None and m.finished_time is not None)


def goodput(outputs, slo, duration):
    fns = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    good = sum(is_completed(o) and all(fns[k](o) is None or fns[k](o) <= v for k, v in slo.items())
               for o in outputs)
    return good / duration
