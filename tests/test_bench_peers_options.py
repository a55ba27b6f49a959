"""bench_peers' ``--hook-option KEY=VALUE``: JSON values, else text; a bad pair is refused."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["window_evictions=256"], {"window_evictions": 256}),
        (["migrate_any_priority=false", "room_worth=2.5"],
         {"migrate_any_priority": False, "room_worth": 2.5}),
        (["rule=rules/x.yaml"], {"rule": "rules/x.yaml"}),  # not JSON: kept as text
    ],
)  # fmt: skip
def test_hook_options_parse(items: list[str], expected: dict[str, object]) -> None:
    import argparse

    from bench.bench_peers import parse_hook_options

    assert parse_hook_options(argparse.ArgumentParser(), items) == expected


def test_a_pair_without_equals_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from bench.bench_peers import parse_hook_options

    with pytest.raises(SystemExit) as exc:
        parse_hook_options(argparse.ArgumentParser(prog="bench_peers"), ["window_evictions"])
    assert exc.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
