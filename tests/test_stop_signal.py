"""SIGTERM stops the extender and the agent through a handler that only records it
(``defrag/adapters/stop_signal.py``): the main thread finds the signal however it arrives."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from defrag.adapters.stop_signal import StopSignal
from defrag.cli.extender import _run_until_sigterm


@pytest.fixture(autouse=True)
def keep_handler() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _sigterm_later(delay_s: float) -> threading.Thread:
    """SIGTERM to this process from another thread: the main thread's wait is not interrupted
    (the signal may be taken while it blocks), the case a handler with no poll never saw."""
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), os.kill(os.getpid(), 15)))
    thread.start()
    return thread


def test_a_signal_from_another_thread_ends_the_wait() -> None:
    sigterm = StopSignal().install()
    sender = _sigterm_later(0.2)
    assert sigterm.wait() == signal.SIGTERM
    sender.join()


def test_the_wait_ends_without_a_signal_when_the_work_is_done() -> None:
    sigterm = StopSignal().install()
    done = threading.Event()
    threading.Timer(0.1, done.set).start()
    assert sigterm.wait(done) is None
    assert sigterm.received == []


def test_the_agent_loop_is_told_to_stop_and_waited_for() -> None:
    steps: list[str] = []

    def run(stop: threading.Event) -> None:
        while not stop.wait(0.05):
            steps.append("sync")
        steps.append("stopped")

    sender = _sigterm_later(0.3)
    _run_until_sigterm(run)
    sender.join()
    assert steps[-1] == "stopped" and steps.count("sync") >= 1


def test_an_agent_loop_that_ends_by_itself_ends_the_command() -> None:
    calls: list[bool] = []
    _run_until_sigterm(lambda stop: calls.append(stop.is_set()))
    assert calls == [False]
