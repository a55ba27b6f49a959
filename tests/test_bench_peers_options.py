"""bench_peers' ``--set KEY=VALUE``: the daemon's settings by dotted key, values read as YAML
scalars; a bad pair, an unknown key or an old flat key is refused before any run."""

from __future__ import annotations

import argparse

import pytest


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["windows.max_evictions_per_window=256"], {"windows.max_evictions_per_window": 256}),
        (["planner.make_room_moves_any_priority=false", "planner.make_room_worth=2.5"],
         {"planner.make_room_moves_any_priority": False, "planner.make_room_worth": 2.5}),
        (["detection.rules_dir=rules/x"], {"detection.rules_dir": "rules/x"}),
    ],
)  # fmt: skip
def test_sets_parse(items: list[str], expected: dict[str, object]) -> None:
    from bench.bench_peers import daemon_options

    options = (
        daemon_options(argparse.ArgumentParser(), None, items, 6.0)
        if "detection.rules_dir=rules/x" not in items
        else None
    )
    if options is not None:
        assert dict(options.overrides) == expected
    from defrag.cli.simulate import parse_sets

    assert parse_sets(items) == expected


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["windows.max_evictions_per_window"], "expected KEY=VALUE"),
        (["planner.bogus=1"], "planner.bogus"),
        (["max_evictions_per_window=3"], "is now windows.max_evictions_per_window"),
    ],
)
def test_a_bad_setting_is_refused(
    items: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.bench_peers import daemon_options

    with pytest.raises(SystemExit) as exc:
        daemon_options(argparse.ArgumentParser(prog="bench_peers"), None, items, 6.0)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
