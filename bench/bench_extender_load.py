"""The extender under load and abuse, in its own process, over real sockets (issue 15).

1. 4 concurrent clients × 2,000 ``prioritize`` calls at 1,000 nodes (NodeNames mode, each on
   its keep-alive connection): p50/p99, and the server's RSS before and after (flat?).
2. 25 stalled clients (half a request line, then nothing) while one client makes 500 calls:
   all answered? p99; how many stalled connections the server closed (read deadline).
3. 10 concurrent maximal bodies: ``Nodes``-mode requests for 5,000 nodes with 50 images each
   (55 MB, ``bench/extender_bodies.py``) against a 5,000-node server: the answers (200, or 503
   while the body budget is taken) and the server's peak RSS (``VmHWM``) against its 1 GiB limit.

4. (``--fleet 1000,5000,20000``, alone) a large fleet: per size N, N nodes of 8 GPUs and 10 pods
   each (200,000 pods at 20,000 nodes), real-shaped objects applied to the watched store as ADDED
   watch events (``KubeWatchSource``'s own event path; no API server), served in its own process;
   ``filter`` then ``prioritize`` per pod, with the node lists kube-scheduler sends at that size
   (:func:`nodes_to_find`) and with every node, one client and four: p50/p99 per verb, the
   server's RSS, and how each grows with N (the exponent of a log-log fit); then each verb's own
   CPU per answer (thread time, in this process, no HTTP), which tells the work from the waits.

    nice -n 15 .venv/bin/python -m bench.bench_extender_load [--calls 2000] [--clients 4]
    .venv/bin/python -m bench.bench_extender_load --fleet 1000,5000,20000
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import multiprocessing.queues
import os
import socket
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from kubernetes import client as kube_client

from bench.bench_extender import _Static, make_cluster, request_body
from bench.bench_extender_http import go_request, read_answer
from bench.extender_bodies import nodes_body
from bench.fed_source import FedSource
from bench.forked import default_signals
from defrag.adapters.httpserve import ServerLimits
from defrag.adapters.kube_convert import paused_gc
from defrag.adapters.kube_watch import KubeWatchSource
from defrag.extender.pace import serving_pace
from defrag.extender.server import ExtenderHTTPServer, ExtenderMetrics, serve, stop
from defrag.extender.state import ClusterCache, make_view
from defrag.extender.verbs import Extender
from defrag.extender.wire import parse_args
from defrag.scoring.profile import ProfileConfig
from tests.support import kubeobjects


def _serve(n_nodes: int, ready: multiprocessing.queues.Queue[int]) -> None:
    default_signals()
    srv = serve(
        _Static(make_cluster(n_nodes)),
        host="127.0.0.1",
        port=0,
        limits=ServerLimits(max_connections=64, idle_timeout_s=30.0, read_timeout_s=10.0),
    )
    ready.put(int(srv.server_address[1]))
    try:
        with serving_pace():
            srv.serve_forever(0.5)
    finally:
        stop(srv)


def start(n_nodes: int) -> tuple[multiprocessing.process.BaseProcess, int]:
    ctx = multiprocessing.get_context("fork")
    ready: multiprocessing.queues.Queue[int] = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(n_nodes, ready), daemon=True)
    proc.start()
    return proc, ready.get(timeout=120)


def cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int | None, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def client(
    port: int, bodies: list[bytes], calls: int, out: list[float], codes: Counter[int]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(calls):
        t0 = time.perf_counter()
        conn.request(
            "POST", "/prioritize", bodies[i % len(bodies)], {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        resp.read()
        out.append(time.perf_counter() - t0)
        codes[resp.status] += 1
    conn.close()


def pct(samples: list[float]) -> str:
    arr = np.array(samples) * 1000
    p50, p99 = np.percentile(arr, 50), np.percentile(arr, 99)
    return f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {arr.max():.1f} ms"


def load(port: int, pid: int | None, clients: int, calls: int) -> None:
    names = [f"gpu-{i:05d}" for i in range(1000)]
    bodies = [request_body(names, g) for g in (1, 2, 4, 8)]
    client(port, bodies, 50, [], Counter())  # warm-up
    before = rss_mib(pid)
    samples: list[float] = []
    codes: Counter[int] = Counter()
    threads = [
        threading.Thread(target=client, args=(port, bodies, calls, samples, codes))
        for _ in range(clients)
    ]
    t0, cpu0 = time.perf_counter(), cpu_s(pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    per_call = (cpu_s(pid) - cpu0) / max(len(samples), 1) * 1000
    print(
        f"1. {clients} x {calls} prioritize at 1,000 nodes: {pct(samples)}; codes {dict(codes)}; "
        f"{len(samples) / wall:.0f} req/s; server CPU {per_call:.2f} ms per call; "
        f"RSS {before:.0f} -> {rss_mib(pid):.0f} MiB"
    )


def stalled(port: int, pid: int | None, calls: int) -> None:
    socks = []
    for _ in range(25):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /prior")
        socks.append(s)
    names = [f"gpu-{i:05d}" for i in range(1000)]
    samples: list[float] = []
    codes: Counter[int] = Counter()
    client(port, [request_body(names, 1)], calls, samples, codes)
    time.sleep(11)  # past the 10 s read deadline
    closed = 0
    for s in socks:
        s.settimeout(0.5)
        try:
            closed += s.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            closed += 1
        s.close()
    print(
        f"2. 25 stalled clients, {calls} calls from another: {pct(samples)}; codes {dict(codes)}; "
        f"stalled connections closed by the server after 11 s: {closed}/25; "
        f"RSS {rss_mib(pid):.0f} MiB"
    )


def maximal(port: int, pid: int | None) -> None:
    body = nodes_body(5000)
    base = rss_mib(pid)
    codes: Counter[int] = Counter()
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            code = resp.status
        except OSError:
            code = 0
        with lock:
            codes[code] += 1

    threads = [threading.Thread(target=one) for _ in range(10)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        f"3. 10 concurrent {len(body) / 1e6:.1f} MB Nodes-mode bodies (5,000 nodes): codes "
        f"{dict(codes)} in {time.perf_counter() - t0:.1f} s; server RSS {base:.0f} MiB before, "
        f"peak (VmHWM) {rss_mib(pid, 'VmHWM'):.0f} MiB, after {rss_mib(pid):.0f} MiB"
    )


# --- 4. a large fleet: the watched store fed through the watch's event path -------------------

MIN_FEASIBLE_NODES = 100
"""kube-scheduler's ``minFeasibleNodesToFind`` (kubernetes/kubernetes
pkg/scheduler/schedule_one.go)."""
MIN_FEASIBLE_PERCENT = 5
"""kube-scheduler's ``minFeasibleNodesPercentageToFind`` (same file)."""


