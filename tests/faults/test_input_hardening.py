"""Hostile files and variables: one line naming the file, line and field; exit 2; no traceback.

Issue 15 found 35 of 254 bad inputs ending in a traceback, a YAML alias bomb hanging past 60 s,
``.inf``/``.nan`` accepted as settings and a misspelt ``DEFRAG_*`` variable silently ignored.
Each case here failed (traceback, hang or acceptance) before the change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from defrag import safe_yaml
from defrag.adapters.snapshot import SnapshotError, load_snapshot
from defrag.rules import RulesError, load_rules
from defrag.settings import SettingsError, check_environment, load_settings

# The classic "billion laughs": nine levels of nine aliases, 9^9 (387 million) strings from a
# document of about 400 bytes.
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{x}: &{x} [{', '.join(['*' + p] * 9)}]\n" for p, x in zip("abcdefgh", "bcdefghi", strict=True)
)
DEEP = "x: " + "[" * 5000 + "]" * 5000 + "\n"
BINARY = bytes(range(256)) * 4
NUL_TEXT = b"rules:\x00\n"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``defrag`` process (a hang is a failure: the timeout raises)."""
    return subprocess.run(
        [sys.executable, "-c", "from defrag.cli import main; main()", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def one_clear_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    hits = [line for line in proc.stderr.splitlines() if all(n in line for n in needles)]
    assert hits, (needles, proc.stderr)


# --- YAML: alias bombs and nesting -----------------------------------------------------------


def test_the_loader_keeps_ordinary_anchors() -> None:
    """A rule file may share a block with an anchor: that still loads."""
    assert safe_yaml.load("x: &x {a: 1}\ny: *x\n") == {"x": {"a": 1}, "y": {"a": 1}}


@pytest.mark.parametrize(
    ("text", "problem", "line"),
    [
        (ALIAS_BOMB, "aliases expand to more than 10,000 nodes", 5),
        (DEEP, "nested deeper than 100 levels", 1),
    ],
)
def test_the_loader_refuses_bombs_with_a_line(text: str, problem: str, line: int) -> None:
    with pytest.raises(Exception) as caught:
        safe_yaml.load(text)
    assert safe_yaml.mark_line(caught.value) == line  # type: ignore[arg-type]
    assert problem in safe_yaml.one_line(caught.value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (ALIAS_BOMB.encode(), "r.yaml:5: YAML syntax: aliases expand to more than 10,000 nodes"),
        (DEEP.encode(), "r.yaml:1: YAML syntax: nested deeper than 100 levels"),
        (BINARY, "r.yaml: not UTF-8 text (byte 0x80 at offset 128"),
        (NUL_TEXT, "r.yaml: YAML: character U+0000 at offset 6 is not allowed"),
        (b"rules: 7\n", "r.yaml:1: rules: Input should be a valid list"),
        (b"- a\n- b\n", "r.yaml:1: a rule file is a mapping"),
        (
            b"rules:\n  - name: l\n    detector: leak\n    queries: {used: a, free: b}\n"
            b"    lookback: .inf\n",
            "r.yaml:5: rules[0].lookback: not a finite duration: inf",
        ),
        (
            b"rules:\n  - name: i\n    detector: idle\n    query: up\n    threshold_pct: .nan\n",
            "r.yaml:5: rules[0].threshold_pct: Input should be a finite number",
        ),
        (
            b"rules:\n  - name: i\n    detector: idle\n    query: up\n    for: 1.0e+400\n",
            "r.yaml:5: rules[0].for: not a finite duration",
        ),
        (
            b"rules:\n  - name: i\n    detector: idle\n    query: up\n    for: 99999999d\n",
            "r.yaml:5: rules[0].for: duration '99999999d' is longer than ten years",
        ),
        (
            b"rules:\n  - name: i\n    detector: idle\n    query: [up]\n",
            "r.yaml:4: rules[0].query: Input should be a valid string",
        ),
    ],
)
def test_bad_rule_files_are_one_line_each(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    with pytest.raises(RulesError) as caught:
        load_rules([path])
    assert any(needle in str(issue) for issue in caught.value.issues), str(caught.value)
    assert all("\n" not in str(issue) for issue in caught.value.issues)


def test_rules_check_on_an_alias_bomb_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    """Before: the bomb hung past 60 s (the timeout in :func:`cli` would fail this test)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    one_clear_line(cli("rules", "check", str(path)), "bomb.yaml:5:", "alias bomb")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (ALIAS_BOMB.encode(), "line 5 column 8: invalid YAML: aliases expand"),
        (DEEP.encode(), "line 1 column 103: invalid YAML: nested deeper than 100"),
        (b"[" * 100_000, "invalid JSON: nested too deeply"),
        (BINARY, "cannot read"),
        (NUL_TEXT, "invalid YAML: character U+0000"),
    ],
)
def test_bad_snapshot_files_are_one_line(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(content)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(path)
    assert needle in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_report_on_an_alias_bomb_snapshot_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "snap.yaml"
    path.write_text(ALIAS_BOMB)
    one_clear_line(cli("report", "--snapshot", str(path)), "snap.yaml", "alias bomb")


# --- settings: non-finite, huge, wrong types, files -------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        (
            "s.yaml",
            "execution: {poll_interval_s: .inf}\n",
            "setting execution.poll_interval_s (S): not a finite number",
        ),
        (
            "s.yaml",
            "daemon: {cycle_interval_s: .nan}\n",
            "setting daemon.cycle_interval_s (S): not a finite",
        ),
        ("s.yaml", "sim: {speedup: .inf}\n", "setting sim.speedup (S): Input should be a finite"),
        ("s.yaml", "execution: {replacement_timeout_s: 1e308}\n", "is more than ten years"),
        (
            "s.json",
            '{"execution": {"poll_interval_s": Infinity}}',
            "setting execution.poll_interval_s (S): not a finite",
        ),
        (
            "s.json",
            '{"leadership": {"lease_duration_s": NaN}}',
            "setting leadership.lease_duration_s (S): not a finite",
        ),
        (
            "s.yaml",
            "windows: {max_evictions_per_node: 1e999}\n",
            "setting windows.max_evictions_per_node (S)",
        ),
        (
            "s.yaml",
            f"windows: {{max_evictions_per_window: {10**30}}}\n",
            "less than or equal to 1000000",
        ),
        (
            "s.yaml",
            "windows: {schedule: [{cron: '0 2 * * *', length_s: .inf}]}\n",
            "windows.schedule.0.length_s",
        ),
        ("s.yaml", "alerts: {urls: {a: 1}}\n", "setting alerts.urls (S)"),
        ("s.yaml", "execution: {dry_run: [true]}\n", "setting execution.dry_run (S)"),
        ("s.yaml", ALIAS_BOMB, "line 5 column 8: not valid YAML: aliases expand"),
        ("s.yaml", DEEP, "not valid YAML: nested deeper than 100"),
        ("s.json", "[" * 100_000, "not valid JSON: nested too deeply"),
        ("s.json", '{"a": ', "line 1 column 7: not valid JSON"),
    ],
)
def test_bad_settings_files_name_the_setting(
    tmp_path: Path, name: str, content: str, needle: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SettingsError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert needle.replace("(S)", f"({path})") in message, message
    assert "\n" not in message


def test_a_binary_settings_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(BINARY)
    with pytest.raises(SettingsError, match=r"s\.yaml: not UTF-8 text \(byte 0x80 at offset 128\)"):
        load_settings(path)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (
            {"DEFRAG_EXECUTION__POLL_INTERVAL_S": "inf"},
            "env DEFRAG_EXECUTION__POLL_INTERVAL_S): not a finite number",
        ),
        ({"DEFRAG_SIM__SPEEDUP": "nan"}, "env DEFRAG_SIM__SPEEDUP): Input should be a finite"),
        ({"DEFRAG_ALERTS__URLS": "[not json"}, "env DEFRAG_ALERTS__URLS): not a JSON"),
    ],
)
def test_bad_environment_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(None)
    assert needle in str(caught.value)


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("DEFRAG_EXECUTION__DRYRUN", "DEFRAG_EXECUTION__DRY_RUN"),
        ("DEFRAG_EXECUTION__POLL_INTERVAL", "DEFRAG_EXECUTION__POLL_INTERVAL_S"),
        ("DEFRAG_DAEMON__CYCLE_INTERVAL_SECONDS", "DEFRAG_DAEMON__CYCLE_INTERVAL_S"),
        ("DEFRAG_ALERTS__URL", "DEFRAG_ALERTS__URLS"),
        ("defrag_execution__dry_runn", "DEFRAG_EXECUTION__DRY_RUN"),
        ("DEFRAG_EXECUTION_DRY_RUN", "DEFRAG_EXECUTION__DRY_RUN"),
    ],
)
def test_an_unknown_defrag_variable_names_the_closest(name: str, closest: str) -> None:
    with pytest.raises(SettingsError, match=f"env {name}: unknown setting; did you mean {closest}"):
        check_environment({name: "x"})


def test_an_unknown_variable_far_from_any_setting_is_still_refused() -> None:
    with pytest.raises(SettingsError, match=r"^env DEFRAG_ZZZZZZZZZZZZ: unknown setting$"):
        check_environment({"DEFRAG_ZZZZZZZZZZZZ": "1"})


def test_settings_and_other_defrag_variables_pass() -> None:
    check_environment(
        {
            "DEFRAG_EXECUTION__DRY_RUN": "false",
            "defrag_daemon__cycle_interval_s": "60",  # pydantic-settings reads names case-blind
            "DEFRAG_AM_BASIC_AUTH": "u:p",  # the alerts CLI's credential, not a setting
            "DEFRAG_FUZZ_EXAMPLES": "10000",
            "PATH": "/usr/bin",
        }
    )


def test_the_daemon_refuses_a_misspelt_variable_at_start() -> None:
    proc = cli("run", "--cluster", "sim", "--once", env={"DEFRAG_EXECUTION__DRYRUN": "false"})
    one_clear_line(
        proc,
        "env DEFRAG_EXECUTION__DRYRUN: unknown setting; did you mean DEFRAG_EXECUTION__DRY_RUN?",
    )


def test_the_daemon_refuses_a_variable_of_the_old_layout_at_start() -> None:
    proc = cli("run", "--cluster", "sim", "--once", env={"DEFRAG_DRY_RUN": "false"})
    one_clear_line(
        proc,
        'env DEFRAG_DRY_RUN is now DEFRAG_EXECUTION__DRY_RUN (docs/daemon.md, "Settings")',
    )


def test_the_daemon_refuses_an_infinite_poll_interval(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("execution:\n  poll_interval_s: .inf\n")
    proc = cli("run", "--cluster", "sim", "--once", "--settings", str(path))
    one_clear_line(
        proc, f"setting execution.poll_interval_s ({path}): not a finite number of seconds"
    )
