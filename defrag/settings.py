"""The daemon's settings: a YAML/JSON file, then ``DEFRAG_*`` environment variables, then flags.

Later sources win: a flag beats the environment, the environment beats the file. Every field
carries its unit in its name (``cycle_interval_s``). A bad value raises :class:`SettingsError`
whose message names the field and where the value came from.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import math
import os
import socket
from collections.abc import Mapping
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
)
from defrag.plan.patience import DEFAULT_MEMORY, DEFAULT_PATIENCE

if TYPE_CHECKING:
    from defrag.plan.config import PlannerConfig
    from defrag.plan.patience import PackingPatience
    from defrag.scoring.profile import ProfileConfig

ENV_PREFIX = "DEFRAG_"
OTHER_ENV = frozenset(
    {"DEFRAG_AM_BASIC_AUTH", "DEFRAG_FUZZ_EXAMPLES", "DEFRAG_DATA_DIR", "DEFRAG_REVISION"}
)
"""``DEFRAG_*`` variables that are not settings: the alerts CLI's credentials, the fuzz tests'
example count, the image's source revision (``defrag_build_info``), the reference data
directory (``defrag data``, the tests and benchmarks). Any other ``DEFRAG_*`` name that is not a
setting is refused as a typo."""

MAX_SECONDS = 10 * 365 * 86400.0
"""Ten years: the longest any ``*_s`` setting may be (longer is a typo, and overflows sleeps)."""

_FILE_DATA: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "defrag_settings_file", default=MappingProxyType({})
)


class SettingsError(ValueError):
    """A setting that cannot be used; the message names the field and its source."""


class Contradiction(ValueError):
    """Settings valid one by one that cannot hold together; ``fields`` names them (the first two
    are the pair, the message gives every value)."""

    def __init__(self, fields: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = fields


def _deadline_text(named: str, deadline: float, interval: float) -> str:
    if named == "ready_max_age_s":
        return f"ready_max_age_s ({deadline:g})"
    return f"3 × cycle_interval_s ({interval:g}) = {deadline:g} (ready_max_age_s unset)"


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
    """``windows`` from the environment: JSON, or ``CRON DURATION`` entries separated by ``;``
    (``0 2 * * * 1h; 0 14 * * 6 2h``)."""
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


class _FileSource(PydanticBaseSettingsSource):
    """The settings file's values (set by :func:`load_settings` for the duration of one load)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        data = _FILE_DATA.get()
        return data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get())


