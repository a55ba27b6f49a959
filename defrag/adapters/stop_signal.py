"""Stopping a process on SIGTERM (and SIGINT) with a handler that takes no lock.

A Python signal handler runs in the main thread between any two of its bytecodes, inside
whatever lock the main thread holds at that moment. ``threading.Event.set`` takes the event's
condition lock, which the main thread holds while it waits on that very event: a handler that
sets it can deadlock the process it was asked to stop. Logging and starting a thread take locks
too. So the handler only records the signal, and the main thread looks for it between waits of
at most :data:`POLL_S`: a handler also runs only when the main thread executes bytecode, and a
signal taken by another thread interrupts no wait of the main one (python/cpython#85300).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

POLL_S = 0.2
"""The longest the main thread waits before looking for a recorded signal again."""


class StopSignal:
    """The signals received since :meth:`install`, recorded without a lock."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def install(self, *signals: signal.Signals) -> StopSignal:
        """Record ``signals`` (SIGTERM when none are named) from now on; only the main thread
        can install a handler, elsewhere (a test calling the command in a thread) nothing is."""
        if threading.current_thread() is threading.main_thread():
            for signum in signals or (signal.SIGTERM,):
                signal.signal(signum, self._record)
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)  # no lock, no I/O: see the module doc

    def wait(self, done: threading.Event | None = None) -> int | None:
        """Until a signal is recorded (its number) or ``done`` is set (None)."""
        idle = threading.Event() if done is None else done
        while not self.received:
            if idle.wait(POLL_S):
                return None
        return self.received[0]
