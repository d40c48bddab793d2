"""The ``codl-tvm`` command line.

One module per command group, each with a ``register(subparsers)`` that adds its commands; the
work is done by library functions. :func:`main` turns every expected failure
(:class:`~codl_tvm.core.errors.CodlError`, and OS errors on the user's files) into one line,
``codl-tvm: error: ...``, and exit status 2; a Ctrl-C into ``codl-tvm: interrupted`` and exit
status 130. Anything else is a bug and keeps its traceback. The library logs through
:mod:`logging` (``codl_tvm.*`` loggers); :func:`setup_logging` shows its records on the console,
as ``-v``/``-q`` ask.

The command table is explicit. A command module that fails to import is an error, except on a
runtime-only TVM (the library without the compiler, as on a deployment device): there the
commands that need the compiler are still listed, and running one says why it cannot run, while
``codl-tvm run ARTIFACT/`` works.

The library never imports this package.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable

from codl_tvm.core.errors import CliError, CodlError
from codl_tvm.core.interrupts import is_interrupt, sigint_count, watching_sigint
from codl_tvm.frontend.models import bundled_model_path

__all__ = ["COMMANDS", "CliError", "build_parser", "bundled_model_path", "main", "setup_logging"]

#: Command modules of ``codl-tvm`` and the commands each adds, in ``--help`` order.
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("codl_tvm.cli.run", ("run", "info")),
    ("codl_tvm.cli.compile", ("compile", "refine")),
    ("codl_tvm.cli.demo", ("demo",)),
    ("codl_tvm.cli.plan", ("plan",)),
    ("codl_tvm.cli.profile", ("profile",)),
    ("codl_tvm.cli.cost_model", ("cost-model",)),
    ("codl_tvm.cli.deploy", ("deploy",)),
    ("codl_tvm.cli.serve", ("serve",)),
    ("codl_tvm.cli.cold_start", ("cold-start",)),
    ("codl_tvm.cli.build_runtime", ("build-runtime",)),
)


def _runtime_only_tvm() -> bool:
    """Whether the installed TVM is its runtime alone (no compiler)."""
    import tvm.base  # only asked after a command module failed to import

    return bool(getattr(tvm.base, "_RUNTIME_ONLY", False))


def _unavailable(names: tuple[str, ...], module: str, exc: Exception) -> Callable:
    """A ``register`` for commands that cannot run on this TVM: each says so when invoked."""
    why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

    def fail(args: argparse.Namespace) -> int:
        if args.command == "run":  # running artifacts needs no compiler: a bug, say so
            raise CliError(
                f"`codl-tvm run` cannot start on this runtime-only TVM (importing {module} "
                f"failed: {why}); running an artifact needs no compiler, so this is a bug in "
                "codl-tvm: please report it"
            )
        raise CliError(
            f"`codl-tvm {args.command}` needs TVM's compiler, but the installed TVM is "
            f"runtime-only (importing {module} failed: {why}); on this machine run compiled "
            "artifacts with `codl-tvm run ARTIFACT/`"
        )

    def register(sub: argparse._SubParsersAction) -> None:
        for name in names:
            p = sub.add_parser(name, help="(needs TVM's compiler; unavailable here)")
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            p.set_defaults(func=fail)

    return register


def build_parser() -> argparse.ArgumentParser:
    """The ``codl-tvm`` argument parser with every command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="codl-tvm",
        description="CPU+GPU co-execution of deep-learning operators for Apache TVM.",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("-v", "--verbose", action="count", default=0, help="also show debug messages")
    talk.add_argument(
        "-q", "--quiet", action="count", default=0, help="show warnings and errors only"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module, names in COMMANDS:
        try:
            register = importlib.import_module(module).register
        except Exception as exc:
            # A runtime-only TVM cannot import compiler-side modules (their import registers
            # Relax ops and schedules); anywhere else a failing import is a bug: fail loudly.
            if not _runtime_only_tvm():
                raise
            register = _unavailable(names, module, exc)
        register(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class _ConsoleHandler(logging.Handler):
    """The library's log records on the console: INFO and DEBUG as plain lines on stdout (the
    progress of a command, beside what it prints), warnings and errors on stderr as
    ``codl-tvm: warning: ...``. The streams are looked up at each record, so that a caller
    that swaps ``sys.stdout`` (a test capturing output) sees the lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.levelno >= logging.ERROR:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            if record.levelno >= logging.WARNING:
                stream = sys.stderr
                text = f"codl-tvm: {record.levelname.lower()}: {text}"
            else:
                stream = sys.stdout
                if record.levelno < logging.INFO:
                    text = f"[{record.name}] {text}"
            stream.write(text + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def setup_logging(verbosity: int = 0) -> Callable[[], None]:
    """Show the library's log records (the ``codl_tvm`` loggers) on the console; return the
    function that undoes it.

    ``verbosity`` 0 shows progress (INFO) and warnings, 1 or more (``-v``) adds debug records
    with the name of the module that logged them, -1 (``-q``) keeps warnings and errors only.
    Calling it again replaces the earlier setup.
    """
    logger = logging.getLogger("codl_tvm")
    for handler in list(logger.handlers):
        if isinstance(handler, _ConsoleHandler):
            logger.removeHandler(handler)
    handler = _ConsoleHandler()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(
        logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO
    )

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(level)

    return undo


def _interrupted() -> int:
    print("codl-tvm: interrupted", file=sys.stderr)
    return 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def main(argv: list[str] | None = None) -> int:
    """Run ``codl-tvm`` with ``argv`` (default: the process arguments); return the exit status.

    A Ctrl-C at any moment prints ``codl-tvm: interrupted`` and returns 130, whatever error
    the interrupted code turned it into (:func:`codl_tvm.core.interrupts.is_interrupt`).
    """
    with watching_sigint():
        before = sigint_count()
        try:
            return _main(argv)
        except KeyboardInterrupt:
            return _interrupted()
        except Exception as exc:
            if is_interrupt(exc, before):
                return _interrupted()
            raise


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    undo_logging = setup_logging(args.verbose - args.quiet)
    before = sigint_count()
    try:
        status = args.func(args)
        if sigint_count() > before:  # an interrupt caught as a failure somewhere and ignored
            raise KeyboardInterrupt
        return status
    except (CodlError, OSError) as exc:
        if is_interrupt(exc, before):
            raise KeyboardInterrupt from exc
        # expected failures (bad input, a model or device that cannot be used, a file that
        # cannot be read or written): one line for the user, no traceback
        print(f"codl-tvm: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        # The library imports TVM's compiler where it first needs it, so on a runtime-only TVM
        # a command that compiles fails inside; say that instead of a traceback into TVM.
        if is_interrupt(exc, before) or not _runtime_only_tvm():
            raise
        print(
            f"codl-tvm: error: `codl-tvm {args.command}` needs TVM's compiler, but the installed "
            f"TVM is runtime-only ({type(exc).__name__}: {_one_line(exc)}); on this machine run "
            "compiled artifacts with `codl-tvm run ARTIFACT/`",
            file=sys.stderr,
        )
        return 2
    finally:
        undo_logging()  # main() may be called again in one process (tests, notebooks)
