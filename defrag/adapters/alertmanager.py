"""Alertmanager client: the :class:`~defrag.ports.AlertSink` that sends findings as alerts.

Every cycle, :meth:`AlertmanagerSink.sync` makes the alerts active in Alertmanager equal to the
cycle's findings, through ``POST /api/v2/alerts`` on every configured URL (an HA pair gets every
alert; Alertmanager deduplicates):

- a new finding fires an alert (``startsAt`` = the finding's ``since``, else first seen);
- an alert still found is re-sent every ``resend_interval_s`` with ``endsAt`` = now + ``ttl_s``,
  so it never lapses while the daemon runs, and lapses by itself if the daemon dies;
- an alert no longer found is sent once more with ``endsAt`` = the time it cleared (resolved).

A send that fails after the retries is logged, counted in
``defrag_alert_send_failures_total{url}`` and kept: the next cycle sends everything that URL
missed. When every URL failed, ``sync`` raises :class:`~defrag.alerting.AlertSendError`.

After a restart, and whenever this replica becomes the leader (:meth:`AlertmanagerSink.take_over`:
the other replica sent while this one followed), the first cycle asks each Alertmanager which of
this sender's alerts it still holds (``GET /api/v2/alerts``) and adopts them: those still found
keep their start time, those no longer found are resolved. Nothing re-fires, nothing is
forgotten.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import requests
from prometheus_client import Counter, Gauge
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)
from tenacity.stop import stop_base

import defrag.detectors  # noqa: F401  (the built-in detectors' alerts are this sender's too)
from defrag.adapters.deadline import DeadlineAdapter, budget_spent, request_deadline
from defrag.alerting import (
    GENERATOR_URL,
    RULE_ANNOTATION,
    RUNBOOK_URL,
    ActiveAlerts,
    Alert,
    AlertKey,
    AlertSendError,
    AlertTemplate,
    Transition,
    parse_rfc3339,
)
from defrag.detect.findings import Finding
from defrag.model.utc import utc
from defrag.redact import redact_text, redact_url

__all__ = [
    "AlertSendError",
    "AlertmanagerSink",
    "SendResult",
    "SyncReport",
]

log = logging.getLogger(__name__)

SEND_FAILURES = Counter(
    "defrag_alert_send_failures_total",
    "Sends to an Alertmanager that failed after retries; the alerts are kept and sent again.",
    ["url"],
)
ALERTS_SENT = Counter(
    "defrag_alerts_sent_total",
    "Alerts an Alertmanager accepted, by state (firing or resolved).",
    ["url", "state"],
)
ALERTS_ACTIVE = Gauge("defrag_alerts_active", "Alerts defrag holds active (firing) now.")

_T = TypeVar("_T")
Outcome = Literal["ok", "failed", "idle"]


class _Retryable(Exception):
    """A failure worth retrying: no connection, a timeout, 429 or a 5xx."""


class _Rejected(Exception):
    """Alertmanager refused the request (4xx other than 429): retrying will not help."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one Alertmanager did with one cycle's alerts."""

    url: str
    outcome: Outcome
    firing: int = 0
    resolved: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SyncReport:
    """One :meth:`AlertmanagerSink.sync`: the state change and each URL's result."""

    transition: Transition
    results: tuple[SendResult, ...]

    @property
    def failures(self) -> dict[str, str]:
        return {r.url: r.reason for r in self.results if r.outcome == "failed"}

    @property
    def all_failed(self) -> bool:
        return bool(self.results) and all(r.outcome == "failed" for r in self.results)


@dataclass(slots=True)
class _Target:
    """One Alertmanager and what it has been told."""

    url: str  # base URL as configured
    shown: str  # the URL without credentials, for logs and metric labels
    last_sent: dict[AlertKey, datetime] = field(default_factory=dict)
    pending_resolved: dict[AlertKey, tuple[Alert, datetime]] = field(default_factory=dict)
    stale: bool = False  # the last send failed: send everything next time

    def endpoint(self, path: str) -> str:
        return self.url.rstrip("/") + path


