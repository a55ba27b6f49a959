"""Findings as Alertmanager alerts, and which alerts are active.

This module is pure: it maps a :class:`~defrag.detect.findings.Finding` to an :class:`Alert`
(labels, annotations, start time) and keeps the set of active alerts from one cycle to the next.
Sending is the job of :mod:`defrag.adapters.alertmanager`.

An alert's identity is its label set, exactly as in Alertmanager: the same finding in the next
cycle yields the same labels, so Alertmanager deduplicates it; a finding whose severity changes
yields a new alert and the old one is resolved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from defrag.detect.findings import Finding
from defrag.model.utc import utc

log = logging.getLogger(__name__)

TEST_ALERT = "DefragTestAlert"

ROUTING_LABELS = ("node", "namespace", "pod", "gpu", "detector")
"""Finding labels copied onto every alert (besides alertname, severity and cluster)."""
RULE_ANNOTATION = "rule"
"""The annotation naming the rule whose finding an alert is (read back after a restart)."""


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """How the findings of one kind become an alert: its name, its annotations' template and
    its runbook section. A kind with several alerts lists them in order; the first whose
    ``when`` holds is sent, and the last has no ``when`` (every finding gets an alert)."""

    name: str
    when: Callable[[Finding], bool] | None = None
    labels: tuple[str, ...] = ()
    """Finding labels copied onto this alert besides :data:`ROUTING_LABELS` (part of its
    identity: ``rule`` on ``DefragRuleEvaluationFailed``)."""
    summary: str = "{summary}"
    """The ``summary`` annotation: ``str.format`` over the finding's fields (``summary``,
    ``subject``, ``kind``, ``severity``, ``action``), its labels and its evidence."""
    runbook: str = ""
    """The section of the runbook (docs/alerts.md) this alert links to; default the name in
    lower case (the anchor of its ``## Name`` heading)."""

    @property
    def anchor(self) -> str:
        return self.runbook or self.name.lower()

    def render_summary(self, finding: Finding) -> str:
        fields = _Fields(
            {
                **{str(k): v for k, v in finding.evidence.items()},
                **finding.labels,
                "summary": finding.summary,
                "subject": finding.subject,
                "kind": finding.kind,
                "severity": finding.severity,
                "action": finding.action,
            }
        )
        try:
            return self.summary.format_map(fields)
        except (ValueError, AttributeError, IndexError, TypeError):
            return finding.summary


class _Fields(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


@dataclass(frozen=True, slots=True)
class NotAlerted:
    """A finding kind that is deliberately never alerted, and why (``idle``: the gate for
    execution windows, not a problem)."""

    reason: str


class AlertCatalogError(ValueError):
    """A finding kind registered without an alert, twice, or with an alert name in use."""


class AlertCatalog:
    """Which alert each finding kind becomes. The daemon's own kinds are registered here; each
    detector's kinds are registered with the detector (:mod:`defrag.detectors.registry`), so a
    detector whose finding kind has no alert cannot be registered at all."""

    def __init__(self) -> None:
        self._kinds: dict[str, tuple[tuple[AlertSpec, ...] | NotAlerted, str]] = {}

    def add(self, kind: str, alerts: Sequence[AlertSpec] | NotAlerted, owner: str) -> None:
        """Register ``kind``'s alerts for ``owner`` (a detector's name, or ``defrag``)."""
        if not kind:
            raise AlertCatalogError(f"{owner}: a finding kind needs a name")
        if kind in self._kinds:
            raise AlertCatalogError(
                f"{owner}: finding kind {kind!r} is already registered by {self._kinds[kind][1]}"
            )
        if not isinstance(alerts, NotAlerted):
            alerts = tuple(alerts)
            if not alerts:
                raise AlertCatalogError(
                    f"{owner}: finding kind {kind!r} has no alert: give it an AlertSpec, or "
                    "NotAlerted(reason) when its findings are never alerted"
                )
            if alerts[-1].when is not None:
                raise AlertCatalogError(
                    f"{owner}: finding kind {kind!r}: the last alert must have no 'when' (some "
                    "findings would get no alert)"
                )
            if any(a.when is None for a in alerts[:-1]):
                raise AlertCatalogError(
                    f"{owner}: finding kind {kind!r}: only the last alert may omit 'when'"
                )
            taken = self.names()
            for alert in alerts:
                if not alert.name:
                    raise AlertCatalogError(
                        f"{owner}: finding kind {kind!r}: an alert needs a name"
                    )
                if alert.name in taken or alert.name == TEST_ALERT:
                    raise AlertCatalogError(
                        f"{owner}: finding kind {kind!r}: alert name {alert.name!r} is already "
                        "in use"
                    )
        self._kinds[kind] = (alerts, owner)

    def remove(self, owner: str) -> None:
        """Forget every kind ``owner`` registered."""
        self._kinds = {k: v for k, v in self._kinds.items() if v[1] != owner}

    def kinds(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def alerted(self, kind: str) -> tuple[AlertSpec, ...]:
        """The alerts of ``kind`` (empty for a kind never alerted); KeyError for an unknown one."""
        alerts, _ = self._kinds[kind]
        return () if isinstance(alerts, NotAlerted) else alerts

    def spec(self, finding: Finding) -> AlertSpec | None:
        """The alert ``finding`` becomes; None for a kind never alerted. A kind nobody
        registered is a programming error (:class:`AlertCatalogError`), never silence."""
        if finding.kind not in self._kinds:
            raise AlertCatalogError(
                f"finding kind {finding.kind!r} has no alert registered (known: "
                f"{', '.join(sorted(self._kinds))})"
            )
        for alert in self.alerted(finding.kind):
            if alert.when is None or alert.when(finding):
                return alert
        return None

    def names(self) -> frozenset[str]:
        """Every alert name registered (without the test alert)."""
        return frozenset(
            a.name
            for alerts, _ in self._kinds.values()
            if not isinstance(alerts, NotAlerted)
            for a in alerts
        )


ALERTS = AlertCatalog()
"""The alert of every finding kind: the daemon's own below, each detector's at registration."""
for _kind, _name, _labels in (
    ("plan-blocked", "DefragPlanBlocked", ()),
    ("execution-failed", "DefragExecutionFailed", ()),
    ("circuit-open", "DefragCircuitOpen", ()),
    ("rule-failed", "DefragRuleEvaluationFailed", ("rule",)),
):
    ALERTS.add(_kind, [AlertSpec(_name, labels=_labels)], "defrag")


def own_alert_names() -> frozenset[str]:
    """Every alert name this project sends; alerts with other names are never touched."""
    return ALERTS.names() | {TEST_ALERT}


AlertKey = tuple[tuple[str, str], ...]
"""An alert's identity: its labels, sorted."""


def rfc3339(moment: datetime) -> str:
    """The RFC 3339 form Alertmanager's API takes, in UTC with a ``Z``."""
    return utc(moment).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    """Parse a timestamp from Alertmanager's API (``...Z``, up to nanoseconds)."""
    value = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    if "." in value:
        head, _, rest = value.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        value = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    return utc(datetime.fromisoformat(value))


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as Alertmanager's ``POST /api/v2/alerts`` takes it, without ``endsAt``.

    ``endsAt`` is chosen at send time: a little ahead of now while firing (so the alert lapses
    by itself if this process dies), or the moment of resolution once resolved.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: datetime | None = None
    generator_url: str = ""
    rule: str = ""
    """The detection rule whose finding this is ('' for findings of no rule): while that rule
    cannot be evaluated the alert is held as it was (:meth:`ActiveAlerts.update`)."""

    @property
    def key(self) -> AlertKey:
        return tuple(sorted(self.labels.items()))

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def to_api(self, ends_at: datetime) -> dict[str, Any]:
        body: dict[str, Any] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "endsAt": rfc3339(ends_at),
        }
        if self.starts_at is not None:
            body["startsAt"] = rfc3339(self.starts_at)
        if self.generator_url:
            body["generatorURL"] = self.generator_url
        return body

    def with_start(self, starts_at: datetime) -> Alert:
        return Alert(self.labels, self.annotations, utc(starts_at), self.generator_url, self.rule)


def alert_name(finding: Finding) -> str | None:
    """The alert name of a finding, or None for kinds that are never alerted (``idle``)."""
    spec = ALERTS.spec(finding)
    return spec.name if spec is not None else None


def subject_labels(subject: str) -> dict[str, str]:
    """Routing labels implied by a subject: ``node/<n>``, ``pod/<ns>/<name>``, ``gpu/<n>/<i>``."""
    head, _, rest = subject.partition("/")
    parts = rest.split("/") if rest else []
    if head == "node" and len(parts) == 1 and parts[0]:
        return {"node": parts[0]}
    if head == "pod" and len(parts) == 2 and all(parts):
        return {"namespace": parts[0], "pod": parts[1]}
    if head == "gpu" and len(parts) == 2 and all(parts):
        return {"node": parts[0], "gpu": parts[1]}
    return {}


def describe(finding: Finding) -> str:
    """A multi-line description: the summary's subject, since when, and the evidence."""
    lines = [f"{finding.kind} on {finding.subject}"]
    if finding.since is not None:
        lines[0] += f", since {rfc3339(finding.since)}"
    for name in sorted(finding.evidence):
        lines.append(f"{name}: {_short(finding.evidence[name])}")
    if finding.action and finding.action != "alert":
        lines.append(f"action: {finding.action}")
    return "\n".join(lines)


RUNBOOK_URL = "https://github.com/defrag-io/defrag/blob/main/docs/alerts.md"
"""The runbooks (docs/alerts.md) on the project's public repository: every alert's
``runbook_url`` is this plus ``#<alert name in lower case>`` (setting ``alerts.runbook_url`` for
a mirror or a fork; the Prometheus rules in rules/prometheus/ carry the same absolute URL)."""

GENERATOR_URL = "http://defrag.invalid/findings"
"""Where an alert's ``generatorURL`` points (``/<finding fingerprint>`` appended); setting
``alerts.generator_url``, e.g. the Grafana dashboard. It also marks the alerts this sender owns
(adopted and resolved after a restart), so changing it orphans the alerts already firing until
their TTL lapses."""


def _short(value: Any, limit: int = 300) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class AlertTemplate:
    """What every alert of one sender shares: the cluster label and the links."""

    cluster: str = "default"
    generator_url: str = GENERATOR_URL
    runbook_url: str = RUNBOOK_URL

    def owns(self, labels: Mapping[str, str], generator_url: str) -> bool:
        """Whether an alert seen in Alertmanager was sent by this sender (same cluster, names
        and generator): only those are adopted and resolved after a restart."""
        return (
            labels.get("alertname") in own_alert_names()
            and labels.get("cluster") == self.cluster
            and generator_url.startswith(self.generator_url)
        )

    def alert(self, finding: Finding) -> Alert | None:
        """The alert for ``finding``; None for a kind that is never alerted."""
        spec = ALERTS.spec(finding)
        if spec is None:
            return None
        name = spec.name
        labels = {"alertname": name, "severity": finding.severity, "cluster": self.cluster}
        implied = subject_labels(finding.subject)
        for label in ROUTING_LABELS:
            value = finding.labels.get(label) or implied.get(label)
            if value:
                labels[label] = str(value)
        for label in spec.labels:
            if finding.labels.get(label):
                labels[label] = str(finding.labels[label])
        labels.setdefault("detector", finding.kind)
        annotations = {
            "summary": spec.render_summary(finding),
            "description": describe(finding),
            "runbook_url": f"{self.runbook_url}#{spec.anchor}",
        }
        rule = "" if finding.kind == "rule-failed" else str(finding.labels.get("rule", ""))
        if rule:
            annotations[RULE_ANNOTATION] = rule
        return Alert(
            labels=labels,
            annotations=annotations,
            starts_at=utc(finding.since) if finding.since else None,
            generator_url=f"{self.generator_url}/{finding.fingerprint}",
            rule=rule,
        )

    def test_alert(self, now: datetime) -> Alert:
        """The alert ``defrag alerts test`` sends: severity info, labelled ``test="true"``."""
        return Alert(
            labels={
                "alertname": TEST_ALERT,
                "severity": "info",
                "cluster": self.cluster,
                "test": "true",
            },
            annotations={
                "summary": "Test alert from defrag: the route to Alertmanager works.",
                "description": "Sent by `defrag alerts test`; it resolves by itself.",
                "runbook_url": f"{self.runbook_url}#{TEST_ALERT.lower()}",
            },
            starts_at=utc(now),
            generator_url=f"{self.generator_url}/test",
        )

    def alerts(self, findings: Iterable[Finding]) -> dict[AlertKey, Alert]:
        """The alerts of a cycle's findings, by identity; two findings with the same labels
        make one alert (the first wins, the clash is logged)."""
        out: dict[AlertKey, Alert] = {}
        for finding in findings:
            alert = self.alert(finding)
            if alert is None:
                continue
            if alert.key in out:
                log.warning("findings share one alert identity %s; keeping the first", alert.key)
                continue
            out[alert.key] = alert
        return out


@dataclass(frozen=True, slots=True)
class Transition:
    """What one cycle changes: alerts that start firing, keep firing, and resolve."""

    fired: tuple[Alert, ...]
    kept: tuple[Alert, ...]
    resolved: tuple[Alert, ...]

    @property
    def firing(self) -> tuple[Alert, ...]:
        return self.fired + self.kept


class ActiveAlerts:
    """The alerts active now, kept between cycles.

    After a restart it starts empty; the first cycle rebuilds it from that cycle's findings (and
    from what Alertmanager still holds, via :meth:`adopt`). A finding that carries no ``since``
    keeps the start time it had when first seen, so a re-sent alert never looks new.
    """

    def __init__(self) -> None:
        self._active: dict[AlertKey, Alert] = {}

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, key: object) -> bool:
        return key in self._active

    def snapshot(self) -> tuple[Alert, ...]:
        return tuple(self._active.values())

    def adopt(self, alerts: Iterable[Alert]) -> int:
        """Take alerts seen in Alertmanager as active (their start time too); returns how many
        were new to this state. Known alerts keep the earlier start time."""
        count = 0
        for alert in alerts:
            known = self._active.get(alert.key)
            if known is None:
                self._active[alert.key] = alert
                count += 1
            elif alert.starts_at and (known.starts_at is None or alert.starts_at < known.starts_at):
                self._active[alert.key] = known.with_start(alert.starts_at)
        return count

    def update(
        self,
        desired: Mapping[AlertKey, Alert],
        now: datetime,
        held_rules: Collection[str] = (),
    ) -> Transition:
        """Make the active set equal to ``desired``; returns what fired, stayed and resolved.

        An active alert of a rule in ``held_rules`` (rules that could not be evaluated this
        cycle) stays as it was: missing data resolves nothing, as in Prometheus's own rule
        evaluation, and the alert is not sent again as new when the rule runs again.
        """
        fired: list[Alert] = []
        kept: list[Alert] = []
        held = frozenset(held_rules)
        if held:
            desired = dict(desired)
            for key, alert in self._active.items():
                if key not in desired and alert.rule and alert.rule in held:
                    desired[key] = alert
        for key, alert in desired.items():
            known = self._active.get(key)
            if known is None:
                start = alert.starts_at or utc(now)
                fired.append(alert.with_start(start))
            else:
                start = known.starts_at or alert.starts_at or utc(now)
                if alert.starts_at is not None and alert.starts_at < start:
                    start = alert.starts_at
                kept.append(alert.with_start(start))
        resolved = [alert for key, alert in self._active.items() if key not in desired]
        self._active = {alert.key: alert for alert in (*fired, *kept)}
        return Transition(tuple(fired), tuple(kept), tuple(resolved))


class AlertSendError(RuntimeError):
    """Every Alertmanager failed to take this cycle's alerts (they are kept and sent again)."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        detail = "; ".join(f"{url}: {reason}" for url, reason in sorted(self.failures.items()))
        super().__init__(f"no Alertmanager took the alerts ({detail})")
