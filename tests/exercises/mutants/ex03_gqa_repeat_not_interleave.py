"""GQA slip: kv heads tiled with repeat (query head h reads kv head h % num_kv_heads), not
repeat_interleave (h // group). The graded tests must blame GQA only."""
from exercise_checks import solution_with

_m = solution_with("ex03_attention",
                   ("k = k.float().repeat_interleave(group, dim=1)", "k = k.float().repeat(1, group, 1)"),
                   ("v = v.float().repeat_interleave(group, dim=1)", "v = v.float().repeat(1, group, 1)"))
attend_one_request, paged_attention = _m.attend_one_request, _m.paged_attention
