"""A watched source over a store fed by hand, for the extender's benches and tests.

The benches that compare with another checkout (``--base``) run their own file against that
checkout's ``defrag``: they load this module by its path (``runpy.run_path``), so it
imports nothing a past ``defrag`` may lack, and answers ahead of the build only when the store
it is given can (``pending``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from defrag.model.cluster import Cluster
from defrag.ports import WatchHealth


class FedSource:
    """A :class:`~defrag.ports.WatchedClusterSource` over a ``KubeWatchSource`` whose store was
    filled by hand through its own event path (no API server: nothing is listed or watched).

    ``wakes``: each event applied after :meth:`start` wakes the cache's builder, as a live watch
    does (else the cache builds when asked). ``synced``: its health is always in sync (a store
    seeded by hand never lists, so its own health never is)."""

    def __init__(self, store: Any, wakes: bool = False, synced: bool = False) -> None:
        self.store = store
        self.wakes = wakes
        self.synced = synced
        if hasattr(store, "pending"):  # the cache answers ahead only from a source that has it
            self.pending: Callable[[], Any] = store.pending

    def snapshot(self) -> Cluster:
        cluster: Cluster = self.store.build()[0]
        return cluster

    def start(self, on_change: Callable[[], None]) -> None:
        if self.wakes:
            self.store._on_change = on_change

    def stop(self) -> None:
        pass

    def generation(self) -> int:
        generation: int = self.store.generation()
        return generation

    def build(self) -> tuple[Cluster, int]:
        built: tuple[Cluster, int] = self.store.build()
        return built

    def health(self) -> WatchHealth:
        if self.synced:
            return WatchHealth(True)
        health: WatchHealth = self.store.health()
        return health


__all__ = ["FedSource"]
