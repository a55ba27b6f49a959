"""Where the cluster is read from: one factory for every command and process.

A :class:`SourceSpec` names one backend — snapshot files (``--snapshot``), the live API server
(``--kubeconfig``/``--context``, or the pod's service account in-cluster), or the simulated
cluster (``defrag run`` with ``cluster: sim``) — and :func:`open_source` returns a
:class:`Backend` whose ``source`` is a :class:`~defrag.ports.ClusterSource`. ``defrag report``,
``plan``, ``detect``, ``extender`` and ``run`` all go through it, so any of them can read a live
cluster (read-only: a source only lists) as well as a file. A spec that names no backend, or
two, and a backend that cannot be opened raise :class:`SourceError` with one line that says why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from defrag.ports import ClusterSource
from defrag.scoring.profile import ProfileConfig

if TYPE_CHECKING:
    from defrag.adapters.simcluster import SimCluster

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
KUBECONFIG_ENV = "KUBECONFIG"
"""Honoured as the Kubernetes client and kubectl do: a colon-separated list of files, used
when no ``--kubeconfig`` is given, and before the pod's service account."""
"""Set by the kubelet in every pod: a service account can be used."""


class SourceError(ValueError):
    """The cluster cannot be read from what was given; the message says which and why."""


class SourceUnreachable(SourceError):
    """The live cluster's API server could not be reached; the message names it."""


DEFAULT_KUBECONFIG = Path("~/.kube/config")
"""Where kubectl and the Kubernetes client look last (expanded against the user's home)."""


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One backend: ``snapshots``, or ``live`` (``kubeconfig``/``context``, else in-cluster),
    or ``sim`` (a simulated cluster running ``sim_speedup`` × real time)."""

    snapshots: tuple[Path, ...] = ()
    live: bool = False
    kubeconfig: Path | None = None
    context: str | None = None
    sim: bool = False
    sim_speedup: float = 60.0
    profile: ProfileConfig | None = None
    """The simulated cluster's own scheduler profile (None: the default)."""
    strict: bool = False
    """Snapshot files: an object that cannot be read is an error, not a warning."""
    probe: bool = False
    """Live: connect to the API server once (a few seconds) before the first request, so an
    unreachable one is said at once (:mod:`defrag.adapters.reach`); one-shot commands ask it,
    a serving daemon, whose API server may come back, does not."""
    watch: bool = False
    """The live API kept by list + watch (:class:`~defrag.adapters.kube_watch.KubeWatchSource`,
    the extender's choice) rather than relisted per snapshot; snapshot files and the simulated
    cluster have no watch and are re-read as before."""

    @classmethod
    def from_flags(
        cls,
        snapshots: Sequence[Path] = (),
        kubeconfig: Path | None = None,
        context: str | None = None,
        *,
        strict: bool = False,
        environ: Any = None,
    ) -> SourceSpec:
        """The CLI's rule: ``--snapshot`` files, or ``--kubeconfig``/``--context`` for the live
        cluster, not both; neither, the live cluster kubectl would read: ``$KUBECONFIG`` when it
        is set (a colon-separated list), else inside a pod the service account, else
        ``~/.kube/config`` when it exists. A live cluster is probed before its first request."""
        env = os.environ if environ is None else environ
        live = kubeconfig is not None or context is not None
        if snapshots and live:
            raise SourceError("give --snapshot or --kubeconfig, not both")
        if not snapshots and not live:
            if not has_default_cluster(env):
                raise SourceError(
                    "no cluster given (--snapshot FILE or --kubeconfig FILE; else $KUBECONFIG, "
                    "the pod's service account or ~/.kube/config is read, and none is there)"
                )
            live = True
        return cls(tuple(snapshots), live, kubeconfig, context, strict=strict, probe=live)

    @property
    def kind(self) -> str:
        return "sim" if self.sim else "kube" if self.live else "snapshot"


