"""The leak rule's label and statistics fields: defaults, single names, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from defrag.detectors.leak.registration import LeakRuleFields
from defrag.detectors.rulemodel import settings_of
from defrag.rules import RulesError, load_rules

HEAD = (
    "rules:\n  - name: l\n    detector: leak\n    queries:\n"
    "      used: DCGM_FI_DEV_FB_USED\n      free: DCGM_FI_DEV_FB_FREE\n"
)


def load(tmp_path: Path, extra: str = "") -> LeakRuleFields:
    (tmp_path / "r.yaml").write_text(HEAD + extra)
    rule = load_rules([tmp_path / "r.yaml"]).rules[0].rule
    assert isinstance(rule, LeakRuleFields)
    return rule


def test_defaults_cover_every_dcgm_variant(tmp_path: Path) -> None:
    labels = settings_of(load(tmp_path).labels)
    assert labels.node == ("Hostname", "hostname", "node", "kubernetes_node", "instance")
    assert labels.uuid == ("UUID", "uuid")
    assert labels.pod == ("exported_pod", "pod_name", "pod")
    assert labels.namespace == ("exported_namespace", "pod_namespace", "namespace")
    assert (labels.gpu_instance, labels.gpu_profile) == ("GPU_I_ID", "GPU_I_PROFILE")


def test_a_single_label_name_is_a_list_of_one(tmp_path: Path) -> None:
    rule = load(tmp_path, "    labels:\n      node: instance\n      uuid: uuid\n")
    assert rule.labels.node == ("instance",) and rule.labels.uuid == ("uuid",)


def test_params_carry_the_statistics_fields(tmp_path: Path) -> None:
    rule = load(tmp_path, "    step: 10m\n    floor_window: 2h\n    max_trend_p: 0.001\n")
    p = rule.params()
    assert (p.bin_s, p.floor_window_s, p.max_trend_p) == (600.0, 7200.0, 0.001)
    assert p.segments == 3 and p.min_persistence == 0.5 and p.cycle_noise == 6.0


@pytest.mark.parametrize(
    ("extra", "line", "field", "message"),
    [
        ("    labels:\n      exporter_pod: '('\n", 8, "rules[0].labels.exporter_pod", "regular"),
        ("    step: 0s\n", 7, "rules[0].step", "greater than 0"),
        ("    min_persistence: 2\n", 7, "rules[0].min_persistence", "less than or equal to 1"),
        ("    queries_reserved: x\n", 7, "rules[0].queries_reserved", "unknown field"),
    ],
)
def test_bad_leak_fields_name_file_line_and_field(
    tmp_path: Path, extra: str, line: int, field: str, message: str
) -> None:
    (tmp_path / "r.yaml").write_text(HEAD + extra)
    with pytest.raises(RulesError) as caught:
        load_rules([tmp_path / "r.yaml"])
    [issue] = caught.value.issues
    assert (issue.line, issue.field) == (line, field)
    assert message in issue.message
