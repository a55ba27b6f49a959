"""The daemon's settings: a YAML/JSON file, then ``DEFRAG_*`` environment variables, then flags.

The settings come in sections, one for each runtime configuration they build (``planner`` →
:class:`~defrag.plan.config.PlannerConfig`, ``execution`` →
:class:`~defrag.execute.executor.ExecutorSettings`, ...): ``planner.make_room_worth`` in the
file, ``DEFRAG_PLANNER__MAKE_ROOM_WORTH`` in the environment. Later sources win: a flag beats
the environment, the environment beats the file. Every field carries its unit in its name
(``daemon.cycle_interval_s``). A bad value raises :class:`SettingsError` whose message names
the dotted field and where the value came from; a flat key of the old layout
(``max_evictions_per_window``) is refused naming its new place (:data:`RENAMED`).
"""

from __future__ import annotations

import contextvars
import difflib
import json
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from defrag import safe_yaml
from defrag.alerting import GENERATOR_URL, RUNBOOK_URL
from defrag.execute.mode import RunMode
from defrag.model.selectors import SelectorSyntaxError, parse_label_selector
from defrag.model.units import DURATION_FORM as DURATION_FORM
from defrag.model.units import duration_seconds as duration_seconds
from defrag.plan.budget import DEFAULT_CEILING, DEFAULT_PER_GPU
from defrag.plan.config import (
    DEFAULT_MAX_EVICTIONS,
    DEFAULT_MAX_PER_NAMESPACE,
    DEFAULT_MAX_PER_NODE,
    DEFAULT_MIN_AGE,
    DEFAULT_OPTIONS,
    Goal,
    RoomValue,
)
from defrag.plan.cost import DEFAULT_COST
from defrag.plan.patience import DEFAULT_MEMORY, DEFAULT_PATIENCE
from defrag.plan.recent import DEFAULT_GUARD

if TYPE_CHECKING:
    from datetime import timedelta

    from defrag.decide import CycleConfig
    from defrag.execute.executor import ExecutorSettings
    from defrag.execute.windows import EarlyWindows
    from defrag.plan.config import EvictionBudget, PlannerConfig
    from defrag.plan.patience import PackingPatience
    from defrag.scoring.profile import ProfileConfig

ENV_PREFIX = "DEFRAG_"
ENV_NESTED = "__"
"""``DEFRAG_<SECTION>__<FIELD>``: the environment's name of ``<section>.<field>``."""
OTHER_ENV = frozenset(
    {
        "DEFRAG_AM_BASIC_AUTH",
        "DEFRAG_FUZZ_EXAMPLES",
        "DEFRAG_DATA_DIR",
        "DEFRAG_REVISION",
        "DEFRAG_RECORD_TIMELINE_EVENTS",
        "DEFRAG_ONE_DECISION_SEED",
    }
)
"""``DEFRAG_*`` variables that are not settings: the alerts CLI's credentials, the fuzz tests'
example count, the image's source revision (``defrag_build_info``), the reference data
directory (``defrag data``, the tests and benchmarks), the switch that re-records the
timeline's event fixture and the differential test's first seed (the simulator reads the
daemon's settings, environment included).
Any other ``DEFRAG_*`` name that is not a setting is refused as a typo."""

MAX_SECONDS = 10 * 365 * 86400.0
"""Ten years: the longest any ``*_s`` setting may be (longer is a typo, and overflows sleeps)."""

SEE = '(docs/daemon.md, "Settings")'
"""Where an error about the settings' layout sends the reader."""

_FILE_DATA: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "defrag_settings_file", default=MappingProxyType({})
)


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the field and its source."""


class Contradiction(ValueError):
    """Settings valid one by one that cannot hold together; ``fields`` names them (dotted, the
    first two are the pair, the message gives every value)."""

    def __init__(self, fields: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = fields


def _deadline_text(named: str, deadline: float, interval: float) -> str:
    if named == "daemon.ready_max_age_s":
        return f"daemon.ready_max_age_s ({deadline:g})"
    return (
        f"3 × daemon.cycle_interval_s ({interval:g}) = {deadline:g} (daemon.ready_max_age_s unset)"
    )


def _seconds(value: Any) -> Any:
    """A ``*_s`` setting: a number of seconds, or a duration string (``15m``); finite and at
    most :data:`MAX_SECONDS`."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            value = duration_seconds(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number of seconds: {value!r}")
        if abs(value) > MAX_SECONDS:
            raise ValueError(f"{value:g} seconds is more than ten years")
    return value


def _string_list(value: Any) -> Any:
    """A list setting from the environment: JSON (``["a", "b"]``) or comma-separated."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"not a JSON list ({exc.msg}); or give a comma-separated list"
            ) from None
    return [item.strip() for item in text.split(",") if item.strip()]


def _window_list(value: Any) -> Any:
    """``windows.schedule`` from the environment: JSON, or ``CRON DURATION`` entries separated
    by ``;`` (``0 2 * * * 1h; 0 14 * * 6 2h``)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list ({exc.msg})") from None
    windows = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        *cron, length = entry.split()
        if len(cron) != 5:
            raise ValueError(
                f"cannot read {entry!r}: expected five cron fields and a length, e.g. "
                "'0 2 * * * 1h' (entries separated by ';'), or a JSON list of "
                '{"cron": ..., "length_s": ...}'
            )
        windows.append({"cron": " ".join(cron), "length_s": _seconds(length)})
    return windows


