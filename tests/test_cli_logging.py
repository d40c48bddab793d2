"""What ``codl-tvm`` shows of the library's log records: progress (INFO) as plain lines on
stdout, warnings and errors on stderr as ``codl-tvm: warning: ...``; ``-q`` keeps warnings and
errors only, ``-v`` adds debug records with the module that logged them.
"""

from __future__ import annotations

import argparse
import logging

import pytest

from codl_tvm import cli


def _log_each_level(args: argparse.Namespace) -> int:
    log = logging.getLogger("codl_tvm.objectives.example")
    log.debug("the cache key is %s", "abc")
    log.info("building for the CPU alone")
    log.warning("the cost model describes another machine")
    log.error("one candidate failed")
    return 0


@pytest.fixture
def with_logging_command(monkeypatch):
    """``cli.main`` with one command, ``x``, that logs one record of each level."""
    real = cli.build_parser

    def parser() -> argparse.ArgumentParser:
        p = real()
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        sub.add_parser("x").set_defaults(func=_log_each_level)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)


def test_default_shows_progress_and_warnings(with_logging_command, capsys):
    assert cli.main(["x"]) == 0
    out, err = capsys.readouterr()
    assert out == "building for the CPU alone\n"
    assert err == (
        "codl-tvm: warning: the cost model describes another machine\n"
        "codl-tvm: error: one candidate failed\n"
    )


def test_quiet_keeps_warnings_and_errors_only(with_logging_command, capsys):
    assert cli.main(["-q", "x"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("codl-tvm: ") == 2


def test_verbose_adds_debug_records_with_their_module(with_logging_command, capsys):
    assert cli.main(["--verbose", "x"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines() == [
        "[codl_tvm.objectives.example] the cache key is abc",
        "building for the CPU alone",
    ]


def test_verbose_and_quiet_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["-v", "-q", "info"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_main_leaves_the_library_loggers_as_it_found_them(with_logging_command, capsys):
    root = logging.getLogger("codl_tvm")
    handlers, level = list(root.handlers), root.level
    cli.main(["-v", "x"])
    assert root.handlers == handlers and root.level == level
    logging.getLogger("codl_tvm.objectives.example").info("after main")
    assert "after main" not in capsys.readouterr().out
