"""The throughput bench's readings: bindings from the audit log, the extender's latency from its
own /metrics histogram, and the cost line ``make bench``'s targets read. (The bench itself runs
in tests/test_bench_smoke.py on the real control plane.)"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.bench_sched_throughput import (
    ModeRun,
    algorithm_mean_ms,
    binding_times,
    cpu_seconds,
    extender_figures,
    fresh_answers,
    histogram_quantile,
    report,
    view_builds,
)
from bench.run_all import BENCHES
from defrag.extender.server import ExtenderMetrics
from tests.support.binaries import free_port


def _audit(name: str, ns: str, subresource: str | None, code: int, stamp: str) -> str:
    # An audit.k8s.io/v1 Event at level Metadata, the fields k8s.io/apiserver
    # pkg/apis/audit/v1/types.go defines (the e2e API server writes one JSON object a line).
    ref = {"resource": "pods", "namespace": ns, "name": name, "apiVersion": "v1"}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "auditID": f"id-{name}-{subresource}",
            "stage": "ResponseComplete",
            "requestURI": f"/api/v1/namespaces/{ns}/pods/{name}/{subresource or ''}",
            "verb": "create",
            "user": {"username": "system:serviceaccount:defrag-system:defrag-scheduler"},
            "objectRef": ref,
            "responseStatus": {"metadata": {}, "code": code},
            "requestReceivedTimestamp": stamp,
            "stageTimestamp": stamp,
        }
    )


def test_bindings_are_read_from_the_audit_log_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    before = _audit("old", "throughput", "binding", 201, "2026-12-04T11:00:00.000000Z") + "\n"
    log.write_text(
        before
        + "\n".join(
            [
                _audit("a", "throughput", "binding", 201, "2026-12-04T11:00:02.500000Z"),
                _audit("b", "throughput", None, 201, "2026-12-04T11:00:02.600000Z"),  # a create
                _audit("c", "elsewhere", "binding", 201, "2026-12-04T11:00:02.700000Z"),
                _audit("d", "throughput", "binding", 409, "2026-12-04T11:00:02.800000Z"),
                _audit("e", "throughput", "binding", 201, "2026-12-04T11:00:01.000000Z"),
            ]
        )
        + "\n"
    )
    times = binding_times(log, len(before.encode()), "throughput")
    assert len(times) == 2
    assert times == sorted(times)
    assert math.isclose(times[1] - times[0], 1.5)
    # a binding the API server is still writing (no newline yet) is left for the next read
    torn = _audit("f", "throughput", "binding", 201, "2026-12-04T11:00:03.000000Z")
    with log.open("a") as handle:
        handle.write(torn[:-5])  # its objectRef (the binding) written, its end not yet
    assert binding_times(log, len(before.encode()), "throughput") == times


def test_extender_latency_from_its_own_histogram() -> None:
    metrics = ExtenderMetrics.create()
    for _ in range(99):
        metrics.seconds.labels(verb="filter").observe(0.0015)
    metrics.seconds.labels(verb="filter").observe(0.2)
    metrics.seconds.labels(verb="prioritize").observe(0.003)
    text = generate_latest(metrics.registry).decode()
    p50, p99, calls, mean = extender_figures(text)
    assert calls == {"filter": 100, "prioritize": 1}
    # rank 50 of 100 in the (1 ms, 2 ms] bucket holding 99: 1 + 1 × 50/99 ms
    assert p50["filter"] == round(1 + 50 / 99, 2)
    assert p99["filter"] == 2.0
    assert p99["prioritize"] == round(2 + 3 * 0.99, 2)  # the (2 ms, 5 ms] bucket
    assert math.isclose(mean["filter"], (99 * 1.5 + 200) / 100, abs_tol=0.01)


def test_quantile_edge_cases() -> None:
    assert math.isnan(histogram_quantile(0.99, [(0.001, 0.0), (math.inf, 0.0)]))
    # every observation above the largest finite bound: that bound
    assert histogram_quantile(0.99, [(0.001, 0.0), (1.0, 0.0), (math.inf, 4.0)]) == 1.0


def test_scheduling_algorithm_mean() -> None:
    # kube-scheduler exposes it as a histogram without labels (kubernetes
    # pkg/scheduler/metrics/metrics.go, SchedulingAlgorithmLatency).
    registry = CollectorRegistry()
    hist = Histogram(
        "scheduler_scheduling_algorithm_duration_seconds", "algorithm", registry=registry
    )
    for seconds in (0.001, 0.003):
        hist.observe(seconds)
    assert algorithm_mean_ms(generate_latest(registry).decode()) == 2.0


def _run(mode: str, nodes: int, rate: float) -> ModeRun:
    ext = {} if mode == "alone" else {"filter": 1.0, "prioritize": 2.0}
    return ModeRun(mode, "1000", nodes, 2000, rate, 10.0, ext, ext, {}, ext, 1.0)


def test_the_cost_lines_are_what_the_targets_read() -> None:
    results = [
        _run(mode, nodes, rate)
        for nodes in (1000, 5000)
        for mode, rate in (("alone", 100.0), ("names", 90.0), ("nodes", 10.0))
    ]
    output = "\n".join(report(results))
    bench = next(b for b in BENCHES if b.name == "sched-throughput")
    figures = {t.label: t.figure(output) for t in bench.targets}
    assert figures == {
        "extender cost (names), 1,000 nodes, kube-scheduler qps 1000": 10.0,
        "extender cost (nodes), 1,000 nodes, kube-scheduler qps 1000": 90.0,
        "extender cost (names), 5,000 nodes, kube-scheduler qps 1000": 10.0,
        "extender cost (nodes), 5,000 nodes, kube-scheduler qps 1000": 90.0,
    }


def test_view_builds_from_the_extenders_metrics() -> None:
    metrics = ExtenderMetrics.create()
    metrics.relists.labels(result="ok").inc(3)
    metrics.relists.labels(result="failed").inc()
    metrics.relist_seconds.set(0.041)
    assert view_builds(generate_latest(metrics.registry).decode()) == (4, 0.041)


def test_fresh_answers_from_the_extenders_metrics() -> None:
    metrics = ExtenderMetrics.create()
    for how in ("ahead", "ahead", "waited", "current"):
        metrics.observe_fresh(how)
    text = generate_latest(metrics.registry).decode()
    assert fresh_answers(text) == {"ahead": 2, "waited": 1, "current": 1}


def test_cpu_seconds_of_a_process_grow_with_its_work() -> None:
    before = cpu_seconds(os.getpid())
    until = time.process_time() + 0.05
    while time.process_time() < until:
        pass
    assert cpu_seconds(os.getpid()) >= before + 0.03  # clock ticks of 10 ms


def test_the_table_says_how_the_filter_answers_were_made() -> None:
    results = [_run("alone", 1000, 100.0), _run("names", 1000, 90.0)]
    results[1] = dataclasses.replace(
        results[1], fresh_answers={"ahead": 40, "waited": 2}, extender_cpu_ms=1.5
    )
    row = next(line for line in report(results) if "| names |" in line)
    assert row.endswith("| 1.5 | 40 / 2 |")


def test_the_null_extender_passes_every_node_and_scores_none() -> None:
    """The floor mode's extender answers kube-scheduler's two calls in both modes, on one
    keep-alive connection, as ``extender/v1/types.go`` shapes them."""
    import http.client

    from bench.null_extender import NullExtender

    port = free_port()
    with NullExtender(port) as null:
        assert null.pid != os.getpid()  # its CPU counted apart from the bench's
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        names = ["gpu-1", "gpu-2"]
        pod = {"metadata": {"name": "p", "namespace": "ns"}}
        answers = []
        for verb, args in [
            ("filter", {"Pod": pod, "Nodes": None, "NodeNames": names}),
            ("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names}),
            ("filter", {"Pod": pod, "Nodes": {"items": [{"metadata": {"name": "n"}}]}}),
        ]:
            conn.request("POST", f"/{verb}", json.dumps(args), {"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 200
            answers.append(json.loads(response.read()))
        conn.close()
        assert null.filter_calls == 2
    assert not null.process.is_alive()
    assert answers[0] == {"NodeNames": names, "FailedNodes": {}, "Error": ""}
    assert answers[1] == [{"Host": "gpu-1", "Score": 0}, {"Host": "gpu-2", "Score": 0}]
    assert answers[2]["Nodes"] == {"items": [{"metadata": {"name": "n"}}]}