class WindowSetting(BaseModel):
    """An execution window: opens at each ``cron`` fire time and stays open ``length_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cron: str = Field(description="five-field crontab expression, e.g. '0 2 * * *'")
    length_s: float = Field(gt=0, description="how long the window stays open, seconds")
    timezone: str = "UTC"

    @field_validator("length_s", mode="before")
    @classmethod
    def _length(cls, value: Any) -> Any:
        return _seconds(value)

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        from defrag.execute.windows import crontab_trigger

        try:
            crontab_trigger(value)
        except ValueError as exc:
            raise ValueError(f"not a crontab expression ({exc})") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone_exists(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value


# --- the sections ------------------------------------------------------------------------------


class Section(BaseModel):
    """One section of the settings: unknown keys refused, numbers finite, ``*_s`` durations."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: Any) -> Any:
        return _seconds(value) if str(info.field_name).endswith("_s") else value


class ClusterSection(Section):
    """The cluster the daemon watches (the cluster source, ``defrag.adapters.sources``)."""

    kind: Literal["kube", "sim"] = "kube"
    """``kube``, or ``sim``: the built-in simulated cluster."""
    name: str = Field("default", min_length=1)
    """The ``cluster`` label of every alert."""
    kubeconfig: str | None = None
    context: str | None = None


class PrometheusSection(Section):
    """The metrics source (``PrometheusSource``)."""

    url: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    timeout_s: float = Field(10.0, gt=0)
    concurrent_queries: int = Field(4, ge=1, le=64)
    """The most queries in flight to Prometheus at once; the leak rule's queries are split
    into at least this many shards (by GPU index, then by node)."""


