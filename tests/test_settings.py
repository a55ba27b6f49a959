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
    with pytest.raises(SettingsError, match="cannot read settings file"):
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