def nodes_to_find(n: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops (and so the longest node
    list it sends an extender), with ``percentageOfNodesToScore`` unset: its
    ``numFeasibleNodesToFind`` (kubernetes/kubernetes pkg/scheduler/schedule_one.go) — every node
    below 100; else max(50 − n/125, 5) % of n (integer division), at least 100."""
    if n < MIN_FEASIBLE_NODES:
        return n
    percent = max(50 - n // 125, MIN_FEASIBLE_PERCENT)
    return max(n * percent // 100, MIN_FEASIBLE_NODES)


PODS_PER_NODE = 10
"""200,000 pods on 20,000 nodes of 8 GPUs (the issue's large fleet)."""
POD_GPUS = (1, 1, 1, 1, 2, 0, 0, 0, 0, 0)
"""Each node's pods: four of 1 GPU, one of 2, five without GPUs (6 of its 8 GPUs taken)."""


def fed_store(n_nodes: int, pod_gpus: tuple[int, ...] = POD_GPUS) -> KubeWatchSource:
    """A store holding ``n_nodes`` 8-GPU nodes and a bound pod of each of ``pod_gpus`` GPUs on
    each (real-shaped objects, tests/support/kubeobjects.py), each applied as an ADDED watch
    event."""
    config = kube_client.Configuration()
    config.host = "http://127.0.0.1:9"  # never reached: nothing is listed or watched
    store = KubeWatchSource(kube_client.ApiClient(config))
    kinds = {kind.name: kind for kind in store._kinds}
    for kind in kinds.values():
        kind.listed = True
    with paused_gc():
        for i in range(n_nodes):
            node = f"gpu-{i:05d}"
            store._apply(kinds["Node"], {"type": "ADDED", "raw_object": kubeobjects.node(node)})
            for j, gpus in enumerate(pod_gpus):
                pod = kubeobjects.pod(
                    f"w-{i:05d}-{j}", f"team-{i % 50}", gpus, node_name=node, phase="Running"
                )
                store._apply(kinds["Pod"], {"type": "ADDED", "raw_object": pod})
    return store


def binding_costs(store: KubeWatchSource, config: ProfileConfig, bindings: int) -> dict[str, float]:
    """Median milliseconds of what one pod's binding costs the extender, by part: the store's
    build after the MODIFIED event (its partial build, ``adapters/store_build.py``), the view
    carried from the last (``make_view(..., previous=)``) and, of the same cluster, the view from
    scratch and the workload mix observed over every pod (``ProfileConfig.for_cluster``): a view
    from scratch plus that mix is what each binding cost before the view was carried."""
    kind = next(k for k in store._kinds if k.name == "Pod")
    n_nodes = len(store.objects("Node"))
    pending = [
        kubeobjects.pod(f"bench-{i:04d}", "bench", 1, phase="Pending") for i in range(bindings)
    ]
    for pod in pending:
        store._apply(kind, {"type": "ADDED", "raw_object": pod})
    cluster, generation = store.build()
    view = make_view(cluster, config, 0.0, generation)
    parts: dict[str, list[float]] = {"store": [], "carried": [], "scratch": [], "mix": []}
    for i, pod in enumerate(pending):
        pod["spec"]["nodeName"] = f"gpu-{(i * 7919) % n_nodes:05d}"
        pod["metadata"]["resourceVersion"] = str(10_000 + i)
        store._apply(kind, {"type": "MODIFIED", "raw_object": pod})
        t0 = time.perf_counter()
        cluster, generation = store.build()
        t1 = time.perf_counter()
        view = make_view(cluster, config, 0.0, generation, previous=view)
        t2 = time.perf_counter()
        make_view(cluster, config, 0.0, generation)
        t3 = time.perf_counter()
        config.for_cluster(cluster)  # the observed mix, which every view derived before
        t4 = time.perf_counter()
        parts["store"].append(t1 - t0)
        parts["carried"].append(t2 - t1)
        parts["scratch"].append(t3 - t2)
        parts["mix"].append(t4 - t3)
    return {name: statistics.median(values) * 1e3 for name, values in parts.items()}


def _serve_fed(
    n_nodes: int, ready: multiprocessing.queues.Queue[tuple[int, float, dict[str, float]]]
) -> None:
    default_signals()
    t0 = time.perf_counter()
    store = fed_store(n_nodes)
    t1 = time.perf_counter()
    costs = binding_costs(store, ProfileConfig(), 50)  # before the cache builds beside it
    t0 += time.perf_counter() - t1  # not part of the fill and first build
    cache = ClusterCache(FedSource(store), ProfileConfig())
    metrics = ExtenderMetrics.create(cache)
    srv = ExtenderHTTPServer(
        ("127.0.0.1", 0),
        Extender(cache),
        metrics,
        ServerLimits(max_connections=64, idle_timeout_s=30.0, read_timeout_s=10.0),
    )
    cache.start()
    built_s = time.perf_counter() - t0
    ready.put((int(srv.server_address[1]), built_s, costs))
    try:
        with serving_pace():  # as `defrag extender` serves
            srv.serve_forever(0.5)
    finally:
        stop(srv)


def lists(n_nodes: int, length: int, count: int) -> list[list[str]]:
    """``count`` node lists of ``length`` names as kube-scheduler sends them: each starts where
    the last stopped (its ``nextStartNodeIndex``), wrapping around the node list."""
    names = [f"gpu-{i:05d}" for i in range(n_nodes)]
    out, start = [], 0
    for _ in range(count):
        out.append([names[(start + k) % n_nodes] for k in range(length)])
        start = (start + length) % n_nodes
    return out


def verb_client(
    port: int, bodies: list[bytes], out: dict[str, list[float]], codes: Counter[int]
) -> None:
    """Each body as kube-scheduler sends it for one pod: ``filter``, then ``prioritize``, each
    written as Go's client writes it, pre-encoded, on one keep-alive connection."""
    verbs = ("filter", "prioritize")
    requests = [[(v, go_request(v, port, body)) for v in verbs] for body in bodies]
    buf = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for pod in requests:
            for verb, request in pod:
                t0 = time.perf_counter()
                sock.sendall(request)
                code, _ = read_answer(sock, buf)
                out[verb].append(time.perf_counter() - t0)
                codes[code] += 1


def _client_process(
    port: int, bodies: list[bytes], answers: multiprocessing.queues.Queue[Any]
) -> None:
    default_signals()
    out: dict[str, list[float]] = {"filter": [], "prioritize": []}
    codes: Counter[int] = Counter()
    verb_client(port, bodies, out, codes)
    answers.put((out, dict(codes)))


def clients_at_once(
    port: int, shares: list[list[bytes]], how: str
) -> tuple[dict[str, list[float]], Counter[int]]:
    """Every share's pods from its own client at the same time: each client a process of its
    own (``processes``: separate kube-schedulers, none waiting for another's interpreter) or a
    thread of this one (``threads``: the clients queue on this process's interpreter too)."""
    samples: dict[str, list[float]] = {"filter": [], "prioritize": []}
    codes: Counter[int] = Counter()
    if how == "threads":
        threads = [
            threading.Thread(target=verb_client, args=(port, share, samples, codes))
            for share in shares
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return samples, codes
    ctx = multiprocessing.get_context("fork")
    answers: multiprocessing.queues.Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=(port, s, answers)) for s in shares]
    for proc in procs:
        proc.start()
    for _ in procs:
        out, got = answers.get(timeout=3600)
        for verb, times in out.items():
            samples[verb] += times
        codes.update(got)
    for proc in procs:
        proc.join()
    return samples, codes


@dataclass(frozen=True, slots=True)
class FleetFigure:
    nodes: int
    list_len: int
    clients: int
    p99_ms: dict[str, float]
    p50_ms: dict[str, float]


def fleet_one(
    n_nodes: int, calls: int, how: str = "processes"
) -> tuple[list[FleetFigure], dict[str, float]]:
    ctx = multiprocessing.get_context("fork")
    ready: multiprocessing.queues.Queue[tuple[int, float, dict[str, float]]] = ctx.Queue()
    proc = ctx.Process(target=_serve_fed, args=(n_nodes, ready), daemon=True)
    proc.start()
    figures: list[FleetFigure] = []
    try:
        port, built_s, costs = ready.get(timeout=3600)
        memory = {"rss_mib": rss_mib(proc.pid), "built_s": built_s}
        print(
            f"4. {n_nodes:,} nodes: one binding costs the extender (median of 50) the store's "
            f"build {costs['store']:.2f} ms + the view carried {costs['carried']:.2f} ms = "
            f"{costs['store'] + costs['carried']:.2f} ms; before, with a view from scratch "
            f"({costs['scratch']:.2f} ms) and the mix of every pod ({costs['mix']:.2f} ms): "
            f"{costs['store'] + costs['scratch'] + costs['mix']:.2f} ms",
            flush=True,
        )
        for length in sorted({nodes_to_find(n_nodes), n_nodes}):
            pods = [
                request_body(names, g)
                for names, g in zip(
                    lists(n_nodes, length, calls), (1, 2, 4, 8) * calls, strict=False
                )
            ]
            verb_client(port, pods[:20], {"filter": [], "prioritize": []}, Counter())  # warm-up
            for clients in (1, 4):
                share = max(calls // clients, 1)
                samples, codes = clients_at_once(
                    port, [pods[c * share : (c + 1) * share] for c in range(clients)], how
                )
                if set(codes) != {200}:
                    raise SystemExit(f"{n_nodes} nodes: answers {dict(codes)}")
                p99 = {v: float(np.percentile(s, 99) * 1e3) for v, s in samples.items()}
                p50 = {v: float(np.percentile(s, 50) * 1e3) for v, s in samples.items()}
                figures.append(FleetFigure(n_nodes, length, clients, p99, p50))
                scheduler_list = length == nodes_to_find(n_nodes)
                which = "kube-scheduler's lists" if scheduler_list else "full lists"
                print(
                    f"4. {n_nodes:,} nodes, {length:,}-node lists, {clients} client(s), "
                    f"{len(samples['filter'])} pods: filter p50 {p50['filter']:.2f} / p99 "
                    f"{p99['filter']:.2f} ms, prioritize p50 {p50['prioritize']:.2f} / p99 "
                    f"{p99['prioritize']:.2f} ms; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                print(
                    f"fleet {n_nodes} nodes, {which}, {clients} client(s): p99 "
                    f"{max(p99.values()):.2f} ms (the slower verb)",
                    flush=True,
                )
        memory["rss_after_mib"] = rss_mib(proc.pid)
        memory["hwm_mib"] = rss_mib(proc.pid, "VmHWM")
    finally:
        proc.terminate()
        proc.join()
    print(
        f"4. {n_nodes:,} nodes, {n_nodes * PODS_PER_NODE:,} pods: store filled and first view "
        f"built in {memory['built_s']:.0f} s; server RSS {memory['rss_mib']:.0f} MiB, "
        f"{memory['rss_after_mib']:.0f} after the calls, peak (VmHWM) {memory['hwm_mib']:.0f} MiB",
        flush=True,
    )
    print(f"fleet {n_nodes} nodes: extender peak RSS {memory['hwm_mib']:.0f} MiB", flush=True)
    return figures, memory


def fleet_cpu(n_nodes: int, calls: int) -> dict[str, float]:
    """The CPU each verb takes on its own thread (``time.thread_time``) with kube-scheduler's
    lists, in this process without HTTP: the work of an answer, apart from the waits for a core
    that make up most of a p99 on a loaded machine. Returns the p99 per verb in ms."""
    store = fed_store(n_nodes)
    cache = ClusterCache(FedSource(store), ProfileConfig())
    cache.start()
    try:
        while cache.latest() is None:
            time.sleep(0.05)
        ext = Extender(cache)
        names = lists(n_nodes, nodes_to_find(n_nodes), calls)
        shapes = (1, 2, 4, 8) * calls
        pods = [parse_args(request_body(n, g)) for n, g in zip(names, shapes, strict=False)]
        for args in pods[:20]:  # warm-up
            ext.filter(args)
            ext.prioritize_body(args)
        spent: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for args in pods:
            for verb, call in (("filter", ext.filter), ("prioritize", ext.prioritize_body)):
                t0 = time.thread_time()
                call(args)
                spent[verb].append(time.thread_time() - t0)
    finally:
        cache.stop()
    p99 = {v: float(np.percentile(s, 99) * 1e3) for v, s in spent.items()}
    p50 = {v: float(np.percentile(s, 50) * 1e3) for v, s in spent.items()}
    print(
        f"4. {n_nodes:,} nodes, kube-scheduler's lists, CPU of the answer alone (no HTTP, "
        f"{calls} pods): filter p50 {p50['filter']:.2f} / p99 {p99['filter']:.2f} ms, "
        f"prioritize p50 {p50['prioritize']:.2f} / p99 {p99['prioritize']:.2f} ms",
        flush=True,
    )
    return p99


def exponent(sizes: list[int], values: list[float]) -> float:
    """The least-squares slope of log(value) over log(size): value ∝ size^slope."""
    return float(np.polyfit(np.log(sizes), np.log(values), 1)[0])


def fleet(sizes: list[int], calls: int, how: str = "processes") -> None:
    figures: list[FleetFigure] = []
    memory: dict[int, dict[str, float]] = {}
    for n in sizes:
        got, memory[n] = fleet_one(n, calls, how)
        figures += got
        fleet_cpu(n, calls)
    if len(sizes) < 2:
        return
    rss = [memory[n]["hwm_mib"] for n in sizes]
    print(f"4. growth with size ({', '.join(f'{n:,}' for n in sizes)} nodes):")
    per_node, fixed = np.polyfit(sizes, rss, 1)
    print(
        f"   server peak RSS ∝ N^{exponent(sizes, rss):.2f}; linear fit {fixed:.0f} MiB + "
        f"{per_node * 1000:.1f} MiB per 1,000 nodes (10 pods each)"
    )
    for which, pick in (("kube-scheduler's lists", min), ("full lists", max)):
        for clients in (1, 4):
            for verb in ("filter", "prioritize"):
                at = [
                    next(
                        f
                        for f in sorted(figures, key=lambda f: f.list_len)
                        if f.nodes == n
                        and f.clients == clients
                        and f.list_len == pick(g.list_len for g in figures if g.nodes == n)
                    ).p99_ms[verb]
                    for n in sizes
                ]
                print(
                    f"   {verb} p99, {which}, {clients} client(s) ∝ N^{exponent(sizes, at):.2f} "
                    f"({' / '.join(f'{v:.2f}' for v in at)} ms)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--skip-maximal", action="store_true")
    parser.add_argument(
        "--fleet",
        help="comma-separated node counts: run only part 4 (a fed watched store of 10 pods a "
        "node; kube-scheduler's node lists and the full list; 1 and 4 clients) at each",
    )
    parser.add_argument("--fleet-calls", type=int, default=400, help="pods per measurement")
    parser.add_argument(
        "--fleet-clients",
        choices=("processes", "threads"),
        default="processes",
        help="part 4's clients: each a process of its own (as separate kube-schedulers), or "
        "threads of this process, which then also wait for each other's interpreter",
    )
    opts = parser.parse_args()
    if opts.fleet:
        fleet([int(n) for n in opts.fleet.split(",") if n], opts.fleet_calls, opts.fleet_clients)
        return
    proc, port = start(1000)
    try:
        load(port, proc.pid, opts.clients, opts.calls)
        stalled(port, proc.pid, 500)
    finally:
        proc.terminate()
        proc.join()
    if not opts.skip_maximal:
        proc, port = start(5000)
        try:
            maximal(port, proc.pid)
        finally:
            proc.terminate()
            proc.join()


if __name__ == "__main__":
    main()
