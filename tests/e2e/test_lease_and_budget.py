"""The Lease and the window's budget on the real control plane.

- One replica's cycle and its renewal job share the Lease from two threads: with the elector's
  lock it never loses the Lease to itself (without it, it did: follower cycles, fence refusals).
- The window's eviction spend rides on the Lease: a leader SIGKILLed mid-window, or a restarted
  replica, resumes it, and the window's budget (4) holds across both, counted from the API
  server's audit log.

The budget stage: eight 8-GPU nodes each running one 2-GPU pod (48 GPUs free, no node with 8)
and six starving 8-GPU pods. Each needs one eviction (its node's 2-GPU pod moves beside
another's), six in all: more than the window's 4.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from defrag.adapters.kube import LeaseElector, connect
from tests.e2e import cluster as c
from tests.e2e.controlplane import ControlPlane
from tests.e2e.kubelet import Kubelet, add_node
from tests.e2e.stage import DAEMON, HIGH, LEASE, STARVATION_RULE, daemon_settings, window_spend
from tests.support.binaries import free_port
from tests.test_lease_serial import race

NODES = 8
TRAINS = 6
BUDGET = 4


# --- one Lease owner per process ---------------------------------------------------------------


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _race(plane: ControlPlane, rounds: int, lock: bool) -> dict[str, int]:
    """One replica's two callers on their shared ticks: the cycle (its leader check, then the
    fence the executor asks before a write) and the renewal job, released together each round;
    as the daemon's ServiceAccount, on the Lease its RBAC names."""
    api = connect(str(plane.service_account_kubeconfig("defrag-system", "defrag")))
    elector = LeaseElector(api, "defrag-system", "defrag", "replica-1", lease_duration_s=6)
    if not lock:
        elector._lock = _NoLock()  # type: ignore[assignment]
    assert elector.is_leader(), elector.last
    seen = race(elector, rounds)
    elector.release()
    plane.admin.delete(LEASE)
    print(f"lock={lock}: {seen}")
    return seen


def test_a_lone_replica_never_races_its_own_lease(plane: ControlPlane) -> None:
    seen = _race(plane, 1000, lock=True)
    assert seen == {"cycles": 1000, "follower cycles": 0, "fence refusals": 0, "lost renewals": 0}


def test_without_the_lock_a_lone_replica_deposes_itself(plane: ControlPlane) -> None:
    """The check above can fail: the same race with the lock taken away."""
    seen = _race(plane, 300, lock=False)
    assert seen["follower cycles"] + seen["fence refusals"] > 0, seen


# --- the window's spend survives a leader change and a restart -------------------------------


@contextmanager
def budget_stage(plane: ControlPlane, ns: str, folder: Path) -> Iterator[dict[str, Any]]:
    c.namespace(plane.admin, ns)
    c.priority_class(plane.admin, HIGH, 100000, preempt=False)
    nodes = [f"{ns}-n{i}" for i in range(1, NODES + 1)]
    rules = folder / "rules"
    rules.mkdir(parents=True, exist_ok=True)
    c.write_yaml(rules / "starvation.yaml", STARVATION_RULE)
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    port = free_port()
    scheduler = f"kube-scheduler-{ns}"
    extender_settings = c.write_yaml(
        folder / "extender.yaml", {"scoring": {"policy": "reserve-binpack"}}
    )
    with c.extender(plane, sched_kc, extender_settings, name=f"extender-{ns}", port=port):
        try:
            for i, node in enumerate(nodes, 1):
                add_node(plane.admin, node, 8)
                c.deployment(plane.admin, ns, f"d{i}", 2)
            for i, node in enumerate(nodes, 1):  # bound by hand: no scheduler yet to race
                pod = c.wait_pods(plane.admin, ns, f"app=d{i}", lambda ps: len(ps) == 1, 30)[0]
                c.bind(plane.admin, pod, node)
            c.wait_pods(plane.admin, ns, "", c.running(NODES), 60, what="the stage running")
            plane.start_scheduler(c.scheduler_config(port, True), sched_kc, scheduler)
            c.deployment(plane.admin, ns, "train", 8, TRAINS, priority_class_name=HIGH)
            c.wait_pods(
                plane.admin, ns, "app=train",
                lambda ps: len(ps) == TRAINS and all(c.node_of(p) is None for p in ps), 30,
                what="the trains created and waiting",
            )  # fmt: skip
            time.sleep(4)  # past the rule's `for`
            settings = c.write_yaml(
                folder / "settings.yaml",
                daemon_settings(
                    execution={"dry_run": False},
                    windows={
                        "max_evictions_per_window": BUDGET,
                        "budget_follows_demand": False,
                        "max_evictions_per_namespace": 50,
                        "max_evictions_per_node": 50,
                    },
                ),
            )
            yield {
                "ns": ns,
                "nodes": nodes,
                "rules": rules,
                "settings": settings,
                "kubeconfig": plane.service_account_kubeconfig("defrag-system", "defrag"),
            }
        finally:
            for name in [n for n in plane.processes if n.startswith(f"daemon-{ns}")]:
                plane.processes.pop(name).stop()
            if scheduler in plane.processes:
                plane.processes.pop(scheduler).stop()
            c.clean(plane, ns, nodes)
            plane.admin.delete(LEASE)


