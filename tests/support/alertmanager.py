"""A real Alertmanager for tests, and a webhook receiver that records its notifications.

``AlertmanagerServer`` runs the Debian ``prometheus-alertmanager`` on 127.0.0.1 with clustering
off (``--cluster.listen-address=`` empty), a fresh storage dir and short timings: each alert is
its own group (``group_by: ['...']``), ``group_wait`` 200 ms, ``group_interval`` 500 ms. The
repeat interval is long (1 h) on purpose: a notification that arrives twice within a test is a
real duplicate, not a scheduled repeat. Resolved notifications are on.

``WebhookReceiver`` is the receiver: an HTTP server on 127.0.0.1 that keeps every payload and
lets a test wait for one (no sleeps; :meth:`WebhookReceiver.wait_for` wakes on arrival).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from tests.support.binaries import free_port, require_binary, stop_process, wait_ready

CONFIG = """\
route:
  receiver: webhook
  group_by: ['...']
  group_wait: 200ms
  group_interval: 500ms
  repeat_interval: 1h
receivers:
  - name: webhook
    webhook_configs:
      - url: {webhook}
        send_resolved: true
"""


@dataclass(frozen=True, slots=True)
class Notification:
    """One alert inside one webhook payload."""

    receiver_url: str  # the externalURL of the Alertmanager that sent it
    status: str  # firing | resolved
    labels: dict[str, str]

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


class WebhookReceiver:
    """Records Alertmanager webhook payloads, flattened to one Notification per alert."""

    def __init__(self) -> None:
        self._notifications: list[Notification] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                receiver._record(payload)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _record(self, payload: dict[str, Any]) -> None:
        with self._cond:
            for alert in payload.get("alerts", []):
                self._notifications.append(
                    Notification(
                        receiver_url=str(payload.get("externalURL", "")),
                        status=str(alert.get("status", "")),
                        labels=dict(alert.get("labels", {})),
                    )
                )
            self._cond.notify_all()

    @property
    def notifications(self) -> list[Notification]:
        with self._cond:
            return list(self._notifications)

    def matching(self, name: str, status: str | None = None) -> list[Notification]:
        return [
            n
            for n in self.notifications
            if n.name == name and (status is None or n.status == status)
        ]

    def wait_for(
        self, predicate: Callable[[list[Notification]], bool], timeout_s: float = 10.0
    ) -> list[Notification]:
        """Block until ``predicate(notifications)`` holds; fail the test after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate(self._notifications):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"webhook condition not met in {timeout_s}s; got {self._notifications}"
                    )
                self._cond.wait(left)
            return list(self._notifications)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class AlertmanagerServer:
    """The real Alertmanager on 127.0.0.1, restartable on the same port and storage."""

    def __init__(self, webhook_url: str, port: int | None = None) -> None:
        self.binary = require_binary("prometheus-alertmanager")
        self._dir = tempfile.TemporaryDirectory(prefix="defrag-am-")
        self.root = Path(self._dir.name)
        (self.root / "data").mkdir()
        self.config = self.root / "alertmanager.yml"
        self.config.write_text(CONFIG.format(webhook=webhook_url))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = self.root / "alertmanager.log"

    def start(self) -> None:
        if self._proc is not None:
            return
        args = [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.external-url={self.url}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_ready("alertmanager", self.url, self._proc, self._log, timeout_s=15, interval_s=0.05)

    def stop(self) -> None:
        """Stop gracefully (SIGTERM): the notification log is written to storage."""
        if self._proc is None:
            return
        stop_process(self._proc)
        self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    # -- API helpers -------------------------------------------------------------------

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """Active alerts (``GET /api/v2/alerts``), optionally filtered by label equality."""
        params = {"filter": [f'{k}="{v}"' for k, v in filters.items()]}
        response = requests.get(f"{self.url}/api/v2/alerts", params=params, timeout=5)
        response.raise_for_status()
        return list(response.json())

    def silence(self, matchers: dict[str, str], minutes: float = 30) -> str:
        """Create a silence through the API; returns its id."""
        now = datetime.now(UTC)
        body = {
            "matchers": [
                {"name": k, "value": v, "isRegex": False, "isEqual": True}
                for k, v in matchers.items()
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=minutes)).isoformat(),
            "createdBy": "defrag tests",
            "comment": "silence test",
        }
        response = requests.post(f"{self.url}/api/v2/silences", json=body, timeout=5)
        response.raise_for_status()
        return str(response.json()["silenceID"])


@contextmanager
def alertmanager_with_receiver() -> Iterator[tuple[AlertmanagerServer, WebhookReceiver]]:
    """A started Alertmanager and the receiver its notifications go to."""
    receiver = WebhookReceiver()
    server = AlertmanagerServer(receiver.url)
    try:
        server.start()
        yield server, receiver
    finally:
        server.close()
        receiver.close()
