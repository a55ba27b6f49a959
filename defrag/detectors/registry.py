"""The detector registry: one registration per detector.

A :class:`Detector` binds everything about one detector:

* ``rule`` — its rule model's edge part (a :class:`~defrag.detectors.rulemodel.RuleModel`
  subclass with the PromQL and label names only the edge reads);
* ``settings`` — the frozen dataclass its pure function takes, the one definition of its
  settings (the full rule model is generated from both: :attr:`Detector.model`);
* ``needs`` and ``run`` — what it asks for (Prometheus, the cluster) and how: ``run`` fetches
  through the ports in :class:`Inputs` and calls the pure function;
* ``alerts`` — each finding kind it emits and the alert that kind becomes
  (:class:`~defrag.alerting.AlertSpec`), or :class:`~defrag.alerting.NotAlerted` with why.

:func:`register` checks the registration (a unique name, an alert for every kind, no kind or
alert name another detector has) and hands the alerts to :data:`defrag.alerting.ALERTS`;
detection (:mod:`defrag.detection`) and rule loading (:mod:`defrag.rules`) read the registry.
Adding a detector is one module with one registration (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from defrag.alerting import ALERTS, AlertCatalogError, AlertSpec, NotAlerted
from defrag.detect.findings import Finding
from defrag.detectors.rulemodel import RuleModel, RuleModelError, rule_model, settings_of
from defrag.model.cluster import Cluster
from defrag.ports import MetricsSource
from defrag.scoring.profile import ScoringProfile

Need = Literal["metrics", "cluster"]
R = TypeVar("R", bound=RuleModel)
P = TypeVar("P")


class MissingInput(LookupError):
    """A rule's queries returned nothing it can use; the message says which and why (the rule
    is listed as skipped, not failed)."""


class RegistryError(ValueError):
    """A registration that cannot be accepted; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a detector's ``run`` gets: the moment, the scoring profile of this snapshot, and
    the sources it declared it ``needs`` (never None when needed)."""

    now: datetime
    profile: ScoringProfile
    metrics: MetricsSource | None = None
    cluster: Cluster | None = None

    @property
    def prometheus(self) -> MetricsSource:
        if self.metrics is None:
            raise RuntimeError("this detector did not declare needs={'metrics'}")
        return self.metrics

    @property
    def snapshot(self) -> Cluster:
        if self.cluster is None:
            raise RuntimeError("this detector did not declare needs={'cluster'}")
        return self.cluster


@dataclass(frozen=True)
class Detector(Generic[R, P]):
    """One detector's registration (see the module's docstring)."""

    name: str
    """The rule files' ``detector:`` value."""
    rule: type[R]
    settings: type[P]
    needs: frozenset[Need]
    run: Callable[[R, P, Inputs], Sequence[Finding]]
    alerts: Mapping[str, Sequence[AlertSpec] | NotAlerted]
    """Every finding kind it emits → its alert(s), or NotAlerted(reason)."""
    edge_settings: Callable[[R], Mapping[str, Any]] | None = None
    """Values of INTERNAL settings the edge fills in from the rule (a query a finding quotes)."""
    moved: Mapping[str, str] = field(default_factory=dict)
    """Rule fields that no longer exist → where they went (the error a rule file gets)."""
    model: type[R] = field(init=False, repr=False, compare=False)
    """The full rule model: ``rule`` plus ``detector`` and every setting."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise RegistryError(f"detector name {self.name!r}: use letters, digits, - and _")
        if not self.alerts:
            raise RegistryError(f"detector {self.name}: it declares no finding kind")
        unknown = set(self.needs) - {"metrics", "cluster"}
        if unknown or not self.needs:
            raise RegistryError(
                f"detector {self.name}: needs must be 'metrics' and/or 'cluster', got "
                f"{sorted(self.needs)}"
            )
        try:
            model = rule_model(self.rule, self.name, self.settings, self.edge_settings)
        except RuleModelError as exc:
            raise RegistryError(f"detector {self.name}: {exc}") from None
        object.__setattr__(self, "model", model)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.alerts)

    def settings_of(self, rule: R) -> P:
        """The rule's settings, as the pure function takes them."""
        value: P = settings_of(rule)
        return value

    def evaluate(self, rule: R, inputs: Inputs) -> list[Finding]:
        """``run`` on the rule; a finding of a kind this detector did not declare is an error
        (its alert is unknown), never dropped."""
        found = list(self.run(rule, self.settings_of(rule), inputs))
        for finding in found:
            if finding.kind not in self.alerts:
                raise RegistryError(
                    f"detector {self.name} emitted a finding of kind {finding.kind!r}, not one "
                    f"it declared ({', '.join(self.kinds)})"
                )
        return found


_DETECTORS: dict[str, Detector[Any, Any]] = {}
_version = [0]


def register(detector: Detector[R, P]) -> Detector[R, P]:
    """Add ``detector``; its alerts go to :data:`defrag.alerting.ALERTS`. Raises
    :class:`RegistryError` for a name already registered, a kind without an alert, a kind or
    an alert name another detector (or the daemon) has."""
    if detector.name in _DETECTORS:
        raise RegistryError(f"detector {detector.name!r} is already registered")
    try:
        for kind, alerts in detector.alerts.items():
            ALERTS.add(kind, alerts, f"detector {detector.name}")
    except AlertCatalogError as exc:
        ALERTS.remove(f"detector {detector.name}")
        raise RegistryError(str(exc)) from None
    _DETECTORS[detector.name] = detector
    _version[0] += 1
    return detector


def unregister(name: str) -> None:
    """Remove a detector and its alerts (tests add toy detectors and take them away)."""
    if _DETECTORS.pop(name, None) is None:
        raise RegistryError(f"no detector {name!r} is registered")
    ALERTS.remove(f"detector {name}")
    _version[0] += 1


@contextmanager
def registered(detector: Detector[R, P]) -> Iterator[Detector[R, P]]:
    """``detector`` registered inside the block, removed after it (a plugin tried out, a toy
    detector in a test: other code never sees it)."""
    register(detector)
    try:
        yield detector
    finally:
        unregister(detector.name)


def get(name: str) -> Detector[Any, Any]:
    """The registration of ``name``; KeyError when there is none."""
    return _DETECTORS[name]


def detectors() -> tuple[Detector[Any, Any], ...]:
    return tuple(_DETECTORS.values())


def names() -> tuple[str, ...]:
    return tuple(_DETECTORS)


def version() -> int:
    """Changes whenever a detector is registered or removed (for caches of the rule union)."""
    return _version[0]


__all__ = [
    "Detector",
    "Inputs",
    "MissingInput",
    "Need",
    "RegistryError",
    "detectors",
    "get",
    "names",
    "register",
    "registered",
    "unregister",
    "version",
]
