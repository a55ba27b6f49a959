"""Rule models at the edge: pydantic models generated from the detectors' settings dataclasses.

A detector's settings are defined once, as the frozen dataclass its pure function takes
(:mod:`defrag.detect.settings` explains the metadata). Its rule model is the detector's edge
part — a :class:`RuleModel` subclass with what only the edge reads (PromQL, label names) —
extended by :func:`rule_model` with one pydantic field per setting: the dataclass's type (bounds
included), its default, its rule-file name as the alias, durations parsed from ``6h``. A loaded
rule's settings are the dataclass again, built by :func:`settings_of` (no per-field copier).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Callable, Mapping
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
)

from defrag.detect.settings import DURATION, INTERNAL, REGEX, RuleName
from defrag.model.units import DURATION_FORM, duration_seconds

MAX_DURATION_S = 10 * 31536000.0
"""Ten years: no lookback, step or hold time is longer; beyond it a number is a typo (or inf)."""


def parse_duration(value: Any) -> float:
    """Seconds from a Prometheus-style duration (``30s``, ``15m``, ``1h30m``) or a number."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return _bounded(float(value), value)
    if isinstance(value, str):
        try:
            seconds = duration_seconds(value)
        except ValueError:
            pass
        else:
            return _bounded(seconds, value)
    raise ValueError(f"bad duration {value!r}: use a number of seconds or {DURATION_FORM}")


def _bounded(seconds: float, given: Any) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {given!r}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration {given!r} is longer than ten years")
    return seconds


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return value


def _names(value: Any) -> Any:
    """A single label name where a list is expected is a list of one."""
    return (value,) if isinstance(value, str) else value


Duration = Annotated[float, BeforeValidator(parse_duration)]
PromQL = Annotated[str, Field(min_length=1)]


