"""The extender under load and abuse, in its own process, over real sockets (issue 15).

1. 4 concurrent clients × 2,000 ``prioritize`` calls at 1,000 nodes (NodeNames mode, each on
   its keep-alive connection): p50/p99, and the server's RSS before and after (flat?).
2. 25 stalled clients (half a request line, then nothing) while one client makes 500 calls:
   all answered? p99; how many stalled connections the server closed (read deadline).
3. 10 concurrent maximal bodies: ``Nodes``-mode requests for 5,000 nodes with 50 images each
   (55 MB, ``bench/extender_bodies.py``) against a 5,000-node server: the answers (200, or 503
   while the body budget is taken) and the server's peak RSS (``VmHWM``) against its 1 GiB limit.

    nice -n 15 .venv/bin/python -m bench.bench_extender_load [--calls 2000] [--clients 4]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import multiprocessing.queues
import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.bench_extender import _Static, make_cluster, request_body
from bench.extender_bodies import nodes_body
from defrag.adapters.httpserve import ServerLimits
from defrag.extender.server import serve, stop


def _serve(n_nodes: int, ready: multiprocessing.queues.Queue[int]) -> None:
    srv = serve(
        _Static(make_cluster(n_nodes)),
        host="127.0.0.1",
        port=0,
        limits=ServerLimits(max_connections=64, idle_timeout_s=30.0, read_timeout_s=10.0),
    )
    ready.put(int(srv.server_address[1]))
    try:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--skip-maximal", action="store_true")
    opts = parser.parse_args()
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
