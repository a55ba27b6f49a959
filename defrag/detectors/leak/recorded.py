"""The leak rule's queries over the recorded series of rules/prometheus/defrag.detection.rules.yaml.

Those recording rules evaluate, once per ``step``, exactly the expressions the leak rule asks of
the raw DCGM series: each range point's median (``quantile_over_time(0.5, used[step])``) and
the prefilter's terms over the lookback (``deriv``, ``count_over_time``, ``min_over_time``,
``max_over_time``). At one of the group's evaluation times ``t`` — and at every ``t − k·step``
— the recorded value *is* the raw expression's value at that time. So the rule is judged as at
the group's last evaluation (:func:`recorded_at`), reading each recorded value only at its own
evaluation time (:func:`read`), and its answers are the raw queries' answers at that time.

:func:`recorded_at` says whether the recorded series can stand in: the group's last marker
sample (``cluster:<metric>:count``, written after every other rule of the group) and one at
every ``step`` back over the whole lookback — else the rule reads the raw series.

The group also records the prefilter's verdict (:attr:`RecordedSeries.verdict`): the very
query the daemon would send over the recorded terms (:meth:`RecordedSeries.prefilter`, over
every series), evaluated in the group right after them, so a detection reads the GPUs that
pass instead of evaluating the joins over every GPU. Its settings are a label on it and on its
witness (:attr:`RecordedSeries.verdict_count`, the number of series that passed); the daemon
reads the verdict only when the witness with its own settings was recorded at the judged time
(:func:`verdict_recorded`), else it asks the prefilter over the terms as before.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from defrag.detectors.leak.core import LeakParams
from defrag.ports import MetricsSource, Sample

_PLAIN = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^{}]*\})?\s*$")

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))

VERDICT_LABEL = "defrag_prefilter"
"""The label that states, on the recorded verdict and its witness, the settings it was
recorded with (:func:`verdict_settings`)."""

RESTART_BELOW = 0.5
"""The prefilter's restart term: a series whose floor over the lookback is below this share of
its peak."""


def duration(seconds: float) -> str:
    """A whole number of seconds as Prometheus writes a duration in a name: ``5m``, ``6h``."""
    whole = round(seconds)
    for unit, size in _UNITS:
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


@dataclass(frozen=True, slots=True)
class RecordedSeries:
    """The recorded names for one leak rule's ``queries.used`` (a plain selector of ``metric``)
    at its ``step`` and ``lookback``; ``matchers`` are the selector's own (``{...}`` or '')."""

    metric: str
    matchers: str
    step_s: float
    lookback_s: float
    verdict_with: str = ""
    """The settings of a verdict recorded at the judged time with the rule's own settings
    (:func:`verdict_recorded`); "" when the prefilter is to be asked over the terms."""

    @property
    def median(self) -> str:
        return f"gpu:{self.metric}:median{duration(self.step_s)}"

    def over_lookback(self, op: str) -> str:
        return f"gpu:{self.metric}:{op}{duration(self.lookback_s)}"

    @property
    def marker(self) -> str:
        return f"cluster:{self.metric}:count"

    @property
    def verdict(self) -> str:
        """The prefilter's verdict: every series that passes it (any value)."""
        return f"gpu:{self.metric}:prefilter{duration(self.lookback_s)}"

    @property
    def verdict_count(self) -> str:
        """The verdict's witness: how many series passed at an evaluation, read from the
        verdict itself (absent when the verdict was not recorded then, or nothing passed)."""
        return f"cluster:{self.metric}:prefilter{duration(self.lookback_s)}"

    def verdict_selector(self, name: str, settings: str) -> str:
        """``name`` with the rule's matchers and the verdict's settings label."""
        inner = self.matchers.strip()[1:-1].strip().rstrip(",") if self.matchers else ""
        own = f"{VERDICT_LABEL}={json.dumps(settings, ensure_ascii=False)}"
        return f"{name}{{{inner + ', ' if inner else ''}{own}}}"

    def selector(self, name: str) -> str:
        """``name`` with the rule's own matchers (the recorded series keep every label)."""
        return f"{name}{self.matchers}"

    def read(self, selector: str) -> str:
        """A recorded series' value at the query's time only: its sample evaluated at that time
        (the window ``(t − step/2, t + 1 s]`` holds one evaluation; the second past ``t``
        forgives a time rounded to the second), never an older evaluation carried forward as a
        plain selector's look-back would. No sample there: no value, as the raw expression
        has none."""
        return f"last_over_time({selector}[{self.step_s / 2:.0f}s] offset -1s)"

    def prefilter(self, selector_of: dict[str, str], threshold: float, fewer: float) -> str:
        """The raw prefilter (registration's ``_prefilter``) over the recorded terms:
        ``selector_of`` maps each recorded name to its selector for this shard; the fleet's
        fullest count is over every series of the rule's own selector."""
        deriv = self.read(selector_of[self.over_lookback("deriv")])
        count = self.read(selector_of[self.over_lookback("count_over_time")])
        whole = self.read(self.selector(self.over_lookback("count_over_time")))
        low = self.read(selector_of[self.over_lookback("min_over_time")])
        high = self.read(selector_of[self.over_lookback("max_over_time")])
        last_step = self.read(selector_of[self.median])
        return (
            f"{deriv} * 3600 > {threshold:g}"
            f" or {count} < {fewer:.6g} * scalar(max({whole}))"
            f" or {count} unless {last_step}"
            f" or {low} < {RESTART_BELOW:g} * {high}"
        )

    def verdict_expr(self, threshold: float, fewer: float) -> str:
        """What the recording group evaluates as :attr:`verdict`: the prefilter over the terms
        of every series, as the daemon asks it (each shard's answer is this one's series of
        that shard)."""
        return self.prefilter({n: n for n in self.names}, threshold, fewer)

    def witness_expr(self, settings: str) -> str:
        """What the recording group evaluates as :attr:`verdict_count`: the verdict's series
        with ``settings`` at that evaluation, counted."""
        return f"count({self.read(self.verdict_selector(self.verdict, settings))})"

    @property
    def names(self) -> tuple[str, ...]:
        """Every recorded name a leak detection reads (the marker aside)."""
        ops = ("deriv", "count_over_time", "min_over_time", "max_over_time")
        return (self.median, *(self.over_lookback(op) for op in ops))


