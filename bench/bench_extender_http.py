"""The extender's CPU per pod in kube-scheduler's path, HTTP server included, without an API
server: where its process's CPU goes, part by part.

:mod:`bench.bench_extender_binding`'s loop with what it leaves out: the requests go over one
keep-alive connection to the extender's own HTTP server (:func:`defrag.extender.server.serve`'s
server: limits, metrics, the request and answer JSON), shaped as kube-scheduler's Go client
sends them (its headers; the Pod as the API server defaults it), and each binding comes back as
the API server's watch event (the whole Pod, ``managedFields`` and all, as one JSON line), decoded
as the Kubernetes client decodes it and applied on a thread of its own, as the watch thread does.
The client writes pre-encoded requests and reads the answers with plain socket calls, so that
the process's CPU is nearly all the extender's; the client thread's own CPU is taken out.

Per run: the extender's CPU per pod (the process's less the client thread's), the filter's
mean and p99 wall time as the client sees it, the view builds. ``--profile FILE`` profiles
every thread of the server (a ``cProfile`` per thread on CPU time, merged) and prints the
parts' shares; ``--base DIR`` runs another checkout's code in the same invocation, the two
interleaved run by run.

    .venv/bin/python -m bench.bench_extender_http --nodes 1000 --pods 300 --base ../ext-base
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import queue
import resource
import runpy
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.calibrate import calibrate

PARTS = (
    ("HTTP: request line and headers", ("http/server.py:parse_request",)),
    ("HTTP: request body read", ("server.py:_read_exact", "server.py:_read_chunked")),
    ("HTTP: answer written", ("httpserve.py:send_body",)),
    ("metrics", ("metrics.py:labels", "metrics.py:inc", "metrics.py:observe")),
    ("request log", ("http/server.py:log_request",)),
    ("request JSON (parse_args)", ("wire.py:parse_args",)),
    ("answer JSON", ("jsonio.py:dumps", "wire.py:encode_priorities_at")),
    ("filter (verbs, the view ahead included)", ("verbs.py:filter",)),
    ("prioritize (verbs)", ("verbs.py:_scored",)),
    ("watch event: decode, trim, convert, apply", ("bench_extender_http.py:watch_event",)),
    ("view builds (builder thread)", ("state.py:_build_loop",)),
)
"""Each part's name and the functions (``file:function``, by its end) whose inclusive CPU time
it is; the parts do not nest in one another."""


def api_pod(name: str, node: str | None, version: int) -> dict[str, Any]:
    """A pending 1-GPU pod as the API server serves it for the throughput bench's pods
    (``tests/e2e/cluster.pod_spec``): defaults, the service account's volume, managedFields."""
    created = "2026-12-04T17:30:00Z"
    spec: dict[str, Any] = {
        "volumes": [
            {
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {
                                            "apiVersion": "v1",
                                            "fieldPath": "metadata.namespace",
                                        },
                                    }
                                ]
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "limits": {"nvidia.com/gpu": "1"},
                    "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                },
                "volumeMounts": [
                    {
                        "name": "kube-api-access-x7k2p",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "defrag-scheduler",
        "tolerations": [
            {
                "key": key,
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    managed: list[dict[str, Any]] = [
        {
            "manager": "python-requests",
            "operation": "Update",
            "apiVersion": "v1",
            "time": created,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {
                    "f:containers": {
                        'k:{"name":"main"}': {
                            ".": {},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
                        }
                    },
                    "f:schedulerName": {},
                    "f:terminationGracePeriodSeconds": {},
                },
            },
        }
    ]
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
    if node is not None:
        spec["nodeName"] = node
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": created,
            }
        ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "throughput",
            "uid": f"7c0d6f0e-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": str(version),
            "creationTimestamp": created,
            "labels": {"app": "tp"},
            "managedFields": managed,
        },
        "spec": spec,
        "status": status,
    }


def go_request(verb: str, port: int, body: bytes) -> bytes:
    """A POST as Go's net/http client writes it (kube-scheduler's extender client)."""
    head = (
        f"POST /{verb} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: Go-http-client/1.1\r\n"
        f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n"
        "Accept-Encoding: gzip\r\n\r\n"
    )
    return head.encode() + body


def read_answer(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """One answer's status code and body (``Content-Length`` framed) off ``sock``; ``buf``
    holds what was read past it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server hung up")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
    code = int(head[0].split()[1])
    length = next(
        int(line.split(":", 1)[1]) for line in head if line.lower().startswith("content-length:")
    )
    del buf[: end + 4]
    while len(buf) < length:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server hung up")
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return code, body


def _profiled(target: Callable[..., Any], profiles: list[cProfile.Profile]) -> Callable[..., Any]:
    """``target`` run under a CPU-time profile of its own thread (appended to ``profiles``)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        profile = cProfile.Profile(timer=time.thread_time)
        profiles.append(profile)
        profile.enable()
        try:
            return target(*args, **kwargs)
        finally:
            profile.disable()

    return run


def one_run(
    n_nodes: int,
    n_pods: int,
    profile_to: str = "",
    rate: float = 60.0,
    min_interval_s: float | None = None,
) -> dict[str, Any]:
    """The loop in this process, with whatever ``defrag`` is on the path: ``rate`` pods a second
    at most (kube-scheduler's pace with the extender, so that a build covers as many bindings
    as in its path; 0: as fast as the answers come)."""
    import orjson

    from bench.bench_extender_load import fed_store, lists, nodes_to_find
    from defrag.extender import server as ext_server
    from defrag.extender.state import ClusterCache
    from defrag.scoring.profile import ProfileConfig

    store = fed_store(n_nodes, pod_gpus=())
    kinds = {kind.name: kind for kind in store._kinds}
    names = [f"p-{i:06d}" for i in range(n_pods)]
    for i, name in enumerate(names):
        store._apply(kinds["Pod"], {"type": "ADDED", "raw_object": api_pod(name, None, 5000 + i)})

    # this checkout's, by path: in a --base child ``bench`` is the other checkout's
    fed = runpy.run_path(str(Path(__file__).with_name("fed_source.py")))["FedSource"]
    source = fed(store, wakes=True)
    profiles: list[cProfile.Profile] = []
    cache_class = ClusterCache
    if profile_to:

        class ProfiledCache(ClusterCache):
            """The cache whose builder thread is profiled (the class itself left as it is)."""

            def _build_loop(self) -> None:
                _profiled(super()._build_loop, profiles)()

        cache_class = ProfiledCache
    cache = cache_class(
        source,
        ProfileConfig(policy="reserve-binpack"),
        **({} if min_interval_s is None else {"min_interval_s": min_interval_s}),
    )
    metrics = ext_server.ExtenderMetrics.create(cache)
    cache.on_relist = metrics.observe_relist
    cache.on_fresh = metrics.observe_fresh
    server = ext_server.ExtenderHTTPServer(("127.0.0.1", 0), ext_server.Extender(cache), metrics)
    if profile_to:  # each connection's thread, on this server only
        server.process_request_thread = _profiled(  # type: ignore[method-assign]
            server.process_request_thread, profiles
        )
    cache.start()
    serving = threading.Thread(target=server.serve_forever, args=(0.5,), daemon=True)
    serving.start()
    port = server.server_address[1]

    # The binding's watch event, as the watch thread gets it: one JSON line, decoded as the
    # Kubernetes client's Watch.unmarshal_event does, applied to the store.
    events: queue.Queue[bytes | None] = queue.Queue()

    def watch_event(line: bytes) -> None:
        event = json.loads(line.decode("utf-8"))
        event["raw_object"] = event["object"]
        store._apply(kinds["Pod"], event)

    def watcher() -> None:
        while (line := events.get()) is not None:
            watch_event(line)

    watching = threading.Thread(
        target=_profiled(watcher, profiles) if profile_to else watcher, daemon=True
    )
    watching.start()

    node_lists = lists(n_nodes, nodes_to_find(n_nodes), n_pods)
    pending_pods = [api_pod(name, None, 5000 + i) for i, name in enumerate(names)]
    filters = [
        go_request(
            "filter", port, orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": node_lists[i]})
        )
        for i, p in enumerate(pending_pods)
    ]
    wall: list[float] = []
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    builds0 = store._builder.partial_builds + store._builder.full_builds
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    client_cpu0, process0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    try:
        for i, pod in enumerate(pending_pods):
            t0 = time.perf_counter()
            sock.sendall(filters[i])
            code, answer = read_answer(sock, buf)
            wall.append(time.perf_counter() - t0)
            if code != 200:
                raise RuntimeError(f"filter: {code} {answer[:200]!r}")
            passed = orjson.loads(answer)["NodeNames"]
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed})
            sock.sendall(go_request("prioritize", port, body))
            code, answer = read_answer(sock, buf)
            if code != 200:
                raise RuntimeError(f"prioritize: {code} {answer[:200]!r}")
            bound = api_pod(names[i], passed[0], 10_000 + i)
            events.put(orjson.dumps({"type": "MODIFIED", "object": bound}) + b"\n")
            if rate > 0:
                time.sleep(max(0.0, wall0 + (i + 1) / rate - time.perf_counter()))
        events.put(None)
        watching.join()
        client_s = time.thread_time() - client_cpu0
        process_s, wall_s = time.process_time() - process0, time.perf_counter() - wall0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    finally:
        sock.close()
        server.shutdown()
        ext_server.stop(server)
    wall.sort()
    builder = store._builder
    out: dict[str, Any] = {
        "extender_cpu_ms_per_pod": (process_s - client_s) * 1e3 / n_pods,
        "client_cpu_ms_per_pod": client_s * 1e3 / n_pods,
        "filter_mean_ms": statistics.mean(wall) * 1e3,
        "filter_p99_ms": wall[min(len(wall) - 1, int(len(wall) * 0.99))] * 1e3,
        "wall_ms_per_pod": wall_s * 1e3 / n_pods,
        "page_faults_per_pod": faults / n_pods,
        "builds": builder.partial_builds + builder.full_builds - builds0,
    }
    if profile_to:
        import pstats

        stats = pstats.Stats(profiles[0])
        for other in profiles[1:]:
            stats.add(other)
        stats.dump_stats(profile_to)
        out["parts_ms_per_pod"] = parts(stats, n_pods)
    return out


