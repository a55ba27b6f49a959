"""daemon/unmodelled.py: one DefragNotModelled Event per unmodelled object while it lasts."""

from __future__ import annotations

import pytest

from defrag.daemon.unmodelled import UnmodelledReporter, warning_target
from defrag.execute.mode import RunMode

POD = "Pod ml/bad: metadata.annotations[defrag.io/gpu-milli]: 'half' is not a number"
NODE = "Node amd-1: status.allocatable[amd.com/gpu]: not a GPU defrag models"


class Recorder:
    """An Actuator's ``event`` only; ``fail``: the next N sends raise."""

    def __init__(self, fail: int = 0) -> None:
        self.sent: list[tuple[str, str, str, str, bool]] = []
        self.fail = fail

    def event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, warning: bool = False
    ) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("API server unreachable")
        self.sent.append((kind, namespace, name, reason, warning))


class Deposed:
    def still_leader(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("warning", "target"),
    [
        (POD, ("Pod", "ml", "bad")),
        (NODE, ("Node", "", "amd-1")),
        ("Pod without-namespace: field: x", None),  # a pod is always namespace/name
        ("snapshot: 3 objects left out", None),  # names no object
    ],
)
def test_the_object_a_warning_names(warning: str, target: tuple[str, str, str] | None) -> None:
    assert warning_target(warning) == target


@pytest.mark.parametrize(
    ("mode", "first", "again"),
    [
        (RunMode.live(), 2, 0),  # once while it lasts
        (RunMode(dry_run=True, events=True), 2, 0),  # dry run with dry_run_events: the same
        (RunMode(), 0, 0),  # dry run: nothing written
    ],
)
def test_each_object_is_told_once_while_it_lasts(mode: RunMode, first: int, again: int) -> None:
    actuator = Recorder()
    reporter = UnmodelledReporter(actuator, mode)  # type: ignore[arg-type]
    assert reporter.report([POD, NODE]) == first
    assert reporter.report([POD, NODE]) == again
    if first:
        assert sorted(actuator.sent) == [
            ("Node", "", "amd-1", "DefragNotModelled", True),
            ("Pod", "ml", "bad", "DefragNotModelled", True),
        ]


def test_told_again_once_fixed_and_broken_again_and_after_a_failed_send() -> None:
    actuator = Recorder(fail=1)
    reporter = UnmodelledReporter(actuator, RunMode.live())  # type: ignore[arg-type]
    assert reporter.report([POD]) == 0  # the send failed: not counted as told
    assert reporter.report([POD]) == 1  # so it is tried again
    assert reporter.report([]) == 0  # fixed
    assert reporter.report([POD]) == 1  # broken again: told again
    assert len(actuator.sent) == 2


def test_a_deposed_leader_tells_nothing() -> None:
    actuator = Recorder()
    reporter = UnmodelledReporter(actuator, RunMode.live())  # type: ignore[arg-type]
    reporter.fence = Deposed()  # type: ignore[assignment]
    assert reporter.report([POD, NODE]) == 0 and actuator.sent == []
