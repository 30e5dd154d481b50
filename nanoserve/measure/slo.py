"""Service-level objectives: per-request latency limits, written in our syntax or vLLM's.

metrics.py scores requests against them (meets_slo, goodput); this file only reads them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_SLO_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_SLO_CLAUSE = re.compile(r"^([a-z0-9_]+)<=([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)(us|ms|s)$")
SLO_KEYS = ("ttft", "tpot", "e2e", "itl_max", "itl_p99", "queue")
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}  # vLLM's --goodput names -> ours


def parse_slo(slo: str | dict | Sequence[str]) -> dict[str, float]:
    """Per-request limits, in seconds once parsed, from either syntax:

    - ours: 'ttft<=500ms,itl_p99<=100ms,e2e<=2s' -> {'ttft': 0.5, 'itl_p99': 0.1, 'e2e': 2.0};
      a unit (us, ms, s) is required so that '500' can't be misread; keys are SLO_KEYS.
    - vLLM's `vllm bench serve --goodput`: 'ttft:500 tpot:50 e2el:2000' (space-separated
      KEY:VALUE, VALUE in milliseconds, keys ttft, tpot, e2el; e2el is our e2e), or the list
      of pairs argparse gives for `--goodput ttft:500 tpot:50`.

    A dict ({'ttft': 0.5}, seconds) is validated and returned with float values.
    """
    if isinstance(slo, dict):
        out = {}
        for k, v in slo.items():
            if k not in SLO_KEYS:
                raise ValueError(f"unknown SLO metric {k!r}; choose from {SLO_KEYS}")
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"SLO {k}={v!r} must be a number of seconds >= 0")
            out[k] = float(v)
        return out
    if not isinstance(slo, str):
        slo = " ".join(map(str, slo))
    if ":" in slo and "<=" not in slo:
        return _parse_goodput(slo)
    out = {}
    for clause in str(slo).split(","):
        m = _SLO_CLAUSE.match(clause.replace(" ", "").lower())
        if m is None:
            raise ValueError(f"bad SLO clause {clause.strip()!r} in {slo!r}: expected "
                             f"METRIC<=NUMBER(us|ms|s), e.g. 'ttft<=500ms,e2e<=2s', or vLLM's "
                             f"'ttft:500 e2el:2000' (milliseconds)")
        name, value, unit = m.groups()
        if name not in SLO_KEYS:
            raise ValueError(f"unknown SLO metric {name!r} in {slo!r}; choose from {SLO_KEYS}")
        if name in out:
            raise ValueError(f"SLO metric {name!r} given twice in {slo!r}")
        out[name] = float(value) * _SLO_UNITS[unit]
    return out


def _parse_goodput(slo: str) -> dict[str, float]:
    """vLLM's --goodput pairs (benchmarks/serve.py parse_goodput, check_goodput_args)."""
    out = {}
    for pair in slo.split():
        key, sep, value = pair.partition(":")
        try:
            ms = float(value) if sep and ":" not in value else None
        except ValueError:
            ms = None
        if ms is None or math.isnan(ms):
            raise ValueError(f"bad goodput pair {pair!r} in {slo!r}: expected KEY:VALUE with VALUE "
                             "in milliseconds, e.g. 'ttft:500 tpot:50'")
        if key not in GOODPUT_KEYS:
            raise ValueError(f"unknown goodput metric {key!r} in {slo!r}; vLLM's are "
                             f"{sorted(GOODPUT_KEYS)}")
        if ms < 0:
            raise ValueError(f"goodput {key}:{value} must be >= 0 milliseconds")
        if GOODPUT_KEYS[key] in out:
            raise ValueError(f"goodput metric {key!r} given twice in {slo!r}")
        out[GOODPUT_KEYS[key]] = ms * 1e-3
    return out
