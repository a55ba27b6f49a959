"""``defrag alerts test`` without an Alertmanager: bad options and unreachable URLs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alertmanager", "alertmanager:9093"], "not an Alertmanager URL"),
        (["--alertmanager", "http://am:9093", "--am-basic-auth", "nocolon"], "user:password"),
        (
            ["--alertmanager", "http://am:9093", "--am-bearer-token-file", "/nonexistent/t"],
            "no such file",
        ),
        (["--alertmanager", "http://am:9093", "--am-ca-file", "/nonexistent/ca"], "CA file"),
        (
            [
                "--alertmanager",
                "http://am:9093",
                "--am-basic-auth",
                "u:p",
                "--am-bearer-token-file",
                __file__,
            ],
            "choose one of",
        ),
    ],
)
def test_bad_options_are_one_clear_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["alerts", "test", "--hold", "0", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_unreachable_alertmanager_exits_3_naming_each_url(tmp_path: Path) -> None:
    # port 9 (discard) on 127.0.0.1: nothing listens, the connection is refused at once
    urls = ["http://127.0.0.1:9", "http://user:secret@127.0.0.1:9/prefix"]
    args = ["alerts", "test", "--hold", "0", "-o", "json"]
    for url in urls:
        args += ["--alertmanager", url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3  # none reached: unreachable (docs/cli.md, Exit codes)
    payload = json.loads(result.stdout)
    assert payload["alert"]["alertname"] == "DefragTestAlert"
    assert [(r["url"], r["fired"], r["resolved"]) for r in payload["results"]] == [
        ("http://127.0.0.1:9", False, False),
        ("http://127.0.0.1:9/prefix", False, False),
    ]
    assert all("Connection refused" in r["reason"] for r in payload["results"])
    assert "secret" not in result.output


@pytest.mark.parametrize(
    ("flags", "code", "label", "stderr"),
    [
        (["--cluster-label", "prod-a"], 3, "prod-a", ""),
        ([], 3, "default", ""),
        # the old name still works, with one warning line
        (["--cluster", "prod-a"], 3, "prod-a", "warning: --cluster (the alert label) is deprec"),
        (["--cluster", "a", "--cluster-label", "b"], 2, None, "error: --cluster is the old name"),
    ],
)
def test_the_alert_label_is_cluster_label(
    flags: list[str], code: int, label: str | None, stderr: str
) -> None:
    """``--cluster`` means kube/sim in ``run``; the alert label is ``--cluster-label``."""
    args = ["alerts", "test", "--hold", "0", "--alertmanager", "http://127.0.0.1:9", *flags]
    result = CliRunner().invoke(app, [*args, "-o", "json"])
    assert result.exit_code == code, result.output
    assert stderr in result.stderr
    if label is not None:
        assert json.loads(result.stdout)["alert"]["cluster"] == label
    help_text = CliRunner().invoke(app, ["detect", "--help"]).stdout
    assert "--cluster-label" in help_text and "--cluster " not in help_text
