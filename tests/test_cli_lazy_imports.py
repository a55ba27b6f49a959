"""Building the ``defrag`` app and printing any help imports no heavy library (issue 22, C).

Each command imports what it needs when it runs; ``defrag --help``, ``--version`` and every
``defrag COMMAND --help`` stay fast. The check is structural (what is in ``sys.modules`` after
the help of every command), not a timing: docs/benchmarks.md has the timing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("scipy", "numpy", "kubernetes", "matplotlib", "prometheus_api_client", "defrag.sim")

# One child process: a fresh interpreter, so nothing a test imported earlier hides a regression.
_CHILD = r"""
import json, sys
from typer.main import get_command
from typer.testing import CliRunner
from defrag.cli import app

runner = CliRunner()
command = get_command(app)
paths = [[]]
for name, sub in command.commands.items():
    paths.append([name])
    for inner in getattr(sub, "commands", {}):
        paths.append([name, inner])
codes = {}
for path in paths:
    result = runner.invoke(app, [*path, "--help"])
    codes[" ".join(path) or "defrag"] = result.exit_code
codes["--version"] = runner.invoke(app, ["--version"]).exit_code
heavy = %r
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps({"codes": codes, "loaded": loaded}))
"""


def _child() -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD % (HEAVY,)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def child() -> dict[str, object]:
    return _child()


def test_help_of_every_command_imports_no_heavy_library(child: dict[str, object]) -> None:
    assert child["loaded"] == []


def test_every_command_help_answers(child: dict[str, object]) -> None:
    codes = child["codes"]
    assert isinstance(codes, dict)
    # the root, every command and every command of a group (rules check, alerts test, data …)
    for name in ("defrag", "detect", "run", "simulate", "plan", "report", "rules check",
                 "alerts test", "data fetch", "--version"):
        assert codes.get(name) == 0, (name, codes)
    assert all(code == 0 for code in codes.values()), codes


def test_the_names_the_help_shows_are_the_registries() -> None:
    from defrag.cli import names
    from defrag.model.units import GPU_MILLI
    from defrag.plan.model import GOALS
    from defrag.scoring.policies import DEFAULT_POLICY, POLICY_NAMES
    from defrag.sim.defragmenters import DEFRAGMENTERS

    assert names.POLICY_NAMES == POLICY_NAMES
    assert names.DEFAULT_POLICY == DEFAULT_POLICY
    assert names.DEFRAGMENTERS == DEFRAGMENTERS
    assert names.GOALS == GOALS
    assert names.GPU_MILLI == GPU_MILLI
