"""An extender that decides nothing: the least any extender can cost kube-scheduler.

It answers kube-scheduler's two calls (``k8s.io/kube-scheduler`` ``extender/v1/types.go``:
an ``ExtenderFilterResult`` passing every node it was sent, a ``HostPriorityList`` of zeros) as
soon as it has read them, on keep-alive connections, from a thread of the bench's own process.
What kube-scheduler's throughput loses with it in the path is what two HTTP calls a pod cost
kube-scheduler itself (encoding the pod and the node list, the round trips, decoding the
answers) plus the least a Python server can take: the floor under any extender's cost on the
same machine, defrag's included.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as kube-scheduler's client uses it
    # the headers and the body are two writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux) — 90 ms a pod, measured
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
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


class NullExtender:
    """The server on 127.0.0.1:``port`` while in a ``with`` block."""

    def __init__(self, port: int) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.server.daemon_threads = True

    def __enter__(self) -> NullExtender:
        threading.Thread(target=self.server.serve_forever, args=(0.2,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["NullExtender"]
