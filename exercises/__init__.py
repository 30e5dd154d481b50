"""The course exercises: fill in each function marked `raise NotImplementedError("exNN: ...")`.

Each module's docstring says what to compute, with shapes, a worked example and a hint; the
signatures match `solutions/` (the reference answers) and the engine's own pieces, so your
code can be checked against them and plugged into the engine:

    python -m nanoserve grade            # score every exercise
    python -m nanoserve grade ex04       # just one
    LLM("preset:tiny", scheduler=ContinuousScheduler)                   # ex04, ex05
    nanoserve.kernels.use_kernels(llm, paged_attention=paged_attention)   # ex03 (ex08: rms_norm)
"""
