"""An eviction whose answer was lost is not sent again blindly (found by the chaos soak).

The API server answers an Eviction of a pod that is already Terminating with 201 again and
without looking at its PodDisruptionBudget. So when the first try was carried out but its
answer never arrived (a connection reset, a gateway's 5xx after the fact), a blind retry evicts
the same pod a second time. The adapter now reads the pod before trying again, and asks the
Lease too: a retry can come seconds after the fence was checked.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from defrag.adapters.kube import KubeActuator, RetryPolicy
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import scattered_20

POD = ("ml", "batch-01-0-0")


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(scattered_20()["items"])


def terminating_after_eviction(api: KubeApi) -> None:
    """Evicted pods stay Terminating (a kubelet has not finished them), as on a real cluster."""

    def keep(server: KubeApi, pod: dict[str, Any]) -> None:
        back = copy.deepcopy(pod)
        back["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        back["metadata"].pop("resourceVersion", None)
        server.put(back)

    api.on_eviction = keep


def evictions(api: KubeApi) -> list[Any]:
    return [r for r in api.requests if r.resource == "pods/eviction" and r.status == 201]


@pytest.mark.parametrize("status", [503, 504, 500])
def test_a_lost_answer_is_not_a_second_eviction(api: KubeApi, status: int) -> None:
    terminating_after_eviction(api)
    api.fail("POST", r"/eviction$", status=status, after=True)  # done; the answer is lost
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    uid = api.get("Pod", POD[1], POD[0])["metadata"]["uid"]  # type: ignore[index]
    result = act.evict(*POD, uid=uid)
    assert result.outcome == "evicted", result
    assert "Terminating" in result.reason
    assert len([r for r in api.requests if r.resource == "pods/eviction"]) == 1
    assert api.evicted == [POD]


def test_a_failure_before_the_server_acted_is_still_retried(api: KubeApi) -> None:
    api.fail("POST", r"/eviction$", status=503)  # refused before anything happened
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    assert act.evict(*POD).outcome == "evicted"
    assert api.evicted == [POD]
    assert len(evictions(api)) == 1


def test_no_retry_once_the_lease_is_lost(api: KubeApi) -> None:
    api.fail("POST", r"/eviction$", status=503)
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    act.fence = lambda: False
    result = act.evict(*POD)
    assert result.outcome == "not-leader", result
    assert api.evicted == []
    assert len([r for r in api.requests if r.resource == "pods/eviction"]) == 1


def test_the_pod_is_read_as_the_daemons_role_allows(api: KubeApi) -> None:
    """Found by the soak on the real API server: the first fix read the pod with ``get``, which
    defrag's ClusterRole does not grant (403), took that for "still running" and evicted the
    pod again. The pod is read with ``list`` (granted) and a field selector."""
    terminating_after_eviction(api)
    api.fail("POST", r"/eviction$", status=503, after=True)
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    assert act.evict(*POD).outcome == "evicted"
    reads = [r for r in api.requests if r.resource == "pods" and r.method == "GET"]
    assert reads and {r.verb for r in reads} == {"list"}, [(r.verb, r.path) for r in reads]


def test_a_pod_that_cannot_be_read_is_not_evicted_again(api: KubeApi) -> None:
    terminating_after_eviction(api)
    api.fail("POST", r"/eviction$", status=503, after=True)
    api.fail("GET", r"/namespaces/ml/pods$", status=403, times=10)  # as without the right
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    result = act.evict(*POD)
    assert result.outcome == "failed", result
    assert "cannot be read" in result.reason
    assert len([r for r in api.requests if r.resource == "pods/eviction"]) == 1


def test_a_replica_paused_past_its_lease_sends_no_eviction(api: KubeApi) -> None:
    """Found by the soak: a leader SIGSTOPped after the fence read the Lease and before the
    Eviction went out woke up 5 s later, after the other replica had taken over, and evicted.
    Right before each send the actuator asks the elector's clock (no request): the hold it
    renewed is older than the lease duration, so nothing is sent."""
    from defrag.adapters.kube import LeaseElector

    elector = LeaseElector(api.client(), "defrag-system", "defrag", "a", lease_duration_s=4)
    assert elector.is_leader()
    act = KubeActuator(api.client(), retry=RetryPolicy(attempts=3, backoff_s=0, timeout_s=2))
    act.fence, act.send_guard = elector.still_leader, elector.holds_now
    assert elector._renewed_at is not None
    elector._renewed_at -= 5  # as after 5 s stopped: the monotonic clock ran on
    result = act.evict(*POD)
    assert result.outcome == "not-leader", result
    assert [r for r in api.requests if r.resource == "pods/eviction"] == []
    assert api.evicted == []
