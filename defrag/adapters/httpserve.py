"""The small HTTP server the extender and the node agent share (stdlib ``http.server``).

:class:`QuietHTTPServer` serves each request on its own daemon thread and logs a client that
hangs up at debug level; :class:`QuietHandler` logs requests at debug level and answers with
one body and its length (:meth:`QuietHandler.send_body`). Both log to their ``logger``: a
subclass sets its own module's, so its records keep their origin.

:class:`BoundedHTTPServer` (the extender's) bounds what clients can hold: a pool of connection
threads, an idle timeout between requests and a total read deadline per request
(:class:`ServerLimits`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

log = logging.getLogger(__name__)

JOIN_BODY_BYTES = 1 << 16
"""The largest body written in one piece with its headers (a larger one is written after them:
copying it to join them would cost more than the write it saves)."""


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs at debug level (never on stderr) and sends sized bodies."""

    logger: logging.Logger = log

    def log_message(self, format: str, *args: Any) -> None:
        # Every answer logs its request line: formatted only when someone reads it.
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("%s %s", self.address_string(), format % args)

    def send_body(self, code: int, body: bytes, content_type: str) -> None:
        """The status line, the headers and ``body`` in one write: a socket write per part
        costs a system call each and, between the two, hands the interpreter's lock to any
        other thread that wants it, for up to its switch interval, while the client waits."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        buffered = getattr(self, "_headers_buffer", None)
        if self.request_version == "HTTP/0.9" or buffered is None or len(body) > JOIN_BODY_BYTES:
            self.end_headers()  # no headers written, or a body too large to copy for this
            self.wfile.write(body)
            return
        # end_headers() is the blank line and a flush of the buffered headers; the body joins
        # them before the flush.
        buffered.append(b"\r\n")
        buffered.append(body)
        self.flush_headers()


class QuietHTTPServer(ThreadingHTTPServer):
    """A threading server whose threads never hold the process up at exit."""

    daemon_threads = True
    logger: logging.Logger = log

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up is routine (kube-scheduler timeouts); anything else is logged."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | ssl.SSLError | TimeoutError):
            self.logger.debug("client %s went away: %s", client_address, exc)
        else:
            self.logger.exception("error serving %s", client_address)


# --- a bounded server, for endpoints any client on the network can reach ----------------------


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one client may hold of a :class:`BoundedHTTPServer`.

    ``max_connections`` connection threads at most (the pool; a connection beyond it gets 503
    and is closed at once); a keep-alive connection idle for ``idle_timeout_s`` is closed; once
    a request's first byte arrived, its headers and body must be in within ``read_timeout_s``
    (a watchdog closes a trickling client, whatever its pace); every socket read or write waits
    at most ``read_timeout_s``.
    """

    max_connections: int = 64
    idle_timeout_s: float = 30.0
    read_timeout_s: float = 10.0


class _Watchdog:
    """Closes connections that pass their deadline (a socket timeout alone bounds each recv, so
    a client sending one byte per interval would never be cut off)."""

    def __init__(self, on_expire: Callable[[], None], period_s: float = 0.2) -> None:
        self._deadlines: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._on_expire = on_expire
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-watchdog", daemon=True)
        self._thread.start()

    def arm(self, conn: socket.socket, seconds: float) -> None:
        with self._lock:
            self._deadlines[conn] = time.monotonic() + seconds

    def disarm(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(conn, None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            now = time.monotonic()
            with self._lock:
                late = [c for c, t in self._deadlines.items() if t <= now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                with contextlib.suppress(OSError):  # the blocked read returns; the thread ends
                    conn.shutdown(socket.SHUT_RDWR)
                self._on_expire()


BUSY_BODY = b'{"Error":"server busy: too many connections"}'


class BoundedHandler(QuietHandler):
    """A handler for :class:`BoundedHTTPServer`: idle and read deadlines around each request.

    Subclasses call :meth:`request_read` once the request (and its body) is in, so that the time
    spent answering is not counted against the client.
    """

    server: BoundedHTTPServer

    def setup(self) -> None:
        super().setup()
        limits = self.server.limits
        self.connection.settimeout(limits.read_timeout_s)
        if isinstance(self.connection, ssl.SSLSocket):  # the TLS handshake, in this thread
            self.server.watchdog.arm(self.connection, limits.read_timeout_s)
            try:
                self.connection.do_handshake()
            finally:
                self.server.watchdog.disarm(self.connection)

    def handle_one_request(self) -> None:
        limits = self.server.limits
        self.connection.settimeout(limits.idle_timeout_s)
        try:
            # wait for the next request, at most the idle timeout
            first = cast(io.BufferedReader, self.rfile).peek(1)
        except (TimeoutError, OSError):
            self.server.count_closed("idle")
            self.close_connection = True
            return
        if not first:
            self.close_connection = True
            return
        self.connection.settimeout(limits.read_timeout_s)
        self.server.watchdog.arm(self.connection, limits.read_timeout_s)
        try:
            super().handle_one_request()
        except TimeoutError:
            self.server.count_closed("read-timeout")
            self.close_connection = True
        finally:
            self.server.watchdog.disarm(self.connection)

    def request_read(self) -> None:
        """The request is in: stop its read deadline."""
        self.server.watchdog.disarm(self.connection)

    def reading(self) -> None:
        """A new read deadline (the body, after waiting for room to hold it)."""
        self.server.watchdog.arm(self.connection, self.server.limits.read_timeout_s)


class BoundedHTTPServer(QuietHTTPServer):
    """A threading server with a bounded pool of connection threads and read/idle deadlines."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BoundedHandler],
        limits: ServerLimits | None = None,
    ) -> None:
        self.limits = limits or ServerLimits()
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self.closed_counts: dict[str, int] = {"idle": 0, "read-timeout": 0, "busy": 0}
        self.active_connections = 0
        """Connections holding a thread of the pool now."""
        self._count_lock = threading.Lock()
        self.watchdog = _Watchdog(lambda: self.count_closed("read-timeout"))
        super().__init__(address, handler)

    def count_closed(self, reason: str) -> None:
        with self._count_lock:
            self.closed_counts[reason] = self.closed_counts.get(reason, 0) + 1

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.count_closed("busy")
            try:
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: "
                    + str(len(BUSY_BODY)).encode()
                    + b"\r\n\r\n"
                    + BUSY_BODY
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._count_lock:
            self.active_connections += 1
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.active_connections -= 1
            self._slots.release()

    def server_close(self) -> None:
        self.watchdog.close()
        super().server_close()
