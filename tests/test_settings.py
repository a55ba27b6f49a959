"""Settings: file, then environment, then flags; every bad value names its field and source."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from defrag.settings import (
    RENAMED,
    SECTIONS,
    SETTING_NAMES,
    Settings,
    SettingsError,
    env_name,
    load_settings,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("DEFRAG_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str, name: str = "defrag.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_are_safe() -> None:
    s = load_settings()
    assert s.execution.dry_run is True and s.windows.schedule == []
    assert s.execution.dry_run_events is False
    assert s.daemon.ready_age_limit_s == 900.0  # 3 × the 300 s cycle interval


def test_flag_beats_environment_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        "daemon:\n  cycle_interval_s: 30\nscoring:\n  policy: fgd\n"
        "windows:\n  max_evictions_per_node: 3\n",
    )
    monkeypatch.setenv("DEFRAG_DAEMON__CYCLE_INTERVAL_S", "45")
    monkeypatch.setenv("DEFRAG_EXECUTION__DRY_RUN", "false")
    s = load_settings(path, {"execution.dry_run": True, "scoring.policy": None})
    assert s.daemon.cycle_interval_s == 45.0  # env over file
    assert s.execution.dry_run is True  # flag over env
    assert s.scoring.policy == "fgd" and s.windows.max_evictions_per_node == 3  # file
    # the environment fills one field of a section the file gives in part
    assert s.windows.max_evictions_per_window == 10


def test_a_flag_may_give_a_section_mapping() -> None:
    s = load_settings(None, {"windows": {"max_evictions_per_node": 2, "idle_gate": None}})
    assert s.windows.max_evictions_per_node == 2 and s.windows.idle_gate is False


def test_windows_from_json_file_and_env_style_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"DEFRAG_WINDOWS__SCHEDULE": [{"cron": "0 2 * * 1-5", "length_s": 3600, "timezone": '
        '"Europe/Berlin"}], "windows": {"idle-gate": true}}',
        "s.json",
    )
    s = load_settings(path)
    assert s.windows.idle_gate is True
    w = s.windows.schedule[0]
    assert (w.cron, w.length_s, w.timezone) == ("0 2 * * 1-5", 3600.0, "Europe/Berlin")


# --- every section, in the file and in the environment --------------------------------------

SECTION_SAMPLES: dict[str, tuple[str, str, Any]] = {
    # section: (field, the text given, the value read)
    "cluster": ("name", "prod-eu", "prod-eu"),
    "prometheus": ("timeout_s", "30s", 30.0),
    "alerts": ("resend_interval_s", "2m", 120.0),
    "detection": ("rules_dir", "/etc/defrag/rules", "/etc/defrag/rules"),
    "daemon": ("cycle_interval_s", "10m", 600.0),
    "scoring": ("seed", "7", 7),
    "planner": ("make_room_worth", "2.5", 2.5),
    "windows": ("max_evictions_per_namespace", "3", 3),
    "execution": ("batch_size", "2", 2),
    "leadership": ("lease_name", "defrag-eu", "defrag-eu"),
    "http": ("port", "9090", 9090),
    "logging": ("level", "DEBUG", "DEBUG"),
    "sim": ("speedup", "120", 120.0),
}


def test_every_section_has_a_sample() -> None:
    assert set(SECTION_SAMPLES) == set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SECTION_SAMPLES))
def test_each_section_in_the_file(tmp_path: Path, section: str) -> None:
    field, text, value = SECTION_SAMPLES[section]
    s = load_settings(write(tmp_path, f"{section}:\n  {field}: '{text}'\n"))
    assert getattr(getattr(s, section), field) == value


@pytest.mark.parametrize("section", sorted(SECTION_SAMPLES))
def test_each_section_in_the_environment(monkeypatch: pytest.MonkeyPatch, section: str) -> None:
    field, text, value = SECTION_SAMPLES[section]
    name = f"DEFRAG_{section.upper()}__{field.upper()}"
    assert env_name(f"{section}.{field}") == name
    monkeypatch.setenv(name, text)
    assert getattr(getattr(load_settings(), section), field) == value


# --- the old flat layout ----------------------------------------------------------------------

OLD_SAMPLES: dict[str, str] = {
    "cluster": "sim",
    "windows": "[]",
    "alertmanager_urls": "[http://am:9093]",
    "evict_namespaces_include": "[a]",
    "evict_namespaces_exclude": "[b]",
    "evict_owner_kinds": "[TFJob.kubeflow.org]",
}


def test_the_old_names_table_covers_every_setting_once() -> None:
    assert len(RENAMED) == len(set(RENAMED.values()))  # one new place each
    assert set(RENAMED.values()) <= set(SETTING_NAMES)
    # every setting of the old layout has its new place (the new planner knobs had none)
    new = {"depth", "min_gain_per_cost", "candidates", "tries", "max_moves_per_room"}
    new |= {"max_rooms_per_cycle", "repack_on_demand", "unknown_hours"}
    new |= {"make_room_value", "make_room_horizon_s", "evict_again_after_s"}
    early = {f"windows.open_early_{n}" for n in ("backlog_gpu_h", "every_s", "length_s")}
    later = {"prometheus.concurrent_queries"}
    assert (
        set(SETTING_NAMES) - set(RENAMED.values()) == {f"planner.{n}" for n in new} | early | later
    )


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_flat_key_in_the_file_is_one_line_naming_its_new_place(
    tmp_path: Path, old: str
) -> None:
    path = write(tmp_path, f"{old}: {OLD_SAMPLES.get(old, '1')}\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    assert str(info.value) == (f'{path}: {old} is now {RENAMED[old]} (docs/daemon.md, "Settings")')


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_flat_variable_is_one_line_naming_its_new_name(
    monkeypatch: pytest.MonkeyPatch, old: str
) -> None:
    monkeypatch.setenv(f"DEFRAG_{old.upper()}", "1")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value) == (
        f'env DEFRAG_{old.upper()} is now {env_name(RENAMED[old])} (docs/daemon.md, "Settings")'
    )


def test_old_keys_together_are_still_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "max_evictions_per_window: 10\nDEFRAG_DRY_RUN: false\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    assert str(info.value) == (
        f"{path}: max_evictions_per_window is now windows.max_evictions_per_window; "
        'DEFRAG_DRY_RUN is now execution.dry_run (docs/daemon.md, "Settings")'
    )


def test_an_old_flat_flag_names_its_new_key() -> None:
    with pytest.raises(SettingsError, match=r"^flag dry_run is now execution\.dry_run \(docs"):
        load_settings(None, {"dry_run": False})


def test_the_cli_prints_an_old_key_as_one_error_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from defrag.cli import app

    path = write(tmp_path, "cluster: sim\n")
    result = CliRunner().invoke(app, ["run", "--once", "--settings", str(path)])
    assert result.exit_code == 2
    assert [line for line in result.output.splitlines() if line.strip()] == [
        f'error: {path}: cluster is now cluster.kind (docs/daemon.md, "Settings")'
    ]


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "execution:\n  batch_size: 0\n",
            {},
            "setting execution.batch_size ({file}): Input should be greater than or equal to 1",
        ),
        (
            "",
            {"DEFRAG_DAEMON__CYCLE_INTERVAL_S": "soon"},
            "setting daemon.cycle_interval_s (env DEFRAG_DAEMON__CYCLE_INTERVAL_S): cannot read "
            "'soon': expected a duration such as 90s",
        ),
        (
            "windows:\n  schedule:\n    - {cron: '61 * * * *', length_s: 60}\n",
            {},
            "setting windows.schedule.0.cron ({file}): not a crontab expression",
        ),
        (
            "windows:\n  schedule:\n    - {cron: '0 2 * * *', length_s: 60, timezone: "
            "Mars/Olympus}\n",
            {},
            "setting windows.schedule.0.timezone ({file}): unknown time zone 'Mars/Olympus'",
        ),
        (
            "windows:\n  schedule:\n    - {cron: '0 2 * * *'}\n",
            {},
            "setting windows.schedule.0.length_s ({file}): Field required",
        ),
        (
            "polcy: fgd\n",
            {},
            "setting polcy ({file}): unknown setting; did you mean scoring.policy?",
        ),
        (
            "planner:\n  make_room_wrth: 2\n",
            {},
            "setting planner.make_room_wrth ({file}): unknown setting; did you mean "
            "planner.make_room_worth?",
        ),
        ("planner: 5\n", {}, "setting planner ({file}): expected a mapping of the planner"),
        (
            "scoring:\n  policy: magic\n",
            {},
            "setting scoring.policy ({file}): unknown policy 'magic'; known: ",
        ),
        (
            "alerts:\n  urls: [http://am:9093]\ndaemon:\n  cycle_interval_s: 1200\n",
            {},
            "alerts.ttl_s (900) must exceed",
        ),
        (
            "planner:\n  evict_label_selector: 'a in (b'\n",
            {},
            "setting planner.evict_label_selector ({file}): ",
        ),
        (
            "alerts:\n  runbook_url: docs/alerts.md\n",
            {},
            "setting alerts.runbook_url ({file}): expected an absolute http(s) URL",
        ),
        (
            "execution:\n  replacement_timeout_s: 11y\n",
            {},
            "setting execution.replacement_timeout_s ({file}): ",
        ),
    ],
)
def test_bad_settings_name_field_and_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, env: dict[str, str], message: str
) -> None:
    path = write(tmp_path, text)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    assert message.format(file=path) in str(info.value)


def test_a_bad_flag_names_the_flag() -> None:
    with pytest.raises(SettingsError, match=r"setting planner\.min_pod_age_s \(flag\): "):
        load_settings(None, {"planner.min_pod_age_s": "soon"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("daemon:\n  cycle_interval_s: [1\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
    ],
)
def test_malformed_files_name_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError, match=message) as info:
        load_settings(path)
    assert str(info.value).startswith(str(path))


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"absent\.yaml: no such file"):
        load_settings(tmp_path / "absent.yaml")


def test_environment_lists_and_durations_in_their_short_forms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The hint the demo prints (a bare URL) and a comma-separated pair both work, as does JSON.
    monkeypatch.setenv("DEFRAG_ALERTS__URLS", "http://am-0:9093, http://am-1:9093")
    monkeypatch.setenv("DEFRAG_WINDOWS__SCHEDULE", "0 2 * * * 1h; 0 14 * * 6 90m")
    monkeypatch.setenv("DEFRAG_DAEMON__CYCLE_INTERVAL_S", "5m")
    monkeypatch.setenv("DEFRAG_ALERTS__TTL_S", "1h30m")
    s = load_settings()
    assert s.alerts.urls == ["http://am-0:9093", "http://am-1:9093"]
    assert [(w.cron, w.length_s) for w in s.windows.schedule] == [
        ("0 2 * * *", 3600.0),
        ("0 14 * * 6", 5400.0),
    ]
    assert (s.daemon.cycle_interval_s, s.alerts.ttl_s) == (300.0, 5400.0)  # 5×60; 3600 + 30×60
    monkeypatch.setenv("DEFRAG_ALERTS__URLS", '["http://am:9093"]')
    monkeypatch.setenv("DEFRAG_WINDOWS__SCHEDULE", '[{"cron": "0 3 * * *", "length_s": "2h"}]')
    monkeypatch.setenv("DEFRAG_PLANNER__EVICT_NAMESPACES_EXCLUDE", "kube-system, monitoring")
    s = load_settings()
    assert s.alerts.urls == ["http://am:9093"]
    assert [(w.cron, w.length_s) for w in s.windows.schedule] == [("0 3 * * *", 7200.0)]
    assert s.planner.evict_namespaces_exclude == ["kube-system", "monitoring"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DEFRAG_ALERTS__URLS": '["http://am:9093"'},
            "setting alerts.urls (env DEFRAG_ALERTS__URLS): not a JSON list",
        ),
        (
            {"DEFRAG_WINDOWS__SCHEDULE": "0 2 * * *"},
            "setting windows.schedule (env DEFRAG_WINDOWS__SCHEDULE): cannot read '0 2 * * *': "
            "expected five cron fields and a length",
        ),
        (
            {"DEFRAG_WINDOWS__SCHEDULE": "0 2 * * * soon"},
            "setting windows.schedule (env DEFRAG_WINDOWS__SCHEDULE): cannot read 'soon': "
            "expected a duration",
        ),
        (
            {"DEFRAG_EXECUTION__DRY_RUN": "maybe"},
            "setting execution.dry_run (env DEFRAG_EXECUTION__DRY_RUN): cannot read 'maybe': "
            "expected true or false",
        ),
        (
            {"DEFRAG_EXECUTION__POLL_INTERVAL_S": "-5s"},
            "setting execution.poll_interval_s (env DEFRAG_EXECUTION__POLL_INTERVAL_S): cannot "
            "read '-5s'",
        ),
        (
            {"DEFRAG_EXECUTION__DRYRUN": "false"},
            "env DEFRAG_EXECUTION__DRYRUN: unknown setting; did you mean "
            "DEFRAG_EXECUTION__DRY_RUN?",
        ),
        (
            {"DEFRAG_EXECUTION": '{"dry_run": false}'},
            "env DEFRAG_EXECUTION: unknown setting",
        ),
    ],
)
def test_bad_environment_settings_are_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# --- what the settings build ------------------------------------------------------------------


def test_the_new_planner_knobs_land_in_the_planner_config(tmp_path: Path) -> None:
    from defrag.plan.config import DEFAULT_OPTIONS
    from defrag.plan.cost import DEFAULT_COST

    options = Settings().planner_config().options
    # the daemon's defaults: the planner's own but for a bounded, on-demand cycle plan
    assert options == replace(DEFAULT_OPTIONS, max_rooms=32, repack_on_demand=True)
    path = write(
        tmp_path,
        "planner:\n  depth: 2\n  min_gain_per_cost: 0.1\n  candidates: 16\n  tries: 4\n"
        "  max_moves_per_room: 6\n  max_rooms_per_cycle: null\n  repack_on_demand: false\n"
        "  unknown_hours: 2\n",
    )
    options = load_settings(path).planner_config().options
    assert (options.depth, options.min_gain_per_cost, options.candidates, options.tries) == (
        2,
        0.1,
        16,
        4,
    )
    assert (options.max_moves_per_room, options.max_rooms, options.repack_on_demand) == (
        6,
        None,
        False,
    )
    assert options.cost == replace(DEFAULT_COST, unknown_hours=2.0)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("candidates: 0", "planner.candidates"),
        ("tries: 0", "planner.tries"),
        ("depth: -1", "planner.depth"),
        ("max_rooms_per_cycle: 0", "planner.max_rooms_per_cycle"),
        ("unknown_hours: -1", "planner.unknown_hours"),
        ("min_gain_per_cost: -0.5", "planner.min_gain_per_cost"),
    ],
)
def test_the_new_planner_knobs_are_bounded(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(SettingsError, match=rf"setting {field} \("):
        load_settings(write(tmp_path, f"planner:\n  {text}\n"))


def test_cycle_config_and_executor_settings(tmp_path: Path) -> None:
    from defrag.execute.executor import ExecutorSettings
    from defrag.execute.windows import Window
    from defrag.plan.config import EvictionBudget
    from defrag.scoring.profile import ProfileConfig

    path = write(
        tmp_path,
        "planner:\n  goal: make-room\n  make_room_packing_patience_s: 1h\n"
        "scoring:\n  policy: fgd\n  seed: 3\n"
        "windows:\n  idle_gate: true\n  schedule:\n"
        "    - {cron: '0 2 * * *', length_s: 2h, timezone: Europe/Berlin}\n"
        "execution:\n  batch_size: 2\n  replacement_timeout_s: 100\n  poll_interval_s: 2\n"
        "  checkpoint_wait_s: 30\n  checkpoint_max_wait_s: 60\n",
    )
    s = load_settings(path)
    config = s.cycle_config()
    assert config.goal == "make-room" and config.idle_gate is True
    assert config.windows == (Window("0 2 * * *", 7200.0, "Europe/Berlin"),)
    assert config.profile == ProfileConfig("fgd", 3)
    assert config.patience == s.packing_patience()
    budget = EvictionBudget(3, 2, 1)
    assert s.executor_settings(budget) == ExecutorSettings(
        budgets=budget,
        batch_size=2,
        replacement_timeout_s=100.0,
        poll_interval_s=2.0,
        checkpoint_wait_s=30.0,
        checkpoint_max_wait_s=60.0,
    )
    # by default the executor enforces the planner's window budget
    assert s.executor_settings().budgets == s.planner_config().window_budget()


# --- settings that contradict each other ------------------------------------------------------

DEADLINE_60 = "daemon:\n  cycle_interval_s: 20\n  ready_max_age_s: 60\n"


def execution(**values: object) -> str:
    return "execution:\n" + "".join(f"  {k}: {v}\n" for k, v in values.items())


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        # The cycle deadline is ready_max_age_s; one replacement wait lasts up to
        # replacement_timeout_s + one poll_interval_s and must end before it.
        (DEADLINE_60 + execution(replacement_timeout_s=54, poll_interval_s=5), None),  # 59 < 60
        (
            DEADLINE_60 + execution(replacement_timeout_s=55, poll_interval_s=5),  # 60 ≥ 60
            "execution.replacement_timeout_s ({file}) and execution.poll_interval_s ({file}) "
            "and daemon.ready_max_age_s ({file}) contradict each other: "
            "execution.replacement_timeout_s (55) plus one execution.poll_interval_s (5) must be "
            "less than the cycle deadline, daemon.ready_max_age_s (60)",
        ),
        (  # the reported case: a 65 s wait, a 60 s deadline
            DEADLINE_60 + execution(replacement_timeout_s=65),
            "execution.replacement_timeout_s (65) plus one execution.poll_interval_s (5) must be "
            "less than the cycle deadline, daemon.ready_max_age_s (60)",
        ),
        # Without ready_max_age_s the deadline is 3 × cycle_interval_s: 3 × 100 = 300.
        (
            "daemon:\n  cycle_interval_s: 100\n"
            + execution(replacement_timeout_s=294, poll_interval_s=5),
            None,
        ),
        (
            "daemon:\n  cycle_interval_s: 100\n"
            + execution(replacement_timeout_s=295, poll_interval_s=5),
            "3 × daemon.cycle_interval_s (100) = 300 (daemon.ready_max_age_s unset)",
        ),
        # The defaults agree: 600 + 5 = 605 < 3 × 300 = 900.
        ("", None),
        # Dry run waits for no replacement: the pair does not apply.
        (DEADLINE_60 + execution(dry_run="true", replacement_timeout_s=65), None),
        # /readyz: the last good cycle is cycle_interval_s old before the next one ends.
        (
            execution(dry_run="true") + "daemon:\n  cycle_interval_s: 60\n  ready_max_age_s: 61\n",
            None,
        ),
        (
            execution(dry_run="true") + "daemon:\n  cycle_interval_s: 60\n  ready_max_age_s: 60\n",
            "daemon.ready_max_age_s ({file}) and daemon.cycle_interval_s ({file}) contradict "
            "each other: daemon.ready_max_age_s (60) must exceed daemon.cycle_interval_s (60)",
        ),
        # Alerts: a TTL no longer than the resend or cycle interval lets them lapse.
        ("alerts:\n  urls: [http://am]\n  ttl_s: 301\n", None),  # > 60 and > 300
        (
            "alerts:\n  urls: [http://am]\n  ttl_s: 300\n",
            "alerts.ttl_s ({file}) and alerts.resend_interval_s (default) and "
            "daemon.cycle_interval_s (default) contradict each other: alerts.ttl_s (300) must "
            "exceed alerts.resend_interval_s (60) and daemon.cycle_interval_s (300)",
        ),
        (
            "planner:\n  evict_namespaces_include: [a]\n  evict_namespaces_exclude: [b]\n",
            "planner.evict_namespaces_include ({file}) and planner.evict_namespaces_exclude "
            "({file}) contradict each other: planner.evict_namespaces_include (a) and "
            "planner.evict_namespaces_exclude (b) are mutually exclusive",
        ),
        (
            "windows:\n  max_evictions_per_window: 20\n  max_evictions_per_window_ceiling: 10\n",
            "windows.max_evictions_per_window_ceiling ({file}) and "
            "windows.max_evictions_per_window ({file}) contradict each other",
        ),
    ],
)
def test_contradicting_settings_are_refused_in_one_line_naming_both(
    tmp_path: Path, text: str, refused: str | None
) -> None:
    dry = "dry_run" in text
    path = write(tmp_path, text)
    overrides = {} if dry else {"execution.dry_run": False}
    if refused is None:
        load_settings(path, overrides)
        return
    with pytest.raises(SettingsError) as info:
        load_settings(path, overrides)
    message = str(info.value)
    assert refused.format(file=path) in message
    assert message.startswith("settings ") and "\n" not in message


def test_contradiction_names_the_source_of_each_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, DEADLINE_60)
    monkeypatch.setenv("DEFRAG_EXECUTION__REPLACEMENT_TIMEOUT_S", "65")
    with pytest.raises(SettingsError) as info:
        load_settings(path, {"execution.dry_run": False})
    assert str(info.value).startswith(
        "settings execution.replacement_timeout_s (env DEFRAG_EXECUTION__REPLACEMENT_TIMEOUT_S) "
        f"and execution.poll_interval_s (default) and daemon.ready_max_age_s ({path}) "
        "contradict each other: "
    )


def test_run_refuses_contradicting_settings_with_one_line_and_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from defrag.cli import app

    path = write(
        tmp_path,
        "cluster:\n  kind: sim\n"
        + DEADLINE_60
        + execution(dry_run="false", replacement_timeout_s=65),
    )
    result = CliRunner().invoke(app, ["run", "--once", "--settings", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(
        f"error: settings execution.replacement_timeout_s ({path}) and "
        f"execution.poll_interval_s (default) and daemon.ready_max_age_s ({path}) contradict "
        "each other: execution.replacement_timeout_s (65)"
    )
    assert "Traceback" not in result.output