def recorded_series(used: str, params: LeakParams) -> RecordedSeries | None:
    """The recorded names standing for ``used`` (a plain selector), else None."""
    match = _PLAIN.match(used)
    if not match or match.group(1).startswith(("gpu:", "cluster:")):
        return None
    if params.bin_s < 2 or params.lookback_s < params.bin_s:
        return None
    return RecordedSeries(match.group(1), match.group(2) or "", params.bin_s, params.lookback_s)


def verdict_settings(threshold: float, fewer: float) -> str:
    """The prefilter's settings as the verdict's label states them: the slope threshold in
    MiB/h, the share of the fleet's fullest count below which a series began or has holes, the
    share of its peak below which a series restarted — written as the query writes them."""
    return f"deriv*3600>{threshold:g},count<{fewer:.6g}*max,min<{RESTART_BELOW:g}*max"


def verdict_recorded(
    recorded: RecordedSeries, metrics: MetricsSource, at: datetime, settings: str
) -> bool:
    """Whether the verdict with ``settings`` can stand in for the prefilter at ``at`` (the
    group's last evaluation, :func:`recorded_at`): the rule's selector has no matchers of its
    own (the verdict counts the fleet's fullest series over every series of the metric), and
    its witness with these settings was recorded at ``at`` itself — it counts the verdict's
    series at that evaluation, so the group recorded the verdict then, after the terms it
    reads, with the rule's settings (when nothing passed there is no witness, and the terms
    are asked). One small query."""
    if recorded.matchers.strip() not in ("", "{}"):
        return False
    witness = recorded.read(recorded.verdict_selector(recorded.verdict_count, settings))
    got = metrics.instant(witness, at)
    return len(got) == 1 and got[0].last is not None and math.isfinite(got[0].last)


def recorded_at(recorded: RecordedSeries, metrics: MetricsSource, now: datetime) -> datetime | None:
    """The last evaluation time of the recording group at or before ``now`` when the group was
    evaluated then and at every ``step`` before it over the lookback (so every point the rule
    reads has its recorded value); else None. Two small queries of the marker series."""
    latest = metrics.instant(f"max(timestamp({recorded.marker}))", now)
    if not latest or latest[0].last is None or not math.isfinite(latest[0].last):
        return None
    at = datetime.fromtimestamp(round(latest[0].last, 3), UTC)
    if at > now:
        return None
    start = at - timedelta(seconds=recorded.lookback_s)
    points = metrics.range(f"max(timestamp({recorded.marker}))", start, at, recorded.step_s)
    expected = math.floor(recorded.lookback_s / recorded.step_s + 1e-9) + 1
    if len(points) != 1 or len(points[0].points) != expected:
        return None
    if any(abs(t - v) > 5e-4 for t, v in points[0].points):
        return None  # an evaluation missed, or the group's interval does not divide the step
    return at


def nameless(samples: list[Sample]) -> list[Sample]:
    """The samples without ``__name__`` (``last_over_time`` keeps the recorded name, where the
    raw queries' functions drop the metric's), so they read as the raw answer."""
    return [
        Sample({k: v for k, v in s.labels.items() if k != "__name__"}, s.points)
        if "__name__" in s.labels
        else s
        for s in samples
    ]


__all__ = [
    "RESTART_BELOW",
    "VERDICT_LABEL",
    "RecordedSeries",
    "duration",
    "nameless",
    "recorded_at",
    "recorded_series",
    "verdict_recorded",
    "verdict_settings",
]
