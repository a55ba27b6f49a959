"""Real-shaped means schema-valid: fixtures and the bodies the adapter sends pass the
Kubernetes OpenAPI schema (kubernetes-validate, strict: unknown fields are errors)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest

from defrag.adapters.kube import KubeActuator, LeaseElector, RetryPolicy
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import ALL, scattered_20

VERSION = "1.31"


def _validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(ALL))
def test_fixture_objects_are_schema_valid(name: str) -> None:
    for obj in ALL[name]()["items"]:
        _validate(obj)


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


class Clock:
    def now(self) -> datetime:
        return datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_bodies_the_adapter_sends_are_schema_valid(api: KubeApi) -> None:
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=1))
    act.evict("ml", "batch-01-0-0")
    act.event("Pod", "ml", "batch-01-0-0", "DefragEvicted", "moved to gpu-07")
    act.event("Node", "", "gpu-01", "DefragDraining", "plan p1", warning=True)
    elector = LeaseElector(api.client(), "defrag-system", "defrag", identity="a", clock=Clock())
    assert elector.is_leader()  # create
    assert elector.is_leader()  # update
    elector.release()
    bodies = [r.body for r in api.writes() if r.method in ("POST", "PUT")]
    assert {b["kind"] for b in bodies} == {"Eviction", "Event", "Lease"}
    for body in bodies:
        _validate(body)
