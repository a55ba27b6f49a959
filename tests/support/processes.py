"""Child processes of the test suite: wait until one serves /readyz, or fail with its output."""

from __future__ import annotations

import http.client
import subprocess
import time

import pytest


def wait_ready(proc: subprocess.Popen[bytes], port: int, what: str = "defrag extender") -> None:
    """Poll ``GET /readyz`` on 127.0.0.1:``port`` until 200 (30 s); if the process exits or the
    time runs out, kill it and fail the test with what it printed."""
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"{what} did not become ready: {out}")
        time.sleep(0.1)