def _evictions(plane: ControlPlane, ns: str, since: int) -> list[dict[str, Any]]:
    """The daemon's Evictions the API server carried out (201) in ``ns``, dry runs aside."""
    return [
        e
        for e in plane.audit_events()[since:]
        if e["user"]["username"] == DAEMON
        and e["verb"] == "create"
        and e.get("objectRef", {}).get("subresource") == "eviction"
        and e.get("objectRef", {}).get("namespace") == ns
        and "dryRun=All" not in e.get("requestURI", "")
        and e.get("responseStatus", {}).get("code") == 201
    ]


def _start(plane: ControlPlane, stage: dict[str, Any], name: str) -> c.Served:
    return c.start_daemon(plane, stage["kubeconfig"], stage["settings"], stage["rules"], name)


def _kill_after_two_evictions(
    plane: ControlPlane, stage: dict[str, Any], daemon: c.Served, mark: int
) -> int:
    c.wait_for(
        "two evictions by the first leader",
        lambda: len(_evictions(plane, stage["ns"], mark)) >= 2,
        120,
        daemon.process,
    )
    daemon.process.proc.kill()  # SIGKILL mid-window: no release, no goodbye
    daemon.process.proc.wait()
    return len(_evictions(plane, stage["ns"], mark))


def _resumed(plane: ControlPlane, stage: dict[str, Any], daemon: c.Served, mark: int) -> None:
    """The survivor leads for a while with trains still starving; the window's 4 hold. A
    leader records a batch's spend before it evicts (so a crash never under-counts), so the
    window is spent — by evictions, or by a dead leader's record of ones it did not reach —
    and every eviction carried out is in the record."""
    c.wait_for(
        f"{daemon.process.name} leading",
        lambda: plane.admin.get(LEASE)["spec"].get("holderIdentity") == daemon.process.name,
        60,
        daemon.process,
    )
    # Long enough for a fresh budget to have been spent: 10 leader cycles (2 s each), and every
    # drain it could have started finished.
    c.wait_cycles(daemon, 10, 120, leading_within_s=30)
    evicted = _evictions(plane, stage["ns"], mark)
    waiting = [p for p in c.pods(plane.admin, stage["ns"], "app=train") if not c.node_of(p)]
    names = [e["objectRef"]["name"] for e in evicted]
    assert len(evicted) <= BUDGET, names
    assert waiting, "every train placed: the stage asked for less than the budget"
    spend = window_spend(plane.admin)
    (window,) = spend["windows"].values()
    assert window["total"] == BUDGET, spend  # spent: a leader that evicted nothing more fails
    # the stage's d<i> runs on node n<i>: each eviction carried out was recorded on its node
    on_nodes = {f"{stage['ns']}-n{name.split('-')[0].removeprefix('d')}" for name in names}
    assert on_nodes <= set(window["by_node"]), (names, spend)


@pytest.fixture
def stage(plane: ControlPlane, kubelet: Kubelet, tmp_path: Path, request: Any) -> Any:
    ns = "wb-" + request.node.name.removeprefix("test_")[:20].replace("_", "-").rstrip("-")
    with budget_stage(plane, ns, tmp_path) as made:
        yield made


def test_a_new_leader_resumes_the_windows_spend(plane: ControlPlane, stage: Any) -> None:
    mark = len(plane.audit_events())
    ns = stage["ns"]
    first = _start(plane, stage, f"daemon-{ns}-1")
    second = _start(plane, stage, f"daemon-{ns}-2")  # a follower until the Lease lapses
    before = _kill_after_two_evictions(plane, stage, first, mark)
    assert 2 <= before <= BUDGET
    _resumed(plane, stage, second, mark)


def test_a_restarted_replica_resumes_the_windows_spend(plane: ControlPlane, stage: Any) -> None:
    mark = len(plane.audit_events())
    name = f"daemon-{stage['ns']}"
    first = _start(plane, stage, name)
    before = _kill_after_two_evictions(plane, stage, first, mark)
    assert 2 <= before <= BUDGET
    plane.processes.pop(name, None)
    again = _start(plane, stage, name)  # the same identity: the Lease is still its own
    _resumed(plane, stage, again, mark)
