"""`serve --speculative-config`: the served run's vLLM spec-decode counters on /metrics equal the
stats of an engine that ran the same greedy requests offline, and the text is the same."""

import json

import httpx
import pytest

from nanoserve import LLM, EngineConfig, SamplingParams
from nanoserve.measure.loadgen import main
from nanoserve.model import DEMO_MODEL_DIR
from tests.serve.conftest import metric, start

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.mark.slow
def test_served_spec_decode_counters_match_the_engine(tmp_path, capsys):
    text = open(f"{DEMO_MODEL_DIR}/heldout.txt").read()
    lines = [t for t in text.splitlines() if len(t) > 30][:4]
    offline = LLM(DEMO_MODEL_DIR, config=EngineConfig(num_kv_blocks=512, speculative_config=SPEC))
    prompts = [offline.engine.encode(" ".join([t] * 3)) for t in reversed(lines)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    want = [offline.generate([p], params)[0].token_ids for p in prompts]  # one at a time, as served
    st = offline.engine.stats
    assert st.spec_decode_num_accepted_tokens > 0
    srv = start("--speculative-config", json.dumps(SPEC))
    try:
        with httpx.Client(base_url=srv.base_url, timeout=60) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            for p, w in zip(prompts, want):
                r = client.post("/v1/completions", json={"model": model, "prompt": p, "max_tokens": 24,
                                                         "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] == offline.decode(w)
            page = client.get("/metrics").text
        # loadgen reads the same counters before and after its run: acceptance as vLLM prints it
        rc = main(["--base-url", srv.base_url, "--tokenizer", DEMO_MODEL_DIR, "--num-prompts", "4",
                   "--random-input-len", "16", "--random-output-len", "12", "--ignore-eos",
                   "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path),
                   "--result-filename", "r.json"])
        after = httpx.get(srv.base_url + "/metrics").text
    finally:
        srv.stop()
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    j = json.loads((tmp_path / "r.json").read_text())
    drafts = metric(after, "vllm:spec_decode_num_drafts_total") - \
        metric(page, "vllm:spec_decode_num_drafts_total")
    accepted = metric(after, "vllm:spec_decode_num_accepted_tokens_total") - \
        metric(page, "vllm:spec_decode_num_accepted_tokens_total")
    assert j["spec_decode_num_drafts"] == drafts and j["spec_decode_accepted_tokens"] == accepted
    if drafts:
        assert j["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert "{s:{c}^{n}}".format(s=" Speculative Decoding ", n=50, c="-") in out
    assert any(line.startswith("Acceptance length:") for line in out) and out[-2] == "=" * 50
    assert metric(page, "vllm:spec_decode_num_drafts_total") == st.spec_decode_num_drafts
    assert metric(page, "vllm:spec_decode_num_draft_tokens_total") == st.spec_decode_num_draft_tokens
    assert metric(page, "vllm:spec_decode_num_accepted_tokens_total") == st.spec_decode_num_accepted_tokens
    for pos, n in enumerate(st.spec_decode_num_accepted_tokens_per_pos):
        assert metric(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == n


def test_no_spec_decode_series_without_speculation():
    from nanoserve.serve.metrics import ServerMetrics
    assert b"spec_decode" not in ServerMetrics("m").render()
    assert b"vllm:spec_decode_num_accepted_tokens_per_pos_total" in ServerMetrics("m", 2).render()
