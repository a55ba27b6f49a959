"""bench/bench_extender_http.py at a tiny size: every request is answered 200 over the server's
own HTTP (the loop raises otherwise), each binding's watch event reaches the store, and the
profile names the parts."""

from __future__ import annotations

from pathlib import Path

from bench.bench_extender_http import FIGURES, PARTS, api_pod, one_run, server_only


def test_the_http_loop_runs_and_profiles(tmp_path: Path) -> None:
    out = tmp_path / "run.pstats"
    result = one_run(30, 8, str(out), rate=0)
    assert set(FIGURES) <= result.keys()
    assert result["extender_cpu_ms_per_pod"] > 0
    assert out.stat().st_size > 0
    parts = result["parts_ms_per_pod"]
    assert {label for label, _ in PARTS} <= parts.keys()
    # The server's threads answered both verbs and the watcher applied the events.
    assert parts["request JSON (parse_args)"] > 0
    assert parts["watch event: decode, trim, convert, apply"] > 0
    assert parts["filter (verbs, the view ahead included)"] > 0
    assert parts["all profiled threads"] >= parts["request JSON (parse_args)"]


def test_the_pod_is_the_api_servers_shape() -> None:
    pending, bound = api_pod("p-000001", None, 7), api_pod("p-000001", "gpu-00003", 8)
    assert pending["spec"].get("nodeName") is None and bound["spec"]["nodeName"] == "gpu-00003"
    assert pending["metadata"]["uid"] == bound["metadata"]["uid"]  # the same pod, bound
    assert bound["metadata"]["resourceVersion"] == "8"
    assert pending["metadata"]["managedFields"]  # what the API server sends, trimmed by the store


def test_the_server_alone_answers_every_request() -> None:
    result = server_only(20)
    assert result["server_cpu_us_per_request"] > 0
