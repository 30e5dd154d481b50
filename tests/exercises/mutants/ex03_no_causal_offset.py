"""Causal mask counted from the chunk's start: ignores the tokens cached before the chunk."""
from exercise_checks import solution_with

_m = solution_with("ex03_attention", (".tril(seq_len - q_len)", ".tril()"))
attend_one_request, paged_attention = _m.attend_one_request, _m.paged_attention
