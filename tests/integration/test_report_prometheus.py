"""`defrag report --prometheus`: the snapshot's fragmentation plus utilisation and leak suspects
from the real Prometheus, on a backfilled DCGM history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from tests.support.prometheus import END, make_fleet, prometheus_server, write_openmetrics

pytestmark = pytest.mark.integration
SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "worked_example.json"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("om") / "history.om"
    with path.open("w") as out:
        write_openmetrics(make_fleet(["leak", "flat", "plateau"], hours=8, step_s=30), out)
    with prometheus_server(path) as server:
        yield server.url


def test_report_adds_utilisation_and_leak_suspects(prom: str) -> None:
    result = CliRunner().invoke(
        app,
        [
            "report",
            "-s",
            str(SNAPSHOT),
            "--prometheus",
            prom,
            "--at",
            END.isoformat(),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["largest_placeable_job"] == 8  # node-2 of the worked example is entirely free
    util = data["utilisation"]
    # every GPU of the fleet at ~10% (sd 2): the percentiles read from the series, in order
    assert 9.0 < util["p50"] < 11.0 and util["p50"] <= util["p90"] <= util["p99"] < 20.0
    # exactly the leaking GPU's pod is a suspect; the flat and plateau GPUs are not
    assert [s["subject"] for s in data["leak_suspects"]] == ["pod/ml/leak-0"]


def test_the_table_says_them_in_words_not_python(prom: str) -> None:
    """Before: ``utilisation: {'p50': …}`` and ``leak_suspects: [{…}]`` — Python's reprs of
    the JSON fields. Now a sentence for the percentiles and a table of the suspects."""
    args = ["report", "-s", str(SNAPSHOT), "--prometheus", prom, "--at", END.isoformat()]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for repr_ in ("{'", "[{", "None", "utilisation:", "leak_suspects:"):
        assert repr_ not in out, (repr_, out)
    assert "GPU utilisation over the last 24 h (" in out and "p50 " in out
    assert "# GPU memory leak suspects" in out and "pod/ml/leak-0" in out
