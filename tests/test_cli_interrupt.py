"""Ctrl-C: ``codl-tvm`` says ``codl-tvm: interrupted`` on one line and exits 130, whatever it
was doing, and a build never reports an interrupt as its own failure.

TVM's FFI turns a ``KeyboardInterrupt`` raised in Python code it called (a pass, a callback)
into an anonymous ``RuntimeError``; these tests raise real SIGINTs inside such calls.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tvm_ffi

from codl_tvm import cli, runtime
from codl_tvm.core.errors import BuildError
from codl_tvm.core.interrupts import is_interrupt, sigint_count, watching_sigint


def _sigint_inside_tvm() -> None:
    """Send this process a SIGINT from Python code called through TVM's FFI (the handler's
    ``KeyboardInterrupt`` comes back out of the call as TVM's ``RuntimeError``)."""

    def callback() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler runs at the next bytecode: never reached in full

    tvm_ffi.convert(callback)()


def test_tvm_turns_an_interrupt_into_an_anonymous_runtime_error():
    """Why the interrupt must be counted: the error itself does not say so."""

    def callback() -> None:
        raise KeyboardInterrupt

    with pytest.raises(RuntimeError) as caught:
        tvm_ffi.convert(callback)()
    assert "KeyboardInterrupt" not in str(caught.value)


def test_a_sigint_during_a_build_stays_an_interrupt():
    with pytest.raises(KeyboardInterrupt), runtime.build_errors("model.onnx", "coexec"):
        _sigint_inside_tvm()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_an_interrupt_caught_as_a_failure_inside_a_build_stops_it_at_its_end():
    """A schedule rule that declines on any error swallows the interrupt; the build stops."""
    with pytest.raises(KeyboardInterrupt), runtime.build_errors("model.onnx", "coexec"):
        try:
            _sigint_inside_tvm()
        except Exception:
            pass


def test_a_failure_without_sigint_is_still_a_build_error():
    def callback() -> None:
        raise ValueError("no such op")

    with pytest.raises(BuildError, match="building for coexec failed: ValueError: no such op"):
        with runtime.build_errors("model.onnx", "coexec"):
            tvm_ffi.convert(callback)()


def test_is_interrupt_follows_the_chain_of_causes():
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as ki:
            raise BuildError("building failed") from ki
    except BuildError as exc:
        assert is_interrupt(exc)
    assert not is_interrupt(BuildError("building failed"))
    with watching_sigint():
        before = sigint_count()
        with pytest.raises(RuntimeError) as caught:
            _sigint_inside_tvm()
    assert is_interrupt(caught.value, before) and not is_interrupt(caught.value)


def _main_with(command, monkeypatch) -> int:
    """``cli.main`` with one command, ``x``, that runs ``command``."""

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="codl-tvm")
        p.add_argument("-v", "--verbose", action="count", default=0)
        p.add_argument("-q", "--quiet", action="count", default=0)
        sub = p.add_subparsers(dest="command", required=True)
        sub.add_parser("x").set_defaults(func=lambda args: command())
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    return cli.main(["x"])


def _raise_keyboard_interrupt() -> int:
    raise KeyboardInterrupt


def _build_interrupted_inside_tvm() -> int:
    # what compile_coexec does around TVM's compiler; a CodlError wrapping would be "failed"
    with runtime.build_errors("model.onnx", "coexec"):
        _sigint_inside_tvm()
    return 0


def _error_after_sigint() -> int:
    # a command that turns any failure into its own one-line error (as `run ARTIFACT/` does)
    try:
        _sigint_inside_tvm()
    except Exception as exc:
        raise BuildError(f"running the artifact failed: {exc}") from None
    return 0


def _interrupt_swallowed() -> int:
    try:
        _sigint_inside_tvm()
    except Exception:
        pass  # as a schedule rule that declines on any error
    return 0


@pytest.mark.parametrize(
    "command",
    [
        _raise_keyboard_interrupt,
        _build_interrupted_inside_tvm,
        _error_after_sigint,
        _interrupt_swallowed,
    ],
)
def test_main_says_interrupted_in_one_line_and_exits_130(command, monkeypatch, capsys):
    assert _main_with(command, monkeypatch) == 130
    captured = capsys.readouterr()
    assert captured.err == "codl-tvm: interrupted\n"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_inside_a_finalizer_is_counted_not_printed(monkeypatch):
    """A Ctrl-C that lands in a ``__del__`` (xgboost's Booster is freed while a compile plans)
    cannot propagate: it is counted and not handed to ``sys.unraisablehook`` (which prints
    Python's "Exception ignored" traceback); other errors in finalizers still are."""
    from codl_tvm.core.interrupts import sigint_count, watching_sigint

    class Interrupted:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    class Failing:
        def __del__(self):
            raise ValueError("a finalizer's own error")

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    with watching_sigint():
        before = sigint_count()
        Interrupted()  # freed at once: the interrupt is raised inside __del__
        assert sigint_count() == before + 1
        Failing()
    assert seen == [ValueError]
    assert sys.unraisablehook is not None and signal.getsignal(signal.SIGINT) is (
        signal.default_int_handler
    )


RUN_COEXEC = ["run", "--device", "coexec", "--dim", "H", "--ratio", "0.5", "--repeat", "1"]


@pytest.mark.opencl
@pytest.mark.parametrize(
    "argv, delay_s",
    [(RUN_COEXEC, 0.0), (RUN_COEXEC, 1.0), (RUN_COEXEC, 3.0), (["compile", "-o", "out"], 1.0)],
)
def test_ctrl_c_while_building_prints_one_line(argv, delay_s, tmp_path, opencl):
    """``codl-tvm run --device coexec`` and ``codl-tvm compile`` interrupted while they plan
    and build (a fresh cache, so nothing is reused), a moment after their first line: one
    line, exit 130, no traceback."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CODL_TVM_CACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "codl_tvm.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline()  # run: "OpenCL: ...", printed just before the build
        assert line.strip(), proc.stderr.read()
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130, out + err
    lines = err.splitlines()
    assert lines[-1] == "codl-tvm: interrupted" and "Traceback" not in err, err
    # TVM's C++ may warn about what the interrupt left unfinished ("BlockBuilder destroyed
    # with remaining blocks!"): its own log lines; ours are one-line warnings before it
    warned = r"\[\d\d:\d\d:\d\d\] \S+: Warning: |codl-tvm: warning: "
    assert all(re.match(warned, ln) for ln in lines[:-1]), err
    assert not (tmp_path / "out").exists()  # an interrupted compile leaves no directory