class AlertsSection(Section):
    """The alert sink (``AlertmanagerSink``)."""

    urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Every Alertmanager gets every alert (an HA pair)."""
    token_file: str | None = None
    ca_file: str | None = None
    resend_interval_s: float = Field(60.0, ge=0)
    ttl_s: float = Field(900.0, gt=0)
    runbook_url: str = RUNBOOK_URL
    """Absolute URL of docs/alerts.md; every alert links ``<this>#<alert name, lower case>``."""
    generator_url: str = GENERATOR_URL
    """Base of every alert's ``generatorURL`` (``/<finding fingerprint>`` appended)."""

    @field_validator("urls", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        return _string_list(value)

    @field_validator("runbook_url", "generator_url")
    @classmethod
    def _absolute_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")) or value[-3:] == "://":
            raise ValueError(f"expected an absolute http(s) URL, got {value!r}")
        return value.rstrip("/")


class DetectionSection(Section):
    """The detection rules."""

    rules_dir: str | None = None
    """The rule files' folder; unset: the rules shipped inside the package (``--rules``
    overrides either)."""


class DaemonSection(Section):
    """The daemon's rhythm and deadline (``Daemon``: the interval, /readyz, the cycle's
    deadline)."""

    cycle_interval_s: float = Field(300.0, gt=0)
    ready_max_age_s: float | None = Field(None, gt=0)
    """/readyz fails when the last good cycle is older; also the cycle's deadline. Default: 3 ×
    ``cycle_interval_s``."""

    def cycle_deadline(self) -> tuple[float, str]:
        """Seconds one cycle may run (past it /healthz fails and the Lease is not renewed) and
        the setting that decides it: ``daemon.ready_max_age_s``, else 3 ×
        ``daemon.cycle_interval_s``."""
        if self.ready_max_age_s is not None:
            return self.ready_max_age_s, "daemon.ready_max_age_s"
        return 3 * self.cycle_interval_s, "daemon.cycle_interval_s"

    @property
    def ready_age_limit_s(self) -> float:
        """/readyz fails when the last good cycle is older than this (default 3 intervals)."""
        return self.ready_max_age_s or 3 * self.cycle_interval_s


class ScoringSection(Section):
    """The one scoring profile (:class:`~defrag.scoring.profile.ProfileConfig`): the daemon's
    detection and planning, ``defrag extender`` and the scoring commands all read it."""

    policy: str = "reserve-binpack"
    seed: int = Field(0, ge=0)
    """The ``random`` policy's seed (the other policies ignore it)."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy

        if value not in POLICY_NAMES:
            raise ValueError(str(UnknownPolicy(value)))
        return value


class PlannerSection(Section):
    """The planner's knobs: their defaults are the planner's own (defrag/plan/config.py) but
    for the two that keep a daemon's plans small (``max_rooms_per_cycle``,
    ``repack_on_demand``); :meth:`Settings.planner_config` turns them, with the budgets of
    ``windows``, into the one :class:`~defrag.plan.config.PlannerConfig`."""

    goal: Literal["auto"] | Goal = "auto"
    """``auto`` (the findings' actions decide) or a :class:`~defrag.plan.config.Goal`."""
    min_pod_age_s: float = Field(DEFAULT_MIN_AGE.total_seconds(), ge=0)
    make_room_moves_any_priority: bool = DEFAULT_OPTIONS.mode.migrates_any_priority
    """Make-room may move pods of any priority, each only where it re-fits at once."""
    make_room_swaps: bool = DEFAULT_OPTIONS.swaps
    """Allow a room that preempts as much GPU as it frees (left to kube-scheduler by default)."""
    make_room_worth: float = Field(DEFAULT_OPTIONS.room_worth, ge=0, le=1e6)
    """The margin: a room is made when what it is worth (``make_room_value``) reaches this × its
    known cost (lost work since the checkpoint and restarts); 0: always."""
    make_room_value: RoomValue = DEFAULT_OPTIONS.room_value
    """``forecast``: a room is worth the wait it saves (the pod's GPUs × the hours until the
    cluster would free such a room by itself); ``waited``: the pod's GPUs × hours pending."""
    make_room_horizon_s: float = Field(DEFAULT_OPTIONS.room_horizon_h * 3600, gt=0, le=30 * 86400)
    """The forecast counts waits up to this long."""
    evict_again_after_s: float | None = Field(
        None if DEFAULT_GUARD is None else DEFAULT_GUARD.total_seconds(), ge=0
    )
    """A pod (or, but for a ReplicaSet's replica, its workload) the daemon evicted less than
    this ago is not evicted again; ``null``: no guard (docs/planning.md, ``recently-evicted``)."""
    make_room_spares_jobs: bool = DEFAULT_OPTIONS.spare_jobs
    """Never move a multi-GPU job that does not answer the checkpoint handshake to make room for
    a multi-GPU pod of equal or lower priority (docs/planning.md, ``spared``)."""
    make_room_packing_patience_s: float | None = Field(
        None if DEFAULT_PATIENCE is None else DEFAULT_PATIENCE.total_seconds(), ge=0
    )
    """While the scheduler packs (the spreading rule's ``packing`` finding), make room only for
    pods pending at least this long; ``null``: never while it packs; 0 (the default): as under
    a spreading scheduler, each room weighed by its forecast value (docs/planning.md, "Patience
    under a packing scheduler")."""
    make_room_packing_memory_s: float = Field(DEFAULT_MEMORY.total_seconds(), ge=0)
    """How long the spreading rule's ``packing`` finding stands after the last cycle that
    reported it (one cycle whose share dips under the bar does not undo it; a ``spreading``
    finding does); 0: only in the cycle that reports it."""
    # The eviction filters, as descheduler's DefaultEvictor takes them.
    evict_namespaces_include: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Only pods in these namespaces may be evicted (empty: all); excludes the next one."""
    evict_namespaces_exclude: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Pods in these namespaces are never evicted."""
    evict_label_selector: str = ""
    """Only pods matching this label selector (``a=b,c!=d,e in (x,y),!f``) may be evicted."""
    evict_priority_threshold: int | None = None
    """Pods at or above this priority are never evicted (``defrag plan --protect-priority``)."""
    evict_owner_kinds: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Controller kinds trusted to recreate their pods beside the known ones (``Kind.group``,
    e.g. ``TFJob.kubeflow.org``; ``Kind`` in the core group), every object of it, unread. A pod
    whose controller is of any other kind is never evicted (docs/planning.md, "Only what comes
    back")."""
    # How hard the planner tries (PlanOptions).
    depth: int = Field(DEFAULT_OPTIONS.depth, ge=0, le=8)
    """Chains of migrations for victims that fit nowhere (room made for them in turn)."""
    min_gain_per_cost: float = Field(DEFAULT_OPTIONS.min_gain_per_cost, ge=0, le=1e6)
    """Repack keeps a drain only if it frees this many fragmented GPUs per unit of cost."""
    candidates: int = Field(DEFAULT_OPTIONS.candidates, ge=1, le=100_000)
    """Nodes priced per pending pod (the ones needing the least freed)."""
    tries: int = Field(DEFAULT_OPTIONS.tries, ge=1, le=100_000)
    """Victim sets tried per pending pod, cheapest first."""
    max_moves_per_room: int | None = Field(DEFAULT_OPTIONS.max_moves_per_room, ge=1)
    """Skip rooms that need more evictions than this (``null``: no limit)."""
    max_rooms_per_cycle: int | None = Field(32, ge=1)
    """Make room for at most this many starved groups per plan, most urgent first (``null``:
    all): a cycle's plan stays small, what it leaves waits for the next cycle."""
    repack_on_demand: bool = True
    """A plan that makes room and repacks (goal ``all``) repacks only when a starved group got
    no room (a drain no pending pod waits for is paid for now and mostly never used)."""
    unknown_hours: float = Field(DEFAULT_COST.unknown_hours, ge=0, le=24 * 365)
    """The lost work priced for a training or batch pod that shows no checkpoint: up to this
    many hours since it started (:class:`~defrag.plan.cost.CostModel`)."""

    @field_validator(
        "evict_namespaces_include", "evict_namespaces_exclude", "evict_owner_kinds", mode="before"
    )
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _string_list(value)

    @field_validator("evict_label_selector")
    @classmethod
    def _selector_parses(cls, value: str) -> str:
        try:
            parse_label_selector(value)
        except SelectorSyntaxError as exc:
            raise ValueError(str(exc)) from None
        return value


class WindowsSection(Section):
    """When execution may happen (the cycle's windows and idle gate) and how much one window
    opening may evict (``EvictionBudget``, ``DemandBudget``)."""

    schedule: Annotated[list[WindowSetting], NoDecode] = Field(default_factory=list)
    """The execution windows; none: nothing executes (but make-room-now)."""
    idle_gate: bool = False
    max_evictions_per_window: int = Field(DEFAULT_MAX_EVICTIONS, ge=0, le=1_000_000)
    max_evictions_per_node: int = Field(DEFAULT_MAX_PER_NODE, ge=0, le=1_000_000)
    max_evictions_per_namespace: int = Field(DEFAULT_MAX_PER_NAMESPACE, ge=0, le=1_000_000)
    budget_follows_demand: bool = True
    """A make-room plan may evict up to ``evictions_per_starved_gpu`` × the GPUs its starved
    pods ask (at least ``max_evictions_per_window``, at most
    ``max_evictions_per_window_ceiling``; per node and per namespace as ever): a window
    serves its backlog under a spreading scheduler too (defrag/plan/budget.py)."""
    max_evictions_per_window_ceiling: int = Field(DEFAULT_CEILING, ge=0, le=1_000_000)
    """The most evictions of one window when the budget follows demand. Left at its default
    it is never below ``max_evictions_per_window`` (a fixed budget raised above 512 raises it
    too); set below that, the settings contradict each other."""
    evictions_per_starved_gpu: float = Field(DEFAULT_PER_GPU, ge=0, le=64)
    """Evictions budgeted per GPU a starved pod asks (1: a spreading scheduler's one pod per
    GPU)."""
    open_early_backlog_gpu_h: float | None = Field(None, gt=0)
    """Open a window ahead of the schedule when the starved pods' GPUs × hours pending reach
    this (checked at the start of every ``open_early_every_s``); all early windows of a day
    spend one window's budgets; ``null`` (the default): only the schedule opens windows."""
    open_early_every_s: float = Field(3600.0, gt=0, le=86400)
    open_early_length_s: float = Field(3600.0, gt=0, le=86400)

    @field_validator("schedule", mode="before")
    @classmethod
    def _windows(cls, value: Any) -> Any:
        return _window_list(value)

    @property
    def ceiling(self) -> int:
        """The ceiling in force: the one set, or the default raised to the fixed budget."""
        if "max_evictions_per_window_ceiling" in self.model_fields_set:
            return self.max_evictions_per_window_ceiling
        return max(self.max_evictions_per_window_ceiling, self.max_evictions_per_window)


class ExecutionSection(Section):
    """How plans are carried out (``ExecutorSettings`` and the :class:`RunMode`)."""

    dry_run: bool = True
    dry_run_events: bool = False
    batch_size: int = Field(4, ge=1, le=64)
    """Evictions in flight at once."""
    replacement_timeout_s: float = Field(600.0, gt=0)
    poll_interval_s: float = Field(5.0, gt=0)
    checkpoint_wait_s: float = Field(120.0, ge=0)
    """How long a pod with ``defrag.io/checkpoint: supported`` is waited for before its eviction
    when it names no ``defrag.io/checkpoint-max-wait`` (docs/daemon.md, the handshake)."""
    checkpoint_max_wait_s: float = Field(600.0, ge=0)
    """The longest checkpoint wait a pod may ask for."""


class LeadershipSection(Section):
    """Leader election (the ``LeaseElector``)."""

    enabled: bool = True
    lease_name: str = "defrag"
    lease_namespace: str = "defrag-system"
    lease_duration_s: float = Field(15.0, gt=0)
    identity: str = Field(default_factory=socket.gethostname)


class HttpSection(Section):
    """The daemon's endpoints (/metrics, /healthz, /readyz)."""

    host: str = "0.0.0.0"
    port: int = Field(8080, ge=0, le=65535)


class LoggingSection(Section):
    format: Literal["text", "json"] = "text"
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


class SimSection(Section):
    """The simulated cluster (``cluster.kind: sim``)."""

    speedup: float = Field(60.0, gt=0)
    """Simulated seconds per real second."""


RENAMED: Mapping[str, str] = MappingProxyType(
    {
        "cluster": "cluster.kind",
        "cluster_name": "cluster.name",
        "kubeconfig": "cluster.kubeconfig",
        "kube_context": "cluster.context",
        "prometheus_url": "prometheus.url",
        "prometheus_token_file": "prometheus.token_file",
        "prometheus_ca_file": "prometheus.ca_file",
        "prometheus_timeout_s": "prometheus.timeout_s",
        "alertmanager_urls": "alerts.urls",
        "alertmanager_token_file": "alerts.token_file",
        "alertmanager_ca_file": "alerts.ca_file",
        "alert_resend_interval_s": "alerts.resend_interval_s",
        "alert_ttl_s": "alerts.ttl_s",
        "alert_runbook_url": "alerts.runbook_url",
        "alert_generator_url": "alerts.generator_url",
        "rules_dir": "detection.rules_dir",
        "cycle_interval_s": "daemon.cycle_interval_s",
        "ready_max_age_s": "daemon.ready_max_age_s",
        "policy": "scoring.policy",
        "policy_seed": "scoring.seed",
        "plan_goal": "planner.goal",
        "min_pod_age_s": "planner.min_pod_age_s",
        "make_room_moves_any_priority": "planner.make_room_moves_any_priority",
        "make_room_swaps": "planner.make_room_swaps",
        "make_room_worth": "planner.make_room_worth",
        "make_room_spares_jobs": "planner.make_room_spares_jobs",
        "make_room_packing_patience_s": "planner.make_room_packing_patience_s",
        "make_room_packing_memory_s": "planner.make_room_packing_memory_s",
        "evict_namespaces_include": "planner.evict_namespaces_include",
        "evict_namespaces_exclude": "planner.evict_namespaces_exclude",
        "evict_label_selector": "planner.evict_label_selector",
        "evict_priority_threshold": "planner.evict_priority_threshold",
        "evict_owner_kinds": "planner.evict_owner_kinds",
        "windows": "windows.schedule",
        "idle_gate": "windows.idle_gate",
        "max_evictions_per_window": "windows.max_evictions_per_window",
        "max_evictions_per_node": "windows.max_evictions_per_node",
        "max_evictions_per_namespace": "windows.max_evictions_per_namespace",
        "eviction_budget_follows_demand": "windows.budget_follows_demand",
        "max_evictions_per_window_ceiling": "windows.max_evictions_per_window_ceiling",
        "evictions_per_starved_gpu": "windows.evictions_per_starved_gpu",
        "dry_run": "execution.dry_run",
        "dry_run_events": "execution.dry_run_events",
        "eviction_batch_size": "execution.batch_size",
        "replacement_timeout_s": "execution.replacement_timeout_s",
        "poll_interval_s": "execution.poll_interval_s",
        "checkpoint_wait_s": "execution.checkpoint_wait_s",
        "checkpoint_max_wait_s": "execution.checkpoint_max_wait_s",
        "leader_election": "leadership.enabled",
        "lease_name": "leadership.lease_name",
        "lease_namespace": "leadership.lease_namespace",
        "lease_duration_s": "leadership.lease_duration_s",
        "identity": "leadership.identity",
        "http_host": "http.host",
        "http_port": "http.port",
        "log_format": "logging.format",
        "log_level": "logging.level",
        "sim_speedup": "sim.speedup",
    }
)
"""Every flat key of the old layout → its dotted place now: a flat key in the file, the
environment or a flag is refused naming its new place (:func:`renamed_message`)."""


def env_name(dotted: str) -> str:
    """The environment variable of a dotted setting: ``execution.dry_run`` →
    ``DEFRAG_EXECUTION__DRY_RUN``."""
    return ENV_PREFIX + dotted.upper().replace(".", ENV_NESTED)


def _section(model: type[Section]) -> Any:
    """A section's field: its defaults when no source gives it."""
    return Field(default_factory=lambda: model.model_validate({}))


class _FileSource(PydanticBaseSettingsSource):
    """The settings file's values (set by :func:`load_settings` for the duration of one load)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _FILE_DATA.get()
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get())


class Settings(BaseSettings):
    """Everything the daemon can be told, in sections. See docs/daemon.md for the reference."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED,
        extra="forbid",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,
    )

    cluster: ClusterSection = _section(ClusterSection)
    prometheus: PrometheusSection = _section(PrometheusSection)
    alerts: AlertsSection = _section(AlertsSection)
    detection: DetectionSection = _section(DetectionSection)
    daemon: DaemonSection = _section(DaemonSection)
    scoring: ScoringSection = _section(ScoringSection)
    planner: PlannerSection = _section(PlannerSection)
    windows: WindowsSection = _section(WindowsSection)
    execution: ExecutionSection = _section(ExecutionSection)
    leadership: LeadershipSection = _section(LeadershipSection)
    http: HttpSection = _section(HttpSection)
    logging: LoggingSection = _section(LoggingSection)
    sim: SimSection = _section(SimSection)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        """Settings each valid alone that contradict each other (docs/daemon.md, "Settings that
        must agree"): refused at start, naming both."""
        planner, alerts, daemon = self.planner, self.alerts, self.daemon
        windows, execution = self.windows, self.execution
        if planner.evict_namespaces_include and planner.evict_namespaces_exclude:
            raise Contradiction(
                ("planner.evict_namespaces_include", "planner.evict_namespaces_exclude"),
                "planner.evict_namespaces_include "
                f"({', '.join(planner.evict_namespaces_include)}) and "
                "planner.evict_namespaces_exclude "
                f"({', '.join(planner.evict_namespaces_exclude)}) are mutually exclusive: give "
                "the namespaces that may be evicted, or those that may not, not both",
            )
        if alerts.urls and alerts.ttl_s <= max(alerts.resend_interval_s, daemon.cycle_interval_s):
            raise Contradiction(
                ("alerts.ttl_s", "alerts.resend_interval_s", "daemon.cycle_interval_s"),
                f"alerts.ttl_s ({alerts.ttl_s:g}) must exceed alerts.resend_interval_s "
                f"({alerts.resend_interval_s:g}) and daemon.cycle_interval_s "
                f"({daemon.cycle_interval_s:g}), or alerts lapse between cycles",
            )
        if daemon.ready_max_age_s is not None and daemon.ready_max_age_s <= daemon.cycle_interval_s:
            raise Contradiction(
                ("daemon.ready_max_age_s", "daemon.cycle_interval_s"),
                f"daemon.ready_max_age_s ({daemon.ready_max_age_s:g}) must exceed "
                f"daemon.cycle_interval_s ({daemon.cycle_interval_s:g}): the last good cycle "
                "is that old before the next one ends, so /readyz would fail between every "
                "two cycles",
            )
        if (
            windows.budget_follows_demand
            and "max_evictions_per_window_ceiling" in windows.model_fields_set
            and windows.max_evictions_per_window_ceiling < windows.max_evictions_per_window
        ):
            raise Contradiction(
                ("windows.max_evictions_per_window_ceiling", "windows.max_evictions_per_window"),
                "windows.max_evictions_per_window_ceiling "
                f"({windows.max_evictions_per_window_ceiling}) is below "
                f"windows.max_evictions_per_window ({windows.max_evictions_per_window}): the "
                "budget that follows demand starts at the fixed one and may only grow to the "
                "ceiling (or set windows.budget_follows_demand: false)",
            )
        deadline, named = daemon.cycle_deadline()
        wait = execution.replacement_timeout_s + execution.poll_interval_s
        if self.run_mode.evicts and wait >= deadline:  # dry run waits for no replacement
            raise Contradiction(
                ("execution.replacement_timeout_s", "execution.poll_interval_s", named),
                "execution.replacement_timeout_s "
                f"({execution.replacement_timeout_s:g}) plus one execution.poll_interval_s "
                f"({execution.poll_interval_s:g}) must be less than the cycle deadline, "
                f"{_deadline_text(named, deadline, daemon.cycle_interval_s)}: one wait for "
                "replacements would outlast the cycle, /healthz would fail and the leader "
                "would stop renewing its Lease mid-drain",
            )
        return self

    # --- the runtime configurations ------------------------------------------------------

    @property
    def run_mode(self) -> RunMode:
        """Dry run or live and what follows (defrag/execute/mode.py): the one decision."""
        return RunMode(
            self.execution.dry_run, self.execution.dry_run_events, self.leadership.enabled
        )

    def profile_config(self, policy: str | None = None) -> ProfileConfig:
        """The one scoring configuration these settings give (``policy``: a command's explicit
        ``--policy``, which overrides the setting). Raises :class:`SettingsError` naming the
        flag for an unknown policy."""
        from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy
        from defrag.scoring.profile import ProfileConfig

        if policy is not None and policy not in POLICY_NAMES:
            raise SettingsError(f"--policy: {UnknownPolicy(policy)}")
        return ProfileConfig(policy or self.scoring.policy, self.scoring.seed)

    def packing_patience(self) -> PackingPatience:
        """Make-room's patience under a packing scheduler (:mod:`defrag.plan.patience`)."""
        from datetime import timedelta

        from defrag.plan.patience import PackingPatience

        seconds = self.planner.make_room_packing_patience_s
        return PackingPatience(
            None if seconds is None else timedelta(seconds=seconds),
            timedelta(seconds=self.planner.make_room_packing_memory_s),
        )

    def planner_config(self) -> PlannerConfig:
        """The one planner configuration these settings give (defrag/plan/config.py): the
        daemon plans with it, and so do ``defrag plan --settings`` (whose flags are settings
        given as flags) and the simulator. Every knob of ``planner`` and the budgets of
        ``windows`` land here."""
        from datetime import timedelta

        from defrag.plan.budget import DemandBudget
        from defrag.plan.config import (
            Constraints,
            EvictionBudget,
            MakeRoomMode,
            PlannerConfig,
            PlanOptions,
        )

        planner, windows = self.planner, self.windows
        selector = parse_label_selector(planner.evict_label_selector)
        constraints = Constraints(
            min_age=timedelta(seconds=planner.min_pod_age_s),
            priority_threshold=planner.evict_priority_threshold,
            budget=EvictionBudget(
                windows.max_evictions_per_window,
                windows.max_evictions_per_node,
                windows.max_evictions_per_namespace,
            ),
            namespaces_include=frozenset(planner.evict_namespaces_include),
            namespaces_exclude=frozenset(planner.evict_namespaces_exclude),
            label_selector=selector if selector.requirements else None,
            owner_kinds=frozenset(planner.evict_owner_kinds),
            evict_again_after=self.evict_again_after(),
        )
        options = PlanOptions(
            cost=replace(DEFAULT_COST, unknown_hours=planner.unknown_hours),
            mode=MakeRoomMode.of(
                preempt=DEFAULT_OPTIONS.mode.preempts,
                migrate_any_priority=planner.make_room_moves_any_priority,
            ),
            swaps=planner.make_room_swaps,
            room_worth=planner.make_room_worth,
            room_value=planner.make_room_value,
            room_horizon_h=planner.make_room_horizon_s / 3600.0,
            spare_jobs=planner.make_room_spares_jobs,
            max_moves_per_room=planner.max_moves_per_room,
            depth=planner.depth,
            candidates=planner.candidates,
            tries=planner.tries,
            min_gain_per_cost=planner.min_gain_per_cost,
            max_rooms=planner.max_rooms_per_cycle,
            repack_on_demand=planner.repack_on_demand,
        )
        demand = (
            DemandBudget(
                windows.max_evictions_per_window,
                windows.ceiling,
                windows.evictions_per_starved_gpu,
            )
            if windows.budget_follows_demand
            else None
        )
        return PlannerConfig(constraints, options, demand)

    def cycle_config(self) -> CycleConfig:
        """What one cycle is configured with (defrag/daemon/cycle.py): the goal, the windows
        and idle gate, the scoring profile and make-room's patience."""
        from defrag.decide import CycleConfig
        from defrag.execute.windows import Window

        return CycleConfig(
            goal=self.planner.goal,
            windows=tuple(Window(w.cron, w.length_s, w.timezone) for w in self.windows.schedule),
            idle_gate=self.windows.idle_gate,
            profile=self.profile_config(),
            patience=self.packing_patience(),
            repack_on_demand=self.planner.repack_on_demand,
            early=self.early_windows(),
            evict_again_after=self.evict_again_after(),
        )

    def evict_again_after(self) -> timedelta | None:
        """The anti-thrash guard (defrag/plan/recent.py); None: none."""
        from datetime import timedelta

        seconds = self.planner.evict_again_after_s
        return None if seconds is None else timedelta(seconds=seconds)

    def early_windows(self) -> EarlyWindows | None:
        """Windows opened early on a backlog (None: not configured); checked within two
        cycles of each period's start, so one cycle at least sees it."""
        from defrag.execute.windows import EarlyWindows

        w = self.windows
        if w.open_early_backlog_gpu_h is None:
            return None
        return EarlyWindows(
            w.open_early_backlog_gpu_h,
            w.open_early_every_s,
            w.open_early_length_s,
            2 * self.daemon.cycle_interval_s,
        )

    def executor_settings(self, budgets: EvictionBudget | None = None) -> ExecutorSettings:
        """The executor's settings (defrag/execute/executor.py); ``budgets``: what it enforces
        across a window's plans, by default the planner configuration's window budget."""
        from defrag.execute.executor import ExecutorSettings

        execution = self.execution
        return ExecutorSettings(
            budgets=self.planner_config().window_budget() if budgets is None else budgets,
            batch_size=execution.batch_size,
            replacement_timeout_s=execution.replacement_timeout_s,
            poll_interval_s=execution.poll_interval_s,
            checkpoint_wait_s=execution.checkpoint_wait_s,
            checkpoint_max_wait_s=execution.checkpoint_max_wait_s,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


SECTIONS: Mapping[str, type[Section]] = MappingProxyType(
    {
        name: field.annotation
        for name, field in Settings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
    }
)
"""Every section by name: ``planner`` → :class:`PlannerSection`, ..."""

SETTING_NAMES = tuple(
    f"{section}.{name}" for section, model in SECTIONS.items() for name in model.model_fields
)
"""Every setting, dotted (``execution.dry_run``)."""


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys (``execution.dry_run``) as the sections' mappings (``{"execution":
    {"dry_run": ...}}``); a key without a dot stays as it is (a section's mapping merges)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        section, dot, name = str(key).partition(".")
        if not dot:
            if isinstance(value, Mapping) and isinstance(out.get(section), dict):
                out[section].update(value)
            else:
                out[section] = dict(value) if isinstance(value, Mapping) else value
            continue
        into = out.setdefault(section, {})
        if isinstance(into, dict):
            into[name] = value
    return out


def _flat(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sections' mappings as dotted keys (the inverse of :func:`nested`, one level)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, Mapping):
            out.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            out[key] = value
    return out


def _is_old(key: str, value: Any) -> bool:
    """A flat key of the old layout (``cluster`` and ``windows`` are sections now: old when
    their value is not a mapping)."""
    return key in RENAMED and not (key in SECTIONS and isinstance(value, Mapping))


def _normal(name: str) -> str:
    return name.lower().replace("-", "_")


def read_settings_file(path: Path) -> dict[str, Any]:
    """The sections' mappings in a YAML or JSON settings file; errors name the file. Keys may
    be given as the environment names them (``DEFRAG_EXECUTION__DRY_RUN``); a flat key of the
    old layout is refused, naming its new place."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{path}: no such file") from None
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read settings file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        ) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else safe_yaml.load(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"{path}: line {exc.lineno} column {exc.colno}: not valid JSON: {exc.msg}"
        ) from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: {safe_yaml.one_line(exc, 'not valid YAML: ')}") from None
    except RecursionError:
        raise SettingsError(f"{path}: not valid {_kind(path)}: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of setting names to values")
    out: dict[str, Any] = {}
    old: list[tuple[str, str]] = []
    for key, value in data.items():
        name = str(key)
        if name.upper().startswith(ENV_PREFIX):
            name = name[len(ENV_PREFIX) :]
        section, nest, field = _normal(name).partition(ENV_NESTED)
        if nest:  # DEFRAG_SECTION__FIELD
            into = out.setdefault(section, {})
            if isinstance(into, dict):
                into[field] = value
            continue
        if _is_old(section, value):
            old.append((str(key), RENAMED[section]))
            continue
        if isinstance(value, dict):
            value = {_normal(str(k)): v for k, v in value.items()}
            if isinstance(out.get(section), dict):
                value = {**value, **out[section]}
        out[section] = value
    if old:
        raise SettingsError(renamed_message(old, str(path)))
    return out


def load_settings(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from ``path`` (optional), the ``DEFRAG_*`` environment and ``overrides`` (the
    flags: dotted keys, ``{"execution.dry_run": False}``, or a section's mapping; None values
    are unset)."""
    file_data = read_settings_file(path) if path is not None else {}
    check_environment(os.environ)
    flags = _flags(overrides or {})
    token = _FILE_DATA.set(file_data)
    try:
        return Settings(**nested(flags))
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path, file_data, flags)) from None
    finally:
        _FILE_DATA.reset(token)


