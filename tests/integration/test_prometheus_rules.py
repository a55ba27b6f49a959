"""The Prometheus recording/alerting rules pass ``promtool check rules`` and their unit tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.binaries import require_binary

pytestmark = pytest.mark.integration

PROM_RULES = Path(__file__).resolve().parents[2] / "rules" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, check=False
    )


def test_rules_are_valid() -> None:
    done = promtool("check", "rules", str(PROM_RULES / "defrag.rules.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 24 rules found" in done.stdout
    done = promtool("check", "rules", str(PROM_RULES / "defrag.detection.rules.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


UNIT_TESTS = sorted(PROM_RULES.glob("tests/*.yaml"))


def test_the_rules_have_unit_tests() -> None:
    """An empty glob would make the test below an empty parameter set: skipped, not failed."""
    wanted = {"defrag.rules.test.yaml", "defrag.detection.rules.test.yaml"}
    assert {p.name for p in UNIT_TESTS} >= wanted, UNIT_TESTS


@pytest.mark.parametrize("test_file", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    done = promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The unit tests can fail: expecting the low-priority pod to alert is caught."""
    text = (PROM_RULES / "tests" / "defrag.rules.test.yaml").read_text()
    broken = text.replace(
        "pod: urgent\n              priority_class: high-priority",
        "pod: batch\n              priority_class: low",
    )
    assert broken != text
    target = tmp_path / "tests"
    target.mkdir()
    (target / "t.yaml").write_text(
        broken.replace("../defrag.rules.yaml", str(PROM_RULES / "defrag.rules.yaml"))
    )
    done = promtool("test", "rules", str(target / "t.yaml"))
    assert done.returncode != 0
    assert "DefragHighPriorityPodStarved" in done.stdout + done.stderr
