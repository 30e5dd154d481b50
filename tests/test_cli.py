"""The command line as a newcomer meets it: every subcommand's --help gives each flag a line of help
and its default (nanoserve/cli.py's formatter), and `--dataset` is loadgen's documented alias of
vLLM's `--dataset-name`/`--dataset-path`."""

import argparse

import pytest

from nanoserve import __main__, cli
from nanoserve.course import grade
from nanoserve.measure import bench, loadgen
from nanoserve.serve import disagg, router, server

PARSERS = {
    "nanoserve": lambda: __main__.build_parser(),
    "demo": lambda: _sub(__main__.build_parser(), "demo"),
    "roofline": lambda: _sub(__main__.build_parser(), "roofline"),
    "bench": bench.build_parser,
    "grade": lambda: _parser_of(grade.main),
    "serve": lambda: server.add_cli_args(cli.parser("nanoserve serve", None)),
    "serve --disaggregated": lambda: disagg.add_disagg_args(cli.parser("nanoserve serve", None)),
    "router": router.build_parser,
    "loadgen": lambda: loadgen.add_cli_args(cli.parser("nanoserve loadgen", None)),
}


def _sub(ap: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _parser_of(main) -> argparse.ArgumentParser:
    """The parser a main() builds: the one whose parse_args it calls, caught there."""
    seen = []

    class Caught(Exception):
        pass

    def catch(self, *a, **kw):
        seen.append(self)
        raise Caught
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch
    try:
        with pytest.raises(Caught):
            main([])
    finally:
        argparse.ArgumentParser.parse_args = original
    return seen[0]


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_has_help_and_its_default_is_shown(name):
    ap = PARSERS[name]()
    assert issubclass(ap.formatter_class, argparse.ArgumentDefaultsHelpFormatter), name
    text = ap.format_help()
    for action in ap._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"{name}: {flag} has no help text"
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            assert f"(default: {action.default})" in " ".join(text.split()), f"{name}: {flag}"


def test_the_demo_help_shows_its_defaults(capsys):
    with pytest.raises(SystemExit):
        __main__.main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "tokens to sample per request (default: 48)" in out and "--verbose" in out


@pytest.mark.parametrize("argv, want", [
    ([], ("random", None)),
    (["--dataset-name", "prefix_repetition"], ("prefix_repetition", None)),
    (["--dataset-path", "t.jsonl"], ("custom", "t.jsonl")),
    (["--dataset-name", "custom", "--dataset-path", "t.jsonl"], ("custom", "t.jsonl")),
    (["--dataset", "random"], ("random", None)),
    (["--dataset", "prefix"], ("prefix_repetition", None)),
    (["--dataset", "t.jsonl"], ("custom", "t.jsonl")),
])
def test_loadgen_takes_vllms_dataset_flags_and_the_alias(argv, want):
    args = PARSERS["loadgen"]().parse_args(argv)
    assert loadgen.dataset_choice(args) == want


@pytest.mark.parametrize("argv", [["--dataset-name", "custom"],
                                  ["--dataset", "random", "--dataset-name", "random"]])
def test_loadgen_refuses_a_dataset_it_cannot_read(argv):
    with pytest.raises(SystemExit):
        loadgen.dataset_choice(PARSERS["loadgen"]().parse_args(argv))


def test_loadgen_saves_into_a_folder_git_ignores():
    args = PARSERS["loadgen"]().parse_args(["--save-result"])
    ignored = (__import__("pathlib").Path(__file__).resolve().parents[1] / ".gitignore").read_text()
    assert args.result_dir == loadgen.RESULT_DIR and f"/{loadgen.RESULT_DIR}/" in ignored.split()
