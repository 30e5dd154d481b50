"""Bills cached prompt tokens at the full input price: the prefix-cache discount never applies."""
from solutions.ex09_cost import *  # noqa: F401,F403
from solutions.ex09_cost import bill as _bill


def bill(outputs, input_per_1m, output_per_1m, cached_input_per_1m):
    return _bill(outputs, input_per_1m, output_per_1m, input_per_1m)


def cache_savings(outputs, input_per_1m, cached_input_per_1m):
    return 0.0
