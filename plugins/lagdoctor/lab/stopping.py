"""How the lab's long-running commands (`lagdoctor topology`, `make airflow`) stop.

Ctrl-C, SIGTERM and SIGHUP (the terminal closed) all start the stop; once it
runs, further ones are noted and ignored, so a second Ctrl-C cannot abort it
half-way and leave JVMs and PostgreSQL behind in process groups of their own.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def tell(print_line: Callable[[str], None], message: str) -> None:
    """Print a line unless the terminal is gone (closed: EIO; a closed pipe: EPIPE): the stop goes on."""
    try:
        print_line(message)
    except OSError:
        pass


def line_by_line() -> None:
    """Each line out as soon as it is printed, also into a pipe (`make airflow | tee demo.log`):
    a long-running command's progress and its stop notes are read while it runs, not at exit."""
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):  # not a text stream of its own (a test's capture)
        pass


def let_go_of_a_closed_terminal() -> None:
    """Flush what is still buffered for the terminal; if it is gone, send stdout to /dev/null, so
    the interpreter's own flush at exit cannot fail (Python exits 120 then, not the command's 0).
    Without PYTHONUNBUFFERED a pipe's output waits in the buffer until exit, so tell() never saw it fail."""
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


def raise_on_stop_signals(print_line: Callable[[str], None]) -> dict[int, object]:
    """The first stop signal raises KeyboardInterrupt in the main thread, and from then on every
    further one is only noted (no window in which a second could cut the stop short).
    Returns the previous handlers."""

    def interrupt(*_: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, _noting(print_line))
        raise KeyboardInterrupt

    return {s: signal.signal(s, interrupt) for s in STOP_SIGNALS}


def _noting(print_line: Callable[[str], None]) -> Callable[[int, object], None]:
    def note(signum: int, _frame: object) -> None:
        message = f"{signal.Signals(signum).name}: already stopping; every part is stopped first"
        try:
            print_line(message)
        except RuntimeError:  # it interrupted a print in progress (reentrant call): write past stdout's buffer
            tell(lambda line: os.write(sys.stdout.fileno(), f"{line}\n".encode()), message)
        except OSError:
            pass

    return note


def restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextmanager
def stop_shielded(print_line: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, a stop signal only says the stop is under way.
    Outside the main thread (where no handler can be set) the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = {s: signal.signal(s, _noting(print_line)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        restore(previous)
