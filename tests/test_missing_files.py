"""A missing file is said one way everywhere: ``[<what> ]<path>: no such file`` (exit 2)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from defrag.cli import app

MISSING = "/nonexistent/defrag-test-file"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["report", "--snapshot", MISSING], f"{MISSING}: no such file"),
        (["plan", "--settings", MISSING, "--snapshot", MISSING], f"{MISSING}: no such file"),
        (["report", "--kubeconfig", MISSING], f"kubeconfig {MISSING}: no such file"),
        (
            ["detect", "--prometheus", "http://127.0.0.1:9", "--prom-ca-file", MISSING],
            f"--prom-ca-file {MISSING}: no such file",
        ),
        (
            [
                "alerts",
                "test",
                "--alertmanager",
                "http://127.0.0.1:9",
                "--am-bearer-token-file",
                MISSING,
            ],
            f"--am-bearer-token-file {MISSING}: no such file",
        ),
    ],
)
def test_a_missing_file_is_said_one_way(argv: list[str], said: str) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any(said in line for line in lines), result.output
    assert "Traceback" not in result.output
