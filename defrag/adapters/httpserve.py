"""The small HTTP server the extender and the node agent share (stdlib ``http.server``).

:class:`QuietHTTPServer` serves each request on its own daemon thread and logs a client that
hangs up at debug level; :class:`QuietHandler` logs requests at debug level and answers with
one body and its length (:meth:`QuietHandler.send_body`). Both log to their ``logger``: a
subclass sets its own module's, so its records keep their origin.
"""

from __future__ import annotations

import logging
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs at debug level (never on stderr) and sends sized bodies."""

    logger: logging.Logger = log

    def log_message(self, format: str, *args: Any) -> None:
        self.logger.debug("%s %s", self.address_string(), format % args)

    def send_body(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietHTTPServer(ThreadingHTTPServer):
    """A threading server whose threads never hold the process up at exit."""

    daemon_threads = True
    logger: logging.Logger = log

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up is routine (kube-scheduler timeouts); anything else is logged."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            self.logger.debug("client %s went away: %s", client_address, exc)
        else:
            self.logger.exception("error serving %s", client_address)
