"""The Lease has one owner per process: the daemon's cycle and its renewal job share one
LeaseElector from two threads, and the window's spend rides on the same Lease (emulated API)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from defrag.adapters.kube import WINDOW_SPEND_ANNOTATION, LeaseElector, RetryPolicy
from defrag.ports import SpendRecord, SpendUnreadable
from tests.support.kubeapi import KubeApi, running

FAST = RetryPolicy(attempts=3, backoff_s=0.0, timeout_s=2.0)
SPEND = {"windows": {"w1": {"total": 2, "by_node": {"n1": 2}, "by_namespace": {"ml": 2}}}}


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.t


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running([])


def elector(api: KubeApi, who: str, clock: Clock | None = None) -> LeaseElector:
    return LeaseElector(
        api.client(), "defrag-system", "defrag", identity=who, clock=clock, retry=FAST
    )


def race(e: LeaseElector, rounds: int) -> dict[str, int]:
    """The daemon's two callers on their shared ticks, released together each round: the cycle
    (its leader check, then the fence the executor asks before a write) and the renewal job,
    ``rounds`` times each; what each saw."""
    tick = threading.Barrier(2)
    seen = {"cycles": 0, "follower cycles": 0, "fence refusals": 0, "lost renewals": 0}

    def cycles() -> None:
        for _ in range(rounds):
            tick.wait()
            seen["cycles"] += 1
            if not e.is_leader():
                seen["follower cycles"] += 1
            elif not e.still_leader():
                seen["fence refusals"] += 1

    def renewals() -> None:
        for _ in range(rounds):
            tick.wait()
            if not e.tick().leader:
                seen["lost renewals"] += 1

    threads = [threading.Thread(target=cycles), threading.Thread(target=renewals)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def test_the_cycle_and_the_renewal_never_depose_their_own_replica(api: KubeApi) -> None:
    e = elector(api, "a")
    assert e.is_leader()
    assert race(e, 150) == {
        "cycles": 150,
        "follower cycles": 0,
        "fence refusals": 0,
        "lost renewals": 0,
    }
    assert e.still_leader()


def test_without_the_lock_the_replica_races_itself(api: KubeApi) -> None:
    """The same race with the lock taken away: the test above can fail."""
    e = elector(api, "a")
    assert e.is_leader()
    e._lock = _NoLock()  # type: ignore[assignment]
    seen = race(e, 150)
    assert seen["follower cycles"] + seen["fence refusals"] + seen["lost renewals"] > 0, seen


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_conflicting_renewal_reads_again_and_keeps_the_hold(api: KubeApi) -> None:
    clock = Clock()
    e = elector(api, "a", clock)
    assert e.is_leader()
    generation = e.tenure().generation
    clock.t += timedelta(seconds=5)
    api.fail("PUT", r"/leases/defrag$", status=409, times=1)  # someone else touched it
    status = e.tick()
    assert status.leader and status.reason == "renewed the Lease", status
    assert e.tenure().generation == generation and e.still_leader()
    lease = api.get("Lease", "defrag", "defrag-system")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"


def test_a_conflict_on_a_lease_held_by_another_is_still_lost(api: KubeApi) -> None:
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.is_leader()
    clock.t += timedelta(seconds=60)  # expired: b may take it, but a write beats b to it
    api.fail("PUT", r"/leases/defrag$", status=409, times=1)
    assert not b.is_leader() and "409" in b.last.reason


# --- the window's spend on the Lease ---------------------------------------------------------


def test_the_spend_rides_on_the_lease_through_renewal_and_takeover(api: KubeApi) -> None:
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert isinstance(a, SpendRecord)
    assert a.is_leader() and a.load() is None
    assert a.save(SPEND).ok
    clock.t += timedelta(seconds=5)
    assert a.is_leader()  # a renewal keeps the annotation
    assert b.load() == SPEND  # anyone may read it
    clock.t += timedelta(seconds=60)
    assert b.is_leader() and not a.is_leader()  # a took over: the annotation went with it
    assert b.load() == SPEND


def test_only_the_holder_writes_the_spend(api: KubeApi) -> None:
    clock = Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.is_leader() and not b.is_leader()
    refused = b.save(SPEND)
    assert not refused.ok and "does not hold the Lease" in str(refused)
    clock.t += timedelta(seconds=60)
    assert b.is_leader()
    # a still believes it holds the Lease (its monotonic clock says so): the read says not.
    deposed = a.save({**SPEND, "total": 9})
    assert not deposed.ok and "held by b" in str(deposed)
    assert b.load() is None


def test_a_failed_spend_write_says_why(api: KubeApi) -> None:
    a = elector(api, "a")
    assert a.is_leader()
    api.fail("PUT", r"/leases/defrag$", status=500, times=10)
    failed = a.save(SPEND)
    assert not failed.ok and "500" in str(failed)


@pytest.mark.parametrize("raw", ["{not json", "[1]"])
def test_a_malformed_spend_is_unreadable_never_nothing(api: KubeApi, raw: str) -> None:
    a = elector(api, "a")
    assert a.is_leader()
    lease = api.get("Lease", "defrag", "defrag-system")
    assert lease is not None
    lease["metadata"]["annotations"] = {WINDOW_SPEND_ANNOTATION: raw}
    api.put(lease)
    with pytest.raises(SpendUnreadable) as info:
        a.load()
    assert info.value.malformed
    assert WINDOW_SPEND_ANNOTATION in str(info.value)


def test_an_unreachable_lease_is_unreadable_not_malformed(api: KubeApi) -> None:
    a = elector(api, "a")
    api.fail("GET", r"/leases/defrag$", status=503, times=10)
    with pytest.raises(SpendUnreadable) as info:
        a.load()
    assert not info.value.malformed