class Settings(BaseSettings):
    """Everything the daemon can be told. See docs/daemon.md for the reference."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,
    )

    # --- where the cluster and its metrics are ------------------------------------------
    cluster: Literal["kube", "sim"] = "kube"
    cluster_name: str = Field("default", min_length=1)
    kubeconfig: str | None = None
    kube_context: str | None = None
    prometheus_url: str | None = None
    prometheus_token_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_timeout_s: float = Field(10.0, gt=0)
    alertmanager_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    alertmanager_token_file: str | None = None
    alertmanager_ca_file: str | None = None
    alert_resend_interval_s: float = Field(60.0, ge=0)
    alert_ttl_s: float = Field(900.0, gt=0)
    alert_runbook_url: str = RUNBOOK_URL
    """Absolute URL of docs/alerts.md; every alert links ``<this>#<alert name, lower case>``."""
    alert_generator_url: str = GENERATOR_URL
    """Base of every alert's ``generatorURL`` (``/<finding fingerprint>`` appended)."""
    rules_dir: str | None = None
    """Detection rules; default: ./rules, else the rules beside the package."""

    # --- the cycle ---------------------------------------------------------------------
    cycle_interval_s: float = Field(300.0, gt=0)
    dry_run: bool = True
    policy: str = "reserve-binpack"
    """The scoring policy of the one scoring profile (docs/architecture.md): the daemon's
    detection and planning, ``defrag extender`` and the scoring commands all read it."""
    policy_seed: int = Field(0, ge=0)
    """The ``random`` policy's seed (the other policies ignore it)."""
    plan_goal: Literal["auto"] | Goal = "auto"
    """``auto`` (the findings' actions decide) or a :class:`~defrag.plan.config.Goal`."""
    # The planner's knobs: their defaults are the planner's own (defrag/plan/config.py), and
    # planner_config() turns them into the one PlannerConfig every planner is handed.
    min_pod_age_s: float = Field(DEFAULT_MIN_AGE.total_seconds(), ge=0)
    make_room_moves_any_priority: bool = DEFAULT_OPTIONS.mode.migrates_any_priority
    """Make-room may move pods of any priority, each only where it re-fits at once."""
    make_room_swaps: bool = DEFAULT_OPTIONS.swaps
    """Allow a room that preempts as much GPU as it frees (left to kube-scheduler by default)."""
    make_room_worth: float = Field(DEFAULT_OPTIONS.room_worth, ge=0, le=1e6)
    """A room is made when the pod's GPUs × hours pending reach this × its known cost; 0: always."""
    make_room_spares_jobs: bool = DEFAULT_OPTIONS.spare_jobs
    """Never move a multi-GPU job that does not answer the checkpoint handshake to make room for
    a multi-GPU pod of equal or lower priority (docs/planning.md, ``spared``)."""
    make_room_packing_patience_s: float | None = Field(
        None if DEFAULT_PATIENCE is None else DEFAULT_PATIENCE.total_seconds(), ge=0
    )
    """While the scheduler packs (the spreading rule's ``packing`` finding), make room only for
    pods pending at least this long; ``null`` (the default): never while it packs; 0: as under
    a spreading scheduler (docs/planning.md, "Patience under a packing scheduler")."""
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

    # --- execution: windows, budgets, safety --------------------------------------------
    windows: Annotated[list[WindowSetting], NoDecode] = Field(default_factory=list)
    idle_gate: bool = False
    max_evictions_per_window: int = Field(DEFAULT_MAX_EVICTIONS, ge=0, le=1_000_000)
    max_evictions_per_node: int = Field(DEFAULT_MAX_PER_NODE, ge=0, le=1_000_000)
    max_evictions_per_namespace: int = Field(DEFAULT_MAX_PER_NAMESPACE, ge=0, le=1_000_000)
    eviction_budget_follows_demand: bool = True
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
    eviction_batch_size: int = Field(4, ge=1, le=64)
    replacement_timeout_s: float = Field(600.0, gt=0)
    poll_interval_s: float = Field(5.0, gt=0)
    checkpoint_wait_s: float = Field(120.0, ge=0)
    """How long a pod with ``defrag.io/checkpoint: supported`` is waited for before its eviction
    when it names no ``defrag.io/checkpoint-max-wait`` (docs/daemon.md, the handshake)."""
    checkpoint_max_wait_s: float = Field(600.0, ge=0)
    """The longest checkpoint wait a pod may ask for."""
    dry_run_events: bool = False

    # --- leader election ----------------------------------------------------------------
    leader_election: bool = True
    lease_name: str = "defrag"
    lease_namespace: str = "defrag-system"
    lease_duration_s: float = Field(15.0, gt=0)
    identity: str = Field(default_factory=socket.gethostname)

    # --- HTTP, logs ---------------------------------------------------------------------
    http_host: str = "0.0.0.0"
    http_port: int = Field(8080, ge=0, le=65535)
    ready_max_age_s: float | None = Field(None, gt=0)
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    # --- the simulated cluster ------------------------------------------------------------
    sim_speedup: float = Field(60.0, gt=0)

    @field_validator(
        "alertmanager_urls",
        "evict_namespaces_include",
        "evict_namespaces_exclude",
        "evict_owner_kinds",
        mode="before",
    )
    @classmethod
    def _urls(cls, value: Any) -> Any:
        return _string_list(value)

    @field_validator("evict_label_selector")
    @classmethod
    def _selector_parses(cls, value: str) -> str:
        try:
            parse_label_selector(value)
        except SelectorSyntaxError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("alert_runbook_url", "alert_generator_url")
    @classmethod
    def _absolute_url(cls, value: str) -> str:
        if not value.startswith(("https://", "http://")) or value[-3:] == "://":
            raise ValueError(f"expected an absolute http(s) URL, got {value!r}")
        return value.rstrip("/")

    @field_validator("windows", mode="before")
    @classmethod
    def _windows(cls, value: Any) -> Any:
        return _window_list(value)

    @field_validator("*", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: Any) -> Any:
        return _seconds(value) if str(info.field_name).endswith("_s") else value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        """Settings each valid alone that contradict each other (docs/daemon.md, "Settings that
        must agree"): refused at start, naming both."""
        if self.evict_namespaces_include and self.evict_namespaces_exclude:
            raise Contradiction(
                ("evict_namespaces_include", "evict_namespaces_exclude"),
                "evict_namespaces_include "
                f"({', '.join(self.evict_namespaces_include)}) and evict_namespaces_exclude "
                f"({', '.join(self.evict_namespaces_exclude)}) are mutually exclusive: give "
                "the namespaces that may be evicted, or those that may not, not both",
            )
        if self.alertmanager_urls and self.alert_ttl_s <= max(
            self.alert_resend_interval_s, self.cycle_interval_s
        ):
            raise Contradiction(
                ("alert_ttl_s", "alert_resend_interval_s", "cycle_interval_s"),
                f"alert_ttl_s ({self.alert_ttl_s:g}) must exceed alert_resend_interval_s "
                f"({self.alert_resend_interval_s:g}) and cycle_interval_s "
                f"({self.cycle_interval_s:g}), or alerts lapse between cycles",
            )
        if self.ready_max_age_s is not None and self.ready_max_age_s <= self.cycle_interval_s:
            raise Contradiction(
                ("ready_max_age_s", "cycle_interval_s"),
                f"ready_max_age_s ({self.ready_max_age_s:g}) must exceed cycle_interval_s "
                f"({self.cycle_interval_s:g}): the last good cycle is that old before the next "
                "one ends, so /readyz would fail between every two cycles",
            )
        if (
            self.eviction_budget_follows_demand
            and "max_evictions_per_window_ceiling" in self.model_fields_set
            and self.max_evictions_per_window_ceiling < self.max_evictions_per_window
        ):
            raise Contradiction(
                ("max_evictions_per_window_ceiling", "max_evictions_per_window"),
                "max_evictions_per_window_ceiling "
                f"({self.max_evictions_per_window_ceiling}) is below max_evictions_per_window "
                f"({self.max_evictions_per_window}): the budget that follows demand starts at "
                "the fixed one and may only grow to the ceiling (or set "
                "eviction_budget_follows_demand: false)",
            )
        deadline, named = self.cycle_deadline()
        wait = self.replacement_timeout_s + self.poll_interval_s
        if self.run_mode.evicts and wait >= deadline:  # dry run waits for no replacement
            raise Contradiction(
                ("replacement_timeout_s", "poll_interval_s", named),
                f"replacement_timeout_s ({self.replacement_timeout_s:g}) plus one "
                f"poll_interval_s ({self.poll_interval_s:g}) must be less than the cycle "
                f"deadline, {_deadline_text(named, deadline, self.cycle_interval_s)}: one wait "
                "for replacements would outlast the cycle, /healthz would fail and the leader "
                "would stop renewing its Lease mid-drain",
            )
        return self

    def cycle_deadline(self) -> tuple[float, str]:
        """Seconds one cycle may run (past it /healthz fails and the Lease is not renewed) and
        the setting that decides it: ``ready_max_age_s``, else 3 × ``cycle_interval_s``."""
        if self.ready_max_age_s is not None:
            return self.ready_max_age_s, "ready_max_age_s"
        return 3 * self.cycle_interval_s, "cycle_interval_s"

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy

        if value not in POLICY_NAMES:
            raise ValueError(str(UnknownPolicy(value)))
        return value

    def packing_patience(self) -> PackingPatience:
        """Make-room's patience under a packing scheduler (:mod:`defrag.plan.patience`)."""
        from datetime import timedelta

        from defrag.plan.patience import PackingPatience

        seconds = self.make_room_packing_patience_s
        return PackingPatience(
            None if seconds is None else timedelta(seconds=seconds),
            timedelta(seconds=self.make_room_packing_memory_s),
        )

    def profile_config(self, policy: str | None = None) -> ProfileConfig:
        """The one scoring configuration these settings give (``policy``: a command's explicit
        ``--policy``, which overrides the setting). Raises :class:`SettingsError` naming the
        flag for an unknown policy."""
        from defrag.scoring.policies import POLICY_NAMES, UnknownPolicy
        from defrag.scoring.profile import ProfileConfig

        if policy is not None and policy not in POLICY_NAMES:
            raise SettingsError(f"--policy: {UnknownPolicy(policy)}")
        return ProfileConfig(policy or self.policy, self.policy_seed)

    def planner_config(self) -> PlannerConfig:
        """The one planner configuration these settings give (defrag/plan/config.py): the
        daemon plans with it, and so does ``defrag plan --settings`` (whose flags are
        settings given as flags). Every planner knob of the settings lands here."""
        from datetime import timedelta

        from defrag.plan.budget import DemandBudget
        from defrag.plan.config import (
            Constraints,
            EvictionBudget,
            MakeRoomMode,
            PlannerConfig,
            PlanOptions,
        )

        selector = parse_label_selector(self.evict_label_selector)
        constraints = Constraints(
            min_age=timedelta(seconds=self.min_pod_age_s),
            priority_threshold=self.evict_priority_threshold,
            budget=EvictionBudget(
                self.max_evictions_per_window,
                self.max_evictions_per_node,
                self.max_evictions_per_namespace,
            ),
            namespaces_include=frozenset(self.evict_namespaces_include),
            namespaces_exclude=frozenset(self.evict_namespaces_exclude),
            label_selector=selector if selector.requirements else None,
            owner_kinds=frozenset(self.evict_owner_kinds),
        )
        options = PlanOptions(
            mode=MakeRoomMode.of(
                preempt=DEFAULT_OPTIONS.mode.preempts,
                migrate_any_priority=self.make_room_moves_any_priority,
            ),
            swaps=self.make_room_swaps,
            room_worth=self.make_room_worth,
            spare_jobs=self.make_room_spares_jobs,
        )
        demand = (
            DemandBudget(
                self.max_evictions_per_window,
                self.window_ceiling,
                self.evictions_per_starved_gpu,
            )
            if self.eviction_budget_follows_demand
            else None
        )
        return PlannerConfig(constraints, options, demand)

    @property
    def window_ceiling(self) -> int:
        """The ceiling in force: the one set, or the default raised to the fixed budget."""
        if "max_evictions_per_window_ceiling" in self.model_fields_set:
            return self.max_evictions_per_window_ceiling
        return max(self.max_evictions_per_window_ceiling, self.max_evictions_per_window)

    @property
    def run_mode(self) -> RunMode:
        """Dry run or live and what follows (defrag/execute/mode.py): the one decision."""
        return RunMode(self.dry_run, self.dry_run_events, self.leader_election)

    @property
    def ready_age_limit_s(self) -> float:
        """/readyz fails when the last good cycle is older than this (default 3 intervals)."""
        return self.ready_max_age_s or 3 * self.cycle_interval_s

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