def parts(stats: Any, n_pods: int) -> dict[str, float]:
    """The inclusive CPU ms per pod of each of :data:`PARTS` (a function's cumulative time,
    summed over the functions a part names), and of every profiled thread together."""
    got: dict[str, float] = {}
    for label, needles in PARTS:
        total = 0.0
        for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
            if f"{file}:{func}".endswith(needles):
                total += ct
        got[label] = round(total * 1e3 / n_pods, 3)
    total = sum(tt for (_cc, _nc, tt, _ct, _callers) in stats.stats.values())
    got["all profiled threads"] = round(total * 1e3 / n_pods, 3)
    return got


def in_child(
    folder: Path, n_nodes: int, n_pods: int, rate: float, profile_to: str = "", requests: int = 0
) -> dict[str, Any]:
    """:func:`one_run` of this file in a fresh process whose ``defrag`` is ``folder``'s (with
    ``requests``, :func:`server_only` of that many requests instead)."""
    env = {**os.environ, "PYTHONPATH": str(folder)}
    argv = [sys.executable, "-c", RUN_CHILD, __file__, str(n_nodes), str(n_pods), profile_to]
    argv += [str(rate), str(requests)]
    done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the run in {folder} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


RUN_CHILD = """
import json, runpy, sys
here = runpy.run_path(sys.argv[1])
nodes, pods, profile_to, rate, requests = sys.argv[2:7]
if int(requests):
    print(json.dumps(here["server_only"](int(requests))))
else:
    print(json.dumps(here["one_run"](int(nodes), int(pods), profile_to, float(rate))))
"""