def has_default_cluster(environ: Any = None) -> bool:
    """Whether a live cluster is named without a flag, as kubectl finds one: ``$KUBECONFIG``,
    the pod's service account, or ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    home = env.get("HOME")
    return bool(
        env.get(KUBECONFIG_ENV)
        or IN_CLUSTER_ENV in env
        or (home and (Path(home) / ".kube" / "config").is_file())
    )


@dataclass(frozen=True, slots=True)
class Backend:
    """An opened source; ``api`` (the live API client) or ``sim`` where the caller also writes
    (the daemon's actuator and Lease)."""

    spec: SourceSpec
    source: ClusterSource
    api: Any = None
    sim: SimCluster | None = None


def open_source(spec: SourceSpec) -> Backend:
    """Open the backend ``spec`` names; the first read of a snapshot file happens here, so a
    bad file is reported before any work starts."""
    chosen = sum((bool(spec.snapshots), spec.live, spec.sim))
    if chosen != 1:
        raise SourceError(
            "name one cluster: snapshot files, the live API or the simulated cluster"
            + (f" (got {chosen})" if chosen else "")
        )
    return _OPENERS[spec.kind](spec)


def _files(spec: SourceSpec) -> Backend:
    from defrag.adapters.kube_convert import ConversionError
    from defrag.adapters.snapshot import SnapshotError, SnapshotFileSource
    from defrag.model.cluster import ModelError

    source = SnapshotFileSource(spec.snapshots, strict=spec.strict)
    try:
        source.snapshot()
    except (SnapshotError, ConversionError, ModelError, OSError) as exc:
        raise SourceError(str(exc)) from None
    return Backend(spec, source)


def _live(spec: SourceSpec) -> Backend:
    from defrag.adapters.kube import KubeClusterSource, KubeError, connect

    if spec.kubeconfig is not None and not spec.kubeconfig.is_file():
        raise SourceError(f"kubeconfig {spec.kubeconfig}: no such file")
    try:
        api = connect(str(spec.kubeconfig) if spec.kubeconfig else None, spec.context)
    except KubeError as exc:
        raise SourceError(str(exc)) from None
    if spec.probe:
        from defrag.adapters.reach import ServerUnreachable, check_reachable

        configuration = api.configuration
        try:
            check_reachable(
                configuration.host,
                "the API server",
                named_by=_named_by(spec),
                proxy=configuration.proxy,
            )
        except ServerUnreachable as exc:
            raise SourceUnreachable(str(exc)) from None
    if spec.watch:
        from defrag.adapters.kube_watch import KubeWatchSource

        return Backend(spec, KubeWatchSource(api), api=api)
    return Backend(spec, KubeClusterSource(api), api=api)


def _named_by(spec: SourceSpec) -> str:
    """Where the API server's address came from, for a message."""
    if spec.kubeconfig is not None:
        return f"(from kubeconfig {spec.kubeconfig})"
    if os.environ.get(KUBECONFIG_ENV):
        return f"(from $KUBECONFIG={os.environ[KUBECONFIG_ENV]})"
    if IN_CLUSTER_ENV in os.environ:
        return "(the pod's service account)"
    return f"(from {DEFAULT_KUBECONFIG})"


def _sim(spec: SourceSpec) -> Backend:
    from defrag.adapters.simcluster import SimClock, SimCluster, fragmented_cluster

    clock = SimClock(speedup=spec.sim_speedup)
    sim = SimCluster(fragmented_cluster(), clock, profile=spec.profile or ProfileConfig())
    return Backend(spec, sim, sim=sim)


_OPENERS: dict[str, Callable[[SourceSpec], Backend]] = {
    "snapshot": _files,
    "kube": _live,
    "sim": _sim,
}
"""One opener per :attr:`SourceSpec.kind`."""


__all__ = [
    "IN_CLUSTER_ENV",
    "KUBECONFIG_ENV",
    "Backend",
    "SourceError",
    "SourceSpec",
    "SourceUnreachable",
    "has_default_cluster",
    "open_source",
]
