"""bench_peers with the stated checkpoint-capability model: the defrag rows run with the
handshake (``--handshake-share``, 0.5 by default), the peers never ask, ``--compare-handshake``
adds each defrag row without it, and the table says which rows had it.

The runs replay a 45-node synthetic slice (tests/test_timeline_events.py's: queues, starved
pods and evictions within a few simulated hours) instead of the openb trace, so they take
seconds and need no data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bench.bench_peers as bench_peers
from bench import data
from defrag.sim.synthetic import WorkloadParams, synthetic_nodes, synthetic_pods

NODES = tuple(synthetic_nodes(0.3))
PARAMS = WorkloadParams(kinds={"cpu": 0.1, "share": 0.3, "1": 0.4, "2": 0.06, "4": 0.06, "8": 0.08})
SHAPES = tuple(synthetic_pods(120, seed=5, params=PARAMS))
SMALL = ["--hours", "4", "--warmup", "2", "--seeds", "1", "--load", "1.1", "--window-every", "2"]
SMALL += ["--jobs", "1"]


@pytest.fixture(autouse=True)
def _slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "require", lambda folder, names: folder)
    monkeypatch.setattr(bench_peers, "load_trace", lambda folder, trace: (NODES, SHAPES))


def peers(tmp_path: Path, name: str, *args: str) -> tuple[str, dict[tuple[str, str], Any]]:
    """The table and the JSON runs by (policy, row) of one bench_peers run."""
    table, runs = tmp_path / f"{name}.md", tmp_path / f"{name}.json"
    assert bench_peers.main([*SMALL, *args, "--out", str(table), "--json", str(runs)]) == 0
    rows = json.loads(runs.read_text(encoding="utf-8"))
    return table.read_text(encoding="utf-8"), {(r["policy"], r["defragmenter"]): r for r in rows}


def cells(table: str) -> dict[tuple[str, str], dict[str, str]]:
    """The markdown table's rows by (policy, defragmenter), each cell by its column."""
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[1:]]  # fmt: skip
    return {(r["policy"], r["defragmenter"]): r for r in rows}


def same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two runs alike in everything but their name and the time they took."""
    skip = {"seconds", "defragmenter"}
    return {k: v for k, v in a.items() if k not in skip} == {
        k: v for k, v in b.items() if k not in skip
    }


def test_the_defrag_rows_with_and_without_the_handshake_in_one_table(tmp_path: Path) -> None:
    names = "none,defrag,kai-consolidation,defrag-blind"
    table, runs = peers(
        tmp_path, "both", "--policies", "least-allocated,best-fit", "--defragmenters", names,
        "--compare-handshake",
    )  # fmt: skip
    handshake = {key: row["handshake"] for key, row in cells(table).items()}
    for policy in ("least-allocated", "best-fit"):
        assert handshake == handshake | {
            (policy, "none"): "—",
            (policy, "defrag"): "50%",
            (policy, "defrag (no handshake)"): "off",
            (policy, "kai-consolidation"): "—",
            (policy, "defrag-blind"): "50%",  # made once, shown under each policy
            (policy, "defrag-blind (no handshake)"): "off",
        }
    assert len(handshake) == 12
    assert "checkpoint handshake in the defrag rows (50% of training/batch pods answer" in table
    # what each run ran with: the stated share and stalls in the defrag rows, nothing else
    on = runs[("least-allocated", "defrag")]["cost"]
    assert on["checkpoint_handshake_share"] == 0.5
    assert on["training"]["checkpoint_stall_h"] == pytest.approx(2 / 60, abs=1e-4)
    assert on["batch"]["checkpoint_stall_h"] == pytest.approx(1 / 60, abs=1e-4)
    for row in ("defrag (no handshake)", "kai-consolidation", "none"):
        assert "checkpoint_handshake_share" not in runs[("least-allocated", row)]["cost"]
    # the handshake acted: defrag's row with it is not its row without it
    with_it = runs[("least-allocated", "defrag")]
    assert with_it["evictions"] > 0
    assert not same_run(with_it, runs[("least-allocated", "defrag (no handshake)")])

    # The same bench with the handshake off: its defrag row is the row "without" above (the
    # same arrivals and draws), and the rows that never ask are the same runs in both.
    off_table, off = peers(
        tmp_path, "off", "--policies", "least-allocated", "--defragmenters",
        "none,defrag,kai-consolidation", "--handshake-share", "0",
    )  # fmt: skip
    assert "no checkpoint handshake" in off_table
    assert {k: r["handshake"] for k, r in cells(off_table).items()} == {
        ("least-allocated", "none"): "—",
        ("least-allocated", "defrag"): "off",
        ("least-allocated", "kai-consolidation"): "—",
    }
    assert same_run(
        off[("least-allocated", "defrag")], runs[("least-allocated", "defrag (no handshake)")]
    )
    for row in ("none", "kai-consolidation"):
        assert same_run(off[("least-allocated", row)], runs[("least-allocated", row)])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--handshake-share", "1.5"], "--handshake-share: expected a share in [0, 1]"),
        (["--handshake-share", "0", "--compare-handshake"], "the handshake is off"),
    ],
)
def test_a_bad_handshake_option_is_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_peers.main([*SMALL, *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
