"""A wall-clock deadline on a whole HTTP request made with requests, not on each socket read.

requests' ``timeout`` bounds connecting and each read: a server that sends one byte every
second never trips it. Here a request made inside ``with request_deadline(s):`` through a
session that has :class:`DeadlineAdapter` mounted is watched: a timer fires at the deadline and
shuts down the socket of every connection the request used (a blocked read returns at once and
requests raises); a connection opened or reused after the deadline is shut at once. The timer
is cancelled and joined when the block ends, so nothing outlives the request.

The deadline belongs to the thread that opened the block (a ``threading.local``); requests
made in other threads are not affected.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = ["Deadline", "DeadlineAdapter", "request_deadline"]


class Deadline:
    """One request's wall-clock limit (see the module's docstring)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._timer = threading.Timer(seconds, self.expire)
        self._timer.daemon = True
        self._timer.name = "request-deadline"
        self._timer.start()

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def watch(self, conn: Any) -> None:
        with self._lock:
            if not any(c is conn for c in self._conns):
                self._conns.append(conn)
            if self.expired:
                _shut(conn)

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for conn in self._conns:
                _shut(conn)

    def close(self) -> None:
        self._timer.cancel()
        self._timer.join()
        with self._lock:
            self._conns.clear()


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[Deadline]:
    """Requests made in this thread inside the block end by ``seconds`` from now."""
    deadline = Deadline(seconds)
    outer = getattr(_current, "deadline", None)
    _current.deadline = deadline
    try:
        yield deadline
    finally:
        _current.deadline = outer
        deadline.close()


def _shut(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


_current = threading.local()


def _watch(conn: Any) -> None:
    deadline: Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None:
        deadline.watch(conn)


class _WatchedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        _watch(self)
        super().connect()
        _watch(self)  # the socket exists now: a deadline that passed meanwhile shuts it

    def request(self, *args: Any, **kwargs: Any) -> None:  # a pooled connection, reused
        _watch(self)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        _watch(self)
        super().connect()
        _watch(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self)
        super().request(*args, **kwargs)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections a :func:`request_deadline` can shut."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _WatchedHTTPPool,
            "https": _WatchedHTTPSPool,
        }
