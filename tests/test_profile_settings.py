"""One settings file configures the scoring profile of the daemon, the extender and the CLI
(issue 13): ``--settings`` on ``place``, ``plan``, ``report``, ``detect`` and ``extender``,
``DEFRAG_SCORING__POLICY`` from the environment, ``--policy`` overriding both."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from defrag.cli import app
from defrag.scoring.profile import ProfileConfig
from defrag.settings import load_settings
from tests.support.binaries import free_port
from tests.support.processes import wait_ready

ROOT = Path(__file__).resolve().parents[1]
WORKED = ROOT / "tests" / "fixtures" / "snapshots" / "worked_example.json"
# The worked example (docs/concepts.md): node-1 has 1 free GPU, node-2 8, node-3 4. A 1-GPU pod
# goes to node-1 under reserve-binpack (the fullest that fits), to the free node-2 under
# least-allocated (most free), to node-1 under best-fit (least left over).
EXPECTED = {"reserve-binpack": "node-1", "least-allocated": "node-2", "best-fit": "node-1"}


MAGIC = "scoring:\n  policy: magic\n"
LEAST = "scoring:\n  policy: least-allocated\n"


def settings_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("file_text", "env", "flags", "policy"),
    [
        ("", {}, [], "reserve-binpack"),  # nothing configured: the default
        (LEAST, {}, [], "least-allocated"),  # the file
        ("", {"DEFRAG_SCORING__POLICY": "least-allocated"}, [], "least-allocated"),  # the env
        (LEAST, {}, ["--policy", "best-fit"], "best-fit"),  # the flag wins
    ],
)
def test_place_and_plan_score_with_the_configured_profile(
    tmp_path: Path, file_text: str, env: dict[str, str], flags: list[str], policy: str
) -> None:
    path = settings_file(tmp_path, file_text)
    common = ["--snapshot", str(WORKED), "--settings", str(path), *flags, "-o", "json"]
    placed = CliRunner().invoke(app, ["place", "--gpus", "1", *common], env=env)
    assert placed.exit_code == 0, placed.output
    answer = json.loads(placed.output)
    assert (answer["policy"], answer["node"]) == (policy, EXPECTED[policy])
    planned = CliRunner().invoke(app, ["plan", *common], env=env)
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["policy"] == policy


@pytest.mark.parametrize(
    ("command", "file_text", "flags", "message"),
    [
        (["place"], MAGIC, [], "setting scoring.policy ({file}): unknown policy 'magic'"),
        (["plan"], "scoring:\n  seed: -1\n", [], "setting scoring.seed ({file}): "),
        (["report"], "polcy: fgd\n", [], "setting polcy ({file}): unknown setting"),
        (["detect"], MAGIC, [], "setting scoring.policy ({file}): unknown policy 'magic'"),
        (["extender"], MAGIC, [], "setting scoring.policy ({file}): unknown policy 'magic'"),
        (["place"], "", ["--policy", "magic"], "--policy: unknown policy 'magic'"),
    ],
)
def test_bad_settings_are_one_line_naming_file_and_field(
    tmp_path: Path, command: list[str], file_text: str, flags: list[str], message: str
) -> None:
    path = settings_file(tmp_path, file_text)
    args = [*command, "--snapshot", str(WORKED), "--settings", str(path), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert message.format(file=path) in result.output


def test_settings_give_one_profile_config() -> None:
    settings = load_settings(None, {"scoring.policy": "random", "scoring.seed": 7})
    assert settings.profile_config() == ProfileConfig("random", 7)
    assert settings.profile_config("fgd") == ProfileConfig("fgd", 7)


def test_the_extender_process_scores_with_the_settings_file(tmp_path: Path) -> None:
    """`defrag extender --settings` ranks first what `defrag place --settings` chooses."""
    path = settings_file(tmp_path, LEAST)
    port = free_port()
    launcher = "import sys; from defrag.cli import main; sys.argv[0] = 'defrag'; main()"
    args = ["extender", "--snapshot", str(WORKED), "--settings", str(path)]
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, *args, "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "DEFRAG_LOGGING__LEVEL": "WARNING"},
    )
    try:
        wait_ready(proc, port)
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "job-1", "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "trainer", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"},
        }  # fmt: skip
        body = {"pod": pod, "nodenames": ["node-1", "node-2", "node-3"]}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/prioritize", json.dumps(body), {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    top = [h["Host"] for h in answer if h["Score"] == 10]
    placed = CliRunner().invoke(
        app, ["place", "--snapshot", str(WORKED), "--settings", str(path), "-o", "json"]
    )
    assert top == [json.loads(placed.output)["node"]] == [EXPECTED["least-allocated"]]
