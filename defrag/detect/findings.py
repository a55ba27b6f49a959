"""Findings: what a detector saw, with evidence and a stable fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

FindingKind = str
"""A finding kind: a detector's (declared with its registration, ``defrag/detectors``) or one
of the daemon's own (:data:`DAEMON_KINDS`). Each has an alert (or is declared never alerted)
in :data:`defrag.alerting.ALERTS`."""
DAEMON_KINDS: tuple[FindingKind, ...] = (
    "plan-blocked",
    "execution-failed",
    "circuit-open",
    "rule-failed",
)
Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing worth knowing or acting on.

    ``subject`` names what it is about: ``cluster``, ``node/<name>``, ``pod/<ns>/<name>``,
    ``gpu/<node>/<index>``, ``gpu/<node>/<index>/mig-<GPU_I_ID>`` (a MIG instance) or
    ``gpu/<uuid>`` (no node label). ``labels`` carries the routing labels an alert needs (``node``,
    ``namespace``, ``pod``, ``detector``). The fingerprint depends on kind, subject and
    ``part`` only, so the same condition seen in the next cycle keeps its identity.
    """

    kind: FindingKind
    subject: str
    severity: Severity
    summary: str
    evidence: Mapping[str, Any] = field(default_factory=dict, hash=False)
    since: datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    action: str = "alert"
    part: str = ""
    """Which part of the subject, when one subject can have several findings of a kind (one
    GPU or MIG instance of a pod: ``gpu/<node>/<index>[/mig-<id>]``); part of the identity."""

    @property
    def fingerprint(self) -> str:
        key = f"{self.kind}\0{self.subject}" + (f"\0{self.part}" if self.part else "")
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "severity": self.severity,
            "summary": self.summary,
            "fingerprint": self.fingerprint,
            "evidence": dict(self.evidence),
            "since": self.since.isoformat() if self.since else None,
            "labels": dict(self.labels),
            "action": self.action,
        } | ({"part": self.part} if self.part else {})
