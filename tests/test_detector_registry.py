"""The detector registry: what a registration must hold, and the errors when it does not.

The toy detector (tests/support/toy_detector.py) is registered only inside
``registry.registered``; each test leaves the registry and the alert catalog as it found them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import pytest

from defrag.alerting import ALERTS, AlertSpec, NotAlerted
from defrag.detect.findings import Finding
from defrag.detect.settings import RuleName, Seconds
from defrag.detection import run_detection
from defrag.detectors import registry
from defrag.detectors.registry import Detector, RegistryError
from defrag.rules import RulesError, load_rules
from defrag.scoring.profile import ScoringProfile
from tests.support.toy_detector import ALERT, KIND, TOY, HotGpuParams, HotGpuRule

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
BUILT_IN = ("fragmentation", "idle", "leak", "spreading", "starvation")


@pytest.fixture(autouse=True)
def untouched() -> Any:
    """Every test leaves the registry and the alert catalog as they were."""
    names, kinds = registry.names(), ALERTS.kinds()
    yield
    assert registry.names() == names and ALERTS.kinds() == kinds


def test_built_in_detectors_are_registered_with_their_alerts() -> None:
    assert sorted(registry.names()) == sorted(BUILT_IN)
    assert {k: [a.name for a in ALERTS.alerted(k)] for k in BUILT_IN} == {
        "fragmentation": ["GPUNodeFragmented", "GPUClusterFragmented"],
        "idle": [],  # NotAlerted: the gate for execution windows
        "leak": ["GPUMemoryLeakSuspected"],
        "spreading": ["GPUSchedulerSpreads"],
        "starvation": ["GPUJobStarved"],
    }
    # the starvation detector's second kind: a pod no node could ever hold
    assert [a.name for a in ALERTS.alerted("unsatisfiable")] == ["GPUJobUnsatisfiable"]


@dataclass(frozen=True, slots=True)
class NoDefault:
    threshold: float


@dataclass(frozen=True, slots=True)
class Clash:
    query: str = "up"  # HotGpuRule has a field `query`


@dataclass(frozen=True, slots=True)
class AliasClash:
    window_s: Annotated[Seconds, RuleName("query")] = 60.0


def toy(**changes: Any) -> Callable[[], Detector[Any, Any]]:
    return lambda: replace(TOY, **changes)


def anything(finding: Finding) -> bool:
    return True


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (toy(name="leak"), "detector 'leak' is already registered"),
        (toy(name="hot gpu!"), "use letters, digits, - and _"),
        (toy(alerts={}), "declares no finding kind"),
        (toy(alerts={KIND: []}), "finding kind 'hot-gpu' has no alert"),
        (
            toy(alerts={KIND: [AlertSpec("A", when=anything)]}),
            "the last alert must have no 'when'",
        ),
        (
            toy(alerts={KIND: [AlertSpec("A"), AlertSpec("B")]}),
            "only the last alert may omit 'when'",
        ),
        (toy(alerts={"leak": [AlertSpec("A")]}), "'leak' is already registered by detector leak"),
        (toy(alerts={"rule-failed": [AlertSpec("A")]}), "already registered by defrag"),
        (toy(alerts={KIND: [AlertSpec("GPUJobStarved")]}), "'GPUJobStarved' is already in use"),
        (toy(alerts={KIND: [AlertSpec("")]}), "an alert needs a name"),
        (toy(needs=frozenset()), "needs must be 'metrics' and/or 'cluster'"),
        (toy(needs=frozenset({"nvml"})), "needs must be 'metrics' and/or 'cluster'"),
        (toy(settings=NoDefault), "NoDefault.threshold: a setting needs a default"),
        (toy(settings=Clash), "Clash.query: the rule model already has a field 'query'"),
        (toy(settings=AliasClash), "AliasClash.window_s: the rule model already has a field"),
    ],
)
def test_registration_errors(make: Callable[[], Detector[Any, Any]], message: str) -> None:
    with pytest.raises(RegistryError, match=None) as caught:
        registry.register(make())
    assert message in str(caught.value)


def test_a_kind_never_alerted_is_declared_so() -> None:
    quiet = replace(TOY, alerts={KIND: NotAlerted("a gate, not a problem")})
    with registry.registered(quiet):
        finding = Finding(KIND, "gpu/n1/0", "warning", "hot")
        assert ALERTS.spec(finding) is None


def test_unregistered_kind_is_an_error_not_silence() -> None:
    from defrag.alerting import AlertCatalogError, AlertTemplate

    with pytest.raises(AlertCatalogError, match="finding kind 'hot-gpu' has no alert registered"):
        AlertTemplate().alert(Finding(KIND, "gpu/n1/0", "warning", "hot"))
    with registry.registered(TOY):
        alert = AlertTemplate().alert(Finding(KIND, "gpu/n1/0", "warning", "hot"))
        assert alert is not None and alert.name == ALERT


def test_unregister_twice_is_an_error() -> None:
    with pytest.raises(RegistryError, match="no detector 'hot-gpu' is registered"):
        registry.unregister("hot-gpu")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


TOY_RULE = "rules:\n  - name: hot\n    detector: hot-gpu\n    max_celsius: 80\n"


@pytest.mark.parametrize(
    ("text", "registered", "line", "field", "message"),
    [
        # a detector nobody registered: file, line and the known ones
        (TOY_RULE, False, 3, "rules[0].detector", "'hot-gpu' found using 'detector'"),
        ("rules:\n  - name: x\n    detector: magic\n", True, 3, "rules[0].detector", "'hot-gpu'"),
        # the toy's own settings are checked like any detector's
        (TOY_RULE + "    lookback: soon\n", True, 5, "rules[0].lookback", "bad duration 'soon'"),
        (TOY_RULE.replace("80", "-1"), True, 4, "rules[0].max_celsius", "greater than 0"),
        (TOY_RULE + "    lookback_s: 60\n", True, 5, "rules[0].lookback_s", "unknown field"),
        (TOY_RULE + "    name2: x\n", True, 5, "rules[0].name2", "unknown field"),
    ],
)
def test_rule_file_errors_name_file_line_and_field(
    tmp_path: Path, text: str, registered: bool, line: int, field: str, message: str
) -> None:
    path = write(tmp_path, text)
    context = registry.registered(TOY) if registered else nullcontext(TOY)
    with context, pytest.raises(RulesError) as caught:
        load_rules([path])
    [issue] = caught.value.issues
    assert (issue.file, issue.line, issue.field) == (str(path), line, field)
    assert message in issue.message, issue.message


def test_settings_come_from_the_file_and_the_dataclass_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, TOY_RULE + "    lookback: 1h30m\n")
    with registry.registered(TOY):
        [loaded] = load_rules([path]).rules
    assert isinstance(loaded.rule, HotGpuRule)
    assert loaded.rule.query == "DCGM_FI_DEV_GPU_TEMP"  # the edge field's default
    # 1h30m = 5400 s; step and severity: the dataclass's defaults
    assert loaded.rule.params() == HotGpuParams(name="hot", max_celsius=80.0, lookback_s=5400.0)


def test_a_finding_of_an_undeclared_kind_fails_its_rule(tmp_path: Path) -> None:
    def rogue(rule: HotGpuRule, params: HotGpuParams, inputs: registry.Inputs) -> list[Finding]:
        return [Finding("leak", "gpu/n1/0", "warning", "not mine to say")]

    path = write(tmp_path, TOY_RULE)
    with registry.registered(replace(TOY, run=rogue)):
        rules = load_rules([path])
        report = run_detection(rules, Empty(), None, NOW, profile=ScoringProfile.default())
    assert report.findings == ()
    [failure] = report.failures
    assert failure.rule == "hot" and "kind 'leak', not one it declared" in failure.message


def test_a_detector_that_needs_metrics_is_skipped_without(tmp_path: Path) -> None:
    path = write(tmp_path, TOY_RULE)
    with registry.registered(TOY):
        report = run_detection(
            load_rules([path]), None, None, NOW, profile=ScoringProfile.default()
        )
    assert dict(report.skipped) == {"hot": "no metrics source"}


class Empty:
    """A metrics source with no series at all."""

    def instant(self, query: str, at: datetime | None = None) -> list[Any]:
        return []

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Any]:
        return []
