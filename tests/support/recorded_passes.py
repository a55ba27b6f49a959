"""The rules of the shipped recording group that read the group's own recorded series,
backfilled as a running Prometheus evaluates them.

``promtool tsdb create-blocks-from rules`` evaluates every rule through the query API of a
Prometheus serving the raw history alone, so a rule that reads another rule's recorded series
(the prefilter's verdict and its witness read the recorded terms) finds nothing there: in a
one-pass backfill the witness is absent and the daemon asks the terms. In a running Prometheus
the rules of a group run in order, each seeing what the ones before it wrote at the same
evaluation. :func:`backfill_second_pass` gets the same after the first pass is in the TSDB:
a Prometheus serving raw and recorded blocks evaluates each such rule (once what it reads is
in) (its query API, as
promtool does) at the group's own evaluation times — read from the group's marker, so the
second pass lines up with the first whatever rule file name that one was evaluated under — and
the answers, named and labelled as the rule says, are written as blocks
(``promtool tsdb create-blocks-from openmetrics``).
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from defrag.adapters.prometheus import PrometheusSource
from tests.support.binaries import require_binary
from tests.support.prometheus import serve_tsdb


def reads_recorded(rule: dict[str, Any]) -> bool:
    """Whether a rule of the group reads a recorded series (a ``gpu:`` name)."""
    return "gpu:" in str(rule.get("expr", ""))


def first_pass(text: str) -> str:
    """The rule file ``text`` without the rules that read recorded series."""
    doc = yaml.safe_load(text)
    groups = [
        {**g, "rules": [r for r in g["rules"] if not reads_recorded(r)]} for g in doc["groups"]
    ]
    return yaml.safe_dump({"groups": groups}, sort_keys=False)


def _escape(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)[1:-1]


def backfill_second_pass(
    data: Path, text: str, marker: str, start: float, end: float, workdir: Path
) -> int:
    """Every rule of ``text`` that reads recorded series, evaluated at each sample time of the
    group's ``marker`` within ``[start, end]`` by a Prometheus serving ``data``, written into
    ``data`` as blocks — in passes: a rule that reads another such rule (the witness reads the
    verdict) is evaluated once that one's blocks are in. Returns the samples written."""
    left = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if reads_recorded(r)]
    written = 0
    while left:
        pending = {r["record"] for r in left}
        now = [r for r in left if not any(p in r["expr"] for p in pending - {r["record"]})]
        if not now:
            raise ValueError("the group's rules read one another in a cycle")
        written += _one_pass(data, now, marker, start, end, workdir)
        left = [r for r in left if r not in now]
    return written


def _one_pass(
    data: Path, rules: list[dict[str, Any]], marker: str, start: float, end: float, workdir: Path
) -> int:
    points: dict[str, list[tuple[str, float, str]]] = {r["record"]: [] for r in rules}
    with serve_tsdb(data, workdir) as server:
        source = PrometheusSource(server.url, retries=0, timeout_s=600)
        at_end = datetime.fromtimestamp(end, UTC)
        [evaluations] = source.instant(f"{marker}[{end - start:.0f}s]", at_end)
        for t, _ in evaluations.points:
            for rule in rules:
                for got in source.instant(rule["expr"], datetime.fromtimestamp(t, UTC)):
                    labels = {k: v for k, v in got.labels.items() if k != "__name__"}
                    labels |= rule.get("labels", {})
                    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                    points[rule["record"]].append((inner, t, repr(got.last)))
    written = sum(len(v) for v in points.values())
    if not written:
        return 0
    om = workdir / "second-pass.om"
    with om.open("w") as out:
        for name, samples in points.items():  # each series' samples together, in time order
            out.write(f"# TYPE {name} gauge\n")
            out.writelines(f"{name}{{{inner}}} {v} {t:.3f}\n" for inner, t, v in sorted(samples))
        out.write("# EOF\n")
    blocks = workdir / "second-pass-blocks"
    done = subprocess.run(
        [
            require_binary("promtool"),
            *("tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    om.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stderr or done.stdout}")
    for block in blocks.iterdir():
        block.rename(data / block.name)
    blocks.rmdir()
    return written