def _flags(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The set ``overrides`` as dotted keys; a flat key of the old layout is refused."""
    flags: dict[str, Any] = {}
    old: list[tuple[str, str]] = []
    for key, value in _flat(overrides).items():
        if value is None:
            continue
        if "." not in key and _is_old(key, value):
            old.append((f"flag {key}", RENAMED[key]))
        else:
            flags[key] = value
    if old:
        raise SettingsError(renamed_message(old))
    return flags


def renamed_message(old: list[tuple[str, str]], where: str | None = None) -> str:
    """One line for flat keys of the old layout, each with its new place:
    ``<where>: <key> is now <new place> (docs/daemon.md, "Settings")``."""
    moves = "; ".join(f"{key} is now {new}" for key, new in old)
    return f"{where}: {moves} {SEE}" if where else f"{moves} {SEE}"


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a ``DEFRAG_*`` variable that names no setting, naming the closest one (a misspelt
    ``DEFRAG_EXECUTION__DRYRUN`` would otherwise be ignored and the daemon run with the
    default), and one of the old flat layout (``DEFRAG_DRY_RUN``), naming its new name."""
    known = {env_name(name) for name in SETTING_NAMES}
    old: list[tuple[str, str]] = []
    unknown: str | None = None
    for key in sorted(environ):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in OTHER_ENV:
            continue
        flat = upper[len(ENV_PREFIX) :].lower()
        if flat in RENAMED:
            old.append((f"env {key}", env_name(RENAMED[flat])))
        elif unknown is None:
            close = difflib.get_close_matches(upper, sorted(known | OTHER_ENV), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            unknown = f"env {key}: unknown setting{hint}"
    if old:
        raise SettingsError(renamed_message(old))
    if unknown is not None:
        raise SettingsError(unknown)


def _describe(
    exc: ValidationError, path: Path | None, file_data: Mapping[str, Any], flags: Mapping[str, Any]
) -> str:
    lines = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"]]
        loc = ".".join(parts) or "settings"
        name = ".".join(parts[:2]) if parts and parts[0] in SECTIONS else ".".join(parts[:1])
        where = _source(name, path, file_data, flags)
        message = str(err["msg"]).removeprefix("Value error, ")
        cause = (err.get("ctx") or {}).get("error")
        if not name and isinstance(cause, Contradiction):
            sources = " and ".join(
                f"{field} ({_source(field, path, file_data, flags)})" for field in cause.fields
            )
            lines.append(f"settings {sources} contradict each other: {cause}")
            continue
        if err["type"] == "extra_forbidden":
            message = f"unknown setting{_did_you_mean(parts)}"
        elif err["type"] == "bool_parsing":
            message = f"cannot read {err.get('input')!r}: expected true or false"
        elif len(parts) == 1 and parts[0] in SECTIONS and err["type"].endswith("_type"):
            example = next(iter(SECTIONS[parts[0]].model_fields))
            message = (
                f"expected a mapping of the {parts[0]} section's settings, e.g. "
                f"{{{example}: ...}} ({parts[0]}.{example})"
            )
        lines.append(f"setting {loc} ({where}): {message}" if name else f"settings: {message}")
    return "; ".join(lines)


def _did_you_mean(parts: list[str]) -> str:
    """``; did you mean <dotted setting>?`` for an unknown key, when one is close."""
    if len(parts) >= 2 and parts[0] in SECTIONS:
        names = list(SECTIONS[parts[0]].model_fields)
        close = difflib.get_close_matches(parts[1], names, n=1, cutoff=0.6)
        return f"; did you mean {parts[0]}.{close[0]}?" if close else ""
    if not parts:
        return ""
    by_leaf = {name.rpartition(".")[2]: name for name in reversed(SETTING_NAMES)}
    close = difflib.get_close_matches(parts[0], [*SECTIONS, *by_leaf], n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {close[0] if close[0] in SECTIONS else by_leaf[close[0]]}?"


def _source(
    name: str, path: Path | None, file_data: Mapping[str, Any], flags: Mapping[str, Any]
) -> str:
    """Where dotted setting ``name`` came from: ``flag``, ``env DEFRAG_X__Y``, the file, or
    ``default``."""
    if name in flags:
        return "flag"
    env = env_name(name)
    if env in {k.upper() for k in os.environ}:
        return f"env {env}"
    section, dot, field = name.partition(".")
    in_file = file_data.get(section) if dot else None
    if path is not None and (
        (isinstance(in_file, Mapping) and field in in_file) or (not dot and name in file_data)
    ):
        return str(path)
    return "default"


def _kind(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"
