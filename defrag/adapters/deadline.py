"""A wall-clock deadline on a whole HTTP request made with requests, not on each socket read.

requests' ``timeout`` bounds connecting and each read: a server that sends one byte every
second never trips it. Here a request made inside ``with request_deadline(s):`` through a
session that has :class:`DeadlineAdapter` mounted is watched: a timer fires at the deadline and
shuts down the socket of every connection the request used (a blocked read returns at once and
requests raises); a connection opened or reused after the deadline is shut at once. The timer
is cancelled and joined when the block ends, so nothing outlives the request.

The socket itself is kept, not only the connection: when a server answers with
``Connection: close`` (or HTTP/1.0), http.client hands the socket to the response and sets the
connection's ``sock`` to None, so a timer that looked only at ``conn.sock`` found nothing to shut
and a trickling body ran on for ever (issue 27). Shutting the kept socket down wakes the blocked
read (it returns end-of-file), over TLS too; the read's caller then fails with a short or broken
answer, which the adapters report as the deadline when :attr:`Deadline.expired` is set.

A :func:`time_budget` bounds a whole command or daemon cycle: every request deadline opened
inside it ends by the budget's end at the latest (its :attr:`Deadline.why` then names the
budget), so a run of requests, each within its own limit, cannot add up past the command's.

The deadline belongs to the thread that opened the block (a ``threading.local``); requests
made in other threads are not affected.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

__all__ = [
    "Budget",
    "Deadline",
    "DeadlineAdapter",
    "budget_spent",
    "current_budget",
    "request_deadline",
    "time_budget",
    "watch_pool_manager",
]

REQUEST = "the whole request"


@dataclass(frozen=True, slots=True)
class Budget:
    """A wall-clock limit on everything a thread does inside :func:`time_budget`."""

    seconds: float
    end: float
    """``time.monotonic()`` at which it is spent."""
    what: str
    """What sets it, for messages: ``"defrag detect's deadline of 60 s (--deadline)"``."""

    def remaining(self) -> float:
        return self.end - time.monotonic()


class Deadline:
    """One request's wall-clock limit (see the module's docstring)."""

    def __init__(self, seconds: float, why: str = REQUEST) -> None:
        seconds = max(0.0, seconds)
        self.seconds = seconds
        self.why = why
        """What set this limit: the request's own (:data:`REQUEST`) or a budget's ``what``."""
        self.end = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self.expire)
        self._timer.daemon = True
        self._timer.name = "request-deadline"
        self._timer.start()

    def remaining(self) -> float:
        return self.end - time.monotonic()

    @property
    def by_budget(self) -> bool:
        """The limit that holds is a command's or cycle's budget, not the request's own."""
        return self.why != REQUEST

    def watch(self, conn: Any) -> None:
        with self._lock:
            if not any(c is conn for c in self._conns):
                self._conns.append(conn)
            sock = getattr(conn, "sock", None)
            if sock is not None and not any(s is sock for s in self._socks):
                self._socks.append(sock)  # kept: the connection may drop it (see above)
            if self.expired:
                self._shut_all()

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut_all()

    def close(self) -> None:
        self._timer.cancel()
        if self._timer is not threading.current_thread():
            self._timer.join()
        with self._lock:
            self._conns.clear()
            self._socks.clear()

    def _shut_all(self) -> None:
        for conn in self._conns:
            sock = getattr(conn, "sock", None)
            if sock is not None:
                _shut(sock)
        for sock in self._socks:
            _shut(sock)


@contextlib.contextmanager
def request_deadline(seconds: float) -> Iterator[Deadline]:
    """Requests made in this thread inside the block end by ``seconds`` from now, or by the
    end of the thread's :func:`time_budget` when that comes first."""
    budget = current_budget()
    if budget is not None and budget.remaining() < seconds:
        deadline = Deadline(budget.remaining(), budget.what)
    else:
        deadline = Deadline(seconds)
    outer = getattr(_current, "deadline", None)
    _current.deadline = deadline
    try:
        yield deadline
    finally:
        _current.deadline = outer
        deadline.close()


@contextlib.contextmanager
def time_budget(seconds: float, what: str) -> Iterator[Budget]:
    """Every request deadline this thread opens inside the block ends by ``seconds`` from now
    (an enclosing budget that ends sooner still holds)."""
    outer = current_budget()
    budget = Budget(seconds, time.monotonic() + max(0.0, seconds), what)
    if outer is not None and outer.end < budget.end:
        budget = outer
    _current.budget = budget
    try:
        yield budget
    finally:
        _current.budget = outer


def current_budget() -> Budget | None:
    """This thread's :func:`time_budget`, if it is inside one."""
    budget: Budget | None = getattr(_current, "budget", None)
    return budget


def budget_spent() -> bool:
    """This thread's budget has run out (retrying a request is then pointless)."""
    budget = current_budget()
    return budget is not None and budget.remaining() <= 0


def _shut(sock: Any) -> None:
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


WATCHED_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _WatchedHTTPPool,
    "https": _WatchedHTTPSPool,
}


def watch_pool_manager(manager: Any) -> None:
    """Make the connections of a urllib3 ``PoolManager`` (the ``kubernetes`` client's) ones a
    :func:`request_deadline` can shut. Pools already open keep their connections unwatched, so
    call this before the first request."""
    manager.pool_classes_by_scheme = dict(WATCHED_POOLS)


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections a :func:`request_deadline` can shut."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        watch_pool_manager(self.poolmanager)
