"""The drain journal: a taint and annotations on the node, so a crash leaves a trail to follow.

Before the first eviction from a node, the executor taints it
``defrag.io/draining=<plan-id>:NoSchedule`` (nothing new lands there while it drains) and
annotates it with the plan id, the start time and the steps (pod, its controller, target).
After the replacements run, both are removed. A daemon that starts and finds either on a node
reconciles it (see :mod:`defrag.execute.executor`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from defrag.execute.fence import Tenure
from defrag.model.resources import DRAIN_TAINT_KEY, Node

PLAN_ANNOTATION = "defrag.io/plan-id"
STARTED_ANNOTATION = "defrag.io/drain-started"
STEPS_ANNOTATION = "defrag.io/drain-steps"
OWNER_ANNOTATION = "defrag.io/drain-owner"
"""The replica that started the drain and its Lease generation: ``<identity>@<generation>``."""
JOURNAL_ANNOTATIONS = (PLAN_ANNOTATION, STARTED_ANNOTATION, STEPS_ANNOTATION, OWNER_ANNOTATION)
DRAIN_EFFECT = "NoSchedule"


@dataclass(frozen=True, slots=True)
class JournalStep:
    """One eviction the journal promises: the pod, its controller (kind/name) and the target."""

    pod: str
    owner: str | None = None
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "owner": self.owner, "target": self.target}


@dataclass(frozen=True, slots=True)
class Journal:
    """What a node's annotations say is in flight on it."""

    node: str
    plan_id: str
    started: str
    steps: tuple[JournalStep, ...]
    tainted: bool
    problem: str = ""
    """Non-empty when the annotations could not be read (the node is still rolled back)."""
    owner: Tenure | None = None
    """Who started the drain (None: a journal from before owners were recorded, or unreadable)."""

    def annotations(self) -> dict[str, str | None]:
        return {
            PLAN_ANNOTATION: self.plan_id,
            STARTED_ANNOTATION: self.started,
            STEPS_ANNOTATION: json.dumps([s.to_dict() for s in self.steps], sort_keys=True),
            OWNER_ANNOTATION: format_owner(self.owner) if self.owner else None,
        }


def new_journal(
    node: str,
    plan_id: str,
    started: datetime,
    steps: tuple[JournalStep, ...],
    owner: Tenure | None = None,
) -> Journal:
    return Journal(node, plan_id, started.isoformat(), steps, tainted=True, owner=owner)


def format_owner(owner: Tenure) -> str:
    return f"{owner.identity}@{owner.generation}"


def parse_owner(raw: str | None) -> Tenure | None:
    """``<identity>@<generation>`` → a Tenure; None when absent or unreadable."""
    if not raw or "@" not in raw:
        return None
    identity, _, generation = raw.rpartition("@")
    try:
        return Tenure(identity, int(generation))
    except ValueError:
        return None


def cleared() -> dict[str, str | None]:
    """The annotation patch that removes a journal (None deletes a key)."""
    return dict.fromkeys(JOURNAL_ANNOTATIONS)


def read_journal(node: Node) -> Journal | None:
    """The journal a node carries, or None when it carries neither the taint nor the annotations."""
    taint = next((t for t in node.taints if t.key == DRAIN_TAINT_KEY), None)
    notes: Mapping[str, str] = node.annotations
    if taint is None and not any(k in notes for k in JOURNAL_ANNOTATIONS):
        return None
    plan_id = notes.get(PLAN_ANNOTATION) or (taint.value if taint else "")
    steps, problem = _parse_steps(notes.get(STEPS_ANNOTATION))
    return Journal(
        node=node.name,
        plan_id=plan_id,
        started=notes.get(STARTED_ANNOTATION, ""),
        steps=steps,
        tainted=taint is not None,
        problem=problem,
        owner=parse_owner(notes.get(OWNER_ANNOTATION)),
    )


def _parse_steps(raw: str | None) -> tuple[tuple[JournalStep, ...], str]:
    if raw is None:
        return (), f"annotation {STEPS_ANNOTATION} missing"
    try:
        data = json.loads(raw)
        if not isinstance(data, list):
            raise ValueError("not a list")
        return tuple(JournalStep(str(d["pod"]), d.get("owner"), d.get("target")) for d in data), ""
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return (), f"annotation {STEPS_ANNOTATION} unreadable ({exc})"
