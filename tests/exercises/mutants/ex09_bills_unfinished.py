"""Bills every request, aborted, failed and unfinished ones included."""
from solutions.ex09_cost import *  # noqa: F401,F403


def bill(outputs, input_per_1m, output_per_1m, cached_input_per_1m):
    usd = 0.0
    for o in outputs:
        cached = max(o.num_cached_tokens, 0)
        usd += ((len(o.prompt_token_ids) - cached) * input_per_1m + cached * cached_input_per_1m
                + len(o.token_ids) * output_per_1m) / 1e6
    return usd