def redact(url: str) -> str:
    """``url`` without user:password or credential query values, for logs and metric labels
    (the project's one helper, :func:`defrag.redact.redact_url`)."""
    return redact_url(url)


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an Alertmanager URL (want http[s]://host[:port]): {url!r}")
    return url


class AlertmanagerSink:
    """Sends findings to one or more Alertmanagers (API v2) and keeps them in sync.

    ``resend_interval_s`` must be shorter than ``ttl_s``, and the caller's cycle interval
    shorter than ``ttl_s`` too, or firing alerts lapse between cycles.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        cluster: str = "default",
        resend_interval_s: float = 60.0,
        ttl_s: float = 900.0,
        generator_url: str = GENERATOR_URL,
        runbook_url: str = RUNBOOK_URL,
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_file: str | Path | None = None,
        verify_tls: bool = True,
        timeout_s: float = 5.0,
        retry_attempts: int = 3,
        retry_wait_s: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one Alertmanager URL is needed")
        if resend_interval_s < 0 or ttl_s <= resend_interval_s:
            raise ValueError(
                f"need 0 <= resend_interval_s < ttl_s (got {resend_interval_s} and {ttl_s})"
            )
        if retry_attempts < 1:
            raise ValueError(f"retry_attempts must be at least 1 (got {retry_attempts})")
        if sum(x is not None for x in (bearer_token, bearer_token_file, basic_auth)) > 1:
            raise ValueError("choose one of bearer_token, bearer_token_file and basic_auth")
        if ca_file is not None and not Path(ca_file).is_file():
            raise ValueError(f"CA file not found: {ca_file}")
        self.template = AlertTemplate(cluster, generator_url.rstrip("/"), runbook_url)
        self.resend_interval = timedelta(seconds=resend_interval_s)
        self.ttl = timedelta(seconds=ttl_s)
        self.timeout_s = timeout_s
        self.retry_attempts = retry_attempts
        self.retry_wait_s = retry_wait_s
        self.state = ActiveAlerts()
        self.last_report: SyncReport | None = None
        self._targets = [_Target(check_url(u), redact(u)) for u in dict.fromkeys(urls)]
        self._unreachable: dict[str, str] = {}
        self._rebuilt = False
        self._clock_warned = False
        self._bearer_token = bearer_token
        self._bearer_token_file = Path(bearer_token_file) if bearer_token_file else None
        if session is None:
            session = requests.Session()
            for prefix in ("http://", "https://"):  # each request under one wall-clock deadline
                session.mount(prefix, DeadlineAdapter(max_retries=0))
        self._session = session
        if basic_auth is not None:
            self._session.auth = basic_auth
        self._session.verify = str(ca_file) if ca_file is not None else verify_tls

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(t.shown for t in self._targets)

    # -- the AlertSink port -------------------------------------------------------------

    def sync(
        self, findings: Sequence[Finding], now: datetime, held_rules: Collection[str] = ()
    ) -> None:
        """Make the active alerts equal to ``findings``; raise AlertSendError if every URL
        failed (nothing is dropped: the next call sends what was missed). Alerts of the rules
        in ``held_rules`` (not evaluated this cycle) stay as they were."""
        report = self.sync_report(findings, now, held_rules)
        if report.all_failed:
            raise AlertSendError(report.failures)

    def sync_report(
        self, findings: Sequence[Finding], now: datetime, held_rules: Collection[str] = ()
    ) -> SyncReport:
        """:meth:`sync` without raising: what changed and what each URL did."""
        now = utc(now)
        self._check_clock(now)
        outcomes: dict[str, SendResult] = {}
        if not self._rebuilt:
            outcomes = self._rebuild()
        transition = self.state.update(self.template.alerts(findings), now, held_rules)
        results = []
        for target in self._targets:
            result = self._push(target, transition, now)
            earlier = outcomes.get(target.shown)
            if result.outcome == "idle" and earlier is not None and earlier.outcome == "failed":
                result = earlier
            results.append(result)
        ALERTS_ACTIVE.set(len(self.state))
        report = SyncReport(transition, tuple(results))
        self.last_report = report
        return report

    def take_over(self) -> None:
        """Forget this sender's alerts and adopt Alertmanager's at the next :meth:`sync`.

        Called when this replica becomes the leader. Only the leader sends, so while this one
        followed, the other fired and resolved alerts it never saw: without this, an alert the
        other fired and whose finding this one does not see is never resolved (it lapses
        ``ttl_s`` later), and one this one knew from before keeps its old start when its
        finding comes back (a new alert, to Alertmanager, if the other resolved it)."""
        self.state = ActiveAlerts()
        self._rebuilt = False
        for target in self._targets:
            target.last_sent.clear()
            target.pending_resolved.clear()  # re-derived from what Alertmanager still holds
            target.stale = False

    # -- direct sends (the test alert) ----------------------------------------------------

    def send(
        self, alerts: Iterable[tuple[Alert, datetime]], now: datetime
    ) -> tuple[SendResult, ...]:
        """Send ``(alert, endsAt)`` pairs to every URL, outside the active-alert state.
        An alert whose ``endsAt`` is not after ``now`` counts as resolved."""
        batch = list(alerts)
        body = [alert.to_api(ends_at) for alert, ends_at in batch]
        firing = sum(1 for _, ends_at in batch if utc(ends_at) > utc(now))
        results = []
        for target in self._targets:
            reason = self._post(target, body, firing)
            if reason:
                results.append(SendResult(target.shown, "failed", reason=reason))
            else:
                results.append(SendResult(target.shown, "ok", firing, len(batch) - firing))
        return tuple(results)

    # -- internals --------------------------------------------------------------------

    def _check_clock(self, now: datetime) -> None:
        """Warn once when ``now`` is far from this machine's clock (a simulated clock, say):
        Alertmanager judges ``endsAt`` by its own clock and would see the alerts expired or
        far in the future."""
        skew = now - utc(datetime.now().astimezone())
        if abs(skew) > self.ttl and not self._clock_warned:
            self._clock_warned = True
            log.warning(
                "alert times are %.0f s %s this machine's clock (more than ttl_s): "
                "Alertmanager will see these alerts as %s; pass the wall-clock time to sync()",
                abs(skew.total_seconds()),
                "behind" if skew < timedelta(0) else "ahead of",
                "already ended" if skew < timedelta(0) else "starting in the future",
            )

    def _rebuild(self) -> dict[str, SendResult]:
        """Adopt the alerts Alertmanager still holds from a previous run of this sender."""
        outcomes: dict[str, SendResult] = {}
        for target in self._targets:
            try:
                held = self._fetch(target)
            except (_Retryable, _Rejected, ValueError) as exc:
                reason = f"reading active alerts: {exc}"
                log.warning("Alertmanager %s: %s", target.shown, reason)
                outcomes[target.shown] = SendResult(target.shown, "failed", reason=reason)
                continue
            # Adopted alerts are refreshed (or resolved) in this same cycle: their endsAt
            # in Alertmanager is whatever the previous run set, possibly close.
            adopted = self.state.adopt(held)
            self._rebuilt = True
            if adopted:
                log.info("adopted %d active alerts from %s", adopted, target.shown)
        return outcomes

    def _push(self, target: _Target, transition: Transition, now: datetime) -> SendResult:
        for alert in transition.resolved:
            target.pending_resolved[alert.key] = (alert, now)
        firing_keys = {alert.key for alert in transition.firing}
        for key in firing_keys & target.pending_resolved.keys():
            del target.pending_resolved[key]  # it cleared and came back before being sent
        due = [
            alert
            for alert in transition.firing
            if target.stale
            or alert.key not in target.last_sent
            or now - target.last_sent[alert.key] >= self.resend_interval
        ]
        resolved = list(target.pending_resolved.values())
        if not due and not resolved:
            target.stale = False
            return SendResult(target.shown, "idle")
        body = [alert.to_api(now + self.ttl) for alert in due]
        body += [alert.to_api(ends_at) for alert, ends_at in resolved]
        reason = self._post(target, body, len(due))
        if reason:
            target.stale = True
            return SendResult(target.shown, "failed", reason=reason)
        target.stale = False
        for alert in due:
            target.last_sent[alert.key] = now
        for key in list(target.last_sent):
            if key not in firing_keys:
                del target.last_sent[key]
        target.pending_resolved.clear()
        return SendResult(target.shown, "ok", len(due), len(resolved))

    def _post(self, target: _Target, body: list[dict[str, Any]], firing: int) -> str:
        """POST alerts (the first ``firing`` of them firing, the rest resolved); '' on
        success, else the reason (already logged and counted)."""
        try:
            self._with_retries(
                lambda: self._request("POST", target.endpoint("/api/v2/alerts"), json=body)
            )
        except (_Retryable, _Rejected, ValueError) as exc:
            SEND_FAILURES.labels(url=target.shown).inc()
            log.error(
                "sending %d alerts to Alertmanager %s failed (kept for the next cycle): %s",
                len(body),
                target.shown,
                exc,
            )
            return str(exc)
        if firing:
            ALERTS_SENT.labels(url=target.shown, state="firing").inc(firing)
        if len(body) > firing:
            ALERTS_SENT.labels(url=target.shown, state="resolved").inc(len(body) - firing)
        return ""

    def _fetch(self, target: _Target) -> list[Alert]:
        query = f'cluster="{self.template.cluster}"'
        response = self._with_retries(
            lambda: self._request(
                "GET", target.endpoint("/api/v2/alerts"), params={"filter": query}
            )
        )
        try:
            items = response.json()
            return [a for a in (self._parse(item) for item in items) if a is not None]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"unexpected answer from {target.shown}: {exc}") from exc

    def _parse(self, item: dict[str, Any]) -> Alert | None:
        labels = {str(k): str(v) for k, v in item["labels"].items()}
        generator = str(item.get("generatorURL") or "")
        if not self.template.owns(labels, generator):
            return None
        starts = item.get("startsAt")
        annotations = {str(k): str(v) for k, v in (item.get("annotations") or {}).items()}
        return Alert(
            labels=labels,
            annotations=annotations,
            starts_at=parse_rfc3339(starts) if starts else None,
            generator_url=generator,
            rule=annotations.get(RULE_ANNOTATION, ""),
        )

    def _with_retries(self, call: Callable[[], _T]) -> _T:
        retrying = Retrying(
            stop=stop_after_attempt(self.retry_attempts) | _BudgetSpent(),
            wait=wait_exponential(multiplier=self.retry_wait_s, max=30),
            retry=retry_if_exception_type(_Retryable),
            reraise=True,
        )
        return retrying(call)

    def probe(self, timeout_s: float | None = None) -> dict[str, str]:
        """Connect once to each Alertmanager, within ``timeout_s``
        (:mod:`defrag.adapters.reach`): each one no connection can be made to fails its
        requests at once from then on, without retries. Returns why, by URL as shown. A
        one-shot command asks this; a serving daemon, whose Alertmanagers may come back, does
        not."""
        from defrag.adapters.reach import CONNECT_TIMEOUT_S, unreachable_reason

        self._unreachable = {}
        for target in self._targets:
            why = unreachable_reason(target.url, timeout_s or CONNECT_TIMEOUT_S)
            if why is not None:
                self._unreachable[target.url] = why
        return {redact(url): why for url, why in self._unreachable.items()}

    def _request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        for base, why in self._unreachable.items():
            if url.startswith(base):
                raise _Rejected(f"cannot connect: {why}")
        headers = {}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        with request_deadline(self.timeout_s) as deadline:
            try:
                response = self._session.request(
                    method, url, headers=headers, timeout=self.timeout_s, **kwargs
                )
            except requests.RequestException as exc:
                if deadline.expired and deadline.by_budget:
                    raise _Retryable(f"no answer before {deadline.why}") from exc
                if deadline.expired or isinstance(exc, requests.Timeout):
                    raise _Retryable(
                        f"timed out after {self.timeout_s:g}s (the whole request)"
                    ) from exc
                if isinstance(exc, requests.ConnectionError):
                    raise _Retryable(f"cannot connect: {_connect_reason(exc)}") from exc
                raise _Rejected(_first_line(exc)) from exc
            if deadline.expired:  # an answer cut short by the deadline (no length to check)
                why = deadline.why if deadline.by_budget else f"{self.timeout_s:g}s"
                raise _Retryable(f"answer cut short by the deadline ({why})")
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}: {response.text.strip()[:200]}")
        if response.status_code >= 400:
            raise _Rejected(f"HTTP {response.status_code}: {response.text.strip()[:200]}")
        return response

    def _token(self) -> str | None:
        if self._bearer_token_file is not None:
            try:  # read every time: projected service-account tokens rotate
                return self._bearer_token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"cannot read bearer token file: {exc}") from exc
        return self._bearer_token


class _BudgetSpent(stop_base):
    """No retry once the cycle's or command's budget is spent."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        return budget_spent()


def _connect_reason(exc: BaseException) -> str:
    """The OS's words for a failed connection ("Connection refused"), not urllib3's wrapping."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(exc))
    return found.group(1).strip() if found else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = redact_text(str(exc)).strip().splitlines()
    return text[0][:200] if text else exc.__class__.__name__
