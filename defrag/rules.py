"""Detection rules: YAML files → typed rules (pydantic), errors with file, line and field.

A rule file holds ``rules:``, a list of rules; each names its ``detector`` (leak, starvation,
fragmentation, idle) and carries that detector's parameters, PromQL, severity and action. Every
problem in every file is collected and reported as ``file:line: field: message``
(:class:`RulesError`); line numbers come from the YAML node marks. See docs/rules.md.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from defrag import safe_yaml
from defrag.detect.fragmentation import FragmentationParams
from defrag.detect.idle import IdleParams
from defrag.detect.leak import DcgmLabels, LeakParams
from defrag.detect.starvation import StarvationParams
from defrag.scoring.policies import POLICY_NAMES

DETECTORS = ("leak", "starvation", "fragmentation", "idle")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(value: Any) -> float:
    """Seconds from a Prometheus-style duration (``30s``, ``15m``, ``1h30m``) or a number."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value}")
        return _bounded(float(value), value)
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION.findall(text)
        if text and "".join(n + u for n, u in parts) == text:
            return _bounded(sum(float(n) * _UNIT_S[u] for n, u in parts), value)
    raise ValueError(f"bad duration {value!r}: use a number of seconds or a form like 30s, 15m, 6h")


MAX_DURATION_S = 10 * 31536000.0
"""Ten years: no lookback, step or hold time is longer; beyond it a number is a typo (or inf)."""


