"""A later detection asks the real Prometheus only for the span since the previous one, and
its merged medians and findings are exactly a whole read's at the same time.

The fleet and the recorded series are test_prometheus_recorded's (the shipped recording
rules backfilled over the last 6.5 h). Each test detects at an earlier time with a memory,
then at the later time, and compares with a detection at the later time that keeps nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from defrag.adapters.prometheus import PrometheusSource
from defrag.detection import cycle_detector, run_detection
from defrag.detectors.leak.registration import (
    _ask_leak_queries,
    _gpu_labels,
    _medians_key,
    judged_at,
)
from defrag.detectors.range_memory import KeptRange, RangeMemory, keyed, remembering
from defrag.detectors.range_memory import kept as keep
from defrag.model.cluster import Cluster
from defrag.ports import Sample
from tests.integration.test_prometheus_recorded import PROFILE, _server, leak_rules, rule_of
from tests.support.prometheus import END

pytestmark = pytest.mark.integration

STEP = timedelta(minutes=5)
LOOKBACK = timedelta(hours=6)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _server(tmp_path_factory.mktemp("incremental"), 6.5)


class Asked(PrometheusSource):
    """The source, noting the span of every medians range it is asked."""

    def __init__(self, url: str) -> None:
        super().__init__(url, retries=0, timeout_s=30)
        self.spans: list[timedelta] = []
        self.reads: list[tuple[timedelta, str]] = []

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        if "median" in query or "quantile_over_time" in query:
            self.spans.append(end - start)
            self.reads.append((end - start, query))
        return super().range(query, start, end, step_s)


def gpus(query: str) -> set[str]:
    return set(re.findall(r"GPU-node-\d+-\d+", query))


def span_reads(prom: Asked) -> tuple[set[str], set[str]]:
    """The GPUs a later detection asked over the span since the kept range and over the whole
    lookback: every medians read is one of the two."""
    assert prom.reads and {span for span, _ in prom.reads} <= {2 * STEP, LOOKBACK}
    spans = {g for span, q in prom.reads if span == 2 * STEP for g in gpus(q)}
    wholes = {g for span, q in prom.reads if span == LOOKBACK for g in gpus(q)}
    assert spans
    return spans, wholes


def kept_answer(kept: KeptRange) -> list[Sample]:
    """The kept answer as samples again."""
    times, values = kept.times.tolist(), kept.values.tolist()
    return [
        Sample(kept.labels[k], tuple(zip(times[a:b], values[a:b], strict=True)))
        for k, (a, b) in kept.runs.items()
    ]


def whole(url: str) -> PrometheusSource:
    return PrometheusSource(url, retries=0, timeout_s=30)


def read(rule: Any, prom: PrometheusSource, now: datetime, memory: RangeMemory | None) -> Any:
    at, recorded = judged_at(rule, prom, now)
    with remembering(memory):
        return _ask_leak_queries(rule, prom, at - LOOKBACK, at, recorded)


@pytest.mark.parametrize("mode", ["auto", "never"])
def test_a_later_detection_reads_the_span_and_finds_what_a_whole_read_finds(
    url: str, tmp_path: Path, mode: str
) -> None:
    rules = leak_rules(tmp_path, mode)
    rule = rule_of(rules)
    memory = RangeMemory()
    prom = Asked(url)
    first = run_detection(rules, prom, None, END - STEP, profile=PROFILE, memory=memory)
    assert prom.spans and all(span == LOOKBACK for span in prom.spans)
    prom.reads.clear()
    later = run_detection(rules, prom, None, END, profile=PROFILE, memory=memory)
    # the kept range's last point but one, asked again, to the new end a step later; a GPU
    # the prefilter passes now and did not then (none, or one whose last step is borderline,
    # as the recording group's evaluation times fall) is read whole
    spans, wholes = span_reads(prom)
    assert not spans & wholes
    assert later == run_detection(rules, whole(url), None, END, profile=PROFILE)
    assert {f.subject for f in later.findings} == {"gpu/node-001/4", "pod/ml/leak-0"}
    assert first.findings  # the earlier detection found them too, from a whole read
    # the medians themselves, and what the memory keeps for the next detection
    memory = RangeMemory()
    read(rule, prom, END - 2 * STEP, memory)
    merged = read(rule, prom, END, memory)
    assert merged == read(rule, whole(url), END, None)
    (kept,) = memory._kept.values()
    assert len(kept.times) == sum(len(s.points) for s in merged[0])


def read_once(rule: Any, prom: Asked) -> tuple[RangeMemory, tuple[str, ...], KeptRange]:
    """A memory after one detection a step before ``END``, the key the later one (at ``END``)
    reads its medians under, and what is kept there."""
    memory = RangeMemory()
    read(rule, prom, END - STEP, memory)
    _, recorded = judged_at(rule, prom, END)
    key = _medians_key(rule, recorded, True)
    kept = memory.get(key)
    assert kept is not None
    return memory, key, kept


def test_a_gpu_new_to_the_prefilter_is_read_over_the_whole_lookback(
    url: str, tmp_path: Path
) -> None:
    rule = rule_of(leak_rules(tmp_path, "auto"))
    prom = Asked(url)
    memory, key, kept = read_once(rule, prom)
    assert kept.covered
    gone = sorted(kept.covered)[0]  # as if this GPU had not passed the prefilter then
    on = _gpu_labels(rule)
    answer = [s for s in kept_answer(kept) if tuple(s.labels.get(n, "") for n in on) != gone]
    assert len(answer) < len(kept.runs)
    memory.put(
        key, keep(keyed(answer), kept.covered - {gone}, kept.end_ms, kept.step_ms, kept.lookback_ms)
    )
    prom.reads.clear()
    assert read(rule, prom, END, memory) == read(rule, whole(url), END, None)
    # the GPUs kept: the span; the one not kept: the whole lookback (in the same round)
    spans, wholes = span_reads(prom)
    assert gpus(gone[0]) <= wholes and not spans & wholes


def test_answers_that_do_not_line_up_read_the_whole_range(url: str, tmp_path: Path) -> None:
    rule = rule_of(leak_rules(tmp_path, "auto"))
    prom = Asked(url)
    memory, key, kept = read_once(rule, prom)
    # a kept value that Prometheus no longer answers (one that lost or rewrote data)
    _, end = next(iter(kept.runs.values()))
    changed = kept.values.copy()
    changed[end - 2] += 1.0  # the run's last point but one: the time asked again
    memory.put(key, replace(kept, values=changed))
    prom.reads.clear()
    assert read(rule, prom, END, memory) == read(rule, whole(url), END, None)
    # the span was asked, did not line up, and the whole range was read after it
    spans, wholes = span_reads(prom)
    assert spans <= wholes and prom.reads[-1][0] == LOOKBACK


@pytest.mark.parametrize(
    ("earlier", "why"),
    [
        (timedelta(minutes=7), "not a whole number of steps before"),
        (LOOKBACK, "no kept point reaches the new start"),
        (-STEP, "after the later detection"),
    ],
)
def test_otherwise_the_whole_range_is_read(
    url: str, tmp_path: Path, earlier: timedelta, why: str
) -> None:
    rule = rule_of(leak_rules(tmp_path, "never"))
    prom = Asked(url)
    memory = RangeMemory()
    read(rule, prom, END - earlier, memory)
    prom.spans.clear()
    assert read(rule, prom, END, memory) == read(rule, whole(url), END, None), why
    assert set(prom.spans) == {LOOKBACK}, why


def test_kept_points_stay_within_the_lookback(url: str, tmp_path: Path) -> None:
    rule = rule_of(leak_rules(tmp_path, "never"))
    prom = whole(url)
    memory = RangeMemory()
    for back in (3, 2, 1, 0):
        read(rule, prom, END - back * STEP, memory)
    (kept,) = memory._kept.values()
    start = (END - LOOKBACK).timestamp()
    assert len(kept.times) and np.all(kept.times >= start)


def test_the_daemons_detector_remembers_between_cycles(url: str, tmp_path: Path) -> None:
    rules = leak_rules(tmp_path, "auto")
    prom = Asked(url)
    cycle = cycle_detector(rules, prom)
    empty = Cluster.build([], [])
    cycle(empty, END - STEP, PROFILE)
    prom.reads.clear()
    later = cycle(empty, END, PROFILE)
    spans, wholes = span_reads(prom)
    assert not spans & wholes
    assert later == cycle_detector(rules, whole(url))(empty, END, PROFILE)
    assert {f.subject for f in later.findings} == {"gpu/node-001/4", "pod/ml/leak-0"}
    # a detector of its own (new rules) reads whole; so does a detection that keeps nothing
    prom.spans.clear()
    cycle_detector(rules, prom)(empty, END, PROFILE)
    run_detection(rules, prom, None, END, profile=PROFILE)
    assert set(prom.spans) == {LOOKBACK}


class Garbled(Asked):
    """Answers the medians ranges of ``span`` with something that is not JSON."""

    def __init__(self, url: str, span: timedelta) -> None:
        super().__init__(url)
        self.span: timedelta | None = span

    def _get(self, path: str, params: Mapping[str, str], timeout: Any) -> Any:
        return self._garbled(path, params) or super()._get(path, params, timeout)

    def _post(self, path: str, form: Mapping[str, str], timeout: Any) -> Any:
        return self._garbled(path, form) or super()._post(path, form, timeout)

    def _garbled(self, path: str, form: Mapping[str, str]) -> None:
        medians = path.endswith("query_range") and "median" in form["query"]
        span = round(float(form["end"]) - float(form["start"]), 3) if medians else None
        if self.span is not None and span == self.span.total_seconds():
            raise requests.exceptions.JSONDecodeError("Expecting value", "<html>", 0)


def test_a_malformed_span_answer_fails_the_rule_as_a_whole_read_does(
    url: str, tmp_path: Path
) -> None:
    rules = leak_rules(tmp_path, "auto")
    memory = RangeMemory()
    prom = Garbled(url, 2 * STEP)
    run_detection(rules, prom, None, END - STEP, profile=PROFILE, memory=memory)
    later = run_detection(rules, prom, None, END, profile=PROFILE, memory=memory)
    read_whole = run_detection(rules, Garbled(url, LOOKBACK), None, END, profile=PROFILE)
    (failed,), (also,) = later.failures, read_whole.failures
    # the same one line, naming the query asked (the span's, the whole read's)
    shape = r"Prometheus at \S+ answered query '.+' with something that is not JSON \(.+\)"
    assert re.fullmatch(shape, failed.message) and re.fullmatch(shape, also.message)
    assert "\n" not in failed.message and failed.rule == also.rule == "gpu-memory-leak"
    # the kept answer is left as it was: the next detection reads the span and merges
    prom.span = None
    prom.reads.clear()
    again = run_detection(rules, prom, None, END, profile=PROFILE, memory=memory)
    spans, wholes = span_reads(prom)
    assert not spans & wholes
    assert again == run_detection(rules, whole(url), None, END, profile=PROFILE)
