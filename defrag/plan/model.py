"""The plan artifact: ordered steps, what blocked a better plan, the expected gain and the cost.

A plan is reviewable: ``to_dict`` gives the JSON/YAML form (the keys of ``defrag plan
--output json``) and ``from_dict`` reads it back, so a saved plan round-trips unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from defrag.plan.config import GOALS as GOALS
from defrag.plan.config import Goal as Goal

StepKind = Literal["migrate", "preempt"]


class PlanFormatError(ValueError):
    """A plan document that is not the shape ``Plan.to_dict`` writes; names the field."""


@dataclass(frozen=True, slots=True)
class Step:
    """Evict ``pod`` from ``source``.

    ``migrate``: the scheduler is expected to put it on ``target``, GPU slots ``gpus``.
    ``preempt``: it will wait (``target`` is None). ``gpus_held`` is the GPUs it holds now
    (fractions for GPU-sharing pods); ``cost`` is its eviction cost (see :mod:`.cost`);
    ``gang`` names the job whose pods move together with it. ``for_pod``: on a make-room
    step whose ``source`` is the node being freed, the pending pod the room is for (the
    executor reserves that node for it while it drains); None on every other step.
    """

    kind: StepKind
    pod: str
    source: str
    target: str | None
    reason: str
    gpus: tuple[int, ...] = ()
    gpus_held: float = 0.0
    cost: float = 0.0
    gang: str | None = None
    for_pod: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pod": self.pod,
            "from": self.source,
            "to": self.target,
            "reason": self.reason,
            "gpus": list(self.gpus),
            "gpus_held": self.gpus_held,
            "cost": self.cost,
            "gang": self.gang,
            "for_pod": self.for_pod,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "step") -> Step:
        kind = _field(data, "kind", str, where)
        if kind not in ("migrate", "preempt"):
            raise PlanFormatError(f"{where}.kind: {kind!r} is not 'migrate' or 'preempt'")
        target = data.get("to")
        if kind == "migrate" and not isinstance(target, str):
            raise PlanFormatError(f"{where}.to: a migrate step needs a target node")
        if kind == "preempt" and target is not None:
            raise PlanFormatError(f"{where}.to: a preempt step has no target (null)")
        gpus = data.get("gpus", [])
        if not isinstance(gpus, list) or not all(isinstance(g, int) for g in gpus):
            raise PlanFormatError(f"{where}.gpus: expected a list of GPU indices")
        gang = data.get("gang")
        for_pod = data.get("for_pod")
        if for_pod is not None and not isinstance(for_pod, str):
            raise PlanFormatError(f"{where}.for_pod: expected a pod key or null, got {for_pod!r}")
        return cls(
            kind=kind,
            pod=_field(data, "pod", str, where),
            source=_field(data, "from", str, where),
            target=target,
            reason=_field(data, "reason", str, where),
            gpus=tuple(gpus),
            gpus_held=float(_number(data, "gpus_held", where, 0.0)),
            cost=float(_number(data, "cost", where, 0.0)),
            gang=gang if isinstance(gang, str) else None,
            for_pod=for_pod,
        )


@dataclass(frozen=True, slots=True)
class RoomWorth:
    """A room the plan makes: for which pod, on which node, what it is worth against what it
    costs (GPU-hours), and the wait the worth counts (hours: the forecast wait it saves, or the
    pod's wait so far; :class:`~defrag.plan.config.RoomValue`).

    ``kind`` is ``room`` (make-room's) or ``drain`` (a repack drain weighed by the starved pods
    it seats: ``pod`` is the first of them, ``value`` counts them all); ``victims_wait`` is the
    part of ``cost`` that is its victims' wait to be placed again (GPUs × hours), the rest
    their lost work and restarts."""

    pod: str
    node: str
    value: float
    cost: float
    wait_h: float
    kind: str = "room"
    victims_wait: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "kind": self.kind,
            "value": round(self.value, 3),
            "cost": round(self.cost, 3),
            "victims_wait": round(self.victims_wait, 3),
            "wait_h": round(self.wait_h, 3),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "room") -> RoomWorth:
        kind = data.get("kind", "room")
        if kind not in ("room", "drain"):
            raise PlanFormatError(f"{where}.kind: expected 'room' or 'drain', got {kind!r}")
        return cls(
            pod=_field(data, "pod", str, where),
            node=_field(data, "node", str, where),
            value=float(_number(data, "value", where, 0.0)),
            cost=float(_number(data, "cost", where, 0.0)),
            wait_h=float(_number(data, "wait_h", where, 0.0)),
            kind=kind,
            victims_wait=float(_number(data, "victims_wait", where, 0.0)),
        )


@dataclass(frozen=True, slots=True)
class Blocked:
    """A pod a better plan would have moved, and the named constraint that kept it in place."""

    pod: str
    constraint: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "constraint": self.constraint, "detail": self.detail}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "blocked") -> Blocked:
        detail = data.get("detail", "")
        return cls(
            pod=_field(data, "pod", str, where),
            constraint=_field(data, "constraint", str, where),
            detail=detail if isinstance(detail, str) else str(detail),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """An ordered list of steps with the fragmentation report before and after them.

    ``before`` / ``after`` are the fragmentation reports (``FragmentationReport.to_dict()``
    form) of the cluster now and once every step is done, before any pending pod is placed.
    ``targets`` lists what the plan makes room for (pending pods, or ``<k>-gpu`` job sizes).
    The ``id`` is a digest of goal, policy and steps: the same snapshot gives the same id.
    """

    goal: str
    policy: str
    steps: tuple[Step, ...]
    blocked: tuple[Blocked, ...]
    before: Mapping[str, Any] = field(default_factory=dict, hash=False)
    after: Mapping[str, Any] = field(default_factory=dict, hash=False)
    targets: tuple[str, ...] = ()
    id: str = ""
    rooms: tuple[RoomWorth, ...] = ()
    """Each room made by evictions: what it is worth against what it costs."""

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", plan_id(self.goal, self.policy, self.steps))

    @property
    def cost(self) -> float:
        return round(sum(s.cost for s in self.steps), 6)

    @property
    def migrations(self) -> int:
        return sum(1 for s in self.steps if s.kind == "migrate")

    @property
    def preemptions(self) -> int:
        return sum(1 for s in self.steps if s.kind == "preempt")

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "goal": self.goal,
            "policy": self.policy,
            "targets": list(self.targets),
            "steps": [s.to_dict() for s in self.steps],
            "blocked": [b.to_dict() for b in self.blocked],
            "before": _plain(self.before),
            "after": _plain(self.after),
            "cost": self.cost,
            "migrations": self.migrations,
            "preemptions": self.preemptions,
            "rooms": [r.to_dict() for r in self.rooms],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, Mapping):
            raise PlanFormatError("plan: expected a mapping")
        steps = data.get("steps", [])
        blocked = data.get("blocked", [])
        if not isinstance(steps, list):
            raise PlanFormatError("plan.steps: expected a list")
        if not isinstance(blocked, list):
            raise PlanFormatError("plan.blocked: expected a list")
        for key in ("before", "after"):
            if not isinstance(data.get(key, {}), Mapping):
                raise PlanFormatError(f"plan.{key}: expected a mapping (a fragmentation report)")
        targets = data.get("targets", [])
        if not isinstance(targets, list):
            raise PlanFormatError("plan.targets: expected a list")
        rooms = data.get("rooms", [])
        if not isinstance(rooms, list):
            raise PlanFormatError("plan.rooms: expected a list")
        plan = cls(
            goal=_field(data, "goal", str, "plan"),
            policy=_field(data, "policy", str, "plan"),
            steps=tuple(
                Step.from_dict(_mapping(s, f"plan.steps[{i}]"), f"plan.steps[{i}]")
                for i, s in enumerate(steps)
            ),
            blocked=tuple(
                Blocked.from_dict(_mapping(b, f"plan.blocked[{i}]"), f"plan.blocked[{i}]")
                for i, b in enumerate(blocked)
            ),
            before=dict(data.get("before", {})),
            after=dict(data.get("after", {})),
            targets=tuple(str(t) for t in targets),
            id=str(data.get("id", "")),
            rooms=tuple(
                RoomWorth.from_dict(_mapping(r, f"plan.rooms[{i}]"), f"plan.rooms[{i}]")
                for i, r in enumerate(rooms)
            ),
        )
        return plan


def plan_id(goal: str, policy: str, steps: Sequence[Step]) -> str:
    """``plan-`` and 12 hex digits of a digest of the plan's content (a valid label value)."""
    body = json.dumps([goal, policy, [s.to_dict() for s in steps]], sort_keys=True)
    return "plan-" + hashlib.sha256(body.encode()).hexdigest()[:12]


def _plain(value: Any) -> Any:
    """A JSON-able copy: mappings with string keys, lists for tuples."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanFormatError(f"{where}: expected a mapping")
    return value


def _field(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in data:
        raise PlanFormatError(f"{where}.{key}: missing")
    value = data[key]
    if not isinstance(value, kind):
        raise PlanFormatError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _number(data: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanFormatError(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)
