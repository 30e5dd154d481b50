"""Reference answers to the exercises in `exercises/` (same modules, names and signatures).

Check them, or your own answers, with `python -m nanoserve grade` (which grades `exercises/`)
or `python -m pytest tests/exercises --impl=solutions`.
"""