FIGURES = (
    "extender_cpu_ms_per_pod",
    "client_cpu_ms_per_pod",
    "filter_mean_ms",
    "filter_p99_ms",
    "wall_ms_per_pod",
    "page_faults_per_pod",
    "builds",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=60.0, help="pods a second at most")
    parser.add_argument("--base", type=Path, help="another checkout, run in the same invocation")
    parser.add_argument(
        "--server-only",
        type=int,
        default=0,
        metavar="N",
        help="measure the HTTP server alone (its verbs stubbed) over N requests a run",
    )
    parser.add_argument(
        "--profile", default="", help="profile each run's server threads; a pstats file prefix"
    )
    args = parser.parse_args(argv)
    cal = calibrate(3)
    print(f"calibration {cal:.3f} s; load {os.getloadavg()}", flush=True)
    here = Path(__file__).resolve().parent.parent
    which = {"HEAD": here} | ({"base": args.base.resolve()} if args.base else {})
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in which}
    if args.server_only:
        return _server_only(which, args.runs, args.server_only)
    for run in range(args.runs):
        order = list(which) if run % 2 == 0 else list(reversed(which))
        for name in order:
            to = str(Path(f"{args.profile}-{name}-{run + 1}.pstats").resolve())
            result = in_child(
                which[name], args.nodes, args.pods, args.rate, to if args.profile else ""
            )
            got[name].append(result)
            shown = ", ".join(f"{k} {result[k]:.3f}" for k in FIGURES)
            print(f"run {run + 1} {name}: {shown}; load {os.getloadavg()[0]:.2f}", flush=True)
            for part, ms in result.get("parts_ms_per_pod", {}).items():
                print(f"    {part}: {ms:.3f} ms a pod", flush=True)
    for name, runs in got.items():
        medians = ", ".join(f"{k} {statistics.median(r[k] for r in runs):.3f}" for k in FIGURES)
        print(f"{name} ({args.nodes} nodes, {args.pods} pods), median of {len(runs)}: {medians}")
    print(f"calibration after {calibrate(3):.3f} s; load {os.getloadavg()}")
    return 0


