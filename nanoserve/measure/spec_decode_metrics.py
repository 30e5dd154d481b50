"""Speculative decoding as a client sees it: the server's vLLM counters on /metrics, read before
and after a run, give the run's acceptance rate and mean acceptance length (`vllm bench serve`
reads them the same way, with vLLM's definitions, vllm/v1/spec_decode/metrics.py):

    acceptance rate   = accepted tokens / draft tokens
    acceptance length = 1 + accepted tokens / drafts   (the token every check adds, counted)
    per position i    = accepted tokens at position i / drafts

A server without speculative decoding exports none of these counters: no summary then.
"""

from __future__ import annotations

import re

PREFIX = "vllm:spec_decode_"
_SAMPLE = re.compile(r'^(vllm:spec_decode_\w+?)(?:_total)?(\{[^}]*\})? (\S+)$')


def parse(text: str) -> dict:
    """Prometheus text -> {"num_drafts": n, "num_draft_tokens": n, "num_accepted_tokens": n,
    "num_accepted_tokens_per_pos": [n, ...]}, summed over engines; {} without those series."""
    out: dict = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1)[len(PREFIX):], m.group(2) or "", float(m.group(3))
        if name == "num_accepted_tokens_per_pos":
            pos = int(re.search(r'position="(\d+)"', labels).group(1))
            per_pos[pos] = per_pos.get(pos, 0) + value
        else:
            out[name] = out.get(name, 0) + value
    if per_pos:
        out["num_accepted_tokens_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)]
    return out


def summary(before: dict, after: dict) -> dict | None:
    """The run's counters (after - before) and its rates, vLLM's keys; None without speculation."""
    if not after:
        return None
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("num_drafts", "num_draft_tokens",
                                                           "num_accepted_tokens")}
    pos_before = before.get("num_accepted_tokens_per_pos", [])
    per_pos = [n - (pos_before[i] if i < len(pos_before) else 0)
               for i, n in enumerate(after.get("num_accepted_tokens_per_pos", []))]
    drafts = d["num_drafts"]
    return {
        "spec_decode_acceptance_rate": 100 * d["num_accepted_tokens"] / d["num_draft_tokens"]
        if d["num_draft_tokens"] else float("nan"),
        "spec_decode_acceptance_length": 1 + d["num_accepted_tokens"] / drafts if drafts else 1.0,
        "spec_decode_num_drafts": int(drafts), "spec_decode_draft_tokens": int(d["num_draft_tokens"]),
        "spec_decode_accepted_tokens": int(d["num_accepted_tokens"]),
        "spec_decode_per_position_acceptance_rates": [n / drafts if drafts else 0.0 for n in per_pos],
    }


def table(s: dict) -> str:
    """The summary as `vllm bench serve` prints its speculative-decoding section."""
    rows = [("Acceptance rate (%):", f"{s['spec_decode_acceptance_rate']:.2f}"),
            ("Acceptance length:", f"{s['spec_decode_acceptance_length']:.2f}"),
            ("Drafts:", s["spec_decode_num_drafts"]), ("Draft tokens:", s["spec_decode_draft_tokens"]),
            ("Accepted tokens:", s["spec_decode_accepted_tokens"])]
    lines = ["{s:{c}^{n}}".format(s=" Speculative Decoding ", n=50, c="-")]
    lines += [f"{k:<40} {v:<10}" for k, v in rows]
    lines.append("Per-position acceptance (%): " + ", ".join(
        f"{100 * r:.2f}" for r in s["spec_decode_per_position_acceptance_rates"]))
    return "\n".join(lines)


def fetch(base_url: str, api_key: str | None = None) -> dict:
    """The server's spec-decode counters now ({} if it exports none or /metrics is not there)."""
    import httpx
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, timeout=30.0)
    except httpx.HTTPError:
        return {}
    return parse(r.text) if r.status_code == 200 else {}
