"""`python -m nanoserve demo` as a newcomer reads it: each request's text (its prompt, then what was
sampled), a short table whose headers are explained under it, the model called by the name the
server gives it; the token-by-token stream only with --verbose."""

import io

import pytest

from nanoserve.__main__ import main
from nanoserve.course.demo import DEMO_PROMPTS, LEGEND, run_demo
from nanoserve.model import DEMO_MODEL_NAME


@pytest.fixture(scope="module")
def quiet_and_verbose():
    outs = []
    for verbose in (False, True):
        buf = io.StringIO()
        finals = run_demo(max_tokens=4, device="cpu", verbose=verbose, out=buf)
        outs.append((buf.getvalue(), finals))
    return outs


def test_texts_then_a_table_whose_headers_are_explained(quiet_and_verbose):
    text, finals = quiet_and_verbose[0]
    assert text.startswith(f"model: {DEMO_MODEL_NAME} on cpu")
    assert len(finals) == len(DEMO_PROMPTS) and all(len(o.token_ids) == 4 for o in finals)
    lines = text.splitlines()
    for i, prompt in enumerate(DEMO_PROMPTS):  # the prompt, then its sampled text
        at = lines.index(f"[{i}] {prompt.splitlines()[0]}")
        assert "\n".join(lines[at:at + 3]).startswith(f"[{i}] {prompt}")
    header = next(ln for ln in lines if ln.split()[:1] == ["req"])
    assert header.split() == ["req", "prompt", "output", "TTFT", "ITL", "tok/s"]
    rows = lines[lines.index(header) + 1:lines.index(header) + 1 + len(DEMO_PROMPTS)]
    assert [int(r.split()[0]) for r in rows] == list(range(len(DEMO_PROMPTS)))
    for name in header.split()[1:]:  # every column is explained under the table
        assert any(ln.startswith(name) or f", {name}" in ln.split(":")[0] for ln in LEGEND.splitlines())
    assert text.rstrip().endswith(LEGEND.splitlines()[-1])
    assert not any(ln.startswith("[0] '") for ln in lines), "the token stream is for --verbose only"


def test_verbose_adds_the_token_stream(quiet_and_verbose):
    quiet, _ = quiet_and_verbose[0]
    verbose, _ = quiet_and_verbose[1]
    streamed = [ln for ln in verbose.splitlines() if ln[:1] == "[" and "] '" in ln]
    assert len(streamed) >= len(DEMO_PROMPTS) * 2  # one line per step that gave a request tokens
    assert len(verbose.splitlines()) > len(quiet.splitlines())


def test_the_command_line_demo(capsys):
    assert main(["demo", "--max-tokens", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"model: {DEMO_MODEL_NAME}") and "TTFT: time to first token" in out
