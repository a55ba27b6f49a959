"""Finding and running the real binaries integration tests use (Prometheus, Alertmanager).

Under CI=true a missing binary fails the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import NoReturn

import pytest
import requests


def require_binary(name: str) -> str:
    """Path of ``name``; skip locally when it is missing, fail under CI (never skip silently)."""
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} not found on PATH (make tools installs it)")
    return path


def require_library(name: str) -> str:
    """The soname the dynamic loader finds for library ``name`` (``jemalloc`` →
    ``libjemalloc.so.2``, usable as ``LD_PRELOAD``); skip locally when it is missing, fail under
    CI (never skip silently)."""
    import ctypes.util

    found = ctypes.util.find_library(name)
    if found is None:
        unavailable(f"lib{name} not found by the dynamic loader (make tools installs it)")
    return found


def in_ci() -> bool:
    """Whether the suite runs in CI (``CI`` set to 1, true or yes, as CI services set it)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(message: str) -> NoReturn:
    """Skip locally; under CI fail, so a missing part is never a silent skip."""
    if in_ci():
        pytest.fail(f"CI={os.environ['CI']}: {message}", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(
    name: str,
    url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float,
    interval_s: float,
) -> None:
    """Poll ``url``/-/ready until it answers 200; fail, with the end of ``log`` (the process's
    output), when the process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {_tail(log)}")
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{name} at {url} not ready after {timeout_s:g} s: {_tail(log)}")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (a graceful stop), then SIGKILL if it is still running after ``timeout_s``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""
