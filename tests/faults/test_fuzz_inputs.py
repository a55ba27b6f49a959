"""Fuzz: random snapshots and rule files through the loaders and the CLI that reads them.

Each input is either random text or a good file with one value, at a path the file really has,
replaced by a random JSON-ish value (wrong types, NaN/Infinity, huge and negative numbers,
strings that are almost quantities, nested lists and maps). The assertion is the project's
bad-input contract: the loader returns or raises its own error (``SnapshotError``,
``RulesError``) as lines naming the file; the CLI exits 0 or 2 and prints no traceback.

In the suite each test runs ``DEFRAG_FUZZ_EXAMPLES`` examples (default 100); the
10,000-input run per entry point is manual::

    DEFRAG_FUZZ_EXAMPLES=10000 .venv/bin/pytest -q --hypothesis-seed=1 \\
        --hypothesis-show-statistics tests/faults/test_fuzz_inputs.py -k <test>
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from defrag.adapters.snapshot import SnapshotError, load_snapshot
from defrag.cli import app
from defrag.rules import RulesError, load_rules

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("DEFRAG_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
runner = CliRunner()


def _base_snapshot() -> dict[str, Any]:
    """Two NVLink nodes and three pods (tests/fixtures/snapshots/nvlink.json), the PDB of
    scattered_20.json, and a PriorityClass shaped as scheduling.k8s.io/v1 defines it (value,
    globalDefault, preemptionPolicy; Kubernetes API reference, PriorityClass)."""
    snap = json.loads((ROOT / "tests/fixtures/snapshots/nvlink.json").read_text())
    scattered = json.loads((ROOT / "tests/fixtures/snapshots/scattered_20.json").read_text())
    snap["items"].append(next(i for i in scattered["items"] if i["kind"] == "PodDisruptionBudget"))
    snap["items"].append(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
        }
    )
    return snap


def _base_rules() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "rules").glob("*.yaml"))]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value`` (keys and list indices), the root excluded."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


SNAPSHOT = _base_snapshot()
SNAPSHOT_PATHS = sorted(_paths(SNAPSHOT), key=repr)
RULES = _base_rules()
RULE_PATHS = [(i, p) for i, doc in enumerate(RULES) for p in sorted(_paths(doc), key=repr)]

ALMOST = [
    "1",
    "-1",
    "0",
    "0.5",
    "1E",
    "1e3",
    "500m",
    "1Ki",
    "1.5Gi",
    "+",
    ".",
    "1 ",
    " 1",
    "1e",
    "NaN",
    "Infinity",
    "-Infinity",
    "",
    "node-1",
    "0-20000000",
    "0-999999999",
    "0,1",
    "7-3",
    "half",
    "1e9223372036854775807",
    "9" * 400,
    "15m",
    "1h30m",
    "-5m",
    "0s",
    "\x00",
    "\ud7ff",
    "leak",
    "idle",
    "starvation",
    "fragmentation",
    "alert",
    "repack",
    "make-room",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats()  # NaN and ±Infinity included: JSON writes them as NaN/Infinity
    | st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0])
    | st.sampled_from(ALMOST)
    | st.text(max_size=16)
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _replace(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


@st.composite
def snapshot_texts(draw: st.DrawFn) -> tuple[str, str]:
    """(suffix, text): random text, or the base snapshot with one or two values changed, as JSON
    or YAML."""
    if draw(st.integers(0, 9)) == 0:
        return ".json", draw(st.text(max_size=200))
    doc = SNAPSHOT
    for _ in range(draw(st.integers(1, 2))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        doc = _replace(doc, path, draw(JSONISH), draw(st.integers(0, 7)) == 0)
    if draw(st.booleans()):
        return ".json", json.dumps(doc)
    return ".yaml", yaml.safe_dump(doc)


@st.composite
def rule_texts(draw: st.DrawFn) -> str:
    """Random text, or one shipped rule file with one or two values changed or removed."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    doc: Any = RULES[draw(st.integers(0, len(RULES) - 1))]
    for _ in range(draw(st.integers(1, 2))):
        paths = list(_paths(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        doc = _replace(doc, path, draw(JSONISH), draw(st.integers(0, 7)) == 0)
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))


def _write(directory: str, name: str, text: str) -> Path:
    path = Path(directory) / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _one_line_naming(message: str, path: Path) -> None:
    assert message.strip(), "an empty error"
    assert str(path) in message, message


@FUZZ
@given(case=snapshot_texts())
def test_fuzz_load_snapshot(case: tuple[str, str]) -> None:
    """A snapshot loads (bad objects left out with a warning) or is a SnapshotError naming the
    file on one line; nothing else escapes."""
    suffix, text = case
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "snap" + suffix, text)
        try:
            cluster = load_snapshot(path)
        except SnapshotError as exc:
            event("SnapshotError")
            _one_line_naming(str(exc), path)
            assert "\n" not in str(exc), str(exc)
        else:
            event(f"loaded, {min(len(cluster.warnings), 2)}+ warnings")
            for warning in map(str, cluster.warnings):
                # "<Kind> <name>: <field>: <problem>", one line
                assert "\n" not in warning and warning.count(": ") >= 2, warning
                assert not warning.split(": ")[1].startswith(" "), warning


@FUZZ
@given(case=snapshot_texts(), strict=st.booleans())
def test_fuzz_report_cli(case: tuple[str, str], strict: bool) -> None:
    """``defrag report --snapshot`` exits 0 or 2 (2 with the file named), never a traceback."""
    suffix, text = case
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "snap" + suffix, text)
        args = ["report", "--snapshot", str(path), "-o", "json", *(["--strict"] if strict else [])]
        result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 2), result.output
    event(f"exit {result.exit_code}")
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert str(path.name) in result.stderr, result.stderr


@FUZZ
@given(text=rule_texts())
def test_fuzz_load_rules(text: str) -> None:
    """A rule file loads, or every problem is one ``file:line: field: message`` line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "r.yaml", text)
        try:
            load_rules([path])
        except RulesError as exc:
            event("RulesError")
            assert exc.issues
            for issue in exc.issues:
                _one_line_naming(str(issue), path)
                assert "\n" not in str(issue), str(issue)


@FUZZ
@given(text=rule_texts())
def test_fuzz_rules_check_cli(text: str) -> None:
    """``defrag rules check`` exits 0 or 2, never a traceback (PromQL is not checked: no
    promtool on the PATH, so the run stays in this process and fast)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "r.yaml", text)
        old = os.environ.get("PATH", "")
        os.environ["PATH"] = "/nonexistent"
        try:
            result = runner.invoke(app, ["rules", "check", str(path)])
        finally:
            os.environ["PATH"] = old
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 2), result.output
    event(f"exit {result.exit_code}")
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert "r.yaml" in result.output, result.output
