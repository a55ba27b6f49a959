"""Rule files: the shipped ones load; every kind of mistake names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from defrag.rules import RulesError, load_rules, parse_duration

ROOT = Path(__file__).resolve().parents[1]

GOOD_LEAK = """\
rules:
  - name: leak
    detector: leak
    queries:
      used: DCGM_FI_DEV_FB_USED
      free: DCGM_FI_DEV_FB_FREE
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_rules_load_one_file_per_detector() -> None:
    rules = load_rules([ROOT / "rules"])
    assert sorted(r.rule.detector for r in rules) == [
        "fragmentation",
        "idle",
        "leak",
        "spreading",
        "starvation",
        "starvation",
        "starvation",
    ]
    # high priority first (it speaks for a pod both find), then any priority, fragmented only,
    # then any priority, unsatisfiable only (never make-room)
    high, fragmented, never = (r.rule.params() for r in rules.enabled("starvation"))
    assert (high.name, high.any_priority, high.every_reason) == (
        "high-priority-starved",
        False,
        True,
    )
    assert (fragmented.name, fragmented.any_priority) == ("fragmented-starved", True)
    assert fragmented.reasons == {"fragmented"} and fragmented.for_s == 1800.0
    assert (never.name, never.any_priority, never.reasons, never.action) == (
        "unsatisfiable-pending",
        True,
        {"unsatisfiable"},
        "alert",
    )
    leak = rules.enabled("leak")[0]
    assert leak.rule.params().lookback_s == 6 * 3600  # "6h"
    assert leak.file.endswith("leak.yaml") and leak.line == 4


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        # wrong type
        (GOOD_LEAK + "    max_trend_p: lots\n", 7, "rules[0].max_trend_p", "valid number"),
        # unknown detector
        ("rules:\n  - name: x\n    detector: magic\n", 3, "rules[0].detector", "magic"),
        # bad duration
        (GOOD_LEAK + "    lookback: 6 hours\n", 7, "rules[0].lookback", "bad duration"),
        # a typo'd field
        (GOOD_LEAK + "    horizn: 2h\n", 7, "rules[0].horizn", "unknown field"),
        # a required query missing: reported at the mapping that lacks it
        (
            "rules:\n  - name: l\n    detector: leak\n    queries:\n      used: X\n",
            5,
            "rules[0].queries.free",
            "required field missing",
        ),
        # out of range
        (
            GOOD_LEAK + "    max_trend_p: 1.5\n",
            7,
            "rules[0].max_trend_p",
            "less than or equal to 1",
        ),
        # the policy moved to the settings: the error says where (issue 13)
        (
            "rules:\n  - name: s\n    detector: starvation\n    policy: fgd\n",
            4,
            "rules[0].policy",
            "configured once, in the settings",
        ),
        # a field no detector has is still just unknown
        (
            "rules:\n  - name: s\n    detector: starvation\n    polcy: fgd\n",
            4,
            "rules[0].polcy",
            "unknown field",
        ),
        # a starvation rule's reasons are the diagnosis's, and at least one
        (
            "rules:\n  - name: s\n    detector: starvation\n    reasons: [fragmentd]\n",
            4,
            "rules[0].reasons[0]",
            "'fragmented', 'insufficient-gpus', 'constrained', 'placeable' or 'unsatisfiable'",
        ),
        (
            "rules:\n  - name: s\n    detector: starvation\n    reasons: []\n",
            4,
            "rules[0].reasons",
            "at least 1 item",
        ),
        # make-room-now (execute outside windows) is for starvation rules only
        (GOOD_LEAK + "    action: make-room-now\n", 7, "rules[0].action", "'make-room'"),
        # YAML syntax
        ("rules:\n  - name: [x\n", 3, "", "YAML syntax"),
        # not a mapping
        ("- just\n- a list\n", 1, "", "mapping with a 'rules:' list"),
    ],
)
def test_bad_rule_file_reports_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RulesError) as caught:
        load_rules([path])
    [issue] = caught.value.issues
    assert (issue.file, issue.line, issue.field) == (str(path), line, field)
    assert message in issue.message
    assert str(issue).startswith(f"{path}:{line}:")


def test_a_starvation_rule_may_make_room_now(tmp_path: Path) -> None:
    text = "rules:\n  - name: s\n    detector: starvation\n    action: make-room-now\n"
    path = write(tmp_path, text)
    [loaded] = load_rules([path])
    assert loaded.rule.params().action == "make-room-now"  # type: ignore[union-attr]


def test_all_errors_of_all_files_are_reported(tmp_path: Path) -> None:
    write(tmp_path, GOOD_LEAK + "    max_trend_p: x\n    step: soon\n", "a.yaml")
    second = GOOD_LEAK.replace("name: leak", "name: leak2") + "    horizon: never\n"
    write(tmp_path, second, "b.yaml")
    with pytest.raises(RulesError) as caught:
        load_rules([tmp_path])
    where = sorted((Path(i.file).name, i.line, i.field) for i in caught.value.issues)
    assert where == [
        ("a.yaml", 7, "rules[0].max_trend_p"),
        ("a.yaml", 8, "rules[0].step"),
        ("b.yaml", 7, "rules[0].horizon"),
    ]


def test_duplicate_names_across_files(tmp_path: Path) -> None:
    write(tmp_path, GOOD_LEAK, "a.yaml")
    write(tmp_path, GOOD_LEAK, "b.yaml")
    with pytest.raises(RulesError, match=r"b.yaml:2: name: duplicate rule name 'leak'"):
        load_rules([tmp_path])


def test_prometheus_rules_subdirectory_is_not_read(tmp_path: Path) -> None:
    write(tmp_path, GOOD_LEAK)
    (tmp_path / "prometheus").mkdir()
    write(tmp_path / "prometheus", "groups: []\n", "alerts.yaml")
    assert len(load_rules([tmp_path])) == 1


def test_no_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="no rule files found"):
        load_rules([tmp_path])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("1h30m", 5400), ("2d", 172800), ("500ms", 0.5), (90, 90)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "6 hours", "h", "-5", "1x", True, -3])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)
