"""Interrupting a child process as Ctrl-C does, wherever the test run was started.

A process started with SIGINT ignored (a background job of a non-interactive
shell, `nohup`) passes that on to its children, and Python leaves an ignored
SIGINT ignored, so such a child cannot be interrupted: tests that send SIGINT
start their child with the default disposition (`preexec_fn=sigint_default`),
and start it from a parent that ignores SIGINT (`sigint_ignored`), so that they
check this whichever way the run itself was started.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


def sigint_default() -> None:
    """`preexec_fn` of a child that SIGINT must reach: it runs in the child before exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process for the block, as in a background job."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
