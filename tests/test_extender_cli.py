"""`defrag extender` as a process, against `defrag place` on the same snapshot; `defrag agent`
without a driver."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from tests.support.binaries import free_port
from tests.support.processes import wait_ready

ROOT = Path(__file__).resolve().parents[1]
WORKED = ROOT / "tests" / "fixtures" / "snapshots" / "worked_example.json"


def gpu_pod(gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"job-{gpus}", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ]
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture(scope="module")
def extender_url() -> Iterator[str]:
    port = free_port()
    launcher = "import sys; from defrag.cli import main; sys.argv[0] = 'defrag'; main()"
    cmd = [sys.executable, "-c", launcher, "extender", "--snapshot", str(WORKED)]
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "DEFRAG_LOGGING__LEVEL": "WARNING"},
    )
    wait_ready(proc, port)
    yield f"127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0  # SIGTERM ends it cleanly


def prioritize(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    conn = http.client.HTTPConnection(url, timeout=5)
    conn.request("POST", "/prioritize", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    result: list[dict[str, Any]] = json.loads(resp.read())
    return result


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_extender_ranks_first_what_defrag_place_chooses(extender_url: str, gpus: int) -> None:
    placed = CliRunner().invoke(
        app, ["place", "--snapshot", str(WORKED), "--gpus", str(gpus), "-o", "json"]
    )
    assert placed.exit_code == 0, placed.output
    expected = json.loads(placed.output)["node"]
    names = ["node-1", "node-2", "node-3"]
    scores = prioritize(extender_url, {"pod": gpu_pod(gpus), "nodenames": names})
    top = [h["Host"] for h in scores if h["Score"] == 10]
    assert top == [expected]


def test_worked_example_one_gpu_goes_to_node1(extender_url: str) -> None:
    scores = prioritize(
        extender_url, {"pod": gpu_pod(1), "nodenames": ["node-1", "node-2", "node-3"]}
    )
    # The worked example (docs/concepts.md): node-1 100 (winner → 10), node-3 62 → 6, node-2 0 → 0.
    assert scores == [
        {"Host": "node-1", "Score": 10},
        {"Host": "node-2", "Score": 0},
        {"Host": "node-3", "Score": 6},
    ]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["extender", "--policy", "nope"], 2, "unknown policy 'nope'"),
        (["extender", "--snapshot", "/no/such/file.json"], 2, "/no/such/file.json"),
        (["agent"], 2, "no node name"),
    ],
)
def test_user_errors(args: list[str], code: int, message: str) -> None:
    result = CliRunner().invoke(app, args, env={"NODE_NAME": ""})
    assert result.exit_code == code
    assert message in " ".join(result.output.split())


def test_agent_without_nvml_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    result = CliRunner().invoke(app, ["agent", "--no-publish", "--once"])
    assert result.exit_code == 3
    assert "NVIDIA driver" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metrics-port", "0"], "error: --metrics-port: must be at least 1, got '0'"),
        (
            ["--metrics-host", "127.0.0.1", "--metrics-port", "{port}"],
            "cannot listen on 127.0.0.1:",
        ),
    ],
)
def test_metrics_port_errors_are_one_line(extra: list[str], message: str) -> None:
    """A bad --metrics-port, or one already taken (here: the extender's own --port), is a usage
    error naming the address, and the extender it had started is stopped again."""
    port = free_port()
    args = ["extender", "--snapshot", str(WORKED), "--host", "127.0.0.1", "--port", str(port)]
    result = CliRunner().invoke(app, [*args, *(a.format(port=port) for a in extra)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
