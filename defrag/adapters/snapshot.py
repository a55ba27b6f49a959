"""Cluster snapshots from files: the JSON (or YAML) of ``kubectl get nodes,pods,pdb -A -o json``.

Several files may make one snapshot (e.g. nodes and pods saved apart, PriorityClasses from
``kubectl get priorityclasses -o json``). Every error names the file and the object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from defrag import safe_yaml
from defrag.adapters.kube_convert import (
    ClusterParts,
    ConversionError,
    describe,
    items_of,
    paused_gc,
)
from defrag.model.cluster import Cluster, ModelError


class SnapshotError(ValueError):
    """A snapshot file that cannot be read or converted; the message names the file."""


def load_snapshot(paths: str | Path | Iterable[str | Path], strict: bool = False) -> Cluster:
    """One Cluster from one or more files, each a v1 ``List`` or a single object, JSON or YAML.

    A snapshot is a dump of a live cluster, read as leniently: an object that cannot be read, or
    a pod bound to a node the files lack or that does not fit its node, is left out with a
    warning (``Cluster.warnings``) naming it and the field. ``strict`` makes those errors."""
    if isinstance(paths, str | Path):
        paths = [paths]
    files = [Path(p) for p in paths]
    if not files:
        raise SnapshotError("no snapshot file given")
    with paused_gc():
        return _load(files, strict)


def _load(files: list[Path], strict: bool) -> Cluster:
    parts = ClusterParts(strict=strict)
    for path in files:
        for doc_index, document in enumerate(_documents(path)):
            where = str(path) if doc_index == 0 else f"{path} (document {doc_index + 1})"
            try:
                for i, obj in enumerate(items_of(document, where)):
                    parts.add(obj, describe(obj, f"items[{i}]"))
            except ConversionError as exc:
                raise SnapshotError(f"{where}: {exc}") from exc
    try:
        return parts.build(lenient=not strict)
    except ModelError as exc:
        names = ", ".join(str(p) for p in files)
        raise SnapshotError(f"{names}: {exc}") from exc


def _documents(path: Path) -> Sequence[object]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SnapshotError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise SnapshotError(
                f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}"
            ) from None
        except RecursionError:
            raise SnapshotError(f"{path}: invalid JSON: nested too deeply") from None
    try:
        docs = [d for d in safe_yaml.load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{path}: {safe_yaml.one_line(exc, 'invalid YAML: ')}") from None
    if not docs:
        raise SnapshotError(f"{path}: empty file")
    return docs


class SnapshotFileSource:
    """A :class:`~defrag.ports.ClusterSource` over snapshot files (``--snapshot``), reread when
    a file changes (e.g. a ConfigMap update), so a long-running trial follows the file."""

    def __init__(self, paths: Sequence[str | Path], *, strict: bool = False) -> None:
        self.paths = tuple(Path(p) for p in paths)
        self.strict = strict
        self._stamp: tuple[float, ...] | None = None
        self._cluster: Cluster | None = None

    def snapshot(self) -> Cluster:
        try:
            stamp = tuple(p.stat().st_mtime for p in self.paths)
        except FileNotFoundError as exc:
            raise SnapshotError(f"{exc.filename}: no such file") from None
        if self._cluster is None or stamp != self._stamp:
            self._cluster = load_snapshot(self.paths, strict=self.strict)
            self._stamp = stamp
        return self._cluster