class Model(BaseModel):
    """Every rule-file model: unknown fields are errors, values are frozen and finite, and a
    setting is read only by its rule-file name (``for``, never ``for_s``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RuleModel(Model):
    """The fields every rule has. A detector's rule model subclasses it with its edge-only
    fields; :func:`rule_model` adds ``detector`` (the registration's name), ``severity``,
    ``action`` and the detector's other settings from its settings dataclass."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    description: str = ""
    enabled: bool = True
    detector: str

    __settings__: ClassVar[type[Any] | None] = None
    __edge_settings__: ClassVar[Callable[[Any], Mapping[str, Any]] | None] = None

    def promql(self) -> dict[str, str]:
        """PromQL of this rule by field path (``queries.used``), for validation."""
        return {}

    def params(self) -> Any:
        """This rule's settings: the detector's settings dataclass (:func:`settings_of`)."""
        return settings_of(self)


GATED_QUERY = 'kube_pod_status_reason{reason="SchedulingGated"} == 1'
"""Pods whose PodScheduled condition has the reason ``SchedulingGated`` (k8s.io/api core/v1
``PodReasonSchedulingGated``: "one or more scheduling gates are still present").
kube-state-metrics exports it from 2.19.0 (kubernetes/kube-state-metrics
``internal/store/pod.go``, ``podStatusReasons``; 2.19 writes a 0 or 1 row per known reason for
every pod, 2.20 only the reason that is set: ``== 1`` reads both)."""


class KubeStateQueries(Model):
    """kube-state-metrics queries that build a GPU-only cluster when no snapshot is given.

    Labels read: ``node`` (allocatable, requests, info), ``namespace``/``pod``, ``phase``,
    ``priority_class`` (info) — kube-state-metrics' own names. ``gated``: the pods held by
    scheduling gates, one series per pod with a value of 1 (kube-state-metrics ≥ 2.19; before,
    no series, and a gated pod reads as pending).
    """

    allocatable: PromQL
    gpu_requests: PromQL
    phase: PromQL
    pending: PromQL
    info: PromQL
    gated: PromQL = GATED_QUERY
    lookback: Duration = 6 * 3600.0
    step: Duration = 60.0

    def promql(self, prefix: str) -> dict[str, str]:
        names = ("allocatable", "gpu_requests", "phase", "pending", "info", "gated")
        return {f"{prefix}.{n}": getattr(self, n) for n in names}


class ClusterRuleModel(RuleModel):
    """A rule whose detector reads the cluster; without one, ``queries`` (kube-state-metrics)
    build a GPU-only cluster from Prometheus."""

    queries: KubeStateQueries | None = None

    def promql(self) -> dict[str, str]:
        return self.queries.promql("queries") if self.queries else {}


class RuleModelError(TypeError):
    """A settings dataclass the generator cannot turn into a rule model."""


R = TypeVar("R", bound=RuleModel)


def rule_model(
    edge: type[R],
    detector: str,
    settings: type[Any],
    edge_settings: Callable[[Any], Mapping[str, Any]] | None = None,
) -> type[R]:
    """``edge`` extended with ``detector: Literal[detector]`` and one field per setting of the
    ``settings`` dataclass. ``edge_settings(rule)``: values of the INTERNAL settings the edge
    fills in (the PromQL a finding quotes). Raises :class:`RuleModelError` when a setting's
    name clashes with a field of ``edge``."""
    fields: dict[str, Any] = {"detector": (_literal(detector), ...)}
    fields.update(_setting_fields(settings, taken=set(edge.model_fields) - {"detector"}))
    model = create_model(
        f"{settings.__name__.removesuffix('Params')}Rule",
        __base__=edge,
        __module__=edge.__module__,
        **fields,
    )
    model.__settings__ = settings
    model.__edge_settings__ = edge_settings
    return model


def settings_model(settings: type[Any]) -> type[Model]:
    """A nested settings dataclass (e.g. DCGM label names) as a model of its own."""
    return create_model(
        settings.__name__,
        __base__=SettingsModel,
        __module__=__name__,
        __settings__=(ClassVar[type[Any]], settings),
        **_setting_fields(settings, taken=set()),
    )


class SettingsModel(Model):
    """A nested settings dataclass's model; :func:`settings_of` turns it back."""

    __settings__: ClassVar[type[Any] | None] = None


def settings_of(model: BaseModel) -> Any:
    """The settings dataclass of a generated model, every setting from the model (nested
    settings too), the rule's name and what the edge fills in."""
    settings = getattr(type(model), "__settings__", None)
    if settings is None:
        raise TypeError(f"{type(model).__name__} is not generated from a settings dataclass")
    names = {f.name for f in dataclasses.fields(settings)}
    values: dict[str, Any] = {}
    for name in type(model).model_fields:
        if name not in names:
            continue
        value = getattr(model, name)
        values[name] = settings_of(value) if isinstance(value, SettingsModel) else value
    if isinstance(model, RuleModel):
        if "name" in names:
            values["name"] = model.name
        extra = type(model).__edge_settings__
        if extra is not None:
            values.update(extra(model))
    return settings(**values)


def setting_names(settings: type[Any]) -> dict[str, str]:
    """Python name → rule-file name of every setting read from a rule file."""
    hints = get_type_hints(settings, include_extras=True)
    out = {}
    for f in dataclasses.fields(settings):
        meta = _meta(hints[f.name])
        if INTERNAL not in meta:
            out[f.name] = next((m.name for m in meta if isinstance(m, RuleName)), f.name)
    return out


def _setting_fields(settings: type[Any], taken: set[str]) -> dict[str, Any]:
    if not dataclasses.is_dataclass(settings):
        raise RuleModelError(f"{settings!r} is not a dataclass")
    hints = get_type_hints(settings, include_extras=True)
    rule_names = setting_names(settings)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        if f.name not in rule_names:
            continue
        alias = rule_names[f.name]
        if f.name in taken or alias in taken:
            raise RuleModelError(
                f"{settings.__name__}.{f.name}: the rule model already has a field {alias!r}"
            )
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise RuleModelError(f"{settings.__name__}.{f.name}: a setting needs a default")
        kind = _edge_type(hints[f.name])
        if dataclasses.is_dataclass(kind):
            nested = settings_model(kind)  # type: ignore[arg-type]
            kind, default = nested, nested.model_validate(dataclasses.asdict(default))
        info = Field(default=default, alias=alias) if alias != f.name else Field(default=default)
        out[f.name] = (kind, info)
    return out


def _meta(tp: Any) -> tuple[Any, ...]:
    return tuple(get_args(tp)[1:]) if get_origin(tp) is Annotated else ()


def _literal(value: str) -> Any:
    return Literal[value]


def _edge_type(tp: Any) -> Any:
    """The pydantic type of a setting's type: markers become validators (durations parsed,
    regular expressions compiled), a tuple of strings also takes a single string."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        keep: list[Any] = [m for m in meta if not isinstance(m, RuleName) and m is not INTERNAL]
        if DURATION in keep:
            keep = [BeforeValidator(parse_duration), *(m for m in keep if m is not DURATION)]
        if REGEX in keep:
            keep = [*(m for m in keep if m is not REGEX), AfterValidator(_regex)]
        inner = _edge_type(base)
        return Annotated.__class_getitem__((inner, *keep)) if keep else inner
    if origin in (Union, types.UnionType):
        return Union[tuple(_edge_type(a) for a in get_args(tp))]  # noqa: UP007
    if origin is tuple and get_args(tp)[1:] == (Ellipsis,) and get_args(tp)[0] is str:
        return Annotated[tp, BeforeValidator(_names)]
    return tp


__all__ = [
    "MAX_DURATION_S",
    "ClusterRuleModel",
    "Duration",
    "KubeStateQueries",
    "Model",
    "PromQL",
    "RuleModel",
    "RuleModelError",
    "parse_duration",
    "rule_model",
    "setting_names",
    "settings_of",
]