def _server_only(which: dict[str, Path], runs: int, requests: int) -> int:
    got: dict[str, list[float]] = {name: [] for name in which}
    for run in range(runs):
        for name in list(which) if run % 2 == 0 else list(reversed(which)):
            result = in_child(which[name], 0, 0, 0.0, "", requests)
            got[name].append(result["server_cpu_us_per_request"])
            print(
                f"run {run + 1} {name}: server CPU {got[name][-1]:.1f} µs a request; "
                f"load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    for name, values in got.items():
        print(f"{name}, median of {runs}: server CPU {statistics.median(values):.1f} µs a request")
    print(f"calibration after {calibrate(3):.3f} s; load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def server_only(n_requests: int, body_bytes: int = 7000) -> dict[str, Any]:
    """The HTTP server's own CPU per request, with whatever ``defrag`` is on the path: the
    extender's server over one keep-alive connection, its verbs stubbed (no parsing, a fixed
    answer of the size a filter's is), so that what is left is reading the request, its
    headers and body, the metrics, the log and writing the answer."""
    from defrag.extender import server as ext_server

    class Stub:
        cache = None

        def filter(self, args: Any) -> dict[str, Any]:
            return {"NodeNames": [f"gpu-{i:05d}" for i in range(420)], "Error": ""}

        def prioritize_body(self, args: Any) -> bytes:
            return b"[]"

    parse_args = ext_server.parse_args
    ext_server.parse_args = lambda body: None  # type: ignore[assignment,misc]
    try:
        metrics = ext_server.ExtenderMetrics.create()
        server = ext_server.ExtenderHTTPServer.__new__(ext_server.ExtenderHTTPServer)
        ext_server.BoundedHTTPServer.__init__(server, ("127.0.0.1", 0), ext_server._Handler)
        server.extender = Stub()  # type: ignore[assignment]
        server.metrics = metrics
        server.max_body_bytes = ext_server.MAX_BODY_BYTES
        server.body_budget = ext_server.BodyBudget(ext_server.BODY_BUDGET_BYTES, 10.0)
        threading.Thread(target=server.serve_forever, args=(0.5,), daemon=True).start()
        port = server.server_address[1]
        request = go_request("filter", port, b"x" * body_bytes)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        client0, process0 = time.thread_time(), time.process_time()
        for _ in range(n_requests):
            sock.sendall(request)
            code, _answer = read_answer(sock, buf)
            if code != 200:
                raise RuntimeError(f"answer {code}")
        client_s, process_s = time.thread_time() - client0, time.process_time() - process0
        sock.close()
        server.shutdown()
        server.server_close()
    finally:
        ext_server.parse_args = parse_args
    return {"server_cpu_us_per_request": (process_s - client_s) * 1e6 / n_requests}