def read_settings_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML or JSON settings file; errors name the file."""
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
    # Accept both ``cycle_interval_s`` and the env-style ``DEFRAG_CYCLE_INTERVAL_S``.
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key)
        if name.upper().startswith(ENV_PREFIX):
            name = name[len(ENV_PREFIX) :]
        out[name.lower().replace("-", "_")] = value
    return out


def load_settings(path: Path | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from ``path`` (optional), the ``DEFRAG_*`` environment and ``overrides``."""
    file_data = read_settings_file(path) if path is not None else {}
    check_environment(os.environ)
    init = {k: v for k, v in (overrides or {}).items() if v is not None}
    token = _FILE_DATA.set(file_data)
    try:
        return Settings(**init)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path, file_data, init)) from None
    finally:
        _FILE_DATA.reset(token)


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse a ``DEFRAG_*`` variable that names no setting, naming the closest one (a misspelt
    ``DEFRAG_DRYRUN`` would otherwise be ignored and the daemon run with the default)."""
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    for key in sorted(environ):
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in OTHER_ENV:
            continue
        close = difflib.get_close_matches(upper, sorted(known | OTHER_ENV), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise SettingsError(f"env {key}: unknown setting{hint}")


def _describe(
    exc: ValidationError, path: Path | None, file_data: Mapping[str, Any], init: Mapping[str, Any]
) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        top = str(err["loc"][0]) if err["loc"] else ""
        where = _source(top, path, file_data, init)
        message = str(err["msg"]).removeprefix("Value error, ")
        cause = (err.get("ctx") or {}).get("error")
        if not top and isinstance(cause, Contradiction):
            sources = " and ".join(
                f"{name} ({_source(name, path, file_data, init)})" for name in cause.fields
            )
            lines.append(f"settings {sources} contradict each other: {cause}")
            continue
        if err["type"] == "extra_forbidden":
            message = "unknown setting"
        elif err["type"] == "bool_parsing":
            message = f"cannot read {err.get('input')!r}: expected true or false"
        lines.append(f"setting {loc} ({where}): {message}" if top else f"settings: {message}")
    return "; ".join(lines)


def _source(
    name: str, path: Path | None, file_data: Mapping[str, Any], init: Mapping[str, Any]
) -> str:
    """Where setting ``name`` came from: ``flag``, ``env DEFRAG_X``, the file, or ``default``."""
    if name in init:
        return "flag"
    if f"{ENV_PREFIX}{name.upper()}" in {k.upper() for k in os.environ}:
        return f"env {ENV_PREFIX}{name.upper()}"
    if path is not None and name in file_data:
        return str(path)
    return "default"


def _kind(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"
