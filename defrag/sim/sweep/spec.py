"""The sweep file: which traces, seeds, policies and rows, and which settings points over a base
settings file (docs/simulator.md, "Sweeps"). A mistake is one :class:`SweepError` naming the file
and the field."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from defrag.model.units import DURATION_FORM, duration_seconds

FIRST_SEED = 42
"""A count of seeds starts here (the FGD paper's first seed, as ``defrag simulate --seeds``)."""


class SweepError(ValueError):
    """A sweep file that cannot be used: the message names the file and the field."""


def _hours(value: Any) -> float:
    """Hours from a duration with its unit (``90m``, ``2h``, ``1h30m``)."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(f"expected {DURATION_FORM} (with its unit), got {value!r}")
    return duration_seconds(value) / 3600.0


Hours = Annotated[float, BeforeValidator(_hours)]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TimelineSpec(Model):
    """The timeline protocol's knobs, as ``defrag simulate --protocol timeline`` takes them."""

    load: float = Field(default=0.9, gt=0, le=2)
    duration: Hours = Field(default=36.0, description="measured time")
    warmup: Hours = 12.0
    window_every: Hours = 6.0
    run_time_scale: float = Field(default=1.0, gt=0)
    checkpoint_scale: float = Field(default=1.0, gt=0)
    overhead_scale: float = Field(default=1.0, gt=0)
    handshake_share: float = Field(default=0.0, ge=0, le=1)
    """Share of training/batch pods that answer the daemon's checkpoint request (the rows
    without the daemon never ask, whatever this says)."""

    @model_validator(mode="after")
    def _positive(self) -> TimelineSpec:
        for name in ("duration", "window_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be longer than zero")
        return self


class TraceFiles(Model):
    """A trace of your own: an openb-shaped pod list and node list (paths relative to the sweep
    file)."""

    pods: Path
    nodes: Path
    name: str | None = None


class SyntheticTrace(Model):
    """The built-in workload (``defrag simulate`` without ``--trace``), sized."""

    synthetic: Annotated[int, Field(gt=0)] = 2000
    """Pods in the shape pool."""
    scale: float = Field(default=1.0, gt=0)
    """The cluster: × 150 nodes."""


def _trace(value: Any) -> Any:
    """``synthetic`` and ``openb:<trace>`` (the openb pod list of that name on the openb GPU
    nodes, from the data directory) as strings; a mapping is a :class:`TraceFiles` or a
    :class:`SyntheticTrace`."""
    if value == "synthetic":
        return SyntheticTrace()
    if isinstance(value, str):
        if value.startswith("openb:") and value.removeprefix("openb:").strip():
            return value
        raise ValueError(
            f"expected synthetic, openb:<trace> (default, gpushare40, …) or a mapping with "
            f"pods and nodes, got {value!r}"
        )
    if isinstance(value, dict) and "synthetic" in value:
        return SyntheticTrace(**value)
    return value


Trace = Annotated[SyntheticTrace | TraceFiles | str, BeforeValidator(_trace)]
Scalar = bool | int | float | str | None


def _seeds(value: Any) -> Any:
    """A count (from 42) or a list of seeds."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"a count of seeds must be >= 1, got {value}")
        return list(range(FIRST_SEED, FIRST_SEED + value))
    return value


class SweepSpec(Model):
    """A sweep file's content."""

    traces: Annotated[list[Trace], Field(min_length=1)] = Field(
        default_factory=lambda: [SyntheticTrace()]  # type: ignore[arg-type]
    )
    seeds: Annotated[list[int], BeforeValidator(_seeds), Field(min_length=1)] = Field(
        default_factory=lambda: [FIRST_SEED]
    )
    policies: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["least-allocated"]
    )
    """The scheduler score each cluster runs (a row that installs its own says so)."""
    rows: Annotated[list[str], Field(min_length=1)] = Field(
        default_factory=lambda: ["none", "defrag"]
    )
    """Defragmenters and peers (``defrag simulate --defragmenter`` names); the settings points
    apply to the daemon's rows (``defrag*``), the others run once and stand beside them."""
    timeline: TimelineSpec = Field(default_factory=lambda: TimelineSpec())
    settings: Path | None = None
    """The base settings file (the one the Deployment mounts), relative to the sweep file; none:
    the simulator's settings."""
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(default_factory=dict)
    """Setting (dotted key) → the values to try: every combination is a point."""
    points: list[dict[str, Any]] = Field(default_factory=list)
    """Settings points listed one by one (after the grid's)."""
    dask: str | None = None
    """A running ``distributed`` scheduler's address (``--dask`` wins); none: a local cluster."""
    results: Path | None = None
    """Where the table, summary, plots and cache go (relative to the sweep file); default:
    ``<sweep file's name>.results`` beside it."""

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed is listed twice")
        for name in ("policies", "rows"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: a name is listed twice")
        for key, values in self.grid.items():
            _check_key(key, "grid")
            for v in values:
                _check_value(v, f"grid.{key}")
        for i, point in enumerate(self.points):
            for key, v in point.items():
                _check_key(key, f"points.{i}")
                _check_value(v, f"points.{i}.{key}")
        return self

    def settings_points(self) -> list[dict[str, Any]]:
        """Every settings point: the grid's combinations, then the listed points; one empty
        point (the base settings) when there are none. Duplicates are kept once."""
        keys = list(self.grid)
        combos = [dict(zip(keys, vs, strict=True)) for vs in itertools.product(*self.grid.values())]
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for p in [*(combos if keys else []), *self.points] or [{}]:
            text = json.dumps(p, sort_keys=True)
            if text not in seen:
                seen.add(text)
                out.append(p)
        return out

    def swept_keys(self) -> list[str]:
        """The settings a point changes, in the file's order."""
        return list(dict.fromkeys([*self.grid, *(k for p in self.points for k in p)]))


def _check_key(key: str, where: str) -> None:
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{where}: {key!r} is not a dotted setting (section.field)")


def _check_value(value: Any, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a plain value") from None


def load_sweep(path: Path) -> SweepSpec:
    """The sweep file at ``path`` (YAML); :class:`SweepError` naming the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SweepError(f"{path}: cannot read the sweep file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        raise SweepError(f"{path}:{at} not YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping of sweep fields, got {type(data).__name__}")
    try:
        return SweepSpec(**data)
    except ValidationError as exc:
        raise SweepError(f"{path}: {describe(exc)}") from None


def describe(exc: ValidationError) -> str:
    """The first error as ``field.path: message`` (one line)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"] if not _is_union_tag(p))
    msg = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _is_union_tag(part: Any) -> bool:
    """pydantic names the union member it tried (``TraceFiles``, ``function-before[…]``)."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part == "str")


__all__ = ["FIRST_SEED", "SweepError", "SweepSpec", "TimelineSpec", "load_sweep"]