def _bounded(seconds: float, given: Any) -> float:
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {given!r}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration {given!r} is longer than ten years")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
Action = Literal["alert", "repack", "make-room"]
StarvationAction = Literal["alert", "repack", "make-room", "make-room-now"]
"""``make-room-now``: make room for the starved pods even when no execution window is open."""
SeverityName = Literal["info", "warning", "critical"]
PromQL = Annotated[str, Field(min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Rule(_Model):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    description: str = ""
    severity: SeverityName = "warning"
    action: Action = "alert"
    enabled: bool = True

    def promql(self) -> dict[str, str]:
        """PromQL of this rule by field path (``queries.used``), for validation."""
        return {}


def _names(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


Names = Annotated[tuple[str, ...], BeforeValidator(_names)]


class DcgmLabelNames(_Model):
    """Label names of the DCGM exporter series; lists are tried in order (a single name is a
    list of one). Defaults cover every variant dcgm-exporter and its ServiceMonitor produce
    (see :class:`defrag.detect.leak.DcgmLabels`)."""

    node: Names = ("Hostname", "hostname", "node", "kubernetes_node", "instance")
    gpu: str = "gpu"
    uuid: Names = ("UUID", "uuid")
    pod: Names = ("exported_pod", "pod_name", "pod")
    namespace: Names = ("exported_namespace", "pod_namespace", "namespace")
    gpu_instance: str = "GPU_I_ID"
    gpu_profile: str = "GPU_I_PROFILE"
    exporter_pod: str = r"^(nvidia-)?dcgm-exporter(-.*)?$"

    @field_validator("exporter_pod")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    def dcgm(self) -> DcgmLabels:
        return DcgmLabels(
            node=self.node,
            gpu=self.gpu,
            uuid=self.uuid,
            pod=self.pod,
            namespace=self.namespace,
            gpu_instance=self.gpu_instance,
            gpu_profile=self.gpu_profile,
            exporter_pod=self.exporter_pod,
        )


class LeakQueries(_Model):
    used: PromQL
    free: PromQL
    reserved: PromQL | None = None
    """``DCGM_FI_DEV_FB_RESERVED`` where the exporter is configured to export it."""


class LeakRule(_Rule):
    detector: Literal["leak"]
    queries: LeakQueries
    labels: DcgmLabelNames = DcgmLabelNames()
    lookback: Duration = 6 * 3600.0
    step: Annotated[Duration, Field(gt=0)] = 300.0
    floor_window: Duration = 3600.0
    prefilter: bool = True
    min_slope_mib_per_h: Annotated[float, Field(gt=0)] = 256.0
    max_trend_p: Annotated[float, Field(gt=0, le=1)] = 0.01
    horizon: Duration = 48 * 3600.0
    critical_within: Duration | None = None
    segments: Annotated[int, Field(ge=2, le=12)] = 3
    min_rising_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    min_persistence: Annotated[float, Field(ge=0, le=1)] = 0.5
    max_drawdown_fraction: Annotated[float, Field(ge=0)] = 0.1
    drawdown_noise: Annotated[float, Field(ge=0)] = 4.0
    cycle_noise: Annotated[float, Field(ge=0)] = 6.0

    def promql(self) -> dict[str, str]:
        out = {"queries.used": self.queries.used, "queries.free": self.queries.free}
        if self.queries.reserved:
            out["queries.reserved"] = self.queries.reserved
        return out

    def params(self) -> LeakParams:
        return LeakParams(
            name=self.name,
            severity=self.severity,
            action=self.action,
            query=self.queries.used,
            lookback_s=self.lookback,
            bin_s=self.step,
            floor_window_s=self.floor_window,
            min_slope_mib_per_h=self.min_slope_mib_per_h,
            max_trend_p=self.max_trend_p,
            horizon_s=self.horizon,
            critical_within_s=self.critical_within,
            segments=self.segments,
            min_rising_fraction=self.min_rising_fraction,
            min_persistence=self.min_persistence,
            max_drawdown_fraction=self.max_drawdown_fraction,
            drawdown_noise=self.drawdown_noise,
            cycle_noise=self.cycle_noise,
        )


class KubeStateQueries(_Model):
    """kube-state-metrics queries that build a GPU-only cluster when no snapshot is given.

    Labels read: ``node`` (allocatable, requests, info), ``namespace``/``pod``, ``phase``,
    ``priority_class`` (info) — kube-state-metrics' own names.
    """

    allocatable: PromQL
    gpu_requests: PromQL
    phase: PromQL
    pending: PromQL
    info: PromQL
    lookback: Duration = 6 * 3600.0
    step: Duration = 60.0

    def promql(self, prefix: str) -> dict[str, str]:
        names = ("allocatable", "gpu_requests", "phase", "pending", "info")
        return {f"{prefix}.{n}": getattr(self, n) for n in names}


class _ClusterRule(_Rule):
    queries: KubeStateQueries | None = None

    def promql(self) -> dict[str, str]:
        return self.queries.promql("queries") if self.queries else {}


class StarvationRule(_ClusterRule):
    detector: Literal["starvation"]
    action: StarvationAction = "alert"  # type: ignore[assignment]  # widened for this detector
    for_: Annotated[Duration, Field(alias="for")] = 900.0
    min_priority: int = 1000
    priority_classes: tuple[str, ...] = ()
    policy: str = "reserve-binpack"
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICY_NAMES:
            raise ValueError(f"unknown policy {value!r}; one of {', '.join(POLICY_NAMES)}")
        return value

    def params(self) -> StarvationParams:
        return StarvationParams(
            name=self.name,
            severity=self.severity,
            action=self.action,
            for_s=self.for_,
            min_priority=self.min_priority,
            priority_classes=frozenset(self.priority_classes),
        )


class FragmentationRule(_ClusterRule):
    detector: Literal["fragmentation"]
    sizes: tuple[Annotated[int, Field(ge=1)], ...] = (8,)
    include_waiting: bool = True
    node_stranded_min_gpus: Annotated[float, Field(gt=0)] = 2.0
    cluster_stranded_min_gpus: Annotated[float, Field(gt=0)] = 8.0
    min_whole_free_nodes: Annotated[int, Field(ge=0)] = 1

    def params(self) -> FragmentationParams:
        return FragmentationParams(
            name=self.name,
            severity=self.severity,
            action=self.action,
            sizes=self.sizes,
            include_waiting=self.include_waiting,
            node_stranded_min_gpus=self.node_stranded_min_gpus,
            cluster_stranded_min_gpus=self.cluster_stranded_min_gpus,
            min_whole_free_nodes=self.min_whole_free_nodes,
        )


class IdleRule(_Rule):
    detector: Literal["idle"]
    severity: SeverityName = "info"
    action: Action = "repack"
    query: PromQL
    per_gpu_query: PromQL | None = None
    threshold_pct: Annotated[float, Field(gt=0, le=100)] = 20.0
    for_: Annotated[Duration, Field(alias="for")] = 1800.0
    step: Duration = 60.0
    max_gap: Duration = 300.0
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    def promql(self) -> dict[str, str]:
        out = {"query": self.query}
        if self.per_gpu_query:
            out["per_gpu_query"] = self.per_gpu_query
        return out

    def params(self) -> IdleParams:
        return IdleParams(
            name=self.name,
            severity=self.severity,
            action=self.action,
            query=self.query,
            threshold_pct=self.threshold_pct,
            for_s=self.for_,
            step_s=self.step,
            max_gap_s=self.max_gap,
        )


Rule = Annotated[
    LeakRule | StarvationRule | FragmentationRule | IdleRule, Field(discriminator="detector")
]


class RuleFile(_Model):
    rules: list[Rule]


# --- loading -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuleIssue:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class RulesError(ValueError):
    """Every problem found in the rule files, one per line."""

    def __init__(self, issues: Sequence[RuleIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass(frozen=True, slots=True)
class LoadedRule:
    """A rule with where it came from: its file and the line of each of its fields."""

    rule: LeakRule | StarvationRule | FragmentationRule | IdleRule
    file: str
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, hash=False)
    index: int = 0
    """Position in its file's ``rules:`` list (field paths in errors are ``rules[index].…``)."""

    def line_of(self, path: str) -> int:
        return self.lines.get(path, self.line)


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[LoadedRule, ...] = ()

    def __iter__(self) -> Iterator[LoadedRule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def enabled(self, detector: str | None = None) -> list[LoadedRule]:
        return [
            r
            for r in self.rules
            if r.rule.enabled and (detector is None or r.rule.detector == detector)
        ]


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """The YAML files named, or directly inside the directories named (sorted)."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
        else:
            out.append(path)
    return out


def default_rules_dir() -> Path:
    """The rules shipped inside the package (``defrag/data/rules``; in a source checkout a link
    to the top-level ``rules/``)."""
    return Path(str(resources.files("defrag") / "data" / "rules"))


def rules_paths(
    explicit: Iterable[str | Path] = (), setting: str | Path | None = None
) -> list[Path]:
    """The one rules lookup: the paths given (``--rules``), else the setting (``rules_dir``,
    i.e. ``$DEFRAG_RULES_DIR``), else the packaged defaults."""
    given = [Path(p) for p in explicit]
    if given:
        return given
    chosen = setting or os.environ.get("DEFRAG_RULES_DIR")
    return [Path(chosen)] if chosen else [default_rules_dir()]


def load_rules(paths: Iterable[str | Path] | None = None) -> RuleSet:
    """Load every rule file (default: :func:`rules_paths`); raise :class:`RulesError`
    listing all problems of all files."""
    issues: list[RuleIssue] = []
    loaded: list[LoadedRule] = []
    paths = rules_paths(paths or ())
    files = rule_files(paths)
    if not files:
        raise RulesError([RuleIssue(", ".join(map(str, paths)), 0, "", "no rule files found")])
    for path in files:
        file_rules, file_issues = _load_file(path)
        loaded.extend(file_rules)
        issues.extend(file_issues)
    seen: dict[str, LoadedRule] = {}
    for item in loaded:
        first = seen.setdefault(item.rule.name, item)
        if first is not item:
            issues.append(
                RuleIssue(
                    item.file,
                    item.line_of("name"),
                    "name",
                    f"duplicate rule name {item.rule.name!r} (first at {first.file}:"
                    f"{first.line_of('name')})",
                )
            )
    if issues:
        raise RulesError(issues)
    return RuleSet(tuple(loaded))


def _load_file(path: Path) -> tuple[list[LoadedRule], list[RuleIssue]]:
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return [], [RuleIssue(name, 0, "", f"cannot read: {exc.strerror}")]
    except UnicodeDecodeError as exc:
        return [], [
            RuleIssue(
                name,
                0,
                "",
                f"not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                f"at offset {exc.start}; a binary file?)",
            )
        ]
    try:
        root = safe_yaml.compose(text)
        data = safe_yaml.load(text)
    except yaml.MarkedYAMLError as exc:
        line = safe_yaml.mark_line(exc)
        return [], [RuleIssue(name, line, "", f"YAML syntax: {exc.problem or exc.context}")]
    except yaml.YAMLError as exc:
        return [], [RuleIssue(name, 0, "", safe_yaml.one_line(exc, "YAML: "))]
    if not isinstance(data, dict):
        return [], [RuleIssue(name, 1, "", "a rule file is a mapping with a 'rules:' list")]
    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as exc:
        found = [_issue(name, root, err) for err in exc.errors()]
        return [], sorted(found, key=lambda i: (i.line, i.field))
    rules_node = _child(root, "rules")
    out = []
    for i, rule in enumerate(parsed.rules):
        node = _child(rules_node, i)
        line = node.start_mark.line + 1 if node is not None else 0
        out.append(LoadedRule(rule, name, line, _field_lines(node), i))
    return out, []


def _issue(file: str, root: yaml.Node | None, err: Any) -> RuleIssue:
    loc = list(err["loc"])
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("detector")
    node, path = root, []
    for part in loc:
        child = _child(node, part)
        if child is None:
            if isinstance(part, str) and part in DETECTORS:
                continue  # the discriminated union's tag is not a YAML key
            if isinstance(part, str):
                path.append(part)
            break
        node = child
        path.append(f"[{part}]" if isinstance(part, int) else str(part))
    line = node.start_mark.line + 1 if node is not None else 0
    dotted = ".".join(path).replace(".[", "[")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "missing":
        message = "required field missing"
    return RuleIssue(file, line, dotted, message)


def _child(node: yaml.Node | None, key: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode) and isinstance(key, str):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
        return None
    if isinstance(node, yaml.SequenceNode) and isinstance(key, int):
        return node.value[key] if 0 <= key < len(node.value) else None
    return None


def _field_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Dotted field path → line, for every key under a rule's mapping."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                path = f"{prefix}{k.value}"
                out[path] = k.start_mark.line + 1
                out.update(_field_lines(v, path + "."))
    return out
