"""The extender and the agent against the emulated API server: the live relist path, a
reservation set on the API and honoured after the next relist, and `defrag agent --once`
publishing through a kubeconfig."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from defrag.adapters.kube import KubeClusterSource, RetryPolicy
from defrag.cli import app
from defrag.extender.server import ExtenderHTTPServer, serve, stop
from defrag.model.resources import NVLINK_DOMAINS_ANNOTATION, RESERVED_FOR_ANNOTATION
from tests.support import kubeobjects as k
from tests.support.extender_http import post_ok as post
from tests.support.kubeapi import KubeApi, running
from tests.support.snapshots import worked_example
from tests.test_agent import FakeNvml, two_islands

FAST = RetryPolicy(attempts=1, backoff_s=0.0, timeout_s=2.0)
NAMES = ["node-1", "node-2", "node-3"]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    yield from running(worked_example()["items"])


@pytest.fixture
def live(api: KubeApi) -> Iterator[ExtenderHTTPServer]:
    source = KubeClusterSource(api.client(), retry=FAST)
    srv = serve(source, host="127.0.0.1", port=0, relist_interval_s=0.05)
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    stop(srv)


def wait_for(predicate: Any, what: str) -> None:
    """Poll until the relist thread has caught up (bounded; not a timing assertion)."""
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_live_relist_follows_the_api(api: KubeApi, live: ExtenderHTTPServer) -> None:
    pod = k.pod("small", "default", 1, owner=None)
    scores = post(live, "prioritize", {"pod": pod, "nodenames": NAMES})
    assert [h["Host"] for h in scores if h["Score"] == 10] == ["node-1"]

    # make-room reserved node-1 for another pod: after the next relist, "small" is kept off.
    node = api.get("Node", "node-1")
    assert node is not None
    node["metadata"].setdefault("annotations", {})[RESERVED_FOR_ANNOTATION] = "ml/vip"
    api.put(node)

    def reserved() -> bool:
        view = live.extender.cache.view()
        return view is not None and "node-1" in view.reserved_for

    wait_for(reserved, "the reservation to be relisted")
    result = post(live, "filter", {"pod": pod, "nodenames": NAMES})
    assert "ml/vip" in result["FailedAndUnresolvableNodes"]["node-1"]
    assert result["NodeNames"] == ["node-2", "node-3"]
    vip = k.pod("vip", "ml", 1, owner=None)
    assert "node-1" in post(live, "filter", {"pod": vip, "nodenames": NAMES})["NodeNames"]
    # Only reads: the extender never writes to the API.
    assert {r.verb for r in api.requests} == {"list"}


def test_agent_once_publishes_through_a_kubeconfig(
    api: KubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": api.url}}],
                "users": [{"name": "emu", "user": {"token": "t"}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(two_islands()))
    result = CliRunner().invoke(
        app,
        ["agent", "--once", "--node", "node-2", "--kubeconfig", str(kubeconfig), "-o", "json"],
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)  # stderr (logs, server noise) is not part of it
    assert printed["annotation"] == {NVLINK_DOMAINS_ANNOTATION: "0-3,4-7"}
    assert printed["driver_version"] == "550.54.15"
    assert len(printed["gpus"]) == 8
    node = api.get("Node", "node-2")
    assert node is not None
    assert node["metadata"]["annotations"][NVLINK_DOMAINS_ANNOTATION] == "0-3,4-7"


def test_unknown_node_triggers_a_relist_at_once(api: KubeApi) -> None:
    source = KubeClusterSource(api.client(), retry=FAST)
    srv = serve(source, host="127.0.0.1", port=0, relist_interval_s=3600)
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    try:
        api.put(k.node("node-4"))  # joins after the first relist
        pod = k.pod("small", "default", 1, owner=None)
        names = [*NAMES, "node-4"]
        result = post(srv, "filter", {"pod": pod, "nodenames": names})
        assert "node-4" in result["FailedNodes"]

        def known() -> bool:
            view = srv.extender.cache.view()
            return view is not None and "node-4" in view.cluster.arrays.index

        wait_for(known, "the nudged relist")  # well before the 3600 s interval
        assert "node-4" in post(srv, "filter", {"pod": pod, "nodenames": names})["NodeNames"]
    finally:
        srv.shutdown()
        stop(srv)
