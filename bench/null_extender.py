"""An extender that decides nothing: the least any extender can cost kube-scheduler.

It answers kube-scheduler's two calls (``k8s.io/kube-scheduler`` ``extender/v1/types.go``:
an ``ExtenderFilterResult`` passing every node it was sent, a ``HostPriorityList`` of zeros) as
soon as it has read them, on keep-alive connections, from a process of its own (so that its CPU
is counted apart, as the extender's is, and the bench's threads do not hold its interpreter).
What kube-scheduler's throughput loses with it in the path is what two HTTP calls a pod cost
kube-scheduler itself (encoding the pod and the node list, the round trips, decoding the
answers) plus the least a Python server can take: the floor under any extender's cost on the
same machine, defrag's included.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.sharedctypes
import multiprocessing.synchronize
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.forked import default_signals


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's client uses it
    # the headers and the body are two writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux) — 90 ms a pod, measured
    disable_nagle_algorithm = True

    filter_calls: multiprocessing.sharedctypes.Synchronized[int] | None = None

    def do_POST(self) -> None:
        if self.path.endswith("/filter") and self.filter_calls is not None:
            with self.filter_calls.get_lock():
                self.filter_calls.value += 1
        args = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        names = args.get("NodeNames") or [
            n["metadata"]["name"] for n in ((args.get("Nodes") or {}).get("items") or [])
        ]
        answer: Any
        if self.path.endswith("/filter"):
            answer = {"NodeNames": names, "FailedNodes": {}, "Error": ""}
            if args.get("NodeNames") is None:
                answer = {"Nodes": args.get("Nodes"), "FailedNodes": {}, "Error": ""}
        else:
            answer = [{"Host": name, "Score": 0} for name in names]
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(
    port: int,
    calls: multiprocessing.sharedctypes.Synchronized[int],
    ready: multiprocessing.synchronize.Event,
) -> None:
    default_signals()
    _Handler.filter_calls = calls
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    ready.set()
    server.serve_forever(0.2)


class NullExtender:
    """The server on 127.0.0.1:``port``, in its own process, while in a ``with`` block."""

    def __init__(self, port: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._calls = ctx.Value("q", 0)
        self._ready = ctx.Event()
        self.process = ctx.Process(
            target=_serve, args=(port, self._calls, self._ready), daemon=True, name="null-extender"
        )

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    @property
    def filter_calls(self) -> int:
        """``filter`` calls answered so far."""
        return int(self._calls.value)

    def __enter__(self) -> NullExtender:
        self.process.start()
        if not self._ready.wait(30.0):
            self.process.kill()
            raise RuntimeError("the null extender did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.join(10.0)


__all__ = ["NullExtender"]
