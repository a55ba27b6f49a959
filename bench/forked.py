"""What a bench's forked child does first: the default action for SIGTERM and SIGINT.

A child forked from a process that installed its own handlers (a test worker that ran the
daemon's or the extender's command line in-process: their handlers only record the signal for
a main loop to see) inherits them, so ``Process.terminate()`` would leave it serving and the
parent's ``join()`` waiting for ever."""

from __future__ import annotations

import signal


def default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


__all__ = ["default_signals"]
