"""Every transient failure of an eviction is counted, the last try's included.

``defrag_kube_api_transient_errors_total`` is how an operator (and the soak's "faults not
visible" invariant) sees what the API server did to defrag's requests. The eviction path retries
by itself (it reads the pod between tries), apart from the retry policy that counts each
failure; it once counted every failure but the one that made it give up, so an eviction (or its
server-side rehearsal) that failed on every try showed one failure fewer than it met.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from prometheus_client import REGISTRY

from defrag.adapters.kube import KubeActuator, RetryPolicy
from defrag.ports import EvictionResult
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import scattered_20

POD = ("ml", "batch-01-0-0")
ATTEMPTS = 3


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


def counted(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("defrag_kube_api_transient_errors_total", {"reason": reason})
        or 0.0
    )


def evict(act: KubeActuator) -> EvictionResult:
    return act.evict(*POD)


def rehearse(act: KubeActuator) -> EvictionResult:
    return act.rehearse_eviction(*POD)


@pytest.mark.parametrize("how", [evict, rehearse], ids=["eviction", "rehearsal"])
@pytest.mark.parametrize("status", [503, 429])
def test_every_failed_try_of_an_eviction_is_counted(
    api: KubeApi, how: Callable[[KubeActuator], EvictionResult], status: int
) -> None:
    api.fail("POST", r"/eviction$", status=status, times=ATTEMPTS + 2)
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=ATTEMPTS, backoff_s=0))
    reason = "5xx" if status >= 500 else "429"
    before = counted(reason)
    result = how(act)
    assert result.outcome == "failed", result
    tries = len([r for r in api.requests if r.resource == "pods/eviction"])
    assert tries == ATTEMPTS
    assert counted(reason) - before == tries


def test_every_timed_out_try_of_an_eviction_is_counted(api: KubeApi) -> None:
    api.fail("POST", r"/eviction$", status=0, delay_s=0.6, times=ATTEMPTS + 2)
    act = KubeActuator(
        api.client(), retry=RetryPolicy(attempts=ATTEMPTS, backoff_s=0, timeout_s=0.2)
    )
    before = counted("timeout")
    result = act.rehearse_eviction(*POD)
    assert result.outcome == "failed", result
    assert "did not answer within 0.2 s" in result.reason
    assert counted("timeout") - before == ATTEMPTS
