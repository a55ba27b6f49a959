"""Settings: file, then environment, then flags; every bad value names its field and source."""

from __future__ import annotations

from pathlib import Path

import pytest

from defrag.settings import SettingsError, load_settings


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
    assert s.dry_run is True and s.windows == [] and s.dry_run_events is False
    assert s.ready_age_limit_s == 900.0  # 3 × the 300 s cycle interval


def test_flag_beats_environment_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "cycle_interval_s: 30\npolicy: fgd\nmax_evictions_per_node: 3\n")
    monkeypatch.setenv("DEFRAG_CYCLE_INTERVAL_S", "45")
    monkeypatch.setenv("DEFRAG_DRY_RUN", "false")
    s = load_settings(path, {"dry_run": True, "policy": None})
    assert s.cycle_interval_s == 45.0  # env over file
    assert s.dry_run is True  # flag over env
    assert s.policy == "fgd" and s.max_evictions_per_node == 3  # file; a None flag is unset


def test_windows_from_json_file_and_env_style_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"DEFRAG_WINDOWS": [{"cron": "0 2 * * 1-5", "length_s": 3600, "timezone": '
        '"Europe/Berlin"}], "idle-gate": true}',
        "s.json",
    )
    s = load_settings(path)
    assert s.idle_gate is True
    assert (s.windows[0].cron, s.windows[0].length_s, s.windows[0].timezone) == (
        "0 2 * * 1-5",
        3600.0,
        "Europe/Berlin",
    )


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "eviction_batch_size: 0\n",
            {},
            "setting eviction_batch_size ({file}): Input should be greater than or equal to 1",
        ),
        (
            "",
            {"DEFRAG_CYCLE_INTERVAL_S": "soon"},
            "setting cycle_interval_s (env DEFRAG_CYCLE_INTERVAL_S): cannot read 'soon': "
            "expected a duration such as 90s",
        ),
        (
            "windows:\n  - {cron: '61 * * * *', length_s: 60}\n",
            {},
            "setting windows.0.cron ({file}): not a crontab expression",
        ),
        (
            "windows:\n  - {cron: '0 2 * * *', length_s: 60, timezone: Mars/Olympus}\n",
            {},
            "setting windows.0.timezone ({file}): unknown time zone 'Mars/Olympus'",
        ),
        (
            "windows:\n  - {cron: '0 2 * * *'}\n",
            {},
            "setting windows.0.length_s ({file}): Field required",
        ),
        ("polcy: fgd\n", {}, "setting polcy ({file}): unknown setting"),
        ("policy: magic\n", {}, "setting policy ({file}): unknown policy 'magic'; known: "),
        (
            "alertmanager_urls: [http://am:9093]\ncycle_interval_s: 1200\n",
            {},
            "alert_ttl_s (900) must exceed",
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


@pytest.mark.parametrize(
    ("text", "message"),
    [("cycle_interval_s: [1\n", "not valid YAML"), ("- a\n- b\n", "expected a mapping")],
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
    monkeypatch.setenv("DEFRAG_ALERTMANAGER_URLS", "http://am-0:9093, http://am-1:9093")
    monkeypatch.setenv("DEFRAG_WINDOWS", "0 2 * * * 1h; 0 14 * * 6 90m")
    monkeypatch.setenv("DEFRAG_CYCLE_INTERVAL_S", "5m")
    monkeypatch.setenv("DEFRAG_ALERT_TTL_S", "1h30m")
    s = load_settings()
    assert s.alertmanager_urls == ["http://am-0:9093", "http://am-1:9093"]
    assert [(w.cron, w.length_s) for w in s.windows] == [
        ("0 2 * * *", 3600.0),
        ("0 14 * * 6", 5400.0),
    ]
    assert (s.cycle_interval_s, s.alert_ttl_s) == (300.0, 5400.0)  # 5×60; 3600 + 30×60
    monkeypatch.setenv("DEFRAG_ALERTMANAGER_URLS", '["http://am:9093"]')
    monkeypatch.setenv("DEFRAG_WINDOWS", '[{"cron": "0 3 * * *", "length_s": "2h"}]')
    s = load_settings()
    assert s.alertmanager_urls == ["http://am:9093"]
    assert [(w.cron, w.length_s) for w in s.windows] == [("0 3 * * *", 7200.0)]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DEFRAG_ALERTMANAGER_URLS": '["http://am:9093"'},
            "setting alertmanager_urls (env DEFRAG_ALERTMANAGER_URLS): not a JSON list",
        ),
        (
            {"DEFRAG_WINDOWS": "0 2 * * *"},
            "setting windows (env DEFRAG_WINDOWS): cannot read '0 2 * * *': expected five cron "
            "fields and a length",
        ),
        (
            {"DEFRAG_WINDOWS": "0 2 * * * soon"},
            "setting windows (env DEFRAG_WINDOWS): cannot read 'soon': expected a duration",
        ),
        (
            {"DEFRAG_DRY_RUN": "maybe"},
            "setting dry_run (env DEFRAG_DRY_RUN): cannot read 'maybe': expected true or false",
        ),
        (
            {"DEFRAG_POLL_INTERVAL_S": "-5s"},
            "setting poll_interval_s (env DEFRAG_POLL_INTERVAL_S): cannot read '-5s'",
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


# --- settings that contradict each other ------------------------------------------------------

DEADLINE_60 = "cycle_interval_s: 20\nready_max_age_s: 60\n"


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        # The cycle deadline is ready_max_age_s; one replacement wait lasts up to
        # replacement_timeout_s + one poll_interval_s and must end before it.
        (f"{DEADLINE_60}replacement_timeout_s: 54\npoll_interval_s: 5\n", None),  # 59 < 60
        (
            f"{DEADLINE_60}replacement_timeout_s: 55\npoll_interval_s: 5\n",  # 60 ≥ 60
            "replacement_timeout_s ({file}) and poll_interval_s ({file}) and ready_max_age_s "
            "({file}) contradict each other: replacement_timeout_s (55) plus one "
            "poll_interval_s (5) must be less than the cycle deadline, ready_max_age_s (60)",
        ),
        (  # the reported case: a 65 s wait, a 60 s deadline
            "cycle_interval_s: 20\nready_max_age_s: 60\nreplacement_timeout_s: 65\n",
            "replacement_timeout_s (65) plus one poll_interval_s (5) must be less than the "
            "cycle deadline, ready_max_age_s (60)",
        ),
        # Without ready_max_age_s the deadline is 3 × cycle_interval_s: 3 × 100 = 300.
        ("cycle_interval_s: 100\nreplacement_timeout_s: 294\npoll_interval_s: 5\n", None),
        (
            "cycle_interval_s: 100\nreplacement_timeout_s: 295\npoll_interval_s: 5\n",
            "3 × cycle_interval_s (100) = 300 (ready_max_age_s unset)",
        ),
        # The defaults agree: 600 + 5 = 605 < 3 × 300 = 900.
        ("", None),
        # Dry run waits for no replacement: the pair does not apply.
        (f"dry_run: true\n{DEADLINE_60}replacement_timeout_s: 65\n", None),
        # /readyz: the last good cycle is cycle_interval_s old before the next one ends.
        ("dry_run: true\ncycle_interval_s: 60\nready_max_age_s: 61\n", None),
        (
            "dry_run: true\ncycle_interval_s: 60\nready_max_age_s: 60\n",
            "ready_max_age_s ({file}) and cycle_interval_s ({file}) contradict each other: "
            "ready_max_age_s (60) must exceed cycle_interval_s (60)",
        ),
        # Alerts: a TTL no longer than the resend or cycle interval lets them lapse.
        ("alertmanager_urls: [http://am]\nalert_ttl_s: 301\n", None),  # > 60 and > 300
        (
            "alertmanager_urls: [http://am]\nalert_ttl_s: 300\n",
            "alert_ttl_s ({file}) and alert_resend_interval_s (default) and cycle_interval_s "
            "(default) contradict each other: alert_ttl_s (300) must exceed "
            "alert_resend_interval_s (60) and cycle_interval_s (300)",
        ),
    ],
)
def test_contradicting_settings_are_refused_in_one_line_naming_both(
    tmp_path: Path, text: str, refused: str | None
) -> None:
    path = write(tmp_path, text if "dry_run" in text else f"dry_run: false\n{text}")
    if refused is None:
        load_settings(path)
        return
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    message = str(info.value)
    assert refused.format(file=path) in message
    assert message.startswith("settings ") and "\n" not in message


def test_contradiction_names_the_source_of_each_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "cycle_interval_s: 20\nready_max_age_s: 60\n")
    monkeypatch.setenv("DEFRAG_REPLACEMENT_TIMEOUT_S", "65")
    with pytest.raises(SettingsError) as info:
        load_settings(path, {"dry_run": False})
    assert str(info.value).startswith(
        "settings replacement_timeout_s (env DEFRAG_REPLACEMENT_TIMEOUT_S) and poll_interval_s "
        f"(default) and ready_max_age_s ({path}) contradict each other: "
    )


def test_run_refuses_contradicting_settings_with_one_line_and_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from defrag.cli import app

    path = write(
        tmp_path,
        "dry_run: false\ncluster: sim\ncycle_interval_s: 20\nready_max_age_s: 60\n"
        "replacement_timeout_s: 65\n",
    )
    result = CliRunner().invoke(app, ["run", "--once", "--settings", str(path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(
        f"error: settings replacement_timeout_s ({path}) and poll_interval_s (default) and "
        f"ready_max_age_s ({path}) contradict each other: replacement_timeout_s (65)"
    )
    assert "Traceback" not in result.output
