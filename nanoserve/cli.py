"""The command line's help: every subcommand lists each flag's default beside its help text."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """argparse's defaults in the help (as `vllm serve --help`), the description as written, and no
    "(default: None)" or "(default: False)": such a flag's help says what leaving it out does."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
