"""Dry run or live, decided in one place (defrag/execute/mode.py): every consequence of the
flags, as a table, and the settings that build it."""

from __future__ import annotations

import pytest

from defrag.execute.mode import RunMode
from defrag.settings import Settings, nested


@pytest.mark.parametrize(
    ("mode", "evicts", "writes_events", "takes_lease", "reconciles", "name"),
    [
        # dry run, the default: nothing written, not even a Lease; leftovers only reported
        (RunMode(), False, False, False, False, "dry run"),
        # dry run with dry_run_events: Events (marked) and nothing else
        (RunMode(dry_run=True, events=True), False, True, False, False, "dry run"),
        (RunMode.live(), True, True, True, True, "live"),
        # live without leader election (one replica): no Lease
        (RunMode.live(leader_election=False), True, True, False, True, "live"),
        # dry_run_events means nothing more when live
        (RunMode(dry_run=False, events=True), True, True, True, True, "live"),
    ],
)
def test_what_each_mode_may_do(
    mode: RunMode, evicts: bool, writes_events: bool, takes_lease: bool, reconciles: bool, name: str
) -> None:
    assert (mode.evicts, mode.writes_events, mode.takes_lease, mode.reconciles, mode.name) == (
        evicts,
        writes_events,
        takes_lease,
        reconciles,
        name,
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, RunMode(True, False, True)),
        ({"execution.dry_run": False}, RunMode(False, False, True)),
        (
            {"execution.dry_run_events": True, "leadership.enabled": False},
            RunMode(True, True, False),
        ),
    ],
)
def test_settings_build_the_one_mode(values: dict[str, bool], expected: RunMode) -> None:
    assert Settings(**nested(values)).run_mode == expected


@pytest.mark.parametrize(
    "values",
    [
        {"cluster.kind": "sim"},
        {"cluster.kind": "sim", "execution.dry_run": False, "leadership.enabled": False},
        {"cluster.kind": "sim", "execution.dry_run_events": True},
    ],
)
def test_the_composition_root_hands_the_one_mode_to_whatever_writes(
    values: dict[str, object],
) -> None:
    """Dry run is decided once, in ``defrag run``'s wiring: the executor and the unmodelled-object
    reporter are built with the settings' mode, and the cycle reports the executor's."""
    from defrag.cli.run import build

    settings = Settings(**nested(values))
    ports = build(settings).daemon.ports
    assert ports.executor is not None and ports.unmodelled is not None
    assert ports.executor.mode == ports.unmodelled.mode == ports.mode == settings.run_mode
