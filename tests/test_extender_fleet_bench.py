"""The large-fleet extender bench's pieces: the node-list length kube-scheduler sends (its
``numFeasibleNodesToFind``, kubernetes/kubernetes pkg/scheduler/schedule_one.go: every node below
100, else max(50 − n/125, 5) % of n with integer division, at least 100), the lists rotating as
its ``nextStartNodeIndex`` does, the store fed through the watch's event path, and the figures
``make bench`` reads."""

from __future__ import annotations

import signal

import pytest

from bench.bench_extender import request_body
from bench.bench_extender_load import (
    PODS_PER_NODE,
    clients_at_once,
    fed_store,
    fleet_cpu,
    lists,
    nodes_to_find,
    start,
)
from bench.run_all import BENCHES
from bench.targets import of_bench


@pytest.mark.parametrize(
    ("nodes", "sent"),
    [
        (50, 50),  # below minFeasibleNodesToFind: every node
        (100, 100),  # 50 % of 100 is 50, raised to the minimum of 100
        (1000, 420),  # 50 − 8 = 42 %
        (2000, 680),  # 50 − 16 = 34 %
        (5000, 500),  # 50 − 40 = 10 %
        (6000, 300),  # 50 − 48 = 2 %, raised to minFeasibleNodesPercentageToFind (5 %)
        (20000, 1000),  # 5 %
    ],
)
def test_the_list_length_is_kube_schedulers(nodes: int, sent: int) -> None:
    assert nodes_to_find(nodes) == sent


def test_each_list_starts_where_the_last_stopped() -> None:
    got = lists(5, 3, 3)
    assert got == [
        ["gpu-00000", "gpu-00001", "gpu-00002"],
        ["gpu-00003", "gpu-00004", "gpu-00000"],
        ["gpu-00001", "gpu-00002", "gpu-00003"],
    ]


def test_the_fed_store_holds_the_fleet_as_a_cluster() -> None:
    store = fed_store(3)
    cluster, generation = store.build()
    assert generation == 3 * (1 + PODS_PER_NODE)
    assert len(cluster.nodes) == 3 and len(cluster.pods) == 3 * PODS_PER_NODE
    assert all(p.node is not None for p in cluster.pods.values())
    # four 1-GPU pods and one 2-GPU pod on each 8-GPU node
    assert cluster.arrays.free_whole_count().tolist() == [2, 2, 2]


FLEET_OUT = """fleet 20000 nodes, kube-scheduler's lists, 1 client(s): p99 4.10 ms (the slower verb)
fleet 20000 nodes, kube-scheduler's lists, 4 client(s): p99 21.50 ms (the slower verb)
fleet 20000 nodes, full lists, 1 client(s): p99 40.00 ms (the slower verb)
fleet 20000 nodes: extender peak RSS 1200 MiB
"""


def test_make_bench_reads_the_fleet_figures() -> None:
    assert any(b.name == "extender-fleet" for b in BENCHES)
    read = {t.label: t.read(FLEET_OUT) for t in of_bench("extender-fleet")}
    values = {label: (r.value if r else None) for label, r in read.items()}
    assert values == {
        "extender p99, 20,000 nodes, kube-scheduler's lists, 1 client": 4.1,
        "extender p99, 20,000 nodes, kube-scheduler's lists, 4 clients": 21.5,
        "extender peak RSS, 20,000 nodes / 200,000 pods": 1200.0,
    }
    limits = {t.label: t.limit for t in of_bench("extender-fleet")}
    assert limits["extender p99, 20,000 nodes, kube-scheduler's lists, 4 clients"] == 15.0


def test_the_answers_cpu_is_measured_per_verb(capsys: pytest.CaptureFixture[str]) -> None:
    p99 = fleet_cpu(120, 8)
    assert set(p99) == {"filter", "prioritize"}
    assert all(0 < ms < 1000 for ms in p99.values())
    assert "120 nodes, kube-scheduler's lists, CPU of the answer alone" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["processes", "threads"])
def test_every_clients_pods_are_answered_and_timed_per_verb(how: str) -> None:
    # as a test worker that ran a command line in-process: a handler that only records SIGTERM
    before = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        proc, port = start(40)
    finally:
        signal.signal(signal.SIGTERM, before)
    try:
        names = lists(40, 40, 1)[0]
        shares = [[request_body(names, g) for g in (1, 2, 4)] for _ in range(4)]
        samples, codes = clients_at_once(port, shares, how)
    finally:
        proc.terminate()
        proc.join(30)
    assert proc.exitcode == -signal.SIGTERM  # ended by the signal, whatever this worker installed
    assert codes == {200: 4 * 3 * 2}
    assert {verb: len(times) for verb, times in samples.items()} == {
        "filter": 12,
        "prioritize": 12,
    }
    assert all(0 < t < 60 for times in samples.values() for t in times)
