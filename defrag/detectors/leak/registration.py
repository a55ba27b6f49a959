"""The leak detector's registration: GPU memory growing steadily towards exhaustion.

Rule model: :class:`LeakRule` (``queries``, ``labels``, ``prefilter`` here; the settings are
:class:`~.core.LeakParams`). Queries: ``queries.used`` over the lookback (5-min
medians computed by Prometheus, see :func:`leak_range_query`), ``queries.free`` and
``queries.reserved`` at the evaluation time. Pure function:
:func:`~.core.detect_leaks`. Alert: ``GPUMemoryLeakSuspected``. docs/rules.md,
"leak".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from itertools import chain
from operator import itemgetter
from typing import Any, Literal

import numpy as np

from defrag.alerting import AlertSpec
from defrag.detect.findings import Finding
from defrag.detect.kube_state import label, pod_key, scrape_targets
from defrag.detectors.leak.core import (
    DcgmLabels,
    GpuMemorySeries,
    LeakParams,
    Life,
    Occupancy,
    detect_leaks,
    detect_workload_leaks,
    memory_of_model,
    per_pod_occupants,
    split_incarnations,
    split_lives,
    split_occupancy,
    without_neighbours,
)
from defrag.detectors.leak.recorded import (
    RESTART_BELOW,
    RecordedSeries,
    nameless,
    recorded_at,
    recorded_series,
    verdict_recorded,
    verdict_settings,
)
from defrag.detectors.range_memory import Group, Key, current_memory, kept, keyed, ms
from defrag.detectors.registry import Detector, Inputs, MissingInput, register
from defrag.detectors.rulemodel import (
    Model,
    PromQL,
    RuleModel,
    settings_model,
    settings_of,
)
from defrag.model.gc_policy import gc_deferred
from defrag.ports import ConcurrentMetricsSource, MetricsSource, Query, Sample, ask

DcgmLabelNames = settings_model(DcgmLabels)
"""The ``labels:`` of a leak rule, generated from :class:`~.core.DcgmLabels`."""


class LeakQueries(Model):
    used: PromQL
    free: PromQL
    reserved: PromQL | None = None
    """``DCGM_FI_DEV_FB_RESERVED`` where the exporter is configured to export it."""
    owner: PromQL | None = "kube_pod_owner"
    """kube-state-metrics' pod owners: the workload whose pods die one after another (asked
    only when some pod's life ended at its GPU's memory; none: lives are grouped by pod)."""


class LeakRuleFields(RuleModel):
    """What only the edge reads; the settings come from :class:`LeakParams`."""

    queries: LeakQueries
    labels: DcgmLabelNames = DcgmLabelNames()  # type: ignore[valid-type]
    prefilter: bool = True
    """Ask Prometheus only for GPUs whose least-squares slope is at least half the minimum."""
    recorded: Literal["auto", "never"] = "auto"
    """``auto``: read the series of rules/prometheus/defrag.detection.rules.yaml where
    Prometheus has recorded them every ``step`` over the whole lookback (the rule is then
    judged as at their last evaluation, with the raw series' answers); else, and with
    ``never``, the raw series."""

    def promql(self) -> dict[str, str]:
        out = {"queries.used": self.queries.used, "queries.free": self.queries.free}
        if self.queries.reserved:
            out["queries.reserved"] = self.queries.reserved
        if self.queries.owner:
            out["queries.owner"] = self.queries.owner
        return out


def _run(rule: LeakRuleFields, params: LeakParams, inputs: Inputs) -> list[Finding]:
    lives: list[Life] = []
    now, recorded = judged_at(rule, inputs.prometheus, inputs.now)
    series = leak_series(rule, inputs.prometheus, now, lives, recorded=recorded)
    found = detect_leaks(
        series,
        params,
        now,
        lambda flagged: recent_samples(rule, inputs.prometheus, now, flagged),
    )
    workloads = detect_workload_leaks(_may_crash_loop(lives, params, now), params, now)
    return _one_per_workload(found, workloads, lives)


def judged_at(
    rule: LeakRuleFields, metrics: MetricsSource, now: datetime
) -> tuple[datetime, RecordedSeries | None]:
    """When the rule is judged and from which series: at ``now`` from the raw series, or — with
    ``recorded: auto`` and the recording rules evaluated over the whole lookback — at their
    last evaluation (at most one ``step`` before ``now``) from the recorded series; and the
    prefilter from its recorded verdict where that was recorded then with the rule's settings
    (``verdict_with``)."""
    recorded = recorded_series(rule.queries.used, LEAK.settings_of(rule))
    if rule.recorded == "never" or recorded is None:
        return now, None
    at = recorded_at(recorded, metrics, now)
    if at is None:
        return now, None
    if rule.prefilter:
        settings = verdict_settings(*_prefilter_settings(rule))
        if verdict_recorded(recorded, metrics, at, settings):
            recorded = replace(recorded, verdict_with=settings)
    return at, recorded


def _one_per_workload(
    found: list[Finding], workloads: list[Finding], lives: Sequence[Life]
) -> list[Finding]:
    """A workload that crash-loops on its leak is one finding: its pod now leaking (each life a
    new pod, or the same pod restarted) is named in the workload's evidence
    (``leaking_now``), not reported apart — else every life would page anew."""
    if not workloads:
        return found
    owner_of = {life.pod: life.owner for life in lives}
    by_owner = {w.subject.removeprefix("workload/"): w for w in workloads}
    kept: list[Finding] = []
    folded: dict[str, list[str]] = {}
    for f in found:
        owner = owner_of.get(f.subject.removeprefix("pod/"))
        if f.subject.startswith("pod/") and owner is not None and owner in by_owner:
            folded.setdefault(owner, []).append(f.summary)
        else:
            kept.append(f)
    merged = [
        replace(w, evidence={**w.evidence, "leaking_now": folded[o]}) if o in folded else w
        for o, w in by_owner.items()
    ]
    return kept + merged


def recent_samples(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    now: datetime,
    flagged: Sequence[GpuMemorySeries],
) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """The raw samples of ``flagged`` over the stop test's reach (``stop_tail`` + ``stop_null``
    before ``now``): the range query answers a step's median per point, too coarse to tell
    growth that stopped 15 min ago. One instant query of a range selector per label that can
    name the GPUs (Prometheus answers its raw samples), narrowed to the flagged GPUs, so a fleet
    pays for the few GPUs about to be reported only. None for a series whose samples are not
    found, and for all when ``queries.used`` is not a plain selector (nothing to ask raw)."""
    if not _SELECTOR.match(rule.queries.used):
        return [None] * len(flagged)
    params = LEAK.settings_of(rule)
    names: DcgmLabels = settings_of(rule.labels)
    window = f"[{params.stop_tail_s + params.stop_null_s:.0f}s]"
    sel = rule.queries.used.strip()
    keys = [one.key for one in flagged]
    uuids = sorted({k[1] for k in keys if k[0] == "uuid"})
    nodes = sorted({k[1] for k in keys if k[0] == "node"})
    matchers = [f"{name}=~{_regex(uuids)}" for name in names.uuid if uuids] + [
        f"{name}=~{_regex(nodes, port=name == 'instance')}" for name in names.node if nodes
    ]
    queries = [_with_matcher(sel, matcher) + window for matcher in matchers]
    samples: dict[tuple[str, ...], list[Sample]] = {}
    seen: set[tuple[tuple[str, str], ...]] = set()
    if isinstance(metrics, ConcurrentMetricsSource):
        answers = metrics.ask_all([Query(q, now) for q in queries])
    else:
        answers = [metrics.instant(q, now) for q in queries]
    for answer in answers:
        for got in answer:
            identity = tuple(sorted(got.labels.items()))
            key = names.key(got.labels)
            if key is not None and identity not in seen:
                seen.add(identity)
                samples.setdefault(key, []).append(got)
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for one, key in zip(flagged, keys, strict=True):
        pods = set(one.pods)
        mine = [
            s for s in samples.get(key, [])
            if (not pods or names.pod_key(s.labels, frozenset()) in pods)
            and (not one.pod_uid or names.uid_of(s.labels) == one.pod_uid)
        ]  # fmt: skip
        out.append(_merge_points(mine) if mine and any(s.points for s in mine) else None)
    return out


def _regex(values: Sequence[str], port: bool = False) -> str:
    """A quoted PromQL regex matching exactly ``values`` (with any ``:port`` after each)."""
    body = "|".join(_quote_meta(v) for v in values)
    return json.dumps(f"({body})(:[0-9]+)?" if port else f"({body})", ensure_ascii=False)


def _may_crash_loop(lives: list[Life], params: LeakParams, now: datetime) -> list[Life]:
    """The lives of the workloads that have at least ``min_lives`` ended lives within the
    lookback — the only ones :func:`~.core.detect_workload_leaks` can report (a finding needs
    that many lives that *ended* grown) — so no other life's growth is fitted. Its findings are
    the same: it groups lives by owner over the same lookback and reads only these groups."""
    since = now.timestamp() - params.lookback_s
    ended: dict[str, int] = {}
    for life in lives:
        if life.ended and len(life.times) and life.times[-1] > since:
            ended[life.owner] = ended.get(life.owner, 0) + 1
    return [life for life in lives if ended.get(life.owner, 0) >= params.min_lives]


def _edge(rule: LeakRuleFields) -> Mapping[str, Any]:
    return {"query": rule.queries.used}


LEAK: Detector[LeakRuleFields, LeakParams] = register(
    Detector(
        name="leak",
        rule=LeakRuleFields,
        settings=LeakParams,
        needs=frozenset({"metrics"}),
        run=_run,
        # gpu_instance and uuid (besides the routing node/gpu): one alert per GPU or MIG
        # instance of a pod, never merged by Alertmanager
        alerts={
            "leak": [AlertSpec("GPUMemoryLeakSuspected", labels=("gpu_instance", "uuid"))],
            "leak-restarts": [
                AlertSpec("GPUMemoryLeakCrashLoop", labels=("owner_kind", "owner_name"))
            ],
        },
        edge_settings=_edge,
    )
)
LeakRule = LEAK.model
"""The leak rule model (edge fields and settings)."""

_SELECTOR = re.compile(r"^\s*[A-Za-z_:][A-Za-z0-9_:]*\s*(\{[^{}]*\})?\s*$")


def leak_range_query(rule: LeakRuleFields, matcher: str = "") -> str:
    """The range query for the leak rule (``matcher``, e.g. ``gpu=~"[0-3]"``, added to the
    selector: one shard of it, see :func:`leak_range_shards`).

    When ``queries.used`` is a plain selector, each point is the median of the samples of its
    ``step`` (``quantile_over_time(0.5, used[step])``): Prometheus does the first reduction, so
    1,000 GPUs at 30 s come back as 72 points each over 6 h. With ``prefilter``, only the GPUs
    of which some series has a least-squares slope over the whole lookback (``deriv(...) @
    end()``, evaluated once) of at least half the minimum come back — *every* series of such a
    GPU (``and on(<the GPU's labels>)``), so the GPU's present occupant is seen beside a pod
    that grew and ended. The detector judges the present occupant only, and a necessary
    condition of its verdict is checked by the property test over the corpus
    (tests/test_detect_corpus.py): the results are the same with the prefilter off.
    """
    used = rule.queries.used
    if not _SELECTOR.match(used):
        return used
    sel = _with_matcher(used.strip(), matcher) if matcher else used.strip()
    query = _medians(rule, sel)
    if not rule.prefilter:
        return query
    on = ", ".join(_gpu_labels(rule))
    return f"({query}) and on({on}) ({_prefilter(rule, sel, 'end()')})"


def _at(now: datetime) -> str:
    """``now`` as the ``@`` of a query ending there: as the adapter sends a range's end (whole
    seconds when whole, else to the millisecond, Prometheus's resolution)."""
    if now.microsecond == 0:
        return f"{round(now.timestamp())}"
    return f"{now.timestamp():.3f}"


def _medians(rule: LeakRuleFields, selector: str) -> str:
    return f"quantile_over_time(0.5, {selector}[{LEAK.settings_of(rule).bin_s:.0f}s])"


def _prefilter(
    rule: LeakRuleFields, selector: str, at: str, recorded: RecordedSeries | None = None
) -> str:
    """The series that may make their GPU's verdict a leak at ``at``: those whose least-squares
    slope over the lookback is at least half the minimum; those that began, or have a hole of
    more than 1.5 steps, inside the lookback (fewer samples than the fleet's fullest series
    less 1.5 steps' worth: a new pod, a pod re-created under its name, a neighbour arriving);
    and those that ended inside it (no sample in the last step: a neighbour or an incarnation
    gone); and those that fell to half their peak or less (a restart, an OOM kill: the
    detector judges what follows, and a workload's lives). The detector judges each incarnation
    apart and removes the steps neighbours make, so a GPU whose history changed hands or
    restarted is always fetched whatever its overall slope. The fullest
    series is found over the whole ``queries.used`` (not the shard's), so every shard compares
    with the same count."""
    params = LEAK.settings_of(rule)
    threshold, fewer = _prefilter_settings(rule)
    look = f"[{params.lookback_s:.0f}s] @ {at}"
    whole = rule.queries.used.strip()
    if recorded is not None:  # the same terms, recorded; asked at ``at`` itself
        own = selector[len(recorded.metric) :].strip()
        return recorded.prefilter({n: f"{n}{own}" for n in recorded.names}, threshold, fewer)
    return (
        f"deriv({selector}{look}) * 3600 > {threshold:g}"
        f" or count_over_time({selector}{look}) < {fewer:.6g} * "
        f"scalar(max(count_over_time({whole}{look})))"
        f" or count_over_time({selector}{look}) unless "
        f"count_over_time({selector}[{params.bin_s:.0f}s] @ {at})"
        f" or min_over_time({selector}{look}) < {RESTART_BELOW:g} * "
        f"max_over_time({selector}{look})"
    )


def _prefilter_settings(rule: LeakRuleFields) -> tuple[float, float]:
    """The prefilter's slope threshold (MiB/h: half the rule's minimum) and the share of the
    fleet's fullest sample count below which a series began or has holes (1.5 steps short)."""
    params = LEAK.settings_of(rule)
    return params.min_slope_mib_per_h / 2, 1.0 - 1.5 * params.bin_s / params.lookback_s


def _gpu_labels(rule: LeakRuleFields) -> list[str]:
    """The labels that name one GPU whatever the series: not ``instance`` (a new exporter pod
    after a restart has a new one), nor the pod labels (a new occupant)."""
    names: DcgmLabels = settings_of(rule.labels)
    node = (n for n in names.node if n != "instance")
    return list(dict.fromkeys([*names.uuid, *node, names.gpu, names.gpu_instance]))


SHARDS = ('=~"[0-3]"', '!~"[0-3]"')
"""How :func:`leak_range_shards` splits the range query: by GPU index, GPUs 0–3 and the rest
(a series without the label is in the rest)."""


def leak_range_shards(rule: LeakRuleFields) -> list[str]:
    """The range query of :func:`leak_range_query` as queries that a server can evaluate at
    once, on several cores. Their answers together are the one query's answer: the shards
    split the series by the GPU index label, which every series is in exactly one of; and the
    prefilter's ``and on(...)`` matches series whose GPU index labels are equal, so its two
    sides meet within one shard. One query when ``queries.used`` is not a plain selector."""
    if not _SELECTOR.match(rule.queries.used):
        return [leak_range_query(rule)]
    return [leak_range_query(rule, matcher) for matcher in _shard_matchers(rule)]


def _shard_matchers(rule: LeakRuleFields) -> list[str]:
    label = settings_of(rule.labels).gpu
    return [f"{label}{match}" for match in SHARDS]


def _with_matcher(selector: str, matcher: str) -> str:
    """``name{a="b"}`` and ``x="y"`` → ``name{a="b", x="y"}``."""
    name, brace, rest = selector.partition("{")
    inner = rest.rstrip()[:-1].strip().rstrip(",") if brace else ""
    return f"{name.strip()}{{{inner + ', ' if inner else ''}{matcher}}}"


NARROW_AT_MOST = 20_000
"""The most GPUs whose names :func:`_ask_leak_queries` writes into the range query's selector
(a larger answer is fetched whole and joined here)."""


def _ask_leak_queries(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    start: datetime,
    now: datetime,
    recorded: RecordedSeries | None = None,
) -> tuple[list[Sample], list[Sample], list[Sample], list[Sample]]:
    """``queries.used`` over the lookback as :func:`leak_range_query` answers it, and
    ``free``, ``reserved`` and ``used`` now.

    A source that answers several queries at once (:class:`ConcurrentMetricsSource`) is asked
    in two rounds. First the prefilter — the slope of every series over the lookback
    ending where the range ends (``@`` its end, which ``end()`` would be), in the shards of
    :data:`SHARDS` so the server evaluates it on several cores — beside the instants. Then the
    medians of only the GPUs that passed, in chunks of whole nodes (at least the source's
    ``concurrency`` of them, :func:`_node_chunks`): each chunk's selector names its GPUs by the
    GPU label that tells most of them apart (a superset: every series the prefilter's
    ``and on(...)`` would keep has one of those values), and the join itself is done here, on
    the same labels, so the answer is the one query's — while Prometheus computes the medians
    of the passing GPUs only, not of all. With ``recorded`` (:func:`judged_at`), the prefilter
    and the medians read the recorded series, asked the same way (any source); the prefilter
    is then one read of its recorded verdict where ``recorded.verdict_with`` says it stands in.
    Any other source is asked the one query, then the instants (``used`` now only when the range
    has series)."""
    params = LEAK.settings_of(rule)
    reserved_q = rule.queries.reserved
    concurrent = isinstance(metrics, ConcurrentMetricsSource)
    if not concurrent and recorded is None:
        used = metrics.range(leak_range_query(rule), start, now, params.bin_s)
        free = metrics.instant(rule.queries.free, now)
        reserved = metrics.instant(reserved_q, now) if reserved_q else []
        used_now = metrics.instant(rule.queries.used, now) if used else []
        return used, free, reserved, used_now
    plain = _SELECTOR.match(rule.queries.used) is not None
    prefilter = rule.prefilter and plain
    sel = rule.queries.used.strip()
    at = _at(now)
    if prefilter and recorded is not None and recorded.verdict_with:
        # the verdict recorded at ``now`` with the rule's settings: the GPUs that pass, read
        # as recorded instead of evaluated over every GPU's terms
        verdict = recorded.verdict_selector(recorded.verdict, recorded.verdict_with)
        first = [Query(recorded.read(verdict), now)]
    elif prefilter:
        first = [
            Query(_prefilter(rule, _with_matcher(sel, m), at, recorded), now)
            for m in _shard_matchers(rule)
        ]
    else:
        first = []
    instants = [Query(rule.queries.free, now), Query(rule.queries.used, now)]
    if reserved_q:
        instants.append(Query(reserved_q, now))
    answers = _ask_all(metrics, [*first, *instants])
    passed = [s for part in answers[: len(first)] for s in part]
    free, used_now = answers[len(first)], answers[len(first) + 1]
    reserved = answers[len(first) + 2] if reserved_q else []
    if not plain:
        used = metrics.range(rule.queries.used, start, now, params.bin_s)
    elif not prefilter:
        used = _medians_read(rule, metrics, start, now, None, recorded)
    elif not passed:
        used = []  # no GPU passed the prefilter: the one query's answer is empty too
        _forget(rule, recorded, prefilter)
    else:
        on = _gpu_labels(rule)
        wanted = frozenset(tuple(s.labels.get(k, "") for k in on) for s in passed)
        used = _medians_read(rule, metrics, start, now, wanted, recorded)
    return used, free, reserved, used_now if used else []


def _ask_all(metrics: MetricsSource, queries: Sequence[Query]) -> list[list[Sample]]:
    if isinstance(metrics, ConcurrentMetricsSource):
        return metrics.ask_all(queries)
    return [ask(metrics, q) for q in queries]


def _as_recorded(recorded: RecordedSeries, selector: str) -> str:
    """``queries.used``'s selector (with a shard's matchers) as the recorded medians'."""
    return f"{recorded.median}{selector[len(recorded.metric) :].strip()}"


def _medians_key(
    rule: LeakRuleFields, recorded: RecordedSeries | None, prefilter: bool
) -> tuple[str, ...]:
    """What a detection's medians read is kept under: the rule, its selector, the series read
    (raw or recorded) and whether the prefilter narrows it (step and lookback are checked by
    the kept answer itself)."""
    median = recorded.median if recorded else ""
    return ("leak", rule.name, rule.queries.used.strip(), median, "prefilter" * prefilter)


def _forget(rule: LeakRuleFields, recorded: RecordedSeries | None, prefilter: bool) -> None:
    memory = current_memory()
    if memory is not None:
        memory.drop(_medians_key(rule, recorded, prefilter))


def _medians_read(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    start: datetime,
    now: datetime,
    wanted: frozenset[Group] | None,
    recorded: RecordedSeries | None,
) -> list[Sample]:
    """The medians of the GPUs ``wanted`` (None: of every series) over ``start`` … ``now``, as
    the one range query answers them (:func:`_medians_of`).

    Within a detection that remembers (:func:`~defrag.detectors.range_memory.current_memory`: a
    daemon's cycles), the answer is kept, and a later detection asks only for what it lacks:
    the span since the kept end for the GPUs kept whole, the whole lookback for the GPUs new
    to the prefilter — in one round — and merges the kept points in
    (:meth:`~defrag.detectors.range_memory.KeptRange.merged`). Anything doubtful reads the whole
    range as a detection that keeps nothing does: nothing kept, another step or lookback, an
    end not a whole number of steps after the kept one or past the lookback, a span that does
    not line up with the kept points (asked again at the kept range's last settled point)."""
    params = LEAK.settings_of(rule)
    memory = current_memory()
    key = _medians_key(rule, recorded, wanted is not None)
    before = memory.get(key) if memory is not None else None
    end_ms, step_ms, lookback_ms = ms(now.timestamp()), ms(params.bin_s), ms(params.lookback_s)
    since = before.since(end_ms, step_ms, lookback_ms) if before is not None else None
    used: list[tuple[Key, Sample]] | None = None
    if before is not None and since is not None:
        covered = before.covered
        old = wanted if wanted is None or covered is None else wanted & covered
        new = None if wanted is None or covered is None else wanted - covered
        span_start = now - timedelta(milliseconds=end_ms - since)
        reads = [(span_start, old)] + ([(start, new)] if new else [])
        answers = _medians_of(rule, metrics, now, reads, recorded)
        on = _gpu_labels(rule)
        with gc_deferred(None):  # a burst of acyclic tuples, as the adapter's decoding
            merged = before.merged(
                answers[0],
                lambda labels: tuple(labels.get(k, "") for k in on),
                old,
                since,
                end_ms - lookback_ms,
            )
        if merged is not None:
            used = sorted(merged + (answers[1] if new else []), key=itemgetter(0))
    if used is None:
        used = _medians_of(rule, metrics, now, [(start, wanted)], recorded)[0]
    if memory is not None:
        memory.put(key, kept(used, wanted, end_ms, step_ms, lookback_ms))
    return [sample for _, sample in used]


def _medians_of(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    now: datetime,
    reads: Sequence[tuple[datetime, frozenset[Group] | None]],
    recorded: RecordedSeries | None,
) -> list[list[tuple[Key, Sample]]]:
    """For each read (a start, and the GPUs wanted: None for every series), the medians from
    that start to ``now`` as the one range query answers them (in its order, each series with
    its label pairs), every read's queries asked at once; recorded: read from the recorded
    series instead of computed.

    Every series: the selector in the shards of :data:`SHARDS`. The GPUs that passed the
    prefilter: in chunks of whole nodes (at least the source's ``concurrency`` of them,
    :func:`_node_chunks`), each chunk's selector naming its GPUs by the GPU label that tells
    most of them apart (a superset: every series the prefilter's ``and on(...)`` would keep
    has one of those values), and the join done here, on the same labels."""
    params = LEAK.settings_of(rule)
    sel = rule.queries.used.strip()
    on = _gpu_labels(rule)
    names: DcgmLabels = settings_of(rule.labels)

    def of(selector: str) -> str:
        if recorded is not None:
            return recorded.read(_as_recorded(recorded, selector))
        return _medians(rule, selector)

    queries: list[list[Query]] = []
    for start, wanted in reads:
        if wanted is None:
            selectors = [_with_matcher(sel, m) for m in _shard_matchers(rule)]
        elif not wanted:
            selectors = []
        else:
            concurrency = getattr(metrics, "concurrency", len(SHARDS))
            chunks = _node_chunks(on, names, set(wanted), concurrency)
            narrowed = [_one_of(on, chunk) for chunk in chunks]
            # a chunk too large to name (one node past NARROW_AT_MOST GPUs): every series, once
            selectors = [_with_matcher(sel, m) for m in narrowed] if all(narrowed) else [sel]
        queries.append([Query(of(s), now, start, params.bin_s) for s in selectors])
    answers = _ask_all(metrics, [q for read in queries for q in read])
    out: list[list[tuple[Key, Sample]]] = []
    for (_, wanted), read in zip(reads, queries, strict=True):
        mine, answers = answers[: len(read)], answers[len(read) :]
        answer = [s for part in mine for s in part]
        if recorded is not None:
            answer = nameless(answer)
        if wanted is not None:
            answer = [s for s in answer if tuple(s.labels.get(k, "") for k in on) in wanted]
        out.append(keyed(answer))  # in the one query's order, each with its label pairs
    return out


def _node_chunks(
    on: list[str], names: DcgmLabels, wanted: set[tuple[str, ...]], at_least: int
) -> list[set[tuple[str, ...]]]:
    """``wanted`` (GPU signatures on the labels ``on``) split by node, round robin over the
    sorted node names, into at least ``at_least`` chunks and enough that none names more than
    :data:`NARROW_AT_MOST` GPUs (a node's GPUs stay together; fewer nodes, fewer chunks).
    Together they are ``wanted``: each GPU is in the chunk of its node."""
    at = [i for i, k in enumerate(on) if k in names.node]
    by_node: dict[str, set[tuple[str, ...]]] = {}
    for w in wanted:
        node = next((w[i] for i in at if w[i]), "")
        by_node.setdefault(node, set()).add(w)
    count = max(at_least, math.ceil(len(wanted) / NARROW_AT_MOST), 1)
    chunks: list[set[tuple[str, ...]]] = [set() for _ in range(min(count, len(by_node)))]
    for i, node in enumerate(sorted(by_node)):
        chunks[i % len(chunks)] |= by_node[node]
    return chunks


def _one_of(on: list[str], wanted: set[tuple[str, ...]]) -> str:
    """A matcher on the label of ``on`` with the most distinct values among ``wanted`` that
    every series with one of those signatures matches (an empty value matches a series without
    the label); "" when there are too many to write."""
    best = max(range(len(on)), key=lambda k: len({w[k] for w in wanted}))
    values = sorted({w[best] for w in wanted})
    if len(values) > NARROW_AT_MOST:
        return ""
    regex = "|".join(_quote_meta(v) for v in values)
    return f"{on[best]}=~{json.dumps(regex, ensure_ascii=False)}"


_META = frozenset("\\.+*?()|[]{}^$")


def _quote_meta(value: str) -> str:
    """A literal in an RE2 regular expression (Go's regexp.QuoteMeta: a backslash before each
    of ``\\.+*?()|[]{}^$``), so Prometheus can match the alternation as a set of values."""
    return "".join("\\" + c if c in _META else c for c in value)


def leak_series(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    now: datetime,
    lives: list[Life] | None = None,
    *,
    recorded: RecordedSeries | None = None,
) -> list[GpuMemorySeries]:
    """One memory series per GPU (per MIG instance) over the rule's lookback: its present
    occupant's (pods that ended are not its present), with the pods DCGM names on it. Raises
    :class:`MissingInput` when DCGM's series are absent, or when no series carries labels that
    name a GPU.

    A GPU whose node's exporter has said nothing for more than a ``step`` (no fresh
    ``queries.free`` on the node) is judged on what it last said, with its age (``stale_s``); a
    GPU that went silent while its node's exporter still speaks has ended (gone, or its pod
    gone without a successor series) and is not judged. Capacity is used + free now, else the
    last used + free within the lookback, else the GPU model's memory (``modelName``), never 0
    by default (``capacity_from`` says which).

    ``lives``, when given, receives every pod's lives on the GPUs seen (cut at restarts, the
    ended ones marked), each with its owner from ``queries.owner`` — asked only when some life
    ended at its GPU's memory. ``recorded``: the medians and the prefilter read from the
    recorded series (``now`` must then be their evaluation time, :func:`judged_at`)."""
    params = LEAK.settings_of(rule)
    start = now - timedelta(seconds=params.lookback_s)
    used, free, reserved, used_now = _ask_leak_queries(rule, metrics, start, now, recorded)
    names: DcgmLabels = settings_of(rule.labels)
    if not used and not free:
        raise MissingInput(
            f"queries.used ({rule.queries.used}) and queries.free ({rule.queries.free}) return "
            "no series: is the DCGM exporter scraped?"
        )
    if used and not free:
        raise MissingInput(
            f"queries.free ({rule.queries.free}) returns no series: no GPU's capacity is known"
        )
    targets = names.target_pods(s.labels for s in [*used, *free])
    last_of: dict[str, dict[Any, float]] = {
        kind: _last_by_key(samples, names)
        for kind, samples in (("free", free), ("reserved", reserved))
    }
    # used now: the device's own series where the exporter adds each pod's beside it (its
    # labels name no pod), else the copies on the pods' series (the same value); and each
    # pod's own, by pod and UID — in one pass over every GPU's series
    any_used: dict[tuple[str, ...], float] = {}
    device_used: dict[tuple[str, ...], float] = {}
    last_of["pod_used"] = {}
    for s in used_now:
        k, last = names.key(s.labels), s.last
        if k is None or last is None:
            continue
        any_used[k] = last
        pod = names.pod_key(s.labels, targets)
        if pod:
            last_of["pod_used"][(k, pod, names.uid_of(s.labels))] = last
        else:
            device_used[k] = last
    last_of["used"] = any_used | device_used
    live_nodes = {names.node_of(s.labels) for s in free} - {""}
    unkeyed = 0
    groups: dict[tuple[str, ...], list[Sample]] = {}
    for s in used:
        key = names.key(s.labels)
        if key is None:
            unkeyed += 1
            continue
        groups.setdefault(key, []).append(s)
    if not groups and (unkeyed or (free and not last_of["free"])):
        raise MissingInput(
            "no DCGM series carries a GPU UUID or a node and GPU label "
            f"(labels.uuid: {', '.join(names.uuid)}; labels.node: {', '.join(names.node)}; "
            f"labels.gpu: {names.gpu})"
        )
    end = now.timestamp()
    final: dict[tuple[str, ...], GpuMemorySeries] = {}
    series: GpuMemorySeries
    silent: list[tuple[tuple[str, ...], GpuMemorySeries]] = []
    occupied: dict[tuple[str, ...], tuple[tuple[Occupancy, ...], tuple[Occupancy, ...]]] = {}
    for key, samples in sorted(groups.items()):
        occupancies, labels_of = _occupancies(samples, names, targets, params.bin_s)
        current, ended = split_occupancy(occupancies, params.bin_s)
        if not current:
            continue
        latest = labels_of[max(current, key=lambda o: o.last)]
        node = names.node_of(latest)
        gpu_fresh = key in last_of["free"] or node in live_nodes
        reserved_mib = last_of["reserved"].get(key, 0.0)
        free_now = last_of["free"].get(key)
        if per_pod_occupants(current):
            # the device's series and each pod's own: each pod judged on its own memory, which
            # runs out when it has taken all the GPU's free memory
            occupied[key] = (current, ended)
            for life in current:
                if not life.pod:
                    continue
                stale_s = end - float(life.times[-1])
                if stale_s > 0 and gpu_fresh:
                    continue  # the exporter still speaks: this pod has left the GPU
                series = GpuMemorySeries(
                    node=node,
                    gpu=latest.get(names.gpu, ""),
                    times=life.times,
                    used_mib=life.used_mib,
                    total_mib=0.0,
                    pods=(life.pod,),
                    uuid=names.uuid_of(latest),
                    instance=latest.get(names.gpu_instance, ""),
                    profile=latest.get(names.gpu_profile, ""),
                    reserved_mib=0.0,
                    stale_s=stale_s,
                    pod_uid=life.uid if not life.uid.startswith("@") else "",
                    per_pod=True,
                )
                own = last_of["pod_used"].get((key, life.pod, life.uid))
                if free_now is not None:
                    mine = own if own is not None else float(life.used_mib[-1])
                    series = replace(series, total_mib=mine + free_now, capacity_from="used+free")
                    final[(*key, life.pod, life.uid)] = series
                else:
                    silent.append(((*key, life.pod, life.uid), series))
            continue
        times, values = _merge_points_arrays([(o.times, o.used_mib) for o in current])
        # pods arriving (a holder now among them) or leaving (another pod, not an earlier
        # incarnation of a holder) while the GPU's present holders were there
        holders = {o.pod for o in current}
        changes = [
            edge
            for o in occupancies
            if o.pod and len(o.times) and (o in current or o.pod not in holders)
            for edge in (
                (float(o.times[0]) - params.bin_s / 2,)
                if o in current
                else (float(o.times[0]) - params.bin_s / 2, float(o.times[-1]))
            )
            if times[0] < edge < times[-1]
        ]
        if changes and any(o.pod for o in current):
            values = without_neighbours(times, values, changes, 3 * params.bin_s)
        # the last point is the bin ending at ``end`` when a sample came within the last bin
        stale_s = end - float(times[-1]) if len(times) else 0.0
        if stale_s > 0 and gpu_fresh:
            continue  # the exporter still speaks: this GPU's occupant has ended
        pods = tuple(sorted({life.pod for life in current if life.pod}))
        uids = {life.uid for life in current if life.pod}
        named = any(labels_of[o].get(p) for o in current for p in names.pod)
        if free_now is not None:
            used_at = last_of["used"].get(key, float(values[-1]) if len(values) else 0.0)
            total = used_at + free_now + reserved_mib
            capacity: dict[str, Any] = {"total_mib": total, "capacity_from": "used+free"}
        else:
            capacity = _model_capacity(latest)
        series = GpuMemorySeries(
            node=node,
            gpu=latest.get(names.gpu, ""),
            times=times,
            used_mib=values,
            pods=pods,
            uuid=names.uuid_of(latest),
            instance=latest.get(names.gpu_instance, ""),
            profile=latest.get(names.gpu_profile, ""),
            reserved_mib=reserved_mib,
            exporter_only=named and not pods,
            stale_s=stale_s,
            pod_uid=next(iter(uids)) if len(pods) == 1 and len(uids) == 1 else "",
            **capacity,
        )
        occupied[key] = (current, ended)
        if free_now is not None:
            final[key] = series
        else:
            silent.append((key, series))
    if silent:  # asked only when some GPU has no fresh reading: capacity from the last values
        window = f"[{params.lookback_s:.0f}s]"
        last_free = _last_by_key(metrics.instant(_last_over(rule.queries.free, window), now), names)
        last_used = _last_by_key(metrics.instant(_last_over(rule.queries.used, window), now), names)
        for key, series in silent:
            gpu_key = key[:3] if key[0] == "uuid" else key[:4]
            if series.per_pod and gpu_key in last_free:
                mine = float(series.used_mib[-1])
                series = replace(
                    series, total_mib=mine + last_free[gpu_key], capacity_from="last used+free"
                )
            elif key in last_free and key in last_used:
                total = last_used[key] + last_free[key] + series.reserved_mib
                series = replace(series, total_mib=total, capacity_from="last used+free")
            final[key] = series
    if lives is not None:
        lives += _lives(rule, metrics, now, occupied, final)
    return sorted(
        final.values(), key=lambda s: (s.node, s.gpu, s.uuid, s.instance, s.pods, s.pod_uid)
    )


def _occupancies(
    samples: list[Sample], names: DcgmLabels, targets: frozenset[str], bin_s: float
) -> tuple[list[Occupancy], dict[Occupancy, Mapping[str, str]]]:
    """The occupants of one GPU: one per pod incarnation — the pod's UID where the exporter
    names it, else its name, cut where its series has a hole while the GPU's other series went
    on (a pod re-created under its name) — and one for the series that name no pod. With the
    labels of each one's latest series."""
    by_pod: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        pod = names.pod_key(s.labels, targets) or ""
        by_pod.setdefault((pod, names.uid_of(s.labels) if pod else ""), []).append(s)
    merged = {ident: _merge_points(group) for ident, group in by_pod.items()}
    out: list[Occupancy] = []
    labels_of: dict[Occupancy, Mapping[str, str]] = {}
    for (pod, uid), group in by_pod.items():
        whole = Occupancy(pod, *merged[(pod, uid)], uid)
        others = [t for ident, (t, _) in merged.items() if ident[0] != pod]
        latest = group[0] if len(group) == 1 else max(group, key=_last_time)
        # no other series on the GPU: nothing tells an incarnation apart (a GPU held by one pod)
        parts = [whole]
        if pod and others:
            parts = split_incarnations(whole, np.concatenate(others), 1.5 * bin_s)
        for part in parts:
            out.append(part)
            labels_of[part] = latest.labels
    return out, labels_of


def _last_time(sample: Sample) -> float:
    """When a series' last point is (0 without points): its GPU's latest series names it."""
    return sample.points[-1][0] if sample.points else 0.0


def _lives(
    rule: LeakRuleFields,
    metrics: MetricsSource,
    now: datetime,
    occupied: Mapping[tuple[str, ...], tuple[tuple[Occupancy, ...], tuple[Occupancy, ...]]],
    series: Mapping[tuple[str, ...], GpuMemorySeries],
) -> list[Life]:
    """Every pod's lives on the judged GPUs, with their owners (the pod itself without one)."""
    runs: list[tuple[str, Life]] = []
    by_gpu: dict[tuple[str, ...], GpuMemorySeries] = {}
    for k, one in series.items():
        by_gpu.setdefault(k if not one.per_pod else k[:-2], one)
    for key, (current, ended) in occupied.items():
        gpu = by_gpu.get(key)
        if gpu is None:
            continue
        for occupancy, now_ in [(o, True) for o in current] + [(o, False) for o in ended]:
            if not occupancy.pod:
                continue
            namespace, _, name = occupancy.pod.partition("/")
            for life in split_lives(
                f"{namespace}/Pod/{name}",  # the owner unless kube_pod_owner names one, below
                occupancy.pod,
                gpu.subject,
                gpu.node,
                occupancy.times,
                occupancy.used_mib,
                gpu.usable_mib,
                current=now_,
            ):
                runs.append((occupancy.pod, life))
    full = [life for _, life in runs if life.ended and life.used_mib.max() >= 0.9 * life.usable_mib]
    owners = _owners(rule, metrics, now) if len(full) >= 2 and rule.queries.owner else {}
    return [life if pod not in owners else replace(life, owner=owners[pod]) for pod, life in runs]


def _owners(rule: LeakRuleFields, metrics: MetricsSource, now: datetime) -> dict[str, str]:
    """``namespace/pod`` → ``namespace/<owner_kind>/<owner_name>`` from kube_pod_owner over the
    lookback (kube-state-metrics docs/metrics/workload/pod-metrics.md: ``pod``, ``namespace``,
    ``owner_kind``, ``owner_name``; the ``exported_*`` variants read first)."""
    assert rule.queries.owner
    params = LEAK.settings_of(rule)
    window = f"[{params.lookback_s:.0f}s]"
    samples = metrics.instant(_last_over(rule.queries.owner, window), now)
    targets = scrape_targets(s.labels for s in samples)
    out = {}
    for s in samples:
        pod = pod_key(s.labels, targets)
        kind, name = label(s.labels, "owner_kind"), label(s.labels, "owner_name")
        if pod and kind and name and kind != "<none>":
            out[pod] = f"{pod.partition('/')[0]}/{kind}/{name}"
    return out


def _last_by_key(samples: list[Sample], names: DcgmLabels) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for s in samples:
        key = names.key(s.labels)
        if key is not None and s.last is not None:
            out[key] = s.last
    return out


def _last_over(query: str, window: str) -> str:
    """``last_over_time`` of a query over ``window`` (a subquery when it is not a selector)."""
    if _SELECTOR.match(query):
        return f"last_over_time({query.strip()}{window})"
    return f"last_over_time(({query}){window[:-1]}:])"


def _model_capacity(labels: Mapping[str, str]) -> dict[str, Any]:
    """The GPU model's memory from dcgm-exporter's ``modelName`` label
    (internal/pkg/rendermetrics/render_metrics.go writes it on every series), else unknown."""
    mib = memory_of_model(labels.get("modelName", ""))
    if mib is None:
        return {"total_mib": 0.0, "capacity_from": "unknown"}
    return {"total_mib": mib, "capacity_from": "model"}


def _merge_points_arrays(
    parts: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """One time-ordered series from several (times, values): values at a time averaged (the
    same value copied onto each pod's series of a GPU without per-process data)."""
    if len(parts) == 1:
        return parts[0]
    times = np.concatenate([t for t, _ in parts])
    values = np.concatenate([v for _, v in parts])
    uniq, inverse, counts = np.unique(times, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values, minlength=len(uniq))
    return uniq, sums / counts


def _merge_points(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """One time-ordered series from several: DCGM exports one series per pod on a shared GPU
    (the same values), and an exporter restart behind a ServiceMonitor starts a new series (a
    new exporter pod label). Values at the same time are averaged."""
    arrays = [_points_array(s.points) for s in samples]
    points = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    if len(samples) == 1 or len(points) == 0:
        return points[:, 0], points[:, 1]
    times, inverse, counts = np.unique(points[:, 0], return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=points[:, 1], minlength=len(times))
    return times, sums / counts


def _points_array(points: Sequence[tuple[float, float]]) -> np.ndarray:
    """A series' (time, value) pairs as an (n, 2) float array, read pair by pair: what
    ``np.asarray(points, dtype=float)`` gives, at half its cost (it walks the nested tuples
    once more to find their shape). Every :class:`Sample`'s points are pairs."""
    flat = np.fromiter(chain.from_iterable(points), dtype=float, count=2 * len(points))
    return flat.reshape(-1, 2)
