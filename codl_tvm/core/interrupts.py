"""Telling a Ctrl-C apart from a failure, even after TVM has turned it into another error.

A ``KeyboardInterrupt`` raised inside Python code that TVM called (a pass, a callback of the
compiler) crosses TVM's FFI as a ``RuntimeError`` with an empty message: nothing in it says that
the user pressed Ctrl-C. Code that turns failures into one-line errors (a build's
:func:`codl_tvm.runtime.build_errors`, the CLI's ``main``) would then report "building for
coexec failed: RuntimeError". :func:`watching_sigint` counts the SIGINTs the process receives
while it is active (and raises ``KeyboardInterrupt`` as Python's own handler does), so that
:func:`is_interrupt` can say whether a failure came from one.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["die_with_parent", "is_interrupt", "sigint_count", "watching_sigint"]

_received = [0]  # SIGINTs seen by the handler of watching_sigint, since the process started


def _count_and_interrupt(signum: int, frame) -> None:
    _received[0] += 1
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as without us


def _quiet_about_interrupts(hook):
    """``hook`` (a ``sys.unraisablehook``) but silent for a ``KeyboardInterrupt``: a Ctrl-C
    landing in a finalizer (xgboost's ``Booster.__del__``) cannot propagate, and Python would
    print its traceback; the handler counted it, and the block's owner acts on the count."""

    def quiet(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            hook(unraisable)

    return quiet


def sigint_count() -> int:
    """How many SIGINTs the process received inside :func:`watching_sigint` blocks so far."""
    return _received[0]


@contextlib.contextmanager
def watching_sigint() -> Iterator[None]:
    """Inside the block, count SIGINTs (:func:`sigint_count`); Ctrl-C still raises
    ``KeyboardInterrupt``.

    Only Python's default handler is replaced, and only on the main thread (the only one that
    may set handlers): a handler the application installed stays in charge, and nested blocks
    share the outer one's. A Ctrl-C raised inside a finalizer, where it cannot propagate, is
    counted without Python's "Exception ignored" traceback.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, _count_and_interrupt)
    hook = sys.unraisablehook
    sys.unraisablehook = _quiet_about_interrupts(hook)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = hook


def is_interrupt(exc: BaseException, since: int | None = None) -> bool:
    """Whether ``exc`` stands for a Ctrl-C: a ``KeyboardInterrupt`` itself or in its chain of
    causes, an error whose text names one, or (with ``since``, an earlier
    :func:`sigint_count`) any failure after the process received SIGINT since then (TVM's FFI
    turns the ``KeyboardInterrupt`` into an anonymous ``RuntimeError``)."""
    if since is not None and sigint_count() > since:
        return True
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt) or "KeyboardInterrupt" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM to this process when its parent dies, so a helper
    process (a build worker, a warm-up shard) of a compile killed outright (SIGKILL) does not
    run on."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # only a missed safety net
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
