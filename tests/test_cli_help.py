"""Every ``codl-tvm`` command and subcommand answers ``--help``, is listed in the help of the
command above it, and appears in the README's command table."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from codl_tvm.cli import COMMANDS, build_parser, main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every command path under ``parser`` (``("run",)``, ``("cost-model", "fit")``, ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _subcommands(sub, (*prefix, name))


PATHS = list(_subcommands(build_parser()))


def test_the_table_and_the_parser_agree():
    top = {path[0] for path in PATHS}
    assert top == {name for _, names in COMMANDS for name in names}
    assert ("cost-model", "fit") in PATHS and ("cost-model", "eval") in PATHS


@pytest.mark.parametrize("path", [(), *PATHS], ids=lambda p: " ".join(p) or "codl-tvm")
def test_help_runs_and_lists_the_subcommands(path, capsys):
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: {' '.join(('codl-tvm', *path))}") and not err
    for child in (p[len(path)] for p in PATHS if len(p) == len(path) + 1 and p[:-1] == path):
        assert child in out, f"{child} missing from the help of {path}"


@pytest.mark.parametrize("command", sorted({p[0] for p in PATHS}))
def test_the_readme_lists_every_command(command):
    rows = re.findall(r"^\| `codl-tvm ([\w-]+)", README, re.M)
    assert command in rows
